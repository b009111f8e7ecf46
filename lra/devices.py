"""What the harness asks of the device it runs on: its name, its cores, a synchronisation point, whether
an error was an out-of-memory one, and the cap on a shared GPU's memory a run keeps to.

The bottom layer of the harness: imports torch, the standard library and :mod:`lra.checks` only, so the
benchmark, the memory meter (:mod:`lra.memory`), the doctor, the run and the sweeps all take these from here.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import torch

from lra.checks import ConfigError

log = logging.getLogger("lra.train")  # the run's messages, under one name
GIB = 1024**3


def device_name(device: str | torch.device) -> str:
    """``NVIDIA H100 (132 SMs, 80 GiB)`` on CUDA, the CPU model and its core count otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory / GIB:.0f} GiB)"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on a CPU. Timers read the clock around it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error: CUDA's, or a CPU allocation that failed."""
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(err, oom):
        return True
    msg = str(err).lower()
    return "out of memory" in msg or "can't allocate memory" in msg


MEMORY_LIMIT_ENV = "LRA_MEMORY_LIMIT_GIB"  # this run's share of a GPU it shares (lra.sweep jobs_per_gpu=k sets it)


def limit_gpu_memory(device: torch.device, env=None) -> float | None:
    """Cap this process's caching allocator at ``$LRA_MEMORY_LIMIT_GIB`` GiB on ``device`` (a CUDA device;
    anything else, or no variable: nothing to do), so a run that shares a GPU and outgrows its estimate
    fails alone with an out-of-memory error instead of taking memory promised to the others (lra.sweep
    ``jobs_per_gpu=k`` sets the variable: docs/sweeps.md). Returns the fraction of the device set."""
    raw = (os.environ if env is None else env).get(MEMORY_LIMIT_ENV)
    if not raw or torch.device(device).type != "cuda":
        return None
    try:
        limit = float(raw)
    except ValueError:
        limit = float("nan")
    if not limit > 0:
        raise ConfigError(f"{MEMORY_LIMIT_ENV}={raw!r}: give this run's GPU memory in GiB, a number > 0 "
                          f"(lra.sweep jobs_per_gpu=k sets it), or unset it")
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, limit * GIB / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    log.info("GPU shared with other runs: this run's caching allocator is capped at %.2f GiB (%.4f of %s)",
             limit, fraction, device)
    return fraction
