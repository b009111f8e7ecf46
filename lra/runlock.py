"""One process owns a run folder at a time.

``with hold(run_dir):`` takes an exclusive ``flock`` on the run folder itself and on ``<run_dir>/.lock``,
and writes the holder's pid, host and start time into the file. The kernel releases both when the
holder exits, however it exits (SIGKILL, a crash, a lost node on a local file system), so a stale lock
never blocks: the file stays, the lock does not. A second command on the same folder gets
:class:`RunLocked`, whose message says who holds it.

Why two: a ``flock`` belongs to an inode, not to a name. ``rm <run>/.lock`` while a run trains (a
natural clean-up after a crash) leaves the holder locking a file no one can open any more, and the
next command creates a new ``.lock`` and locks that: two writers. The folder cannot be removed from
under a run without removing the run, so its lock is the one that holds; the file keeps the holder's
name for the refusal's message and for :func:`holder`, and is what a file system that cannot lock
a directory (NFS, which emulates ``flock`` with byte-range locks on regular files only) still locks.

On a shared file system the lock is only as good as its ``flock``: NFS v4 and Lustre mounted with
``-o flock`` lock across nodes; Lustre with ``-o localflock`` locks on one node only (two nodes can both
hold a folder); Lustre without either refuses ``flock``, which is :class:`LockUnsupported`, one line
saying what to do. ``LRA_RUN_LOCK=off`` runs without the lock, for such a file system, at the price
of nothing stopping two commands on one folder (docs/sweeps.md, "Run folders on a shared file system").
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import socket
import tempfile
from pathlib import Path

from lra.checks import ConfigError

EXIT_LOCKED = 75  # EX_TEMPFAIL: try again later
LOCK_ENV = "LRA_RUN_LOCK"  # off: no lock (a file system without flock)
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # what flock says where it cannot lock
log = logging.getLogger("lra.runlock")


class RunLocked(RuntimeError):
    """Another live process holds the run folder."""


class LockUnsupported(ConfigError):
    """The run folder's file system cannot ``flock``: the user's to fix (exit 2), one line saying how."""


@contextlib.contextmanager
def hold(run_dir: Path):
    path = Path(run_dir) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.environ.get(LOCK_ENV, "").lower() == "off":
        log.warning("%s=off: %s is not locked; nothing stops a second command on it", LOCK_ENV, run_dir)
        yield {"pid": os.getpid(), "host": socket.gethostname(), "lock": "off"}
        return
    with contextlib.ExitStack() as held:  # closing a descriptor releases its lock
        folder = _lock_folder(run_dir, path)
        if folder is not None:
            held.callback(os.close, folder)
        fd = _lock_file(run_dir, path)
        held.callback(os.close, fd)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)  # never over a longer, older content: it parses (else its holder is unknown)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield me


def _refused(run_dir: Path, path: Path) -> RunLocked:
    return RunLocked(
        f"{run_dir} is in use by {who(_said(path))}: wait for that run to end (or stop it), then run the same "
        f"command again"
    )


def _lock_folder(run_dir: Path, path: Path) -> int | None:
    """The run folder's own exclusive lock (its descriptor); None where its file system cannot lock a folder
    (then the file's lock is the only one, as before)."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _refused(run_dir, path) from None
    except OSError:  # EBADF, ENOLCK, EISDIR, ...: no folder locks here; the file's lock (or its refusal) follows
        os.close(fd)
        return None
    return fd


def _lock_file(run_dir: Path, path: Path) -> int:
    """``.lock``, opened and locked; the lock is taken again if the name was removed or replaced between the
    open and the lock (the locked inode must be the one the name shows, or the next command locks another)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, path):
                return fd
        except BlockingIOError:
            os.close(fd)
            raise _refused(run_dir, path) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in UNSUPPORTED:
                raise
            raise _unsupported(path, e) from None
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _unsupported(path: Path, e: OSError) -> LockUnsupported:
    return LockUnsupported(
        f"cannot lock {path} ({os.strerror(e.errno)}): its file system does not support flock (Lustre without "
        f"-o flock?). Put the runs root (LRA_RUNS) on one that does (a local disk, NFS v4, Lustre with -o flock), "
        f"or set {LOCK_ENV}=off to run unlocked (nothing then stops two commands on one folder)"
    )


def check_lockable(folder: Path) -> None:
    """:class:`LockUnsupported` now, before the run's folder exists, where ``folder``'s file system cannot
    ``flock`` (asked on a temporary file in its nearest existing parent, removed at once)."""
    if os.environ.get(LOCK_ENV, "").lower() == "off":
        return
    base = Path(folder)
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=base, prefix=".lra-lock-check-")
    except OSError:  # a folder that cannot be written: the run's own checks say so
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as e:
        if e.errno in UNSUPPORTED:
            raise _unsupported(Path(folder) / ".lock", e) from None
    finally:
        os.close(fd)
        os.unlink(tmp)


def holder(run_dir: Path) -> dict | None:
    """Who holds ``run_dir`` (:func:`hold`): None when nobody does (or its file system cannot say), else what its
    ``.lock`` says (``pid``, ``host``, ``started``), ``{"pid": None}`` where that does not parse: held all the same.
    Asked with shared locks taken and dropped at once, so a pid a dead holder left is never taken for a live run."""
    run_dir = Path(run_dir)
    return _said(run_dir / ".lock") if _locked(run_dir) or _locked(run_dir / ".lock") else None


def holder_pid(run_dir: Path) -> int | None:
    """The pid of the process that holds ``run_dir`` on this host, or None: not held, held from another host (its
    pid there is no process here), or by a process its ``.lock`` does not name (:func:`holder` says it is held)."""
    h = holder(run_dir)
    return h["pid"] if h is not None and h.get("host") == socket.gethostname() else None


def who(h: dict) -> str:
    """A :func:`holder` in words: ``pid 12 on node-b since <time>``, or ``another process`` that its ``.lock`` does not
    name."""
    if h["pid"] is None:
        return "another process (its .lock does not say which)"
    return f"pid {h['pid']} on {h['host']}" + (f" since {h['started']}" if h.get("started") else "")


def _locked(path: Path) -> bool:
    """Does another open file hold ``path``'s flock? False where it cannot be opened, or its file system cannot lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # dropped when fd closes
    except OSError as e:
        return isinstance(e, BlockingIOError)
    finally:
        os.close(fd)
    return False


def _said(path: Path) -> dict:
    """Who ``.lock`` says holds it; ``{"pid": None}`` where that does not parse (cut short, written over, edited)."""
    try:
        h = json.loads(path.read_text())
    except (OSError, ValueError):
        h = None
    ok = isinstance(h, dict) and type(h.get("pid")) is int and h["pid"] > 0 and isinstance(h.get("host"), str)
    return h if ok else {"pid": None}
