"""How the harness writes files, and which code wrote them.

Every output (run records, caches, tables, plots, benchmark and study files) is written through
:func:`write_atomic`: a reader sees the old file or the new one, never half of one, and an
interrupted write leaves no temporary file behind. :func:`git_commit` is the provenance stamp of
records, benchmarks and studies.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from lra import REPO_ROOT

_UMASK = os.umask(0)  # read the process umask once (os.umask can only be read by setting it)
os.umask(_UMASK)


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = tmp = None
    try:
        with _signals_held():  # a signal's exception comes once ``tmp`` is known, so it is always removed
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        fd = os.close(fd)  # None
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are shared like any file
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait (are delivered on leaving) while the temporary file is created and named."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal mask
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_text(path: Path, text: str, *, fsync: bool = False) -> Path:
    """``text`` as UTF-8 with ``\\n`` line ends; ``fsync`` for files that must survive a power cut."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    return write_atomic(path, write)


def json_safe(x):
    """NaN/inf become None (strict JSON); tensors and numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 0) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path: Path, obj) -> Path:
    """Strict JSON, sorted keys; an unserialisable value fails before anything is written."""
    text = json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False)
    return write_text(path, text, fsync=True)


def write_csv(path: Path, rows: Iterable[dict], columns: list[str], *, float_format: str = ".6g") -> Path:
    """``rows`` under ``columns`` (other keys ignored); floats as ``float_format`` so reruns are byte-stable."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (format(v, float_format) if isinstance(v, float) else v) for k, v in r.items()})
    return write_text(path, buf.getvalue())


def data_root(configured: str | os.PathLike | None = None) -> Path:
    """The data root: ``$LRA_DATA`` if set, else the configured path (``data_root`` in conf/config.yaml),
    else ``<repo>/data``."""
    env = os.environ.get("LRA_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return Path(configured).expanduser().resolve() if configured else REPO_ROOT / "data"


def runs_root() -> Path:
    """The runs root as conf/config.yaml resolves ``runs_root``: ``$LRA_RUNS`` when set, else ``<repo>/runs``
    (a checkout's runs/, or ./runs where an installed harness was started). For the tools that write
    outside a run (benchmarks, studies), so that ``LRA_RUNS`` moves every output of the harness."""
    env = os.environ.get("LRA_RUNS")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "runs"


def git_commit(short: bool = False) -> str | None:
    """HEAD of the checkout the code runs from, ``-dirty`` when tracked files changed; None outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", *(["--short"] if short else []), "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None
