"""A signal as an exception: SIGINT or SIGTERM, raised where the main thread was, so whatever is running
(a run, a sweep's driver) ends through its own ``except`` and ``finally`` and says where it stopped."""

from __future__ import annotations

import contextlib
import signal
import threading


class Interrupted(SystemExit):
    """SIGINT or SIGTERM; its exit code is 128 + the signal. A SystemExit, not a KeyboardInterrupt: Lightning
    turns a KeyboardInterrupt inside ``Trainer.fit`` into ``sys.exit(1)`` and the signal would be lost.
    ``code``: another exit code where a SystemExit of its own interrupted a run (then ``signum`` is None)."""

    def __init__(self, signum: int | None, code: int | None = None):
        super().__init__(code if code is not None else 128 + int(signum))
        self.signum = None if signum is None else int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name if self.signum else f"exit {self.code}"


def signal_of(e: BaseException) -> int:
    """The signal behind an interruption: Interrupted knows it; a bare KeyboardInterrupt is a Ctrl-C."""
    return getattr(e, "signum", None) or signal.SIGINT


def raise_interrupted(signum, frame):
    """A signal handler: the signal becomes :class:`Interrupted` where the main thread was."""
    raise Interrupted(signum)


@contextlib.contextmanager
def sigterm_raises():
    """SIGTERM raises :class:`Interrupted` inside the block (as Ctrl-C raises KeyboardInterrupt), so every
    ``finally`` runs (temporary files go) and the command ends with one line; the handler it replaced is put
    back on leaving. Yields whether it is in place: only the main thread can set a handler."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    old = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, old)
