"""The study's rows as Markdown tables and as a figure (mean relative error vs budget, log-log)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from lra.files import write_atomic
from lra.tools.approx.methods import order_key
from lra.tools.display import readable_names

# Plot panels: the sketching family of the Skeinformer figure, then everything else.
SKETCH_GROUP = (
    "vmean",
    "informer",
    "informer_mask",
    "linformer",
    "linformer_jlt",
    "skeinformer",
    "skeinformer_uniform",
    "skeinformer_no_rownorm",
    "skeinformer_simple_rownorm",
    "skeinformer_no_pilot",
    "amm_oracle",
)
PLOT_YMAX = 10.0  # lines above are clipped and named in the panel (see the CSV for their values)


# names the papers give no row to; reference keys as the figure says them (exact attention of a target)
_EXTRA_NAMES = {"amm_oracle": "AMM oracle (O(n²) sketch, Skeinformer Sec. 3.3)"}
REFERENCE_NAMES = {
    "softmax": "exact softmax",
    "softmax_shared_qk": "exact shared-QK softmax",
    "kernelized": "exact Gaussian kernel",
    "gaussian": "exact Gaussian kernel",
    "polynomial": "exact polynomial attention",
    "yoso_e": "YOSO-E (YOSO's expectation)",
}
PNG_META = {"Software": "lra.tools.approx (matplotlib)"}  # fixed metadata: reruns on the same rows are byte-identical


def method_names(methods) -> dict:
    """{method key: the name the figure prints}: the papers' row names (``lra.tools.display``), a twin
    with a public code's quirks as ``Skyformer (skyformer code's quirks)``, the key for one no paper has."""
    bases = {m: m.split("[")[0] for m in methods}
    codes = {m: m[len(b) + 1 : -1] for m, b in bases.items() if m != b}
    names = readable_names(set(bases.values()) | set(codes.values()))
    code_names = {**names, "nystromformer": "Nyströmformer"}
    out = {}
    for m, base in bases.items():
        name = _EXTRA_NAMES.get(base) or names[base]
        out[m] = f"{name} (quirks of the {code_names[codes[m]]} code)" if m in codes else name
    return out


def line_label(name: str, reference: str) -> str:
    """A legend entry: the method's name, and the exact attention it is compared with unless softmax."""
    return name if reference == "softmax" else f"{name} vs {REFERENCE_NAMES.get(reference, reference)}"


def _plain(v, _pos=None) -> str:
    return f"{v:g}"


def figure(rows: list[dict]):
    """The figure of ``approx.png`` (a matplotlib ``Figure``, object API): mean relative error ± standard
    error vs budget (log-log): one row of panels per (source, method group), one column per n, one line
    per (method, reference); second references dashed, open markers; legend right of each row."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    sources = sorted({r["source"] for r in rows}) or ["none"]
    lengths = sorted({r["n"] for r in rows}) or [0]
    budgets = sorted({int(r["budget"]) for r in rows})
    names = {r["method"] for r in rows}
    readable = method_names(names)
    groups = [
        (title, members)
        for title, members in (
            ("the Skeinformer paper's methods", [m for m in names if m in SKETCH_GROUP]),
            ("other backends", [m for m in names if m not in SKETCH_GROUP]),
        )
        if members
    ] or [("", [])]
    panel_rows = [(src, title, members) for src in sources for title, members in groups]
    fig = Figure(figsize=(6.0 * len(lengths) + 3.5, 3.9 * len(panel_rows) + 1.0), layout="constrained")
    axes = fig.subplots(len(panel_rows), len(lengths), squeeze=False)
    colors = [colormaps["tab20"].colors[i] for i in (*range(0, 20, 2), *range(1, 20, 2))]
    markers = "os^vD<>pPX*h"
    trials = sorted({int(r["trials"]) for r in rows if r["trials"]})
    for i, (src, title, members) in enumerate(panel_rows):
        lines = sorted(
            {(r["method"], r["reference"]) for r in rows if r["method"] in members},
            key=lambda x: (order_key(x[0]), x[1]),
        )
        order = sorted(members, key=order_key)
        for j, n in enumerate(lengths):
            ax, off = axes[i][j], []
            for ln in lines:
                pts = sorted(
                    (r["budget"], r["mean"], r["stderr"])
                    for r in rows
                    if (r["method"], r["reference"]) == ln
                    and r["source"] == src
                    and r["n"] == n
                    and r["trials"]
                    and np.isfinite(r["mean"])
                    and r["mean"] > 0
                )
                if not pts:
                    continue
                x, y, se = map(np.array, zip(*pts))
                primary = ln[1].startswith("softmax")
                label = line_label(readable[ln[0]], ln[1])
                if y.max() > PLOT_YMAX:
                    span = f"{y.min():.3g}" if f"{y.min():.3g}" == f"{y.max():.3g}" else f"{y.min():.3g}–{y.max():.3g}"
                    off.append(f"{label} ({span})")
                k = order.index(ln[0])
                color = colors[k % len(colors)]
                ax.errorbar(
                    x,
                    y,
                    yerr=np.nan_to_num(se),
                    label=label,
                    color=color,
                    marker=markers[k % len(markers)],
                    markersize=4,
                    capsize=2,
                    linewidth=1.2,
                    linestyle="-" if primary else "--",
                    markerfacecolor=color if primary else "none",
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if budgets:
                ax.set_xticks(budgets, [str(b) for b in budgets])
                ax.xaxis.set_minor_formatter(NullFormatter())
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, min(hi, PLOT_YMAX))
            # plain numbers (0.3, 2) instead of 3×10⁻¹; ticks between the powers of 10 when the range is short
            lo, hi = ax.get_ylim()
            subs = (2, 3, 5) if hi / lo < 30 else (2, 5) if hi / lo < 300 else ()
            ax.yaxis.set_major_formatter(FuncFormatter(_plain))
            ax.yaxis.set_minor_locator(LogLocator(subs=subs) if subs else LogLocator(subs="auto"))
            ax.yaxis.set_minor_formatter(FuncFormatter(_plain) if subs else NullFormatter())
            if off:
                note = "off the top (mean, lowest–highest over d): " + "; ".join(off)
                ax.annotate(
                    textwrap.fill(note, 105),
                    (0, 0),
                    xycoords="axes fraction",
                    xytext=(0, -34),
                    textcoords="offset points",
                    va="top",
                    fontsize=7,
                    color="0.25",
                )
            ax.set_title(f"{src} Q/K/V, n = {n}: {title}", fontsize=10)
            ax.set_xlabel("feature budget d (log scale)")
            ax.set_ylabel("relative error (log scale)")
            ax.grid(True, which="both", alpha=0.3)
        handles = {}
        for ax in axes[i]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        if handles:
            axes[i][-1].legend(
                list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7
            )
    per = f"{trials[0]} trials" if len(trials) == 1 else "trials"
    fig.suptitle(
        "Relative error ‖BV − R‖₂ / ‖BV‖₂ of each method's output R (B: the exact attention matrix, "
        f"V: the values), mean ± standard error over {per}\n"
        "d: sampled columns, features or landmarks; solid: against exact softmax, dashed with open "
        "markers: against the method's own exact target",
        fontsize=9,
    )
    return fig


def plot(path: Path, rows: list[dict]) -> None:
    """``approx.png``: :func:`figure`, written atomically with fixed metadata."""
    fig = figure(rows)
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight", metadata=PNG_META))


def summary_table(rows: list[dict], n: int, source: str, stat: str = "median") -> str:
    """Markdown table: one row per (method, reference), one column per budget, of ``stat``."""
    sel = [r for r in rows if r["n"] == n and r["source"] == source]
    budgets = sorted({r["budget"] for r in sel})
    lines_ = sorted({(r["method"], r["reference"]) for r in sel}, key=lambda x: (order_key(x[0]), x[1]))
    out = [
        "| method | reference | " + " | ".join(f"d={b}" for b in budgets) + " |",
        "|---|---|" + "---:|" * len(budgets),
    ]
    for m, ref in lines_:
        vals = {r["budget"]: r[stat] for r in sel if (r["method"], r["reference"]) == (m, ref)}
        out.append(
            f"| {m} | {ref} | "
            + " | ".join(f"{vals[b]:.4f}" if b in vals and np.isfinite(vals[b]) else "—" for b in budgets)
            + " |"
        )
    return "\n".join(out)
