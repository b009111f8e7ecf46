"""The one timer of the harness: seconds of one call of a callable on a device, the device's queued work
waited for before and after it (CUDA; nothing to wait for on a CPU), and the columns a series of such
calls is reported as. The benchmark's layer and task modes and the doctor's overhead check time with it."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from lra.devices import LoadMeter, sync


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
    """The machine's load over a measurement, read and judged as a run's record is (:class:`lra.devices.LoadMeter`,
    :func:`lra.devices.machine_loaded`: one rule for "loaded"). Started on construction, :meth:`stop` at the end;
    every report prints :meth:`line`, and :meth:`warning` where the machine was loaded."""

    def __init__(self, threads: int, device: str = "cpu"):
        self.threads, self.meter = threads, LoadMeter(device)
        self.machine = self.meter.fields

    def stop(self) -> Load:
        self.machine = self.meter.end()
        return self

    @property
    def loaded(self) -> bool:
        return bool(self.machine["loaded"])

    def line(self) -> str:
        m, others = self.machine, self.machine.get("cpu_others")
        avg = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        return (
            f"Load average {avg(m['loadavg_start'])} at the start, {avg(m['loadavg_end'])} at the end, on {m['cpus']} "
            f"cores ({self.threads} thread(s) of this measurement)"
            + ("" if others is None else f"; other processes used {others:.0%} of the machine's CPU time")
            + "."
        )

    def warning(self) -> str | None:
        """One sentence when the machine was loaded (None on a calm one)."""
        if not self.loaded:
            return None
        return (
            "Warning: the machine was loaded while this ran (others' CPU share, or the GPU, as a run's record judges "
            "it: lra.devices.machine_loaded): times are inflated and noisy (ratios measured in one process suffer "
            "less). Rerun on a quiet machine before quoting them."
        )
