"""Where each job runs: the visible GPUs, k runs per GPU, and each run's share of a GPU's memory.

The model is tiny (86k parameters): one LRA run uses a fraction of a modern GPU, so a sweep may run
k of them on each GPU. lra.fit fits a micro-batch when ``peak x (1 + m) + c <= total``
(:attr:`lra.config.HardwareSpec.budget_bytes`; ``c`` = ``cuda_context_gib``, the CUDA context each process
holds outside PyTorch's caching allocator, ``m`` = ``allocator_margin``). The sweep asks the physical card
its memory ``P`` (:func:`device_total_gib`) and compares it with the profile's ``T`` (``hardware.total_gib``):

* **profile** (``T`` smaller than the card, e.g. the default ``hardware=v100_16gb`` on an 80 GB H100): the
  profile is a *memory profile*, the papers' protocol: every run fits its micro-batch to that GPU whatever
  card it runs on. Each of the k runs keeps ``total = T`` (the fit, micro-batch and accumulation are exactly
  the V100's) and caps its caching allocator at ``T - c`` (15.77 - 0.75 = 15.02 GiB for a V100: what
  tools/gpu_window.sh sets by hand), so it cannot use more than that GPU would give it. The k runs must fit
  the card: ``k x T <= P`` (each run's own context is inside its ``T``), else a one-line :class:`ShareError`
  says how many fit.
* **divided** (the profile is the card: ``T >= P`` or within :data:`SAME_CARD` below it; ``hardware=auto``:
  ``T = P``): the k processes share ``T``: the k allocators together may hold ``T - k c``, each ``(T - k c) / k``.
  Giving the run ``total = T / k`` (same ``c`` and ``m``) turns lra.fit's rule into
  ``peak x (1 + m) <= T/k - c = (T - k c) / k``: exactly its share; its allocator is capped at ``T/k - c``.

Either way the sweep only passes ``hardware.total_gib`` to the run (lra.fit is unchanged) and the allocator
limit in ``LRA_MEMORY_LIMIT_GIB`` (:func:`lra.devices.limit_gpu_memory`), so a run that outgrows its estimate
fails alone with an out-of-memory error instead of taking memory the other k - 1 were promised. A card that
does not report its memory gives ``None`` (cannot tell): a dry run says so, a real run refuses
(:func:`not_reported`).
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


GPU_TOTAL_ENV = "LRA_SWEEP_GPU_TOTAL_GIB"  # the GPUs' total memory in GiB, instead of asking torch.cuda

# A profile within this fraction below the card's memory is that card (boards of one model report slightly
# different totals: the A100 40GB's PCIe and SXM4 39.39 and 39.59 GiB), so its k runs divide it.
SAME_CARD = 0.03


def device_total_gib(gpu: str, env=None) -> float | None:
    """torch's total_memory of one GPU, asked in a short child process so that this process holds no CUDA
    context on a card the runs share; ``$LRA_SWEEP_GPU_TOTAL_GIB`` instead where set (a card torch cannot
    see from here, a test with a fake device list). None: no such CUDA device here."""
    env = os.environ if env is None else env
    if env.get(GPU_TOTAL_ENV):
        try:
            given = float(env[GPU_TOTAL_ENV])
        except ValueError:
            given = float("nan")
        if not given > 0:
            raise ShareError(f"{GPU_TOTAL_ENV}={env[GPU_TOTAL_ENV]!r}: give the GPUs' memory in GiB, a number > 0")
        return given
    code = "import torch; print(torch.cuda.get_device_properties(0).total_memory)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "CUDA_VISIBLE_DEVICES": gpu},
        )
        return int(out.stdout.strip().splitlines()[-1]) / 2**30 if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def not_reported(gpu: str, hw: dict, jobs_per_gpu: int) -> ShareError:
    """The one-line refusal when :func:`job_share` could not tell (the GPU did not report its memory)."""
    name = hw.get("name")
    why = "to divide it" if name == "auto" else f"to tell whether the runs keep the {name} fit or divide the card"
    return ShareError(
        f"jobs_per_gpu={jobs_per_gpu} with hardware={name}: GPU {gpu} did not report its memory to torch.cuda "
        f"(needed {why}); check that torch.cuda sees it, or set {GPU_TOTAL_ENV}=<its total GiB>"
    )


def job_share(hw: dict, jobs_per_gpu: int, gpu: str, total_of=None) -> dict | None:
    """One of k runs on ``gpu`` (the module docstring has both modes): ``total_gib`` (its
    ``hardware.total_gib``), ``limit_gib`` (its allocator limit), ``budget_gib`` (what lra.fit will let a
    micro-batch reach), ``mode`` (``"profile"``: the profile kept, ``"divided"``: T/k), ``card_gib`` (the
    card's memory) and ``profile_total_gib``. ``hw``: the job's composed hardware profile; ``total_of(gpu)``:
    the card's memory in GiB (default :func:`device_total_gib`). None: the GPU did not report its memory
    (cannot tell; :func:`not_reported` says so)."""
    k, name = jobs_per_gpu, hw.get("name")
    if str(hw.get("devices", 1)) != "1":
        raise ShareError(
            f"jobs_per_gpu={k} places single-GPU runs; this grid has trainer.devices={hw['devices']}: "
            "drop one of the two"
        )
    profile = hw.get("total_gib")
    if profile is None and name != "auto":
        raise ShareError(
            f"jobs_per_gpu={k} with hardware={name}: the profile has no GPU memory to share; use "
            "hardware=auto or a GPU profile (conf/hardware/, e.g. hardware=h100_80gb)"
        )
    card = (device_total_gib if total_of is None else total_of)(gpu)
    if card is None:
        return None
    card = float(card)
    context, margin = float(hw.get("cuda_context_gib") or 0.0), float(hw.get("allocator_margin") or 0.0)
    if profile is not None and float(profile) < card * (1 - SAME_CARD):
        T = float(profile)
        most = math.floor(card / T + 1e-9)
        if k > most:
            raise ShareError(
                f"jobs_per_gpu={k} runs of the {name} fit need {k} x {T:g} = {k * T:.2f} GiB; GPU {gpu} has "
                f"{card:.2f} GiB: at most {most} fit; lower jobs_per_gpu"
            )
        mode, total, limit = "profile", T, T - context
    else:
        T = card if profile is None else float(profile)
        mode, total, limit = "divided", share_gib(T, k), limit_gib(T, context, k)
    if limit <= 0:
        raise ShareError(
            f"jobs_per_gpu={k} on hardware={name} ({T:.2f} GiB, a {context} GiB CUDA context "
            f"per run) leaves {limit:.2f} GiB per run; lower jobs_per_gpu"
        )
    return {
        "gpu": gpu,
        "hardware": name,
        "mode": mode,
        "total_gib": total,
        "limit_gib": round(limit, 6),
        "budget_gib": limit / (1.0 + margin),
        "card_gib": card,
        "profile_total_gib": T,
    }


def describe(share: dict, jobs_per_gpu: int) -> str:
    """The share's mode in words, for the log and a dry run."""
    if share["mode"] == "profile":
        return (
            f"each run keeps the {share['hardware']} fit: {share['total_gib']:g} of the card's "
            f"{share['card_gib']:.2f} GiB"
        )
    return f"the {share['profile_total_gib']:g} GiB of hardware={share['hardware']} divided by {jobs_per_gpu}"


def share_plan(todo: list, jobs_per_gpu: int, parallel: int, gpus: list[str], total_of=None) -> list:
    """(GPU, share) of each job to run, as :func:`launch` places them: batches of ``parallel``, the
    i-th job in slot i % parallel. A share is None where its GPU did not report its memory (cannot tell:
    a dry run shows it, a real run refuses). ``total_of``: as :func:`job_share`'s."""
    total_of = device_total_gib if total_of is None else total_of
    totals: dict[str, float | None] = {}

    def cached(gpu):  # ask each GPU once
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


def share_gib(total_gib: float, k: int) -> float:
    """``hardware.total_gib`` of one of k runs on a card of ``total_gib``: T / k, rounded down to 1 KiB-ish."""
    return math.floor(float(total_gib) / int(k) * 1e6) / 1e6


def limit_gib(total_gib: float, context_gib: float, k: int) -> float:
    """What one of k runs' caching allocator may hold: T/k - c = (T - k c) / k."""
    return share_gib(total_gib, k) - float(context_gib)


def budget_gib(total_gib: float, context_gib: float, margin: float, k: int) -> float:
    """The estimate a micro-batch of one of k runs may reach: (T - k c) / (k (1 + m))."""
    return limit_gib(total_gib, context_gib, k) / (1.0 + float(margin))


# ----------------------------------------------------------------------------- jobs_per_gpu=auto
PAYS = 1.05  # a larger k must give at least 5 % more aggregate steps/s than the best smaller one


def auto_jobs_per_gpu(measured: list[dict], device: str, hw: dict, gpu: str, total_of=None) -> tuple[int, str]:
    """(k, why) for ``jobs_per_gpu=auto``: the k whose runs share-bench measured fastest together on this device
    (its ``share_bench.json`` rows, each k's aggregate steps/s), a larger k only where it pays (:data:`PAYS`),
    and no more than the card holds for these jobs' profile (:func:`job_share`). A ShareError when nothing
    was measured on this device: k is measured here, never assumed."""
    rows = sorted(
        (
            r
            for r in measured
            if r.get("device") == device and r.get("steps_per_s") and r.get("completed") == r.get("k")
        ),
        key=lambda r: r["k"],
    )
    if not rows:
        raise ShareError(
            f"jobs_per_gpu=auto: no share-bench measurement on {device} under this runs root; run "
            "`make share-bench` here first (a few minutes), or give jobs_per_gpu=<k>"
        )
    best = rows[0]
    for r in rows[1:]:
        if r["steps_per_s"] >= PAYS * best["steps_per_s"]:
            best = r
    k = int(best["k"])
    while k > 1:
        try:
            job_share(hw, k, gpu, total_of=total_of)
            break
        except ShareError:
            k -= 1
    figures = ", ".join(f"k={r['k']}: {r['steps_per_s']:.2f}" for r in rows)
    held = "" if k == best["k"] else f"; the card holds {k} of these jobs"
    return k, f"jobs_per_gpu=auto: {k} (share-bench on {device}, aggregate steps/s {figures}{held})"
