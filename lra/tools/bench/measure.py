"""The layer benchmark's measurements: one (backend, n) point, and the sweep over the lengths.

Per (backend, n) point:
  1. two *instrumented* fwd+bwd passes (they are also warm-ups): one under the live-tensor meter
     (:func:`lra.tools.meter.live_peak`, exact at the op level), one under ``FlopCounterMode`` with
     formulas for the CPU fused SDPA kernels that torch does not price (:mod:`lra.tools.bench.flops`);
  2. on CUDA a plain pass for the allocator's ``max_memory_allocated`` (:func:`lra.tools.meter.measure_peak`);
  3. ``warmup`` untimed passes, then ``repeats`` timed ones (:func:`lra.tools.meter.timed`: median reported;
     synchronised on CUDA;
     fewer repeats, at least 3, when one call is slow).
A backend stops after the first n whose fastest call exceeds the time budget or whose peak exceeds
the memory budget, and a point predicted (log-log extrapolation) to exceed the memory budget or 4×
the time budget is not run; the record says why.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

import attention
from lra.devices import device_name, is_oom, sync
from lra.tools.bench.flops import OpNames, flop_counter
from lra.tools.bench.rows import BASELINE, CSV_COLUMNS, GIB, MIB, Config, Row, build_module, effective_options
from lra.tools.meter import LIVE, live_peak, measure_peak, timed, timing_columns


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

    def call() -> None:
        fwd_bwd(module, q, k, v, mask, dout)

    # 1. memory pass (also the first warm-up): exact peak of live tensor storages. Alone, because
    #    FlopCounterMode keeps references that change autograd's buffer reuse (+1 (b,h,n,d) tensor).
    tensor_peak = live_peak(call, known)
    sync(cfg.device)
    _clear_grads(module, q, k, v)

    # 2. FLOP pass (second warm-up): matmul FLOPs, and which SDPA kernel actually ran
    ops, flops = OpNames(), flop_counter()

    def counted() -> None:
        with ops, flops:
            call()

    t_first = timed(counted, cfg.device)
    _clear_grads(module, q, k, v)

    # 3. allocator peak on CUDA, measured after the warm-up so workspaces/autotune are not counted
    if cfg.device.startswith("cuda"):
        peak, mem_method = measure_peak(call, known, cfg.device, above_idle=False)
        _clear_grads(module, q, k, v)
    else:
        peak, mem_method = tensor_peak, LIVE

    # 4. timing: warm-up, then repeats (fewer when one call is slow, at least min_repeats)
    budget = budget_s if budget_s is not None else cfg.time_budget_s
    t_warm = t_first
    slow = t_first > 3 * budget  # a runaway point: time it once, the sweep stops after it anyway
    # the two instrumented passes already warmed up; long calls need no further warm-up
    for _ in range(0 if t_first > 0.5 else cfg.warmup):
        t_warm = timed(call, cfg.device)
        _clear_grads(module, q, k, v)
    reps = 1 if slow else max(cfg.min_repeats, min(cfg.repeats, int(1.5 * budget / max(t_warm, 1e-9))))
    times = []
    for _ in range(reps):
        times.append(timed(call, cfg.device))
        _clear_grads(module, q, k, v)
    med = statistics.median(times)
    total_flops = int(flops.get_total_flops())
    return {
        **timing_columns(times),
        "peak_mem_bytes": int(peak),
        "tensor_peak_bytes": int(tensor_peak),
        "mem_method": mem_method,
        "flops": total_flops,
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


def run(
    cfg: Config,
    rows: list[Row],
    log: Callable[[str], None] = print,
    on_point: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Measure every row at every length; returns one record per (row, n) in CSV_COLUMNS order."""
    common = {
        "batch": cfg.batch,
        "heads": cfg.heads,
        "head_dim": cfg.head_dim,
        "dtype": str(cfg.dtype).replace("torch.", ""),
        "device": cfg.device,
        "device_name": device_name(cfg.device),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "mask": "all-real bool" if cfg.mask else "none",
    }
    results: list[dict] = []
    total = len(rows) * len(cfg.lengths)
    for row in rows:
        caps = attention.capabilities(row.base)
        quadratic = "n^2" in caps.complexity.replace("²", "^2") and row.label != BASELINE
        opts = effective_options(row, cfg)
        budget = cfg.budget_s(row)
        stop: str | None = None
        t_hist: list[tuple[int, float]] = []
        m_hist: list[tuple[int, float]] = []
        for n in cfg.lengths:
            rec = {c: "" for c in CSV_COLUMNS}
            rec.update(
                common,
                backend=row.label,
                base=row.base,
                n=n,
                complexity=caps.complexity,
                exact=caps.exact,
                options=" ".join(f"{k}={v}" for k, v in sorted(opts.items())),
            )
            tag = f"[{len(results) + 1}/{total}] {row.label} n={n}"
            reason = stop
            if reason is None and caps.block_multiple and n % caps.block_multiple:
                reason = f"n={n} is not a multiple of block_multiple={caps.block_multiple}"
            if reason is None:
                pm = _predict(m_hist, n, quadratic)
                pt = _predict(t_hist, n, quadratic, max_slope=2.0)
                if pm is not None and pm > cfg.mem_budget_bytes:
                    reason = stop = (
                        f"predicted peak {pm / GIB:.1f} GiB at n={n} exceeds the memory budget "
                        f"{cfg.mem_budget_bytes / GIB:.1f} GiB"
                    )
                elif pt is not None and pt > 4 * budget:
                    reason = stop = f"predicted {pt:.1f} s per call at n={n} exceeds 4x the {budget:g} s time budget"
            if reason is not None:
                rec.update(status="skipped", reason=reason)
                log(f"{tag}: skipped ({reason})")
            else:
                try:
                    rec.update(measure_point(row, n, cfg, budget), status="ok")
                except Exception as err:  # a broken backend must not end the sweep
                    msg = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                    if is_oom(err):
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
                    log(
                        f"{tag}: {rec['time_ms']:.2f} ms (median of {rec['repeats']}), "
                        f"peak {mem / MIB:.1f} MiB, {rec['flops'] / 1e9:.3f} GFLOP"
                        + (f" [{rec['sdpa_ops']}]" if rec["sdpa_ops"] else "")
                    )
                    if t_s > budget:
                        stop = f"fastest call {t_s:.2f} s at n={n} exceeded the {budget:g} s per-point budget"
                    elif mem > cfg.mem_budget_bytes:
                        stop = (
                            f"peak {mem / GIB:.1f} GiB at n={n} exceeded the memory budget "
                            f"{cfg.mem_budget_bytes / GIB:.1f} GiB"
                        )
            results.append(rec)
            if on_point is not None:
                on_point(results)
    return results
