"""How a run ends: whatever ends it short of SIGKILL leaves a record that says why (:func:`recorded`), and one
exit policy (:func:`ending`) says which exit code and which one line each ending gets. ``lra.train`` runs inside
:func:`recorded` and :func:`owned` (one process per run folder, lra/runlock.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

import attention
from lra.cli import UsageError
from lra.config import ConfigError
from lra.data import DataError
from lra.fit import FitError
from lra.interrupts import Interrupted, raise_interrupted
from lra.module import CompileError
from lra.protocol import RunError, resumes_at
from lra.record import Record, write_record
from lra.runlock import EXIT_LOCKED, RunLocked, hold

log = logging.getLogger("lra.train")


@dataclasses.dataclass(frozen=True)
class Ending:
    """How an exception ends a run: what its record says (``status``, ``reason``) and, where the harness has
    a policy for it, the exit code and the one line on the console (None: a bug, ended by its traceback)."""

    status: str  # interrupted | failed
    reason: str
    code: int | None = None
    line: str | None = None


# Once the run has started (its record says the rest): exception types, exit code, the one line.
_EXITS = (
    ((ConfigError, DataError, RunError), 2, "{e}"),  # the user's to fix
    ((attention.BackendContractError, CompileError), 1, "{e}"),  # a backend broke its contract, compile failed
    ((FitError,), 3, "does not fit, not training: {e}"),
    ((RunLocked,), EXIT_LOCKED, "{e}"),
    ((OSError,), 1, "{name}: {e} (the run's record says where it stopped)"),  # disk full: the environment's
)
# Before it started (nothing is written): a bad command line or value.
_EXITS_BEFORE = (((UsageError, ConfigError, DataError, RunError), 2, "error: {e}"),)


def ending(e: BaseException, command: str | None = None, last: Path | None = None) -> Ending:
    """The one exit policy of ``python -m lra.train``. ``command``: the command line that resumes the run;
    None: the run has not started (an interruption then leaves nothing to resume). ``last``: the run's
    ``last.ckpt``, where an interruption says what it kept."""
    code = _interrupt_code(e)
    if code is not None:
        name = signal.Signals(code - 128).name if code > 128 else type(e).__name__
        status, reason = "interrupted", f"{name}: run the same command again to resume from the last checkpoint"
    else:
        status, reason = "failed", f"{type(e).__name__}: {e}"
    said = signal.Signals(code - 128).name if code is not None and code > 128 else f"exit {code}"
    if command is None and isinstance(e, (KeyboardInterrupt, Interrupted)):
        line = f"interrupted ({said}) before the run started; nothing was written to the runs root"
        return Ending(status, reason, code, line)
    if command is not None and isinstance(e, Interrupted):  # the record says interrupted; the line how to go on
        kept = resumes_at(last) if last is not None else "its last checkpoint"
        line = f"interrupted ({said}), keeping {kept}: resume with the same command: {command}"
        return Ending(status, reason, code, line)
    for types, exit_code, fmt in _EXITS if command is not None else _EXITS_BEFORE:
        if isinstance(e, types):
            return Ending(status, reason, exit_code, fmt.format(e=e, name=type(e).__name__))
    return Ending(status, reason)


@contextlib.contextmanager
def recorded(run_dir: Path, rec: Record):
    """The failure policy: SIGINT/SIGTERM become ``interrupted`` (exit 130/143), any exception
    ``failed`` with its reason (:func:`ending`); the record is written, then the exception goes on. Signals
    are turned into exceptions here (loader workers ignore them), so a signal to the whole process group
    ends the run as cleanly as one to this process."""
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield rec
    except BaseException as e:
        end = ending(e)
        rec.set(status=end.status, reason=end.reason)
        code = _interrupt_code(e)
        if code is not None and handlers:  # a second Ctrl-C must not cut the interrupted record short
            for s in handlers:
                signal.signal(s, signal.SIG_IGN)
        write_or_keep(run_dir, rec)
        if code is not None and not isinstance(e, Interrupted):
            raise Interrupted(code - 128 if code > 128 else None, code) from e
        raise
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def _interrupt_code(e: BaseException) -> int | None:
    """128 + signal for an interruption, the exit code of another SystemExit, None for a failure."""
    if isinstance(e, Interrupted):
        return int(e.code)
    if isinstance(e, SIGTERMException):  # Lightning's own SIGTERM handling
        return 128 + signal.SIGTERM
    if isinstance(e, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return (e.code if isinstance(e.code, int) else 1) if isinstance(e, SystemExit) else None


@contextlib.contextmanager
def owned(run_dir: Path):
    """Global rank zero owns the run folder (lra/runlock.py); the other DDP ranks share its run."""
    with hold(run_dir) if getattr(rank_zero_only, "rank", 0) == 0 else contextlib.nullcontext():
        yield


def write_rank_zero(run_dir: Path, rec: Record) -> None:
    """Only global rank zero writes the record (DDP runs one process per device)."""
    if getattr(rank_zero_only, "rank", 0) == 0:
        write_record(run_dir, rec)


def progress_record(run_dir: Path, rec: Record, fields: dict) -> None:
    """The record rewritten at a checkpoint (lra.loop.RecordProgress): what a SIGKILL leaves."""
    rec.set(**fields)
    write_or_keep(run_dir, rec)


def write_or_keep(run_dir: Path, rec: Record) -> None:
    """Write the record of a run that is ending badly; if even that fails (disk full), say so and leave
    the previous record as it was (records are replaced atomically, never half-written)."""
    try:
        write_rank_zero(run_dir, rec)
    except OSError as e:
        log.error("could not write %s (%s): the previous record is left as it was", run_dir / "result.json", e)
