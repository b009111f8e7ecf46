"""The layer benchmark's outputs from its records: ``bench.md`` (ratio tables, crossover, absolute
values, memory growth, what was not measured) and ``bench.png`` (log-log time and memory against n)."""

from __future__ import annotations

from pathlib import Path

import torch

from lra.display import mem_unit, readable_names
from lra.files import write_atomic
from lra.tools.bench.analyse import _ok, crossover, growth, ratios
from lra.tools.bench.rows import BASELINE, MATERIALIZED, MIB


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
        f"# Attention micro-benchmark: one layer at batch {meta.get('batch')} "
        f"({'CPU' if meta.get('device') == 'cpu' else 'GPU'}; `--tasks` measures the tasks' training shapes)",
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
    lines += [
        "",
        "## Absolute: median time (ms) / peak memory (MiB) / GFLOP per fwd+bwd",
        "",
        "| backend | " + " | ".join(str(n) for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for b in labels:
        cells = []
        for n in lengths:
            r = ok.get(b, {}).get(n)
            cells.append(
                f"{float(r['time_ms']):.3g} / {float(r['peak_mem_bytes']) / MIB:.3g} / "
                f"{float(r['flops']) / 1e9:.3g}"
                if r
                else cell({}, b, n)
            )
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
        lines.append(
            f"| {g['backend']} | {g['complexity']} | {g['n0']}→{g['n1']} | {g['mem_growth']:.3g}× | "
            f"{g['linear']:.0f}× | {g['quadratic']:.0f}× | {g['mem_slope']:.2f} | {g['time_slope']:.2f} | "
            f"{cls} | {as_exp} |"
        )

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


# names the papers give no row to (readable_names returns the key for those)
_EXTRA_NAMES = {BASELINE: "Standard (fused SDPA), the reference", MATERIALIZED: "Standard, materialised n×n softmax"}
PNG_META = {"Software": "lra.tools.bench (matplotlib)"}  # fixed metadata: reruns on the same records are byte-identical


def backend_names(labels) -> dict:
    """{backend label: the name the figure prints}: the papers' row names (``lra.display``),
    the fused and materialised softmax rows spelt out, the label itself for a backend no paper has."""
    names = readable_names([b for b in labels if b not in _EXTRA_NAMES])
    return {b: _EXTRA_NAMES.get(b) or names[b] for b in labels}


def figure(results: list[dict]):
    """The figure of ``bench.png`` (a matplotlib ``Figure``, object API): median forward+backward time
    and peak memory against n, log-log, one line per measured backend, legend on the right."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    ok = _ok(results)
    labels = [b for b in dict.fromkeys(r["backend"] for r in results) if ok.get(b)]
    names = backend_names(labels)
    fig = Figure(figsize=(14, 6), layout="constrained")
    axes = fig.subplots(1, 2)
    cmap = colormaps["tab20"]
    markers = "os^D"
    peak = max((float(r["peak_mem_bytes"]) for pts in ok.values() for r in pts.values()), default=float("nan"))
    mem_div, mem_name = mem_unit(peak)
    others = [b for b in labels if b not in (BASELINE, MATERIALIZED)]
    for b in labels:
        ns = sorted(ok[b])
        i = others.index(b) if b in others else 0
        kw = dict(marker=markers[(i // 20) % 4], ms=4, lw=1.2, color=cmap(i % 20), ls="-", label=names[b])
        if b == BASELINE:
            kw.update(color="black", lw=2.5, marker="o")
        elif b == MATERIALIZED:
            kw.update(color="0.45", lw=2.0, ls="--", marker="o")
        axes[0].plot(ns, [float(ok[b][n]["time_ms"]) for n in ns], **kw)
        axes[1].plot(ns, [float(ok[b][n]["peak_mem_bytes"]) / mem_div for n in ns], **kw)
    lengths = sorted({int(r["n"]) for r in results})
    r0 = results[0] if results else {}
    base = ok.get(BASELINE, {})
    panels = (
        (axes[0], "forward + backward time (median of the timed calls)", "time (ms, log scale)", "time_ms", 1.0),
        (
            axes[1],
            "peak memory (inputs and gradients included)",
            f"peak memory ({mem_name}, log scale)",
            "peak_mem_bytes",
            mem_div,
        ),
    )
    for ax, title, ylabel, key, div in panels:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length n (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        # slope guides through the reference's first point
        if base and len(lengths) > 1:
            n0 = min(base)
            y0 = float(base[n0][key]) / div
            xs = [n0, lengths[-1]]
            for power, text in ((1, "∝ n"), (2, "∝ n²")):
                ys = [y0, y0 * (xs[1] / n0) ** power]
                ax.plot(xs, ys, color="0.5", lw=0.9, ls=":")
                ax.annotate(
                    text,
                    (xs[1], ys[1]),
                    xytext=(4, 0),
                    textcoords="offset points",
                    fontsize=8,
                    color="0.35",
                    va="center",
                )
    fig.suptitle(
        f"One attention layer, forward + backward: batch {r0.get('batch')}, {r0.get('heads')} heads of "
        f"dimension {r0.get('head_dim')}, {r0.get('dtype')}, {r0.get('device_name', '')}",
        fontsize=11,
    )
    handles, labs = axes[0].get_legend_handles_labels()
    if base and len(lengths) > 1:
        handles.append(Line2D([], [], color="0.5", lw=0.9, ls=":"))
        labs.append("guides ∝ n and ∝ n² through\nthe reference's first point")
    if handles:
        fig.legend(
            handles,
            labs,
            loc="outside right center",
            fontsize=8,
            frameon=False,
            title="attention (reference: fused softmax)",
            title_fontsize=8,
        )
    return fig


def plot(results: list[dict], path: Path) -> None:
    """``bench.png``: :func:`figure`, written atomically with fixed metadata."""
    fig = figure(results)
    write_atomic(path, lambda p: fig.savefig(p, dpi=120, format="png", metadata=PNG_META))
