"""The doctor's vocabulary: what it was asked (:class:`Options`), what it found (:class:`Result`), and
the time budget each check runs under."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lra.module import error_line
from lra.tasks import TASK_NAMES

CHECKS = ("backends", "fit", "overhead", "compile", "resume", "cost")
STATUSES = ("pass", "warn", "fail", "skip")


@dataclass
class Result:
    """One line of a check: what was looked at, how it went, the figure that says so."""

    check: str
    item: str
    status: str  # pass | warn | fail | skip
    figure: str = ""  # e.g. "12.3 ms, 41 MiB"
    detail: str = ""  # why it failed or warns, or what the figure means
    data: dict = field(default_factory=dict)  # the numbers behind the figure (report.json)

    def line(self) -> str:
        text = f"[{self.status.upper():4}] {self.check:8} {self.item}"
        text += f": {self.figure}" if self.figure else ""
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class Options:
    """What ``lra-doctor`` was asked (its command line, typed)."""

    checks: tuple = CHECKS
    quick: bool = False  # the quick preset's shapes and small budgets (what CI runs on a CPU)
    tasks: tuple = TASK_NAMES  # the task registry's (lra.tasks)
    backends: tuple = ()  # only these (registered names or module:Class of external ones); empty: all
    preset: str = "skeinformer_paper"  # the preset check 6 costs (and whose shapes checks 1, 2, 4 use)
    hardware: str = "auto"  # the profile the micro-batch is fitted to (auto: this device's memory)
    device: str = "cpu"
    budget_s: float = 600.0  # per check: items past it are skipped, so the doctor ends in bounded time
    threads: int | None = None
    out: Path | None = None

    @property
    def shapes_preset(self) -> str:
        return "quick" if self.quick else self.preset

    @property
    def device_overrides(self) -> list[str]:
        """``--device cpu`` on a GPU machine: the specs and runs must not take the GPU (and compile)."""
        return [] if self.device.startswith("cuda") else ["trainer.accelerator=cpu"]

    @property
    def run_overrides(self) -> list[str]:
        """What every spec and run of the doctor takes: the hardware profile and the device."""
        return [f"hardware={self.hardware}", *self.device_overrides]


class OverBudget(BaseException):
    """Raised in the main thread when a check runs past its budget plus grace (:func:`watchdog`). A
    BaseException, so the checks' own ``except Exception`` (a failing item is named and the rest go on)
    does not take it for the item's failure."""


def grace_s(seconds: float) -> float:
    """What a check may run past its budget to end the item in flight: 10% of it, 0.5 to 15 s."""
    return min(15.0, max(0.5, 0.1 * seconds))


class Budget:
    """A check's time budget: ``left()`` says whether another item may start, ``share(n)`` what one of
    ``n`` remaining items may spend; :func:`watchdog` stops the check ``grace`` past its end."""

    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.perf_counter()
        self.grace = grace_s(seconds)
        self.cut = False  # the watchdog fired: what failed after it was cut, not broken

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def remaining(self) -> float:
        return max(0.0, self.seconds - self.elapsed())

    def left(self) -> bool:
        return self.elapsed() < self.seconds

    def share(self, items: int) -> float:
        """Seconds one of ``items`` items still to run may take: an equal share of what is left."""
        return self.remaining() / max(1, items)

    def skip(self, check: str, item: str) -> Result:
        return Result(check, item, "skip", detail=f"past the check's time budget of {self.seconds:g} s (--budget-s)")

    def cut_result(self, check: str) -> Result:
        return Result(
            check,
            "(cut)",
            "skip",
            detail=f"stopped at {self.elapsed():.0f} s, past the check's time budget of {self.seconds:g} s "
            f"(+{self.grace:.1f} s grace): the item in flight did not finish (--budget-s)",
        )


_armed: list[Budget] = []  # the budget the watchdog guards now (at most one)


def _alarm(signum, frame):
    if _armed:
        _armed[0].cut = True
        raise OverBudget(f"past the check's time budget of {_armed[0].seconds:g} s")


@contextlib.contextmanager
def watchdog(budget: Budget):
    """Raise :class:`OverBudget` in the main thread ``budget.grace`` after the budget ends, and again each
    second (or grace) after (a ``finally`` or a library that swallows it gets it again), until the block is left.
    Only where a timer signal can be set (the main thread on a POSIX system); elsewhere a no-op."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGALRM, _alarm)
    _armed[:] = [budget]
    signal.setitimer(signal.ITIMER_REAL, max(budget.remaining() + budget.grace, 0.001), min(1.0, budget.grace))
    try:
        yield
    finally:
        _armed.clear()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line(err: BaseException) -> str:
    """An error as one line (:func:`lra.module.error_line`: its type and first line), bounded."""
    return error_line(err)[:300]
