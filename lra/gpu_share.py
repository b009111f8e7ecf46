"""Several runs on one GPU (``lra.sweep ... jobs_per_gpu=k``): each run's share of the card.

The model is tiny (86k parameters): one LRA run uses a fraction of a modern GPU, so a sweep may run
k of them on each GPU. Each of the k processes holds its own CUDA context ``c`` (``cuda_context_gib``)
outside PyTorch's caching allocator, so on a card of ``T`` GiB the k allocators together may hold
``T - k c``, and each run gets ``(T - k c) / k``. lra.fit fits a micro-batch when
``peak x (1 + m) + c <= total`` (:attr:`lra.config.HardwareSpec.budget_bytes`, ``m`` =
``allocator_margin``). Giving the run ``total = T / k`` (and the same ``c`` and ``m``) turns that into
``peak x (1 + m) <= T/k - c = (T - k c) / k``: exactly its share. So the sweep only passes
``hardware.total_gib=T/k`` to the run (lra.fit is unchanged), and the run caps its caching allocator at
the same ``T/k - c`` (:func:`limit_gpu_memory`), so a run that outgrows its estimate fails alone with
an out-of-memory error instead of taking memory the other k - 1 were promised.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from lra.config import ConfigError

log = logging.getLogger("lra.gpu_share")

MEMORY_LIMIT_ENV = "LRA_MEMORY_LIMIT_GIB"  # set by lra.sweep for a shared GPU; read by lra.train
GIB = 2 ** 30


def share_gib(total_gib: float, k: int) -> float:
    """``hardware.total_gib`` of one of k runs on a card of ``total_gib``: T / k, rounded down to 1 KiB-ish."""
    return math.floor(float(total_gib) / int(k) * 1e6) / 1e6


def limit_gib(total_gib: float, context_gib: float, k: int) -> float:
    """What one of k runs' caching allocator may hold: T/k - c = (T - k c) / k."""
    return share_gib(total_gib, k) - float(context_gib)


def budget_gib(total_gib: float, context_gib: float, margin: float, k: int) -> float:
    """The estimate a micro-batch of one of k runs may reach: (T - k c) / (k (1 + m))."""
    return limit_gib(total_gib, context_gib, k) / (1.0 + float(margin))


def limit_gpu_memory(device: torch.device, env=None) -> float | None:
    """Cap this process's caching allocator at ``$LRA_MEMORY_LIMIT_GIB`` GiB on ``device`` (a CUDA device;
    anything else, or no variable: nothing to do). Returns the fraction of the device set."""
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
