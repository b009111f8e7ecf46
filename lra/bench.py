"""Attention micro-benchmark: forward+backward time, peak memory and FLOPs of every backend vs n.

``python -m lra.bench [--quick] [--out DIR] [--lengths ...] [--backends ...] [--device cpu|cuda]``
(``make bench ARGS='...'``). See docs/bench.md for how to read the output.

One process measures every registered attention backend (``attention.available()``) plus the
softmax baseline in both implementations, ``softmax`` (fused SDPA, the reference every ratio is
taken against) and ``softmax_materialized`` (the papers' n×n score matrix), at each sequence length.
The shapes are those of one LRA attention layer: ``(batch, heads=2, n, head_dim=32)``, fp32, an
all-real bool padding mask, module in training mode with any ``dropout`` option set to 0.

Per (backend, n) point:
  1. two *instrumented* fwd+bwd passes (they are also warm-ups): one under :class:`LiveTensorBytes`
     (peak of live tensor storages, exact at the op level), one under ``FlopCounterMode`` with
     formulas for the CPU fused SDPA kernels that torch does not price (:data:`EXTRA_FLOP_FORMULAS`);
  2. on CUDA a plain pass after ``reset_peak_memory_stats`` for ``max_memory_allocated``;
  3. ``warmup`` untimed passes, then ``repeats`` timed ones (median reported; synchronised on CUDA;
     fewer repeats, at least 3, when one call is slow).
A backend stops after the first n whose fastest call exceeds ``--time-budget-s`` or whose peak
exceeds the memory budget, and a point predicted (log-log extrapolation) to exceed the memory
budget or 4× the time budget is not run; the CSV records why. Outputs (atomic writes) in
``--out``: ``bench.csv``, ``bench.md``, ``bench.png``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import math
import os
import platform
import statistics
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from lra.files import git_commit, write_atomic, write_csv

import attention
from lra import REPO_ROOT
from lra.cli import Parser

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (256, 512)
BASELINE = "softmax"  # fused SDPA; every ratio is relative to this row
MATERIALIZED = "softmax_materialized"
GIB = 1024**3
MIB = 1024**2

CSV_COLUMNS = (
    "backend", "base", "options", "n", "batch", "heads", "head_dim", "dtype", "device", "device_name",
    "torch_version", "threads", "mask", "status", "reason", "time_ms", "time_ms_min", "time_ms_max",
    "repeats", "peak_mem_bytes", "tensor_peak_bytes", "mem_method", "flops", "gflops_per_s",
    "sdpa_ops", "complexity", "exact",
)


# ----------------------------------------------------------------------------- rows to measure
@dataclass(frozen=True)
class Row:
    """One line of the benchmark: a label, the registry name it builds and the options it passes."""

    label: str
    base: str
    options: dict = field(default_factory=dict, hash=False, compare=False)


def all_rows() -> list[Row]:
    """The baseline pair first, then every other registered backend (sorted)."""
    rows = [Row(BASELINE, "softmax", {"impl": "fused"}), Row(MATERIALIZED, "softmax", {"impl": "materialized"})]
    taken = {r.label for r in rows}
    rows += [Row(name, name) for name in attention.available() if name not in taken]
    return rows


def select_rows(names: list[str] | None) -> list[Row]:
    """Rows for ``names`` (all when None); the fused baseline is always included (ratios need it).

    Unknown names raise ``ValueError`` listing the valid ones.
    """
    rows = all_rows()
    if not names:
        return rows
    by_label = {r.label: r for r in rows}
    unknown = [n for n in names if n not in by_label]
    if unknown:
        raise ValueError(f"unknown attention backend(s) {unknown}; available: {', '.join(by_label)}")
    wanted = [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]
    return [by_label[n] for n in wanted]


def effective_options(row: Row, cfg: "Config") -> dict:
    """The row's options, ``dropout=0`` where the backend has that option, then ``--set`` overrides."""
    opts = dict(row.options)
    if "dropout" in attention.option_defaults(row.base):
        opts.setdefault("dropout", 0.0)  # fused CPU SDPA has no dropout; we time the attention itself
    opts.update(cfg.overrides.get(row.label, {}))
    return opts


def build_module(row: Row, cfg: "Config", n: int) -> torch.nn.Module:
    opts = effective_options(row, cfg)
    m = attention.build(row.base, num_heads=cfg.heads, head_dim=cfg.head_dim, max_len=n, **opts)
    return m.to(device=cfg.device, dtype=cfg.dtype).train()


# ----------------------------------------------------------------------------- memory: live tensor bytes
class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of tensor storages alive at once, counted at the aten-op level.

    Every tensor an op returns is attributed to its storage (views share one); the storage's bytes
    are added when it is first seen and removed by a weakref callback when torch frees it. Storages
    of ``known`` tensors (inputs, parameters) exist before the measurement: they are not counted
    here (the caller adds their bytes) but views of them are recognised. Scratch memory a kernel
    allocates and frees inside one op (e.g. the blocks of the fused CPU SDPA kernel, BLAS buffers)
    is invisible at this level. Works for any device; used as *the* peak on CPU, where allocator
    statistics do not exist and RSS is too noisy.
    """

    def __init__(self, known=()):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._bytes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self._known: set[int] = set()
        for t in known:
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage()._cdata
                self._known.add(key)
                self._refs[key] = weakref.ref(t.untyped_storage(), self._forget(key))

    def _forget(self, key: int) -> Callable:
        def cb(_ref):
            self._known.discard(key)
            self._refs.pop(key, None)
            self.current -= self._bytes.pop(key, 0)
        return cb

    def _track(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            return
        key = st._cdata
        if key in self._known:
            return
        nbytes = st.nbytes()
        old = self._bytes.get(key)
        if old is None:
            self._refs[key] = weakref.ref(st, self._forget(key))
            self._bytes[key] = nbytes
            self.current += nbytes
        elif old != nbytes:  # resized in place
            self._bytes[key] = nbytes
            self.current += nbytes - old
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st._cdata] = st.nbytes()
    return sum(seen.values())


# ----------------------------------------------------------------------------- FLOPs
def _sdpa_fwd_flops(b: int, h: int, nq: int, nk: int, dqk: int, dv: int) -> int:
    # S = Q Kᵀ (2·nq·nk·dqk) and O = P V (2·nq·nk·dv); softmax and scaling are not matmuls.
    return b * h * (2 * nq * nk * dqk + 2 * nq * nk * dv)


def _sdpa_bwd_flops(b: int, h: int, nq: int, nk: int, dqk: int, dv: int) -> int:
    # Recompute S (qk), dV = Pᵀ dO (v), dP = dO Vᵀ (v), dQ = dS K (qk), dK = dSᵀ Q (qk): 2.5× fwd at dqk = dv.
    return b * h * (2 * nq * nk * dqk * 3 + 2 * nq * nk * dv * 2)


def cpu_sdpa_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``aten._scaled_dot_product_flash_attention_for_cpu`` (shapes (b, h, n, d)).

    4·n²·d per head per sample at d_qk = d_v, the FlashAttention convention; causal is not
    discounted (as in torch's own SDPA formulas).
    """
    b, h, nq, dqk = query
    nk, dv = key[-2], value[-1]
    return _sdpa_fwd_flops(b, h, nq, nk, dqk, dv)


def cpu_sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``aten._scaled_dot_product_flash_attention_for_cpu_backward`` (2.5× forward)."""
    b, h, nq, dqk = query
    nk, dv = key[-2], value[-1]
    return _sdpa_bwd_flops(b, h, nq, nk, dqk, dv)


aten = torch.ops.aten
EXTRA_FLOP_FORMULAS: dict = {}
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
    EXTRA_FLOP_FORMULAS[aten._scaled_dot_product_flash_attention_for_cpu] = cpu_sdpa_flops
    EXTRA_FLOP_FORMULAS[aten._scaled_dot_product_flash_attention_for_cpu_backward] = cpu_sdpa_backward_flops


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` that also prices the CPU fused SDPA kernels (torch counts them as 0)."""
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)


class OpNames(TorchDispatchMode):
    """Records which SDPA kernels ran (SDPA falls back silently between kernels)."""

    def __init__(self):
        super().__init__()
        self.sdpa: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if "scaled_dot_product" in name or "attention_forward" in name or "attention_backward" in name:
            self.sdpa.add(name)
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- configuration
@dataclass
class Config:
    lengths: tuple = DEFAULT_LENGTHS
    batch: int = 2
    heads: int = 2
    head_dim: int = 32
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    repeats: int = 10
    min_repeats: int = 3
    warmup: int = 1
    time_budget_s: float = 2.0  # per point: median fwd+bwd above this ends the backend's sweep
    baseline_budget_factor: float = 4.0  # the fused baseline may take this much longer (ratios need it)
    mem_budget_bytes: int = 8 * GIB
    threads: int = 1
    seed: int = 0
    mask: bool = True  # pass an all-real bool mask (the LRA model always passes one)
    overrides: dict = field(default_factory=dict)  # label -> {option: value}

    def budget_s(self, row: Row) -> float:
        return self.time_budget_s * (self.baseline_budget_factor if row.label == BASELINE else 1.0)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _is_oom(err: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(err, oom):
        return True
    msg = str(err).lower()
    return "out of memory" in msg or "can't allocate memory" in msg


def make_inputs(cfg: Config, n: int):
    g = torch.Generator().manual_seed(cfg.seed * 100003 + n)
    shape = (cfg.batch, cfg.heads, n, cfg.head_dim)
    q, k, v, dout = (torch.randn(shape, generator=g, dtype=cfg.dtype).to(cfg.device) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = torch.ones(cfg.batch, n, dtype=torch.bool, device=cfg.device) if cfg.mask else None
    return q, k, v, mask, dout


def fwd_bwd(module, q, k, v, mask, dout) -> None:
    """One training-style call: forward, then backward of a fixed upstream gradient."""
    out = module(q, k, v, mask)
    if out.requires_grad:
        out.backward(dout)


def _clear_grads(module, *tensors) -> None:
    for t in tensors:
        t.grad = None
    module.zero_grad(set_to_none=True)


def measure_point(row: Row, n: int, cfg: Config, budget_s: float | None = None) -> dict:
    """Time, peak memory and FLOPs of one fwd+bwd of ``row`` at length ``n`` (see module doc)."""
    torch.manual_seed(cfg.seed + n)
    module = build_module(row, cfg, n)
    q, k, v, mask, dout = make_inputs(cfg, n)
    state = list(module.parameters()) + list(module.buffers())
    known = [q, k, v, mask, dout, *state]
    base_bytes = storage_bytes(known)
    cuda = cfg.device.startswith("cuda")

    # 1. memory pass (also the first warm-up): exact peak of live tensor storages. Alone, because
    #    FlopCounterMode keeps references that change autograd's buffer reuse (+1 (b,h,n,d) tensor).
    live = LiveTensorBytes(known)
    with live:
        fwd_bwd(module, q, k, v, mask, dout)
    _sync(cfg.device)
    _clear_grads(module, q, k, v)
    tensor_peak = base_bytes + live.peak
    del live  # drop the weakref callbacks

    # 2. FLOP pass (second warm-up): matmul FLOPs, and which SDPA kernel actually ran
    ops, flops = OpNames(), flop_counter()
    t0 = time.perf_counter()
    with ops, flops:
        fwd_bwd(module, q, k, v, mask, dout)
    _sync(cfg.device)
    t_first = time.perf_counter() - t0
    _clear_grads(module, q, k, v)

    # 3. allocator peak on CUDA, measured after the warm-up so workspaces/autotune are not counted
    if cuda:
        _sync(cfg.device)
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd(module, q, k, v, mask, dout)
        _sync(cfg.device)
        peak, mem_method = torch.cuda.max_memory_allocated(), "cuda.max_memory_allocated"
        _clear_grads(module, q, k, v)
    else:
        peak, mem_method = tensor_peak, "live tensor storages (dispatch)"

    # 4. timing: warm-up, then repeats (fewer when one call is slow, at least min_repeats)
    budget = budget_s if budget_s is not None else cfg.time_budget_s
    t_warm = t_first
    slow = t_first > 3 * budget  # a runaway point: time it once, the sweep stops after it anyway
    # the two instrumented passes already warmed up; long calls need no further warm-up
    for _ in range(0 if t_first > 0.5 else cfg.warmup):
        _sync(cfg.device)
        t0 = time.perf_counter()
        fwd_bwd(module, q, k, v, mask, dout)
        _sync(cfg.device)
        t_warm = time.perf_counter() - t0
        _clear_grads(module, q, k, v)
    reps = 1 if slow else max(cfg.min_repeats, min(cfg.repeats, int(1.5 * budget / max(t_warm, 1e-9))))
    times = []
    for _ in range(reps):
        _sync(cfg.device)
        t0 = time.perf_counter()
        fwd_bwd(module, q, k, v, mask, dout)
        _sync(cfg.device)
        times.append(time.perf_counter() - t0)
        _clear_grads(module, q, k, v)
    med = statistics.median(times)
    total_flops = int(flops.get_total_flops())
    return {
        "time_ms": med * 1e3, "time_ms_min": min(times) * 1e3, "time_ms_max": max(times) * 1e3,
        "repeats": reps, "peak_mem_bytes": int(peak), "tensor_peak_bytes": int(tensor_peak),
        "mem_method": mem_method, "flops": total_flops,
        "gflops_per_s": total_flops / med / 1e9 if med > 0 else float("nan"),
        "sdpa_ops": " ".join(sorted(ops.sdpa)),
    }


# ----------------------------------------------------------------------------- the sweep
def _slope(x0, y0, x1, y1) -> float:
    return math.log(y1 / y0) / math.log(x1 / x0) if min(x0, y0, x1, y1) > 0 and x1 != x0 else float("nan")


def _predict(history: list[tuple[int, float]], n: int, quadratic: bool, max_slope: float = math.inf) -> float | None:
    """Extrapolate y(n) log-log from the last two measured points (one point: n or n² by class).

    The slope is at least 1 (nothing here is sublinear for long) and at most ``max_slope`` (timings
    on a loaded machine jump; memory is deterministic and is not capped).
    """
    if not history:
        return None
    n1, y1 = history[-1]
    if len(history) >= 2:
        n0, y0 = history[-2]
        s = _slope(n0, y0, n1, y1)
        s = min(max_slope, max(1.0, s if math.isfinite(s) else 1.0))
    else:
        s = 2.0 if quadratic else 1.0
    return y1 * (n / n1) ** s


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
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


def run(cfg: Config, rows: list[Row], log: Callable[[str], None] = print,
        on_point: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Measure every row at every length; returns one record per (row, n) in CSV_COLUMNS order."""
    common = {
        "batch": cfg.batch, "heads": cfg.heads, "head_dim": cfg.head_dim,
        "dtype": str(cfg.dtype).replace("torch.", ""), "device": cfg.device,
        "device_name": device_name(cfg.device), "torch_version": torch.__version__,
        "threads": torch.get_num_threads(), "mask": "all-real bool" if cfg.mask else "none",
    }
    results: list[dict] = []
    total = len(rows) * len(cfg.lengths)
    for r_i, row in enumerate(rows, 1):
        caps = attention.capabilities(row.base)
        quadratic = "n^2" in caps.complexity.replace("²", "^2") and row.label != BASELINE
        opts = effective_options(row, cfg)
        budget = cfg.budget_s(row)
        stop: str | None = None
        t_hist: list[tuple[int, float]] = []
        m_hist: list[tuple[int, float]] = []
        for n in cfg.lengths:
            rec = {c: "" for c in CSV_COLUMNS}
            rec.update(common, backend=row.label, base=row.base, n=n, complexity=caps.complexity,
                       exact=caps.exact, options=" ".join(f"{k}={v}" for k, v in sorted(opts.items())))
            tag = f"[{len(results) + 1}/{total}] {row.label} n={n}"
            reason = stop
            if reason is None and caps.block_multiple and n % caps.block_multiple:
                reason = f"n={n} is not a multiple of block_multiple={caps.block_multiple}"
            if reason is None:
                pm = _predict(m_hist, n, quadratic)
                pt = _predict(t_hist, n, quadratic, max_slope=2.0)
                if pm is not None and pm > cfg.mem_budget_bytes:
                    reason = stop = (f"predicted peak {pm / GIB:.1f} GiB at n={n} exceeds the memory budget "
                                     f"{cfg.mem_budget_bytes / GIB:.1f} GiB")
                elif pt is not None and pt > 4 * budget:
                    reason = stop = f"predicted {pt:.1f} s per call at n={n} exceeds 4x the {budget:g} s time budget"
            if reason is not None:
                rec.update(status="skipped", reason=reason)
                log(f"{tag}: skipped ({reason})")
            else:
                try:
                    rec.update(measure_point(row, n, cfg, budget), status="ok")
                except Exception as err:  # noqa: BLE001 - a broken backend must not end the sweep
                    msg = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                    if _is_oom(err):
                        rec.update(status="oom", reason=msg)
                        stop = f"out of memory at n={n}"
                        if cfg.device.startswith("cuda"):
                            torch.cuda.empty_cache()
                    else:
                        rec.update(status="error", reason=msg)
                    log(f"{tag}: {rec['status']} ({msg})")
                else:
                    # budget decisions use the fastest call: a load spike must not end a sweep
                    t_s, mem = rec["time_ms_min"] / 1e3, rec["peak_mem_bytes"]
                    t_hist.append((n, t_s))
                    m_hist.append((n, float(mem)))
                    log(f"{tag}: {rec['time_ms']:.2f} ms (median of {rec['repeats']}), "
                        f"peak {mem / MIB:.1f} MiB, {rec['flops'] / 1e9:.3f} GFLOP"
                        + (f" [{rec['sdpa_ops']}]" if rec["sdpa_ops"] else ""))
                    if t_s > budget:
                        stop = f"fastest call {t_s:.2f} s at n={n} exceeded the {budget:g} s per-point budget"
                    elif mem > cfg.mem_budget_bytes:
                        stop = (f"peak {mem / GIB:.1f} GiB at n={n} exceeded the memory budget "
                                f"{cfg.mem_budget_bytes / GIB:.1f} GiB")
            results.append(rec)
            if on_point is not None:
                on_point(results)
    return results


# ----------------------------------------------------------------------------- analysis
def _ok(results: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in results:
        out.setdefault(r["backend"], {})
        if r["status"] == "ok":
            out[r["backend"]][int(r["n"])] = r
    return out


def ratios(results: list[dict], key: str) -> dict[str, dict[int, float]]:
    """``key`` of each backend divided by the fused softmax's at the same n (both measured)."""
    ok = _ok(results)
    base = ok.get(BASELINE, {})
    return {b: {n: float(r[key]) / float(base[n][key]) for n, r in pts.items()
                if n in base and float(base[n][key]) > 0} for b, pts in ok.items()}


def crossover(ratio_by_n: dict[int, float]) -> tuple[str, float | None]:
    """Where a backend becomes (and stays) faster than fused softmax over the measured lengths.

    Returns (text, interpolated n or None). The first grid length from which the time ratio stays
    below 1, and a log-log interpolation between it and the previous length.
    """
    ns = sorted(ratio_by_n)
    if not ns:
        return "n/a (no common length)", None
    first = None
    for i in range(len(ns) - 1, -1, -1):
        if ratio_by_n[ns[i]] < 1.0:
            first = i
        else:
            break
    if first is None:
        return f"not faster up to {ns[-1]}", None
    if first == 0:
        return f"faster at all n (from ≤{ns[0]})", None
    n0, n1 = ns[first - 1], ns[first]
    r0, r1 = ratio_by_n[n0], ratio_by_n[n1]
    lr0, lr1 = math.log(max(r0, 1e-12)), math.log(max(r1, 1e-12))
    est = math.exp(math.log(n0) + (0 - lr0) * (math.log(n1) - math.log(n0)) / (lr1 - lr0)) if lr1 != lr0 else n1
    return f"≈{est:,.0f} (faster from {n1})", est


def loglog_slope(points: dict[int, float]) -> float:
    """Least-squares slope of log y against log n."""
    pts = [(math.log(n), math.log(y)) for n, y in sorted(points.items()) if y > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx > 0 else float("nan")


def growth(results: list[dict], ref_n: int = 1024) -> list[dict]:
    """Per backend: memory growth from ``ref_n`` (or the smallest n) to the largest n reached, slopes."""
    out = []
    for b, pts in _ok(results).items():
        if not pts:
            out.append({"backend": b, "n0": None})
            continue
        use = {n: r for n, r in pts.items() if n >= ref_n} if sum(n >= ref_n for n in pts) >= 2 else pts
        n0, n1 = min(use), max(use)
        mem = {n: float(r["peak_mem_bytes"]) for n, r in use.items()}
        tms = {n: float(r["time_ms"]) for n, r in use.items()}
        out.append({"backend": b, "n0": n0, "n1": n1, "mem_growth": mem[n1] / mem[n0] if mem[n0] else float("nan"),
                    "linear": n1 / n0, "quadratic": (n1 / n0) ** 2, "mem_slope": loglog_slope(mem),
                    "time_slope": loglog_slope(tms), "complexity": next(iter(pts.values()))["complexity"]})
    return out


# ----------------------------------------------------------------------------- outputs
def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3g}" if x < 10 else f"{x:,.0f}"


def render_markdown(results: list[dict], meta: dict) -> str:
    lengths = sorted({int(r["n"]) for r in results})
    labels = list(dict.fromkeys(r["backend"] for r in results))
    status = {(r["backend"], int(r["n"])): r for r in results}
    t_ratio, m_ratio = ratios(results, "time_ms"), ratios(results, "peak_mem_bytes")

    def cell(table, b, n):
        if n in table.get(b, {}):
            return _fmt_ratio(table[b][n])
        st = status.get((b, n), {}).get("status", "")
        return {"ok": "—", "skipped": "skip", "error": "error", "oom": "OOM"}.get(st, "—")

    lines = [
        "# Attention micro-benchmark",
        "",
        f"{meta.get('date', '')} · device **{meta.get('device_name', '')}** (`{meta.get('device', '')}`) · "
        f"torch {torch.__version__} · {meta.get('threads', '')} threads · git {meta.get('git', '?')}",
        "",
        f"One attention layer, forward + backward: batch {meta.get('batch')}, heads {meta.get('heads')}, "
        f"head_dim {meta.get('head_dim')}, {meta.get('dtype')}, mask: {meta.get('mask')}, training mode, "
        f"dropout options 0. Time = median of up to {meta.get('repeats')} calls after warm-up; memory = "
        f"{meta.get('mem_method')}, inputs and gradients included. Budgets per point: "
        f"{meta.get('time_budget_s')} s (fused baseline ×{meta.get('baseline_budget_factor')}), "
        f"{meta.get('mem_budget_gib', 0):.1f} GiB. Load average at start/end: {meta.get('load', '?')}"
        " (a loaded machine makes CPU timings noisy).",
        "",
        f"Reference row: `{BASELINE}` = fused SDPA. Ratios below are *backend / fused softmax at the same n*: "
        "below 1 is faster (or smaller). `skip`/`error`/`OOM`: see the reasons at the end and in bench.csv.",
        "",
        "## Time ratio to fused softmax (and crossover)",
        "",
        "| backend | " + " | ".join(str(n) for n in lengths) + " | crossover n (faster than fused from) |",
        "|---|" + "---:|" * len(lengths) + "---|",
    ]
    for b in labels:
        cross = "(reference)" if b == BASELINE else crossover(t_ratio.get(b, {}))[0]
        lines.append(f"| {b} | " + " | ".join(cell(t_ratio, b, n) for n in lengths) + f" | {cross} |")
    lines += [
        "",
        "## Peak-memory ratio to fused softmax",
        "",
        "| backend | " + " | ".join(str(n) for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for b in labels:
        lines.append(f"| {b} | " + " | ".join(cell(m_ratio, b, n) for n in lengths) + " |")

    ok = _ok(results)
    lines += ["", "## Absolute: median time (ms) / peak memory (MiB) / GFLOP per fwd+bwd", "",
              "| backend | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for b in labels:
        cells = []
        for n in lengths:
            r = ok.get(b, {}).get(n)
            cells.append(f"{float(r['time_ms']):.3g} / {float(r['peak_mem_bytes']) / MIB:.3g} / "
                         f"{float(r['flops']) / 1e9:.3g}" if r else cell({}, b, n))
        lines.append(f"| {b} | " + " | ".join(cells) + " |")

    lines += [
        "",
        "## Sanity: memory growth with n",
        "",
        "Peak-memory growth from n₀ (1024, or the smallest n measured) to the largest n reached, against "
        "pure linear (n₁/n₀) and quadratic ((n₁/n₀)²) growth, and least-squares log-log slopes over the "
        "same points (1 = linear, 2 = quadratic; inputs and gradients are linear, so quadratic methods "
        "approach 2 from below). Expected memory class: quadratic for materialising methods (registry "
        "complexity O(n^2)), linear for the fused softmax (O(n²) time, O(n) memory) and everything else.",
        "",
        "| backend | complexity | n₀→n₁ | mem growth | linear | quadratic | mem slope | time slope "
        "| memory class | as expected |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for g in growth(results):
        if g.get("n0") is None or g["n0"] == g["n1"]:
            lines.append(f"| {g['backend']} | | (fewer than two lengths measured) | | | | | | | |")
            continue
        cls = "quadratic" if g["mem_slope"] >= 1.5 else "sub-quadratic"
        expect_quad = "n^2" in g["complexity"].replace("²", "^2") and g["backend"] != BASELINE
        as_exp = "yes" if (cls == "quadratic") == expect_quad else "**no**"
        lines.append(f"| {g['backend']} | {g['complexity']} | {g['n0']}→{g['n1']} | {g['mem_growth']:.3g}× | "
                     f"{g['linear']:.0f}× | {g['quadratic']:.0f}× | {g['mem_slope']:.2f} | {g['time_slope']:.2f} | "
                     f"{cls} | {as_exp} |")

    notes = [r for r in results if r["status"] != "ok"]
    if notes:
        lines += ["", "## Points not measured", ""]
        seen = set()
        for r in notes:
            key = (r["backend"], r["reason"])
            if r["status"] == "skipped" and key in seen:
                continue
            seen.add(key)
            lines.append(f"- `{r['backend']}` n={r['n']}: {r['status']}: {r['reason']}")
    kern = {r["sdpa_ops"] for r in results if r["backend"] == BASELINE and r.get("sdpa_ops")}
    if kern:
        lines += ["", f"Fused softmax ran the kernel(s): {', '.join(f'`{k}`' for k in sorted(kern))}."]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = _ok(results)
    labels = [b for b in dict.fromkeys(r["backend"] for r in results) if ok.get(b)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    cmap = plt.get_cmap("tab20")
    styles = ["-", "--", "-.", ":"]
    for i, b in enumerate(labels):
        ns = sorted(ok[b])
        kw = dict(marker="o", ms=3, lw=1.2, color=cmap(i % 20), ls=styles[(i // 20) % 4], label=b)
        if b == BASELINE:
            kw.update(color="black", lw=2.5, ls="-", label=f"{b} (fused, reference)")
        elif b == MATERIALIZED:
            kw.update(color="gray", lw=2.0, ls="--")
        axes[0].plot(ns, [float(ok[b][n]["time_ms"]) for n in ns], **kw)
        axes[1].plot(ns, [float(ok[b][n]["peak_mem_bytes"]) / MIB for n in ns], **kw)
    lengths = sorted({int(r["n"]) for r in results})
    for ax, title, unit in ((axes[0], "forward+backward time", "ms (median)"), (axes[1], "peak memory", "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        # slope guides through the first point of the baseline
        base = ok.get(BASELINE, {})
        if base and len(lengths) > 1:
            n0 = min(base)
            y0 = float(base[n0]["time_ms"] if ax is axes[0] else float(base[n0]["peak_mem_bytes"]) / MIB)
            xs = [n0, lengths[-1]]
            ax.plot(xs, [y0, y0 * (xs[1] / n0)], color="0.6", lw=0.8, ls=":")
            ax.plot(xs, [y0, y0 * (xs[1] / n0) ** 2], color="0.6", lw=0.8, ls=":")
            ax.annotate("∝n", (xs[1], y0 * xs[1] / n0), fontsize=8, color="0.4")
            ax.annotate("∝n²", (xs[1], y0 * (xs[1] / n0) ** 2), fontsize=8, color="0.4")
    r0 = results[0] if results else {}
    fig.suptitle(f"attention fwd+bwd, batch {r0.get('batch')} × heads {r0.get('heads')} × head_dim "
                 f"{r0.get('head_dim')}, {r0.get('dtype')}, {r0.get('device_name', '')}", fontsize=10)
    handles, labs = axes[0].get_legend_handles_labels()
    fig.legend(handles, labs, loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.85, 0.95))
    write_atomic(path, lambda p: fig.savefig(p, dpi=120, format="png"))
    plt.close(fig)


# ----------------------------------------------------------------------------- command line
def _parse_overrides(items: list[str]) -> dict:
    import ast

    out: dict = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        label, dot, opt = key.partition(".")
        if not sep or not dot or not opt:
            raise ValueError(f"--set expects BACKEND.OPTION=VALUE, got {item!r}")
        try:
            value = ast.literal_eval(val)
        except (ValueError, SyntaxError):
            value = val
        out.setdefault(label, {})[opt] = value
    return out


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m lra.bench", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="examples:\n  python -m lra.bench --quick\n  python -m lra.bench --backends skeinformer "
                      "nystrom --lengths 1024 4096 --set nystrom.landmarks=128")
    p.add_argument("--quick", action="store_true", help="n in 256, 512 and 3 repeats (seconds)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench", help="output folder")
    p.add_argument("--lengths", type=int, nargs="+", help=f"sequence lengths (default {list(DEFAULT_LENGTHS)})")
    p.add_argument("--backends", nargs="+", help="rows to run (default: all; the fused baseline is always added)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--repeats", type=int, help="timed calls per point (default 10 on CPU, 50 on CUDA; quick 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls after the instrumented one")
    p.add_argument("--time-budget-s", type=float, default=2.0,
                   help="per-point budget: a median fwd+bwd above it ends the backend's sweep")
    p.add_argument("--baseline-budget-factor", type=float, default=4.0,
                   help="the fused softmax baseline gets this multiple of the time budget")
    p.add_argument("--mem-budget-gib", type=float,
                   help="per-point peak budget (default: CPU min(8, half of available RAM); CUDA 80%% of free)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--no-mask", action="store_true", help="pass mask=None instead of an all-real bool mask")
    p.add_argument("--threads", type=int, help="torch threads (default: all cores available to the process)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", metavar="BACKEND.OPTION=VALUE",
                   help="backend option override, repeatable (e.g. --set linformer.k=128)")
    return p


def _default_mem_budget(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return int(0.8 * free)
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(min(8 * GIB, 0.5 * avail)) if avail else 8 * GIB


def config_from_args(args: argparse.Namespace) -> Config:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
    lengths = tuple(args.lengths) if args.lengths else (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    if any(n < 1 for n in lengths):
        raise ValueError(f"--lengths must be positive, got {list(lengths)}")
    repeats = args.repeats or (3 if args.quick else (50 if device == "cuda" else 10))
    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    mem = int(args.mem_budget_gib * GIB) if args.mem_budget_gib else _default_mem_budget(device)
    for name in ("batch", "heads", "head_dim"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    return Config(lengths=tuple(sorted(set(lengths))), batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                  device=device, repeats=repeats, min_repeats=min(3, repeats), warmup=max(0, args.warmup),
                  time_budget_s=args.time_budget_s, baseline_budget_factor=args.baseline_budget_factor,
                  mem_budget_bytes=mem, threads=int(threads), seed=args.seed, mask=not args.no_mask,
                  overrides=_parse_overrides(args.overrides))


def main(argv: list[str] | None = None) -> list[dict]:
    p = parser()
    args = p.parse_args(argv)
    try:
        rows = select_rows(args.backends)
        cfg = config_from_args(args)
        unknown = sorted(set(cfg.overrides) - {r.label for r in rows})
        if unknown:
            raise ValueError(f"--set names backend(s) {unknown} that are not being run")
    except ValueError as err:
        p.error(str(err))
    torch.set_num_threads(cfg.threads)
    if cfg.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    meta = {
        "date": start, "device": cfg.device, "device_name": device_name(cfg.device), "threads": cfg.threads,
        "git": git_commit(short=True) or "?", "batch": cfg.batch, "heads": cfg.heads, "head_dim": cfg.head_dim,
        "dtype": str(cfg.dtype).replace("torch.", ""), "mask": "all-real bool" if cfg.mask else "none",
        "repeats": cfg.repeats, "time_budget_s": cfg.time_budget_s,
        "baseline_budget_factor": cfg.baseline_budget_factor, "mem_budget_gib": cfg.mem_budget_bytes / GIB,
        "mem_method": ("torch.cuda.max_memory_allocated" if cfg.device == "cuda"
                       else "peak of live tensor storages (TorchDispatchMode, exact at op level)"),
    }
    print(f"lra.bench: {len(rows)} backends × n={list(cfg.lengths)} on {meta['device_name']} "
          f"[{cfg.device}], {cfg.threads} threads, batch {cfg.batch}, heads {cfg.heads}, head_dim {cfg.head_dim}, "
          f"time budget {cfg.time_budget_s} s/point, memory budget {cfg.mem_budget_bytes / GIB:.1f} GiB → {out}",
          flush=True)
    t0 = time.perf_counter()
    csv_path = out / "bench.csv"
    results = run(cfg, rows, log=lambda s: print(s, flush=True), on_point=lambda res: write_csv(csv_path, res, CSV_COLUMNS))
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    meta["load"] = f"{load0:.2f} / {load1:.2f}"
    write_csv(csv_path, results, CSV_COLUMNS)
    md = render_markdown(results, meta)
    write_atomic(out / "bench.md", lambda p: p.write_text(md))
    plot(results, out / "bench.png")
    print(f"lra.bench: done in {time.perf_counter() - t0:.0f} s; wrote {csv_path}, {out / 'bench.md'}, "
          f"{out / 'bench.png'}", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
