"""The one timer of the harness: seconds of one call of a callable on a device, the device's queued work
waited for before and after it (CUDA; nothing to wait for on a CPU), and the columns a series of such
calls is reported as. The benchmark's layer and task modes and the doctor's overhead check time with it."""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Callable

import torch

from lra.devices import default_threads, sync


def timed(fn: Callable[[], object], device: str | torch.device) -> float:
    """Seconds one call of ``fn()`` takes on ``device``, synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def timing_columns(times: list[float]) -> dict:
    """The median, fastest and slowest of ``times`` (seconds) in milliseconds, and how many they are."""
    return {
        "time_ms": statistics.median(times) * 1e3,
        "time_ms_min": min(times) * 1e3,
        "time_ms_max": max(times) * 1e3,
        "repeats": len(times),
    }


class Load:
    """The machine's load average over a benchmark, and whether it makes the CPU timings unreliable.

    Started on construction, :meth:`stop` at the end. Other processes' load is the larger of the load average
    at the start and the one at the end less this benchmark's own ``threads`` (the 1-minute average lags, so
    the start shows who was there before and the end what ran beside it). Every report prints :meth:`line`,
    and :meth:`warning` where other processes wanted more cores than the benchmark left free."""

    def __init__(self, threads: int, device: str = "cpu"):
        self.threads, self.device = threads, str(device)
        self.cores = default_threads()
        self.start = self._now()
        self.end = self.start

    @staticmethod
    def _now() -> float:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan

    def stop(self) -> Load:
        self.end = self._now()
        return self

    @property
    def others(self) -> float:
        return max(self.start, self.end - self.threads)

    def line(self) -> str:
        return (
            f"Load average {self.start:.2f} at the start, {self.end:.2f} at the end, on {self.cores} cores "
            f"({self.threads} thread(s) of this benchmark)."
        )

    def warning(self) -> str | None:
        """One sentence when other processes competed for the cores (None on a quiet machine or on a GPU)."""
        free = self.cores - self.threads
        if not self.device.startswith("cpu") or not math.isfinite(self.others) or self.others <= free + 0.25:
            return None
        return (
            f"Warning: other processes kept about {self.others:.1f} cores busy beside this benchmark's "
            f"{self.threads} thread(s) on {self.cores} cores: times are inflated and noisy (ratios measured "
            f"in one process suffer less). Rerun on a quiet machine before quoting them."
        )
