"""The study's rows as Markdown tables and as a figure (mean relative error vs budget, log-log)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lra.approx.methods import order_key
from lra.files import write_atomic


# Plot panels: the sketching family of the Skeinformer figure, then everything else.
SKETCH_GROUP = ("vmean", "informer", "informer_mask", "linformer", "linformer_jlt", "skeinformer",
                "skeinformer_uniform", "skeinformer_no_rownorm", "skeinformer_simple_rownorm",
                "skeinformer_no_pilot", "amm_oracle")
PLOT_YMAX = 10.0  # lines above are clipped and named in the panel (see the CSV for their values)


def plot(path: Path, rows: list[dict]) -> None:
    """Mean relative error ± stderr vs budget (log-log): one row of panels per (source, method group),
    one column per n, one line per (method, reference); second references dashed, open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = sorted({r["source"] for r in rows}) or ["none"]
    lengths = sorted({r["n"] for r in rows}) or [0]
    names = {r["method"] for r in rows}
    groups = [(title, members) for title, members in
              (("Skeinformer-paper set", [m for m in names if m in SKETCH_GROUP]),
               ("other backends", [m for m in names if m not in SKETCH_GROUP])) if members] or [("", [])]
    panel_rows = [(src, title, members) for src in sources for title, members in groups]
    fig, axes = plt.subplots(len(panel_rows), len(lengths), squeeze=False,
                             figsize=(6.0 * len(lengths) + 2.5, 3.8 * len(panel_rows)))
    colors = [plt.get_cmap("tab20").colors[i] for i in (*range(0, 20, 2), *range(1, 20, 2))]
    markers = "os^vD<>pPX*h"
    for i, (src, title, members) in enumerate(panel_rows):
        lines = sorted({(r["method"], r["reference"]) for r in rows if r["method"] in members},
                       key=lambda x: (order_key(x[0]), x[1]))
        order = sorted(members, key=order_key)
        for j, n in enumerate(lengths):
            ax, off = axes[i][j], []
            for ln in lines:
                pts = sorted((r["budget"], r["mean"], r["stderr"]) for r in rows
                             if (r["method"], r["reference"]) == ln and r["source"] == src and r["n"] == n
                             and r["trials"] and np.isfinite(r["mean"]) and r["mean"] > 0)
                if not pts:
                    continue
                x, y, se = map(np.array, zip(*pts))
                primary = ln[1].startswith("softmax")
                label = ln[0] if primary else f"{ln[0]} vs {ln[1]}"
                if y.max() > PLOT_YMAX:
                    off.append(f"{label} ({y.min():.3g}-{y.max():.3g})")
                k = order.index(ln[0])
                color = colors[k % len(colors)]
                ax.errorbar(x, y, yerr=np.nan_to_num(se), label=label, color=color,
                            marker=markers[k % len(markers)], markersize=4, capsize=2, linewidth=1.2,
                            linestyle="-" if primary else "--", markerfacecolor=color if primary else "none")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, min(hi, PLOT_YMAX))
            if off:
                ax.text(0.02, 0.98, "mean above the top, min-max: " + "; ".join(off), transform=ax.transAxes,
                        va="top", fontsize=7, color="0.3")
            ax.set_title(f"{src} Q/K/V, n={n}: {title}", fontsize=10)
            ax.set_xlabel("feature budget d")
            ax.set_ylabel("‖BV − R‖₂ / ‖BV‖₂")
            ax.grid(True, which="both", alpha=0.3)
        handles = {}
        for ax in axes[i]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        if handles:
            axes[i][-1].legend(list(handles.values()), list(handles), loc="center left",
                               bbox_to_anchor=(1.02, 0.5), fontsize=7)
    fig.tight_layout()

    def w(tmp):
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")

    write_atomic(path, w)
    plt.close(fig)


def summary_table(rows: list[dict], n: int, source: str, stat: str = "median") -> str:
    """Markdown table: one row per (method, reference), one column per budget, of ``stat``."""
    sel = [r for r in rows if r["n"] == n and r["source"] == source]
    budgets = sorted({r["budget"] for r in sel})
    lines_ = sorted({(r["method"], r["reference"]) for r in sel}, key=lambda x: (order_key(x[0]), x[1]))
    out = ["| method | reference | " + " | ".join(f"d={b}" for b in budgets) + " |",
           "|---|---|" + "---:|" * len(budgets)]
    for m, ref in lines_:
        vals = {r["budget"]: r[stat] for r in sel if (r["method"], r["reference"]) == (m, ref)}
        out.append(f"| {m} | {ref} | " + " | ".join(
            f"{vals[b]:.4f}" if b in vals and np.isfinite(vals[b]) else "—" for b in budgets) + " |")
    return "\n".join(out)
