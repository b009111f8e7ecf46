"""The run record ``result.json`` (DESIGN.md): written atomically, never half-written."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from lra import REPO_ROOT

SCHEMA_VERSION = 1  # additions that keep every earlier field are not a new version
_UMASK = os.umask(0)  # read the process umask once (os.umask can only be read by setting it)
os.umask(_UMASK)
REQUIRED = ("task", "attn", "seed", "status", "test_acc", "best_val_acc", "steps", "train_time_s",
            "time_per_1k_steps_s", "peak_mem_bytes", "micro_batch", "accum_steps", "effective_batch", "hardware",
            "config", "git_commit",
            # the papers' protocol (docs/protocol.md): why it stopped, selection, estimated memory, throughput
            "reason", "steps_at_stop", "steps_to_best", "peak_mem_estimate_bytes", "tokens_per_s", "attn_options")


def git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def _clean(x):
    """JSON-safe: NaN/inf become None (strict JSON), tensors and numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 0) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The one way every output of the harness is written (records, caches, tables, plots, benchmark
    and study files): a reader sees the old file or the new one, never half of one, and an
    interrupted write leaves no temporary file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are shared like any file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: Path, obj) -> Path:
    text = json.dumps(_clean(obj), indent=2, sort_keys=True, allow_nan=False)  # fails before anything is written

    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    return write_atomic(path, write)


def write_record(run_dir: Path, record: dict) -> Path:
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"run record lacks {missing}")
    return write_json_atomic(Path(run_dir) / "result.json", {"schema_version": SCHEMA_VERSION, **record})


def read_record(run_dir: Path) -> dict | None:
    p = Path(run_dir) / "result.json"
    return json.loads(p.read_text()) if p.exists() else None
