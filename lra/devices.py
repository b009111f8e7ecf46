"""What the measuring tools ask of the device they run on: its name, its cores, a synchronisation
point, and whether an error was an out-of-memory one.

The bottom layer of the harness: imports torch and the standard library only, so the benchmark, the
memory meter (:mod:`lra.memory`) and the doctor all take these from here.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

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
