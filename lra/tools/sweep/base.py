"""What every part of a sweep shares: its constants, its one-line refusal, and the driver's signal handling."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

from lra import CONF_DIR
from lra.interrupts import Interrupted, signal_of  # noqa: F401 - the sweep's names for them

log = logging.getLogger("lra.tools.sweep")


GRID_DIR = CONF_DIR / "sweep"
FINISHED = ("completed", "stopped_early", "stuck")  # = lra.train.FINISHED: lra.train returns at once
MARKER = ".sweep_job.json"  # written by run_job in the run folder: who runs it, attempts
SWEEP_OPTIONS = (
    "grid",
    "parallel",
    "jobs_per_gpu",
    "dry_run",
    "n_trials",
    "progress",
    "budget",
    "carry",
    "probe",
)  # consumed here, never passed to a run
MANIFEST_VERSION = 2  # manifest-<key>.json per sweep definition
STOP_GRACE_S = 10.0  # an interrupted sweep's jobs get this long to end on their own signal
# A budget: the runs still training at its end get SIGTERM and STOP_WAIT_S to write their record (seconds here),
# then SIGKILL; the sweep ends at most BUDGET_SLACK_S after its budget (the rest: the manifest and the summary).
STOP_WAIT_S, BUDGET_SLACK_S = 15.0, 20.0
MIN_START_S = 15.0  # a run needs this long to start and write its first record: no job starts closer to the end


class Refusal(SystemExit):
    """A one-line refusal of the command (exit 2: bad input; 75: the sweep is in use); its text is the line."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def process_start() -> float:
    """When this process started (Linux's /proc; elsewhere: now): a budget counts from the command's start, its
    seconds of imports included."""
    with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    return time.time()


class BudgetReached(Interrupted):
    """The sweep's time budget ran out: its runs are stopped with SIGTERM (interrupted, resumable)."""

    def __init__(self):
        super().__init__(signal.SIGTERM)


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Raise :class:`BudgetReached` in the main thread after ``seconds`` (None: never): wherever the driver
    waits (the launcher's poll, a job's wait), as a signal would."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise BudgetReached()

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def interruptible():
    """SIGINT and SIGTERM raise :class:`Interrupted` in the driver, once: a second signal while the sweep
    winds down is ignored, so the jobs are stopped and the manifest is written (without this a SIGTERM
    ends the driver at once, silently, its manifest left saying ``pending``)."""
    if threading.current_thread() is not threading.main_thread():  # signal.signal works in the main thread only
        yield
        return
    got: list[int] = []

    def handler(signum, frame):
        if not got:
            got.append(signum)
            raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
