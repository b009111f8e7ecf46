"""The layer benchmark's statistics over its records: ratios to fused softmax, the crossover length,
log-log slopes and memory growth with n."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from lra.tools.bench.rows import BASELINE


def read_csv(path: Path) -> list[dict]:
    """The records of a ``bench.csv`` (strings, as the functions here accept them)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


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
    return {
        b: {n: float(r[key]) / float(base[n][key]) for n, r in pts.items() if n in base and float(base[n][key]) > 0}
        for b, pts in ok.items()
    }


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
        out.append(
            {
                "backend": b,
                "n0": n0,
                "n1": n1,
                "mem_growth": mem[n1] / mem[n0] if mem[n0] else float("nan"),
                "linear": n1 / n0,
                "quadratic": (n1 / n0) ** 2,
                "mem_slope": loglog_slope(mem),
                "time_slope": loglog_slope(tms),
                "complexity": next(iter(pts.values()))["complexity"],
            }
        )
    return out
