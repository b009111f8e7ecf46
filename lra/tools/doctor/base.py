"""The doctor's vocabulary: what it was asked (:class:`Options`), what it found (:class:`Result`), and
the time budget each check runs under."""

from __future__ import annotations

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


class Budget:
    """A check's time budget: ``left()`` says whether another item may start."""

    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.perf_counter()

    def left(self) -> bool:
        return time.perf_counter() - self.t0 < self.seconds

    def skip(self, check: str, item: str) -> Result:
        return Result(check, item, "skip", detail=f"past the check's time budget of {self.seconds:.0f} s (--budget-s)")


def one_line(err: BaseException) -> str:
    """An error as one line (:func:`lra.module.error_line`: its type and first line), bounded."""
    return error_line(err)[:300]
