"""Figures from the run records (written by ``lra.collect`` next to the tables, PNG and PDF).

* ``curves_<task>``: validation loss and accuracy against training time, one curve per attention: the
  mean over its seeds, band ± std (Skeinformer Fig. 2 / Skyformer Fig. 2). The run's ``metrics.csv`` (Lightning's
  CSVLogger) logs validation by optimizer step, not by time, so the time of each evaluation is
  approximated as ``step × time_per_1k_steps_s / 1000``: the run's average training time per step,
  evaluation excluded. Warm-up and uneven steps make early points slightly off.
* ``efficiency_<task>``: test accuracy against training minutes per 1k steps and against peak memory,
  one point per attention (mean over seeds, bars: std). CPU runs record no peak memory; that panel
  then says so instead of plotting an estimate.

Only matplotlib's object API is used (no pyplot state), so importing this module never changes the
backend of a notebook; files are written atomically with fixed metadata, so reruns are byte-identical.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lra.collect.render import safe_name
from lra.files import write_atomic

PNG_META = {"Software": "lra.collect (matplotlib)"}
PDF_META = {"Creator": "lra.collect", "Producer": "matplotlib", "CreationDate": None, "ModDate": None}
_ALIASES = {"val/loss": ("val/loss", "val_loss"), "val/acc": ("val/acc", "val_acc")}


def short(key: str, width: int = 40) -> str:
    """A legend label: run keys with long override tags are cut (the tables print them in full)."""
    return key if len(key) <= width else key[:width - 1] + "…"


def colours(keys) -> dict:
    """A fixed colour per row key (sorted order), so a backend keeps its colour across figures."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(keys) <= 10 else "tab20"]
    return {k: cmap(i % cmap.N) for i, k in enumerate(sorted(keys))}


def read_curve(run_dir: Path) -> pd.DataFrame | None:
    """Validation rows of a run's metrics.csv as columns step, val/loss, val/acc; None if unusable."""
    f = Path(run_dir) / "metrics.csv"
    try:
        with open(f, newline="") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not rows or "step" not in rows[0]:
        return None
    head = rows[0]
    idx = {name: next((head.index(a) for a in aliases if a in head), None) for name, aliases in _ALIASES.items()}
    if all(i is None for i in idx.values()):
        return None
    out = []
    for r in rows[1:]:
        vals = [_float(r, head.index("step"))] + [_float(r, idx[k]) for k in ("val/loss", "val/acc")]
        if math.isfinite(vals[0]) and (math.isfinite(vals[1]) or math.isfinite(vals[2])):
            out.append(vals)
    if not out:
        return None
    return pd.DataFrame(out, columns=["step", "val/loss", "val/acc"]).sort_values("step", kind="stable")


def _float(row: list, i: int | None) -> float:
    if i is None or i >= len(row) or not row[i]:
        return math.nan
    try:
        return float(row[i])
    except ValueError:
        return math.nan


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.png and ``stem``.pdf, each written atomically."""
    paths = []
    for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
        path = Path(f"{stem}.{ext}")
        write_atomic(path, lambda tmp, ext=ext, meta=meta: fig.savefig(tmp, format=ext, metadata=meta, dpi=120))
        paths.append(path)
    return paths


def curves_figure(runs: pd.DataFrame, root: Path, preset: str, task: str, names: dict | None = None):
    """(figure or None, notes): validation loss/accuracy against approximate training time.

    One curve per attention: the mean over its seeds at each evaluated step (band: ± std where at least
    two seeds reached that step); time = step × the seeds' mean training time per step."""
    sel = runs[(runs["preset"] == preset) & (runs["task"] == task) & runs["usable"] & runs["kept"]]
    notes = []
    curves: dict[str, list] = {}
    for r in sel.sort_values(["attn", "variant", "seed", "path"], kind="stable").itertuples():
        key = f"{r.attn} [{r.variant}]" if r.variant else r.attn
        cur = read_curve(Path(root) / r.path)
        if cur is None:
            notes.append((r.path, "no validation rows in metrics.csv: left out of the curves"))
            continue
        if not math.isfinite(r.time_per_1k_steps_s):
            notes.append((r.path, "no time_per_1k_steps_s: left out of the curves"))
            continue
        curves.setdefault(key, []).append((r.time_per_1k_steps_s, cur.assign(seed=r.seed)))
    if not curves:
        return None, notes
    names = names or {}
    col = colours(curves)
    fig = Figure(figsize=(10, max(4.0, 1.2 + 0.22 * len(curves))), layout="constrained")
    axes = fig.subplots(1, 2)
    for key in sorted(curves):
        per_step = np.mean([t for t, _ in curves[key]]) / 1000
        g = pd.concat([c for _, c in curves[key]]).groupby("step", sort=True)
        steps = np.asarray(list(g.groups), dtype=float)
        for ax, metric, scale in ((axes[0], "val/loss", 1.0), (axes[1], "val/acc", 100.0)):
            mean = g[metric].mean().to_numpy() * scale
            std = g[metric].std(ddof=1).to_numpy() * scale
            ok = np.isfinite(mean)
            label = f"{short(names.get(key, key))} ({len(curves[key])})" if ax is axes[0] else None
            ax.plot(steps[ok] * per_step, mean[ok], color=col[key], marker="o", ms=3, lw=1.2, label=label)
            band = ok & np.isfinite(std)
            if band.any():
                ax.fill_between(steps[band] * per_step, (mean - std)[band], (mean + std)[band], color=col[key],
                                alpha=0.15, lw=0)
    axes[0].set_ylabel("validation loss")
    axes[1].set_ylabel("validation accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.supxlabel("training time (s), approximated as step × the run's training time per step (evaluation excluded)",
                  fontsize=9)
    fig.legend(loc="outside center right", fontsize=8, title="attention (seeds)", title_fontsize=8)
    fig.suptitle(f"{task} ({preset}): validation against training time, mean over seeds ± std")
    return fig, notes


def efficiency_figure(summary: pd.DataFrame, preset: str, task: str, names: dict | None = None):
    """Figure or None: test accuracy against minutes per 1k steps and against peak memory."""
    s = summary[(summary["preset"] == preset) & (summary["task"] == task)]
    s = s[np.isfinite(s["test_acc_mean"].to_numpy(dtype=float))]
    if s.empty:
        return None
    names = names or {}
    col = colours(set(s["row"]))
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    acc = 100 * s["test_acc_mean"].to_numpy(dtype=float)
    acc_sd = np.nan_to_num(100 * s["test_acc_std"].to_numpy(dtype=float))
    panels = ((axes[0], "time_per_1k_steps_s", 1 / 60, "training time per 1k steps (min)"),
              (axes[1], "peak_mem_bytes", 1 / 2 ** 30, "peak training memory (GB = 2^30 bytes)"))
    for ax, field, scale, xlabel in panels:
        x = s[f"{field}_mean"].to_numpy(dtype=float) * scale
        x_sd = np.nan_to_num(s[f"{field}_std"].to_numpy(dtype=float) * scale)
        ok = np.isfinite(x)
        if ok.any():
            keys = list(s["row"].iloc[np.flatnonzero(ok)])
            ax.errorbar(x[ok], acc[ok], xerr=x_sd[ok], yerr=acc_sd[ok], fmt="none", ecolor="0.6", capsize=2, lw=0.8)
            ax.scatter(x[ok], acc[ok], c=[col[k] for k in keys], zorder=3)
            for xi, yi, key in zip(x[ok], acc[ok], keys):
                ax.annotate(short(names.get(key, key), 24), (xi, yi), textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
        if not ok.any():
            ax.text(0.5, 0.5, "no measured value in these runs\n(CPU runs record no peak memory)"
                    if field == "peak_mem_bytes" else "no measured value in these runs",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{task} ({preset}): test accuracy against cost, mean ± std over seeds")
    return fig


def plot_preset(runs: pd.DataFrame, summary: pd.DataFrame, root: Path, preset: str, out_dir: Path,
                names: dict | None = None) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every figure of one preset into ``out_dir``; returns (files, notes about runs left out)."""
    files, notes = [], []
    tasks = sorted(set(runs.loc[(runs["preset"] == preset) & runs["usable"] & runs["kept"], "task"]))
    for task in tasks:
        fig, n = curves_figure(runs, root, preset, task, names)
        notes += n
        if fig is not None:
            files += save(fig, Path(out_dir) / f"curves_{safe_name(task)}")
        fig = efficiency_figure(summary, preset, task, names)
        if fig is not None:
            files += save(fig, Path(out_dir) / f"efficiency_{safe_name(task)}")
    return files, notes
