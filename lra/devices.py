"""What the harness asks of the device it runs on: its name, its cores, a synchronisation point, whether
an error was an out-of-memory one, and the cap on a shared GPU's memory a run keeps to.

The bottom layer of the harness: imports torch, the standard library and :mod:`lra.checks` only, so the
benchmark, the measuring package (:mod:`lra.tools.meter`), the doctor, the run and the sweeps all take these from here.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path

import torch

from lra.checks import ConfigError

log = logging.getLogger("lra.train")  # the run's messages, under one name
GIB = 1024**3


def device_count(d) -> int:
    """Devices the effective batch is split over (``trainer.devices``: int, list or "auto")."""
    if isinstance(d, str):
        if d.isdigit():
            return max(1, int(d))
        if d == "auto":
            return max(1, torch.cuda.device_count())
        return max(1, len([x for x in d.split(",") if x.strip()]))
    if isinstance(d, int):
        return max(1, d) if d != -1 else max(1, torch.cuda.device_count())
    return max(1, len(list(d)))


def loader_workers(setting, on_cuda: bool):
    if setting != "auto":
        return setting  # checked by HardwareSpec
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, cores - 1)) if on_cuda else 0  # the loader is ~10^4x faster than a step: a few suffice


def trains_on_cuda(accelerator: str) -> bool:
    """Does ``trainer.accelerator`` train on a CUDA device here?"""
    return accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())


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


def check_devices(accelerator: str, devices, cuda_count: int | None = None, mps: bool | None = None) -> None:
    """``trainer.accelerator`` and ``trainer.devices`` this machine can run, before any work: a ConfigError
    (one line) where Lightning would stop with a traceback once the data is loaded and the batch fitted.
    ``devices``: a count >= 1, -1 or ``auto`` (all), a list of indices, or such a string. ``cuda_count``,
    ``mps``: what this machine has (None: asked of torch)."""
    need = _gpus_needed(devices)
    if need == 0:
        raise ConfigError(
            f"trainer.devices={devices!r} is not allowed: a count >= 1, -1 or auto (all the accelerator's devices), "
            "or a list of device indices such as [0,1]"
        )
    n = torch.cuda.device_count() if cuda_count is None else cuda_count
    if accelerator in ("cuda", "gpu") or (accelerator == "auto" and n > 0):
        if n == 0:
            raise ConfigError(
                f"trainer.accelerator={accelerator} but this machine has no CUDA GPU that torch can use: "
                "use trainer.accelerator=auto (the GPU where there is one, else the CPU) or cpu"
            )
        if need > n:
            raise ConfigError(
                f"trainer.devices={devices!r} asks for more GPUs than this machine shows ({n}): "
                f"give at most {n} (or -1 for all)"
            )
    if accelerator == "mps" and not (torch.backends.mps.is_available() if mps is None else mps):
        raise ConfigError(
            "trainer.accelerator=mps but this machine has no MPS device: use trainer.accelerator=auto or cpu"
        )


def _gpus_needed(devices) -> int:
    """How many devices ``devices`` needs there to be: a count n: n; -1 or ``auto`` (all): 1; a list of
    indices (or ``"0,2"``): the highest index + 1; 0 where it names none that can run."""
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "-1"):
            return 1
        if text.isdigit():
            return int(text)
        parts = [p.strip() for p in text.split(",")]
        devices = [int(p) for p in parts if p] if all(p.isdigit() for p in parts if p) and "," in text else None
    if isinstance(devices, int) and not isinstance(devices, bool):
        return 1 if devices == -1 else max(devices, 0)
    if isinstance(devices, (list, tuple)) and devices and len(set(devices)) == len(devices):
        if all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            return max(devices) + 1
    return 0


MEMORY_LIMIT_ENV = (
    "LRA_MEMORY_LIMIT_GIB"  # this run's share of a GPU it shares (lra.tools.sweep jobs_per_gpu=k sets it)
)


def memory_share(device: torch.device, env=None) -> float | None:
    """The fraction of ``device``'s memory ``$LRA_MEMORY_LIMIT_GIB`` gives this run (None: not a CUDA device,
    or no variable: the run does not share it by the sweep's plan); a value that is not a number > 0 is a
    ConfigError."""
    raw = (os.environ if env is None else env).get(MEMORY_LIMIT_ENV)
    if not raw or torch.device(device).type != "cuda":
        return None
    try:
        limit = float(raw)
    except ValueError:
        limit = float("nan")
    if not limit > 0:
        raise ConfigError(
            f"{MEMORY_LIMIT_ENV}={raw!r}: give this run's GPU memory in GiB, a number > 0 "
            f"(lra.tools.sweep jobs_per_gpu=k sets it), or unset it"
        )
    return min(1.0, limit * GIB / torch.cuda.get_device_properties(device).total_memory)


def limit_gpu_memory(device: torch.device, env=None) -> float | None:
    """Cap this process's caching allocator at ``$LRA_MEMORY_LIMIT_GIB`` GiB on ``device`` (a CUDA device;
    anything else, or no variable: nothing to do), so a run that shares a GPU and outgrows its estimate
    fails alone with an out-of-memory error instead of taking memory promised to the others (lra.tools.sweep
    ``jobs_per_gpu=k`` sets the variable: docs/sweeps.md). Returns the fraction of the device set."""
    fraction = memory_share(device, env)
    if fraction is None:
        return None
    limit = float((os.environ if env is None else env)[MEMORY_LIMIT_ENV])
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    log.info(
        "GPU shared with other runs: this run's caching allocator is capped at %.2f GiB (%.4f of %s)",
        limit,
        fraction,
        device,
    )
    return fraction


# ---------------------------------------------------------------------------------------------
# How shared the machine was while a run trained: the record's ``machine``

JOBS_PER_GPU_ENV = "LRA_SWEEP_JOBS_PER_GPU"  # lra.tools.sweep jobs_per_gpu=k: k runs on each GPU
PARALLEL_ENV = "LRA_SWEEP_PARALLEL"  # lra.tools.sweep parallel=n: n runs at once on this machine
LOADED_CPU = 0.5  # others' share of the machine's CPU above which a timing counts as taken under load
LOADED_GPU_GIB = 2.0  # GPU memory held outside this run's allocator above which another process shares the GPU


def machine_loaded(m: dict | None) -> bool | None:
    """Whether a run's timing was taken under load, from its record's ``machine`` (None: no ``machine``). True
    when any of these holds:

    * ``cpu_others > LOADED_CPU`` (0.5): other processes used more than half the machine's CPU time while
      the run trained (measured: /proc/stat less this process's own CPU time). Where that is null (no
      /proc/stat), ``loadavg_start / cpus > LOADED_CPU`` instead;
    * ``gpu_share < 1``: the run was one of several on its GPU (lra.tools.sweep ``jobs_per_gpu``: also ``gpu_jobs``);
    * ``gpu_others_gib_start`` or ``gpu_others_gib_end > LOADED_GPU_GIB`` (2 GiB): GPU memory held outside this
      run's allocator, i.e. another process on the GPU (this run's own CUDA context, under 1 GiB, counts too).
    * ``devices`` names more than one device: its stretches' times sum two cards'.

    Speed ratios should come only from runs for which this is False (and the same ``device``)."""
    if not m:
        return None
    cpus = m.get("cpus") or 1
    if m.get("cpu_others") is not None:
        cpu = m["cpu_others"] > LOADED_CPU
    else:
        cpu = m.get("loadavg_start") is not None and m["loadavg_start"] / cpus > LOADED_CPU
    gpu_others = max((m.get(k) or 0.0) for k in ("gpu_others_gib_start", "gpu_others_gib_end"))
    cards = len(m.get("devices") or ()) > 1
    return bool(cpu or (m.get("gpu_share") or 1.0) < 1.0 or gpu_others > LOADED_GPU_GIB or cards)


def loadavg() -> float | None:
    """The machine's one-minute load average, rounded (None where the platform has none): the one reading."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(monotonic time, CPU seconds every core was busy since boot (/proc/stat: all but idle and iowait; steal
    counts: a hypervisor serving others), this process's CPU seconds with its waited-for children)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return time.monotonic(), (sum(v) - v[3] - v[4]) / tick, own


def _gpu_others_gib(device: torch.device) -> float | None:
    """GiB of ``device``'s memory in use outside this process's caching allocator (others, and this process's
    CUDA context)."""
    if device.type != "cuda":
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
        return round(max(0, total - free - torch.cuda.memory_reserved(device)) / GIB, 3)
    except Exception:  # a query that fails says nothing, it must not stop the run
        return None


def _env_int(env, name: str) -> int | None:
    try:
        return int(env[name]) if env.get(name) else None
    except ValueError:
        return None


class LoadMeter:
    """The record's ``machine``: how shared the machine was while the run trained. Made just before training
    (``fields``: what is known then), ``end()`` after it. Fields:

    * ``loadavg_start`` / ``loadavg_end``: the 1-minute load average then. The start may still count this
      process's data preparation; the end counts this run's own busy threads (about ``threads`` +
      ``loader_workers`` on a CPU, 1 + ``loader_workers`` on a GPU);
    * ``cpus``: ``os.cpu_count()``, the cores the load average spreads over; ``threads``: torch's CPU threads;
      ``loader_workers``: the data loader's processes;
    * ``cpu_others``: the share (0..1) of the machine's CPU time that other processes used while the run
      trained (null without /proc/stat; a multi-device run's other ranks count as others); ``window_s``: the
      wall time it covers (from just before training to its end);
    * ``gpu_share``: this run's fraction of its GPU's memory (1.0: not shared by a sweep's plan; null on a
      CPU); ``gpu_jobs``: runs per GPU (lra.tools.sweep jobs_per_gpu; 1 on an unshared GPU; null when unknown or
      on a CPU); ``sweep_parallel``: runs a sweep ran at once (null: not from a sweep);
    * ``gpu_others_gib_start`` / ``gpu_others_gib_end``: GPU memory in use outside this run's allocator;
    * ``stretches``: the processes the training took: a resumed run folds its earlier stretches in (the
      highest load and memory, the lowest share, ``cpu_others`` weighted by time), as its timing sums them;
    * ``devices``: the device names its stretches trained on (a run carried from one GPU window to another can
      sum times from two cards: then its timing is no card's);
    * ``loaded``: :func:`machine_loaded` of these fields, the rule to use."""

    def __init__(self, device: str | torch.device, loader_workers: int = 0, earlier: dict | None = None, env=None):
        env = os.environ if env is None else env
        self.device, self.earlier, self.t0 = torch.device(device), earlier, _cpu_seconds()
        share = memory_share(self.device, env)
        cuda = self.device.type == "cuda"
        self.start = {
            "loadavg_start": loadavg(),
            "loadavg_end": None,
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "loader_workers": loader_workers,
            "cpu_others": None,
            "window_s": None,
            "gpu_share": (1.0 if share is None else round(share, 4)) if cuda else None,
            "gpu_jobs": (_env_int(env, JOBS_PER_GPU_ENV) or (1 if share is None else None)) if cuda else None,
            "sweep_parallel": _env_int(env, PARALLEL_ENV),
            "gpu_others_gib_start": _gpu_others_gib(self.device),
            "gpu_others_gib_end": None,
            "stretches": 1,
            "devices": [device_name(self.device)],
        }

    @property
    def fields(self) -> dict:
        return self._with_earlier(self.start)

    def end(self) -> dict:
        """The fields at the end of training (any end: finished, failed, interrupted)."""
        m = {**self.start, "loadavg_end": loadavg(), "gpu_others_gib_end": _gpu_others_gib(self.device)}
        t1 = _cpu_seconds()
        if self.t0 is not None and t1 is not None and t1[0] > self.t0[0]:
            wall, others = t1[0] - self.t0[0], (t1[1] - self.t0[1]) - (t1[2] - self.t0[2])
            share = min(1.0, max(0.0, others / (wall * (m["cpus"] or 1))))
            m.update(window_s=round(wall, 3), cpu_others=round(share, 4))
        return self._with_earlier(m)

    def _with_earlier(self, m: dict) -> dict:
        e = self.earlier
        if e:

            def pick(key, f=max):
                vals = [x for x in (e.get(key), m.get(key)) if x is not None]
                return f(vals) if vals else None

            timed = [
                (x["window_s"], x["cpu_others"])
                for x in (e, m)
                if x.get("window_s") and x.get("cpu_others") is not None
            ]
            total = sum(t for t, _ in timed)
            m = {
                **m,
                "loadavg_start": pick("loadavg_start"),
                "gpu_share": pick("gpu_share", min),
                "gpu_jobs": pick("gpu_jobs"),
                "gpu_others_gib_start": pick("gpu_others_gib_start"),
                "gpu_others_gib_end": pick("gpu_others_gib_end"),
                "stretches": int(e.get("stretches") or 1) + 1,
                "devices": sorted({*(e.get("devices") or ()), *m["devices"]}),
                "window_s": round(total, 3) if timed else None,
                "cpu_others": round(sum(t * c for t, c in timed) / total, 4) if timed else None,
            }
        return {**m, "loaded": machine_loaded(m)}
