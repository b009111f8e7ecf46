"""The layer benchmark's outputs from its records: ``bench.md`` (ratio tables, crossover, absolute
values, memory growth, what was not measured) and ``bench.png`` (log-log time and memory against n)."""

from __future__ import annotations

from pathlib import Path

import torch

from lra.bench.analyse import _ok, crossover, growth, ratios
from lra.bench.rows import BASELINE, MATERIALIZED, MIB
from lra.files import write_atomic


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

