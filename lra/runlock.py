"""One process owns a run folder at a time.

``with hold(run_dir):`` takes an exclusive ``flock`` on ``<run_dir>/.lock`` and writes the holder's
pid, host and start time into it. The kernel releases the lock when the holder exits, however it
exits (SIGKILL, a crash, a lost node on a local file system), so a stale lock never blocks: the file
stays, the lock does not. A second command on the same folder gets :class:`RunLocked`, whose message
says who holds it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import socket
from pathlib import Path

EXIT_LOCKED = 75  # EX_TEMPFAIL: try again later


class RunLocked(RuntimeError):
    """Another live process holds the run folder."""


@contextlib.contextmanager
def hold(run_dir: Path):
    path = Path(run_dir) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLocked(
                f"{run_dir} is in use by {_holder(path)}: wait for that run to end (or stop it), "
                f"then run the same command again"
            ) from None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield me
    finally:
        os.close(fd)  # releases the lock


def holder_pid(run_dir: Path) -> int | None:
    """The pid of the process that holds ``run_dir`` on this host, or None (not held, held from another
    host, or no such folder). Asked with a shared lock taken and dropped at once, so the pid a dead
    holder left in the file is never taken for a live run (its pid may be reused)."""
    path = Path(run_dir) / ".lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                info = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                return None
            return int(info["pid"]) if info.get("host") == socket.gethostname() and info.get("pid") else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        h = json.loads(path.read_text() or "{}")
        return f"pid {h['pid']} on {h['host']} since {h['started']}"
    except (OSError, ValueError, KeyError):
        return "another process"
