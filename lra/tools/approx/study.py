"""The study: every method on every draw of every source and length, and the statistics of each cell.

Every method sees the same inputs (common random numbers): a draw's generator is seeded from (seed,
source, n, draw), and ``torch.manual_seed`` from (seed, source, n, draw, method, budget) before a
backend is built and called. A cell (method, reference, source, n, budget) holds one relative error
per (draw, head); its standard error is over draw means once there are enough draws.
"""

from __future__ import annotations

import logging
import math
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

import attention
from lra.tools.approx.methods import Method, order_key
from lra.tools.approx.references import Reference, reference_for, relative_error, shared_qk_attention, softmax_attention

log = logging.getLogger(__name__)

# The columns of the summary rows (approx.csv) and of the per-trial rows (approx_trials.csv).
COLUMNS = [
    "method",
    "reference",
    "source",
    "n",
    "budget",
    "budget_option",
    "option_value",
    "trials",
    "draws",
    "mean",
    "median",
    "stderr",
    "std",
    "min",
    "max",
    "sec_per_call",
    "failures",
    "error_message",
]
TRIAL_COLUMNS = ["method", "reference", "source", "n", "budget", "draw", "head", "rel_error"]


def _seed(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


@dataclass
class Cell:
    """Errors of one (method, reference, source, n, budget): one value per (draw, head)."""

    errors: list = field(default_factory=list)
    draws: list = field(default_factory=list)
    heads: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    failures: list = field(default_factory=list)


HEADS_PER_CALL = 2  # heads per backend call: bounds the n×n buffers of O(n²) methods (2 = LRA's heads)


def _ref_keys(m: Method, refs: dict) -> list[str]:
    """Reference keys ``m`` is compared with: softmax (shared-QK form for Reformer-like methods),
    then the exact attention of its own target when that differs and is not ``m`` itself."""
    if m.shared_qk:  # Reformer's target is shared-QK softmax itself
        return ["softmax_shared_qk"]
    keys = ["softmax"]
    if m.target != "softmax" and m.target in refs and refs[m.target].name != m.name:
        keys.append(m.target)
    return keys


def run_study(
    methods: list[Method],
    sources: dict,
    lengths,
    budgets,
    trials: int | dict,
    seed: int = 0,
    registered: list[str] | None = None,
    heads_per_call: int = HEADS_PER_CALL,
) -> tuple[list[dict], list[dict], dict]:
    """Evaluate every method; returns (summary rows, per-trial rows, {reference key: description}).

    For each source and length, ``ceil(trials / heads)`` independent input draws; each backend is
    built and called on groups of ``heads_per_call`` heads, reseeded per (draw, head group, method,
    budget), so every method sees the same inputs (common random numbers across methods).
    """
    registered = attention.available() if registered is None else registered
    refs = {
        "softmax": Reference("softmax", softmax_attention),
        "softmax_shared_qk": Reference(
            "softmax_shared_qk", shared_qk_attention, "keys = q/||q||, no attention to self (Reformer Sec. 2)"
        ),
    }
    for m in methods:
        if m.target != "softmax" and m.target not in refs and not m.shared_qk:
            r = reference_for(m.target, registered)
            if r is not None:
                refs[m.target] = r
            else:
                log.info("no exact reference for target %r of %s: compared with softmax only", m.target, m.name)
    cells: dict[tuple, Cell] = {}
    for source, make in sources.items():
        heads = make.heads
        groups = [slice(g, min(g + heads_per_call, heads)) for g in range(0, heads, heads_per_call)]
        for n in lengths:
            draws = math.ceil((trials[n] if isinstance(trials, dict) else trials) / heads)
            t0 = time.perf_counter()
            for draw in range(draws):
                gen = torch.Generator().manual_seed(_seed(seed, source, n, draw))
                q, k, v, head_ids = make(n, gen)
                exact, ref_sec = {}, {}
                with torch.no_grad():
                    for m in methods:
                        keys = _ref_keys(m, refs)
                        for key in keys:
                            if key not in exact:
                                tic = time.perf_counter()
                                exact[key] = torch.cat([refs[key].fn(q[g], k[g], v[g]) for g in groups])
                                ref_sec[key] = time.perf_counter() - tic
                        if m.block_multiple and n % m.block_multiple:
                            continue
                        for budget in [None] if m.budget_option is None else budgets:
                            if budget is not None and budget > n:
                                continue
                            out, err, sec = _call(
                                m,
                                budget,
                                n,
                                q,
                                k,
                                v,
                                groups,
                                refs,
                                exact,
                                ref_sec,
                                _seed(seed, source, n, draw, m.name, budget),
                            )
                            for key in keys:
                                cell = cells.setdefault((m.name, refs[key].name, source, n, budget), Cell())
                                if err is not None:
                                    cell.failures.append(err)
                                    continue
                                e = relative_error(exact[key], out)
                                cell.errors += e.tolist()
                                cell.draws += [draw] * len(e)
                                cell.heads += head_ids
                                cell.seconds.append(sec)
            log.info("source=%s n=%d: %d draws x %d heads in %.1f s", source, n, draws, heads, time.perf_counter() - t0)
    rows, trial_rows = [], []
    by_name = {m.name: m for m in methods}
    for (name, ref, source, n, budget), cell in cells.items():
        m = by_name[name]
        budgets_out = budgets if budget is None else [budget]
        stats = _stats(cell)
        if cell.failures:
            log.warning(
                "%s (source=%s n=%d budget=%s): %d call(s) failed, first: %s",
                name,
                source,
                n,
                budget,
                len(cell.failures),
                cell.failures[0],
            )
        for b in budgets_out:
            if b > n:
                continue
            rows.append(
                {
                    "method": name,
                    "reference": ref,
                    "source": source,
                    "n": n,
                    "budget": b,
                    "budget_option": m.budget_option or "",
                    "option_value": m.budget_value(b, n) if m.budget_option else "",
                    **stats,
                    "failures": len(cell.failures),
                    "error_message": cell.failures[0] if cell.failures else "",
                }
            )
        for d, h, e in zip(cell.draws, cell.heads, cell.errors):
            trial_rows.append(
                {
                    "method": name,
                    "reference": ref,
                    "source": source,
                    "n": n,
                    "budget": "" if budget is None else budget,
                    "draw": d,
                    "head": h,
                    "rel_error": e,
                }
            )
    rows.sort(key=lambda r: (r["source"], r["n"], order_key(r["method"]), r["reference"], r["budget"]))
    return rows, trial_rows, {t: r.name + (f" ({r.note})" if r.note else "") for t, r in refs.items()}


MIN_DRAWS_FOR_CLUSTER_SE = 8  # fewer draws: SE over all trials (treats heads as independent)


def _call(m: Method, budget, n, q, k, v, groups, refs, exact, ref_sec, seed):
    """(output (heads, n, d), error message or None, seconds) of one method on one draw."""
    for key, ref in refs.items():  # a budget-free exact backend that is itself a reference
        if ref.name == m.name and key in exact and m.budget_option is None:
            return exact[key], None, ref_sec[key]
    tic = time.perf_counter()
    try:
        outs = []
        for i, g in enumerate(groups):
            torch.manual_seed(seed + i)
            mod = m.build(budget, n, g.stop - g.start).eval()
            kk = q[g] if m.shared_qk else k[g]
            outs.append(mod(q[g][None], kk[None], v[g][None])[0].float())
        out, err = torch.cat(outs), None
        if not torch.isfinite(out).all():
            err = "non-finite output"
    except Exception as e:  # recorded in the CSV, the study goes on
        out, err = None, f"{type(e).__name__}: {e}"
    return out, err, time.perf_counter() - tic


def _stats(cell: Cell) -> dict:
    e = np.asarray(cell.errors, dtype=float)
    if e.size == 0:
        nan = float("nan")
        return dict(trials=0, draws=0, mean=nan, median=nan, stderr=nan, std=nan, min=nan, max=nan, sec_per_call=nan)
    draws = np.asarray(cell.draws)
    uniq = np.unique(draws)
    if len(uniq) >= MIN_DRAWS_FOR_CLUSTER_SE:  # heads of one draw share randomness: SE over draw means
        means = np.array([e[draws == d].mean() for d in uniq])
        stderr = means.std(ddof=1) / math.sqrt(len(uniq))
    else:
        stderr = e.std(ddof=1) / math.sqrt(e.size) if e.size > 1 else float("nan")
    return dict(
        trials=int(e.size),
        draws=int(len(uniq)),
        mean=float(e.mean()),
        median=float(np.median(e)),
        stderr=float(stderr),
        std=float(e.std(ddof=1)) if e.size > 1 else float("nan"),
        min=float(e.min()),
        max=float(e.max()),
        sec_per_call=float(np.mean(cell.seconds)),
    )
