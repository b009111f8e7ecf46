"""The one timer of the harness: seconds of one call of a callable on a device, the device's queued work
waited for before and after it (CUDA; nothing to wait for on a CPU), and the columns a series of such
calls is reported as. The benchmark's layer and task modes and the doctor's overhead check time with it."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from lra.devices import sync


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
