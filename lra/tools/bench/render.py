"""The layer benchmark's outputs from its records: ``bench.md`` (ratio tables, crossover, absolute
values, memory growth, what was not measured) and ``bench.png`` (log-log time and memory against n)."""

from __future__ import annotations

from pathlib import Path

import torch

from lra.files import write_atomic
from lra.tools.bench.analyse import _ok, crossover, growth, ratios
from lra.tools.bench.rows import BASELINE, MATERIALIZED, MIB
from lra.tools.display import mem_unit, readable_names


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
        f"{meta.get('mem_budget_gib', 0):.1f} GiB.",
        "",
        meta.get("load_line", "Load average: not recorded."),
        *(["", f"**{meta['load_warning']}**"] if meta.get("load_warning") else []),
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
    backwards = []  # work grows with n: a time that falls is noise
    for b in labels:
        pts = sorted((n, float(r["time_ms"])) for n, r in ok.get(b, {}).items())
        backwards += [
            f"`{b}` n={n0}→{n1} ({t0:.3g} → {t1:.3g} ms)" for (n0, t0), (n1, t1) in zip(pts, pts[1:]) if t1 < 0.9 * t0
        ]
    if backwards:
        lines += [
            "",
            "## Times that fall as n grows",
            "",
            "Work grows with n, so these are noise (the machine's load, a frequency change, a warm-up): rerun before "
            "quoting them: " + "; ".join(backwards) + ".",
        ]
    kern = {r["sdpa_ops"] for r in results if r["backend"] == BASELINE and r.get("sdpa_ops")}
    if kern:
        lines += ["", f"Fused softmax ran the kernel(s): {', '.join(f'`{k}`' for k in sorted(kern))}."]
    return "\n".join(lines) + "\n"


# names the papers give no row to (readable_names returns the key for those)
_EXTRA_NAMES = {BASELINE: "Standard (fused SDPA), the reference", MATERIALIZED: "Standard, materialised n×n softmax"}
PNG_META = {"Software": "lra.tools.bench (matplotlib)"}  # fixed metadata: reruns on the same records are byte-identical


def backend_names(labels) -> dict:
    """{backend label: the name the figure prints}: the papers' row names (``lra.tools.display``),
    the fused and materialised softmax rows spelt out, the label itself for a backend no paper has."""
    names = readable_names([b for b in labels if b not in _EXTRA_NAMES])
    return {b: _EXTRA_NAMES.get(b) or names[b] for b in labels}


FEW = 6  # up to this many backends share one panel pair; more get one small panel each (colours never repeat)
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")  # with black and grey
MARKERS = "osD^vP"


def _metric(key: str, results: list[dict]) -> tuple[str, float, str]:
    """(panel title, divisor, y label) of ``time_ms`` or ``peak_mem_bytes``."""
    if key == "time_ms":
        return "forward + backward time (median of the timed calls)", 1.0, "time (ms, log scale)"
    peak = max((float(r["peak_mem_bytes"]) for r in results if r.get("status") == "ok"), default=float("nan"))
    div, unit = mem_unit(peak)
    return "peak memory (inputs and gradients included)", div, f"peak memory ({unit}, log scale)"


def _log_axes(ax, lengths: list[int], ylabel: str | None, xlabel: bool = True) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off() if len(lengths) > 6 else None
    if xlabel:
        ax.set_xlabel("sequence length n (log scale)")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def _guides(ax, base: dict, lengths: list[int], key: str, div: float) -> None:
    """Slope guides ∝ n and ∝ n² through the reference's first point."""
    if not base or len(lengths) < 2:
        return
    n0 = min(base)
    y0 = float(base[n0][key]) / div
    xs = [n0, lengths[-1]]
    for power, text in ((1, "∝ n"), (2, "∝ n²")):
        ys = [y0, y0 * (xs[1] / n0) ** power]
        ax.plot(xs, ys, color="0.5", lw=0.9, ls=":")
        ax.annotate(text, (xs[1], ys[1]), xytext=(4, 0), textcoords="offset points", fontsize=8, color="0.35")


def _draw_references(ax, ok: dict, key: str, div: float, names: dict) -> None:
    for b, kw in ((BASELINE, dict(color="black", lw=2.2)), (MATERIALIZED, dict(color="0.55", lw=1.8, ls="--"))):
        if b in ok:
            ns = sorted(ok[b])
            ax.plot(ns, [float(ok[b][n][key]) / div for n in ns], marker="o", ms=3, label=names[b], **kw)


def _title_and_notes(fig, results: list[dict], meta: dict | None, subtitle: str = "") -> None:
    r0 = results[0] if results else {}
    meta = meta or {}
    fig.suptitle(
        f"One attention layer, forward + backward: batch {r0.get('batch')}, {r0.get('heads')} heads of "
        f"dimension {r0.get('head_dim')}, {r0.get('dtype')}, {r0.get('device_name', '')}"
        + (f"\n{subtitle}" if subtitle else ""),
        fontsize=10,
    )
    notes = [meta["load_line"]] if meta.get("load_line") else []
    if meta.get("load_warning"):
        notes.append(meta["load_warning"])
    if notes:
        fig.supxlabel("\n".join(notes), fontsize=8, color="firebrick" if meta.get("load_warning") else "0.3")


def figure(results: list[dict], meta: dict | None = None, key: str | None = None):
    """The figure of ``bench.png``: median forward+backward time (and peak memory) against n, log-log.

    Up to :data:`FEW` backends: one panel for time and one for memory, every backend its own colour and
    marker beside the fused (black) and materialised (grey, dashed) softmax. More: ``key``'s small
    multiples, one panel per backend against the same two references on shared axes, the ratio to fused
    softmax at the largest n in the panel's corner. ``meta``'s load line (and warning) is printed below."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    ok = _ok(results)
    labels = [b for b in dict.fromkeys(r["backend"] for r in results) if ok.get(b)]
    names = backend_names(labels)
    others = [b for b in labels if b not in (BASELINE, MATERIALIZED)]
    lengths = sorted({int(r["n"]) for r in results})
    base = ok.get(BASELINE, {})
    if len(others) > FEW:
        return _small_multiples(results, meta, key or "time_ms", ok, others, names, lengths)
    fig = Figure(figsize=(14, 6), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, k in zip(axes, ("time_ms", "peak_mem_bytes")):
        title, div, ylabel = _metric(k, results)
        _draw_references(ax, ok, k, div, names)
        for i, b in enumerate(others):
            ns = sorted(ok[b])
            ax.plot(
                ns, [float(ok[b][n][k]) / div for n in ns], marker=MARKERS[i], ms=4, lw=1.3, color=PALETTE[i],
                label=names[b],
            )  # fmt: skip
        _log_axes(ax, lengths, ylabel)
        ax.set_title(title, fontsize=10)
        _guides(ax, base, lengths, k, div)
    _title_and_notes(fig, results, meta)
    handles, labs = axes[0].get_legend_handles_labels()
    if base and len(lengths) > 1:
        handles.append(Line2D([], [], color="0.5", lw=0.9, ls=":"))
        labs.append("guides ∝ n and ∝ n² through\nthe reference's first point")
    if handles:
        fig.legend(
            handles, labs, loc="outside right center", fontsize=8, frameon=False,
            title="attention (reference: fused softmax)", title_fontsize=8,
        )  # fmt: skip
    return fig


def _small_multiples(results, meta, key, ok, others, names, lengths):
    from matplotlib.figure import Figure

    title, div, ylabel = _metric(key, results)
    cols = 5
    rows = -(-len(others) // cols)
    fig = Figure(figsize=(3.1 * cols, 2.5 * rows + 1.2), layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    base = ok.get(BASELINE, {})
    for ax, b in zip(axes, others):
        _draw_references(ax, ok, key, div, names)
        ns = sorted(ok[b])
        ax.plot(ns, [float(ok[b][n][key]) / div for n in ns], marker="o", ms=3, lw=1.6, color="tab:blue")
        _log_axes(ax, lengths, None, xlabel=False)
        ax.set_title(names[b], fontsize=8)
        common = [n for n in ns if n in base]
        if common:
            n = common[-1]
            ratio = float(ok[b][n][key]) / float(base[n][key])
            ax.text(
                0.03, 0.95, f"{_fmt_ratio(ratio)}× fused at n={n}", transform=ax.transAxes, fontsize=7, va="top",
                color="tab:blue",
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1},
            )  # fmt: skip
    for ax in axes[len(others) :]:
        ax.set_visible(False)
    fig.supylabel(ylabel, fontsize=9)
    refs = " and ".join(
        f"{names[b]} ({style})" for b, style in ((BASELINE, "black"), (MATERIALIZED, "grey, dashed")) if b in ok
    )
    _title_and_notes(fig, results, meta, f"{title}: in every panel one backend (blue) against {refs}")
    return fig


def plot(results: list[dict], path: Path, meta: dict | None = None) -> list[Path]:
    """``bench.png`` (:func:`figure`), and with more than :data:`FEW` backends ``bench_memory.png`` (the
    memory's small multiples) beside it; written atomically with fixed metadata. Returns the files."""
    many = len({r["backend"] for r in results if r.get("status") == "ok"} - {BASELINE, MATERIALIZED}) > FEW
    figures = [(path, "time_ms")] + ([(path.with_name(path.stem + "_memory.png"), "peak_mem_bytes")] if many else [])
    for target, key in figures:
        fig = figure(results, meta, key)
        write_atomic(target, lambda p, fig=fig: fig.savefig(p, dpi=120, format="png", metadata=PNG_META))
    return [t for t, _ in figures]
