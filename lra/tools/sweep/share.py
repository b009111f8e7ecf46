"""Where each job runs: the visible GPUs, k runs per GPU, and each run's share of a GPU's memory.

The model is tiny (86k parameters): one LRA run uses a fraction of a modern GPU, so a sweep may run
k of them on each GPU. Each of the k processes holds its own CUDA context ``c`` (``cuda_context_gib``)
outside PyTorch's caching allocator, so on a card of ``T`` GiB the k allocators together may hold
``T - k c``, and each run gets ``(T - k c) / k``. lra.fit fits a micro-batch when
``peak x (1 + m) + c <= total`` (:attr:`lra.config.HardwareSpec.budget_bytes`, ``m`` =
``allocator_margin``). Giving the run ``total = T / k`` (and the same ``c`` and ``m``) turns that into
``peak x (1 + m) <= T/k - c = (T - k c) / k``: exactly its share. So the sweep only passes
``hardware.total_gib=T/k`` to the run (lra.fit is unchanged), and the run caps its caching allocator at
the same ``T/k - c`` (:func:`lra.devices.limit_gpu_memory`, told by ``LRA_MEMORY_LIMIT_GIB``), so a run that
outgrows its estimate fails alone with an out-of-memory error instead of taking memory the other k - 1 were promised.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("lra.tools.sweep")


def visible_gpus(env=None) -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES if set (ids or UUIDs), else nvidia-smi's list."""
    vis = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [d.strip() for d in vis.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(1 for line in out.splitlines() if line.startswith("GPU ")))]


def gpu_count() -> int:
    return len(visible_gpus())


# ----------------------------------------------------------------------------- several runs per GPU
class ShareError(ValueError):
    """jobs_per_gpu cannot be honoured (one line: what, and what to do)."""


def gpu_of_slot(slot: int, jobs_per_gpu: int, gpus: list[str]) -> str:
    """Job slot s (0 <= s < parallel) runs on GPU s // k: slots 0..k-1 share the first GPU, and so on."""
    i = slot // jobs_per_gpu
    if i >= len(gpus):
        raise ShareError(
            f"job slot {slot} with jobs_per_gpu={jobs_per_gpu} needs GPU #{i}, but only "
            f"{len(gpus)} are visible ({','.join(gpus) or 'none'})"
        )
    return gpus[i]


def check_sharing(jobs_per_gpu: int, parallel: int, gpus: list[str], kind: str) -> None:
    """What jobs_per_gpu needs, checked before anything runs."""
    k = jobs_per_gpu
    if kind != "local":
        raise ShareError(
            f"jobs_per_gpu={k} shares the GPUs of this machine between the local launcher's parallel "
            f"jobs; the {kind} launcher cannot: add hydra/launcher=local (or drop jobs_per_gpu)"
        )
    if not gpus:
        raise ShareError(
            f"jobs_per_gpu={k}: no GPU visible here (CUDA_VISIBLE_DEVICES empty or nvidia-smi lists "
            "none); set CUDA_VISIBLE_DEVICES=<ids> or drop jobs_per_gpu"
        )
    if parallel > k * len(gpus):
        raise ShareError(
            f"parallel={parallel} with jobs_per_gpu={k} needs parallel <= jobs_per_gpu x GPUs = "
            f"{k} x {len(gpus)} = {k * len(gpus)} (visible: {','.join(gpus)}); lower parallel or "
            "raise jobs_per_gpu"
        )


def device_total_gib(gpu: str, env=None) -> float | None:
    """torch's total_memory of one GPU (for hardware=auto), asked in a short child process so that this
    process holds no CUDA context on a card the runs share. None: no such CUDA device here."""
    code = "import torch; print(torch.cuda.get_device_properties(0).total_memory)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**(os.environ if env is None else env), "CUDA_VISIBLE_DEVICES": gpu},
        )
        return int(out.stdout.strip().splitlines()[-1]) / 2**30 if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def job_share(hw: dict, jobs_per_gpu: int, gpu: str, total_of=device_total_gib) -> dict | None:
    """One of k runs on ``gpu``: ``hardware.total_gib`` = T/k for it (lra.fit's budget becomes
    (T - k c) / (k (1 + m))) and its allocator limit T/k - c (lra/gpu_share.py derives both).
    ``hw``: the job's composed hardware profile. None: hardware=auto and the GPU is not here to ask."""
    k, name = jobs_per_gpu, hw.get("name")
    if str(hw.get("devices", 1)) != "1":
        raise ShareError(
            f"jobs_per_gpu={k} places single-GPU runs; this grid has trainer.devices={hw['devices']}: "
            "drop one of the two"
        )
    total = hw.get("total_gib")
    if total is None:
        if name != "auto":
            raise ShareError(
                f"jobs_per_gpu={k} with hardware={name}: the profile has no GPU memory to share; use "
                "hardware=auto or a GPU profile (conf/hardware/, e.g. hardware=h100_80gb)"
            )
        total = total_of(gpu)
        if total is None:
            return None
    context, margin = float(hw.get("cuda_context_gib") or 0.0), float(hw.get("allocator_margin") or 0.0)
    limit = limit_gib(total, context, k)
    if limit <= 0:
        raise ShareError(
            f"jobs_per_gpu={k} on hardware={name} ({float(total):.2f} GiB, a {context} GiB CUDA context "
            f"per run) leaves {limit:.2f} GiB per run; lower jobs_per_gpu"
        )
    return {
        "gpu": gpu,
        "total_gib": share_gib(total, k),
        "limit_gib": round(limit, 6),
        "budget_gib": budget_gib(total, context, margin, k),
        "profile_total_gib": float(total),
    }


def share_plan(todo: list, jobs_per_gpu: int, parallel: int, gpus: list[str], total_of=device_total_gib) -> list:
    """(GPU, share) of each job to run, as :func:`launch` places them: batches of ``parallel``, the
    i-th job in slot i % parallel."""
    totals: dict[str, float | None] = {}

    def cached(gpu):  # hardware=auto: ask each GPU once
        if gpu not in totals:
            totals[gpu] = total_of(gpu)
        return totals[gpu]

    out = []
    for i, j in enumerate(todo):
        gpu = gpu_of_slot(i % parallel, jobs_per_gpu, gpus)
        out.append((gpu, job_share(j.hw or {}, jobs_per_gpu, gpu, total_of=cached)))
    return out


def hw_of(cfg: DictConfig) -> dict:
    hw = OmegaConf.to_container(cfg.hardware, resolve=True)
    return {
        "name": hw.get("name"),
        "total_gib": hw.get("total_gib"),
        "cuda_context_gib": hw.get("cuda_context_gib"),
        "allocator_margin": hw.get("allocator_margin"),
        "devices": OmegaConf.to_container(cfg.trainer, resolve=True).get("devices", 1),
    }


GIB = 2**30


def share_gib(total_gib: float, k: int) -> float:
    """``hardware.total_gib`` of one of k runs on a card of ``total_gib``: T / k, rounded down to 1 KiB-ish."""
    return math.floor(float(total_gib) / int(k) * 1e6) / 1e6


def limit_gib(total_gib: float, context_gib: float, k: int) -> float:
    """What one of k runs' caching allocator may hold: T/k - c = (T - k c) / k."""
    return share_gib(total_gib, k) - float(context_gib)


def budget_gib(total_gib: float, context_gib: float, margin: float, k: int) -> float:
    """The estimate a micro-batch of one of k runs may reach: (T - k c) / (k (1 + m))."""
    return limit_gib(total_gib, context_gib, k) / (1.0 + float(margin))
