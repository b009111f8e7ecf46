"""Figures from the run records (written by ``lra.collect`` next to the tables, PNG and PDF).

* ``curves_<task>``: validation accuracy (top) and loss (bottom) against optimizer steps (left) and
  against training time (right), one curve per attention: the mean over its seeds, band ± std
  (Skeinformer Fig. 2 / Skyformer Fig. 2). The run's ``metrics.csv`` (Lightning's CSVLogger) logs
  validation by optimizer step, not by time, so the time of each evaluation is approximated as
  ``step × time_per_1k_steps_s / 1000``: the run's average training time per step, evaluation
  excluded. Warm-up and uneven steps make early points slightly off.
* ``efficiency_<task>``: test accuracy against training minutes per 1k steps and against peak memory,
  one point per attention (mean over seeds, bars: std). Memory is the measured peak
  (``peak_mem_bytes``, GPU runs) where there is one, else the planner's estimate
  (``peak_mem_estimate_bytes``, e.g. CPU runs): filled markers are measured, hollow ones estimated.
* ``lra_chart``: the LRA paper's Figure 3 for one preset: x = training speed, y = test accuracy
  averaged over the tasks present, marker area = peak memory (measured, else estimated, as above).

Legends print the full row names (attention and override tags), wrapped, never cut. Only
matplotlib's object API is used (no pyplot state), so importing this module never changes the
backend of a notebook; files are written atomically with fixed metadata, so reruns are byte-identical.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from lra.collect.render import safe_name
from lra.files import write_atomic

PNG_META = {"Software": "lra.collect (matplotlib)"}
PDF_META = {"Creator": "lra.collect", "Producer": "matplotlib", "CreationDate": None, "ModDate": None}
_ALIASES = {"val/loss": ("val/loss", "val_loss"), "val/acc": ("val/acc", "val_acc")}
GB = 2 ** 30
MEASURED, ESTIMATED = "measured", "estimated"


def label(key: str, width: int = 90) -> str:
    """A legend label: the full row key, wrapped at ``width`` characters (override tags can be long).

    Lines break after a comma or a space (between overrides), inside a word only if it is too long."""
    lines, line = [], ""
    for token in re.split(r"(?<=[, ])", key):
        while len(token) > width:  # one override longer than a line
            lines, line, token = lines + ([line] if line else []) + [token[:width]], "", token[width:]
        if line and len(line) + len(token) > width:
            lines.append(line)
            line = ""
        line += token
    return "\n".join(lines + [line] if line else lines) or key  # "".join(lines) gives the key back


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
        if math.isfinite(vals[0]) and vals[0] >= 0 and (math.isfinite(vals[1]) or math.isfinite(vals[2])):
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


def _time_unit(seconds: float) -> tuple[float, str]:
    """(divisor, name) so that the largest time reads in s, min or h."""
    return (3600.0, "h") if seconds > 2 * 3600 else (60.0, "min") if seconds > 120 else (1.0, "s")


def _mem_unit(largest: float) -> tuple[float, str]:
    """(divisor, name): GB = 2^30 bytes, or MB = 2^20 bytes when every value is under 1 GB (tiny runs)."""
    return (2.0 ** 20, "MB") if math.isfinite(largest) and largest < GB else (float(GB), "GB")


def _legend_below(fig: Figure, handles, labels, title: str):
    """The row legend under the axes: full labels in as many columns as fit the figure's width."""
    longest = max((max(len(line) for line in lab.split("\n")) for lab in labels), default=1)
    ncol = max(1, min(len(labels), int(fig.get_figwidth() * 11 // max(longest + 4, 1))))
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=8, title=title, title_fontsize=8,
               frameon=False)


def curves_figure(runs: pd.DataFrame, root: Path, preset: str, task: str, names: dict | None = None):
    """(figure or None, notes): validation accuracy and loss against optimizer steps and training time.

    One curve per attention: the mean over its seeds at each evaluated step (band: ± std where at least
    two seeds reached that step). Time = step × the seeds' mean training time per step; a run without
    a time per step is drawn against steps only."""
    sel = runs[(runs["preset"] == preset) & (runs["task"] == task) & runs["usable"] & runs["kept"]]
    notes = []
    curves: dict[str, list] = {}
    for r in sel.sort_values(["attn", "variant", "seed", "path"], kind="stable").itertuples():
        key = f"{r.attn} [{r.variant}]" if r.variant else r.attn
        cur = read_curve(Path(root) / r.path)
        if cur is None:
            notes.append((r.path, "no validation rows in metrics.csv: left out of the curves"))
            continue
        per_step = r.time_per_1k_steps_s / 1000
        if not math.isfinite(per_step):
            notes.append((r.path, "no valid time_per_1k_steps_s: drawn against steps only, not against time"))
        curves.setdefault(key, []).append(cur.assign(seed=r.seed, time=cur["step"] * per_step))
    if not curves:
        return None, notes
    names = names or {}
    col = colours(curves)
    t_max = max((float(np.nanmax(c["time"])) for cs in curves.values() for c in cs if c["time"].notna().any()),
                default=0.0)
    t_div, t_unit = _time_unit(t_max)
    n_rows = len(curves)
    fig = Figure(figsize=(11, 7.2 + 0.22 * n_rows), layout="constrained")
    axes = fig.subplots(2, 2, sharey="row")
    handles, labels = [], []
    for key in sorted(curves):
        all_seeds = pd.concat(curves[key])
        for j, x in enumerate(("step", "time")):
            data = all_seeds if x == "step" else all_seeds[all_seeds["time"].notna()]
            if data.empty:
                continue
            g = data.groupby("step", sort=True)
            xs = (g["step"].first() if x == "step" else g["time"].mean() / t_div).to_numpy(dtype=float)
            for i, (metric, scale) in enumerate((("val/acc", 100.0), ("val/loss", 1.0))):
                ax = axes[i, j]
                mean = g[metric].mean().to_numpy() * scale
                std = g[metric].std(ddof=1).to_numpy() * scale
                ok = np.isfinite(mean)
                (line,) = ax.plot(xs[ok], mean[ok], color=col[key], marker="o", ms=3, lw=1.2)
                band = ok & np.isfinite(std)
                if band.any():
                    ax.fill_between(xs[band], (mean - std)[band], (mean + std)[band], color=col[key], alpha=0.15,
                                    lw=0)
                if i == 0 and j == 0:
                    handles.append(line)
                    labels.append(f"{label(names.get(key, key))} ({len(curves[key])} seeds)")
    axes[0, 0].set_ylabel("validation accuracy (%)")
    axes[1, 0].set_ylabel("validation loss")
    axes[1, 0].set_xlabel("optimizer step")
    axes[1, 1].set_xlabel(f"training time ({t_unit}) ≈ step × the run's training time per step")
    axes[0, 0].set_title("against optimizer steps", fontsize=10)
    axes[0, 1].set_title("against training time (evaluation excluded)", fontsize=10)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    _legend_below(fig, handles, labels, "attention (seeds averaged); band: ± std over seeds")
    fig.suptitle(f"{task} ({preset}): validation accuracy and loss, mean over seeds ± std")
    return fig, notes


def memory(frame: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Per summary row: (peak memory in bytes, its source). The measured mean where there is one,
    else the estimate's mean (``measured`` / ``estimated``); NaN and ``""`` where neither."""
    meas = frame["peak_mem_bytes_mean"].to_numpy(dtype=float)
    est = frame["peak_mem_estimate_bytes_mean"].to_numpy(dtype=float)
    value = np.where(np.isfinite(meas), meas, est)
    source = [MEASURED if math.isfinite(m) else ESTIMATED if math.isfinite(e) else "" for m, e in zip(meas, est)]
    return value, source


def _scatter_by_source(ax, x, y, colours_, sources, sizes=None):
    """Filled markers for measured memory, hollow for estimated (or unknown) memory."""
    for src, filled in ((MEASURED, True), (ESTIMATED, False), ("", False)):
        idx = [i for i, s in enumerate(sources) if s == src]
        if not idx:
            continue
        c = [colours_[i] for i in idx]
        s = None if sizes is None else np.asarray(sizes)[idx]
        if filled:
            ax.scatter(x[idx], y[idx], s=s, c=c, edgecolors="0.2", linewidths=0.6, alpha=0.85, zorder=3)
        else:
            ax.scatter(x[idx], y[idx], s=s, facecolors="none", edgecolors=c, linewidths=1.8, zorder=3)


def _source_handles(sources) -> list:
    """Legend entries that explain filled (measured) and hollow (estimated) markers, for those present."""
    out = []
    if MEASURED in sources:
        out.append(Line2D([], [], ls="", marker="o", ms=8, mfc="0.5", mec="0.2",
                          label="memory measured (peak_mem_bytes)"))
    if ESTIMATED in sources:
        out.append(Line2D([], [], ls="", marker="o", ms=8, mfc="none", mec="0.3",
                          label="memory estimated (peak_mem_estimate_bytes)"))
    return out


def efficiency_figure(summary: pd.DataFrame, preset: str, task: str, names: dict | None = None):
    """Figure or None: test accuracy against minutes per 1k steps and against peak memory."""
    s = summary[(summary["preset"] == preset) & (summary["task"] == task)]
    s = s[np.isfinite(s["test_acc_mean"].to_numpy(dtype=float))].reset_index(drop=True)
    if s.empty:
        return None
    names = names or {}
    keys = list(s["row"])
    col = colours(set(keys))
    fig = Figure(figsize=(11, 4.4 + 0.22 * len(keys)), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    acc = 100 * s["test_acc_mean"].to_numpy(dtype=float)
    acc_sd = np.nan_to_num(100 * s["test_acc_std"].to_numpy(dtype=float))
    mem, mem_src = memory(s)
    mem_sd = np.where([src == MEASURED for src in mem_src], s["peak_mem_bytes_std"].to_numpy(dtype=float),
                      s["peak_mem_estimate_bytes_std"].to_numpy(dtype=float))
    used = [f"{mark} {src} ({field})" for mark, src, field in (("●", MEASURED, "peak_mem_bytes"),
                                                                 ("○", ESTIMATED, "peak_mem_estimate_bytes"))
            if src in mem_src]
    m_div, m_unit = _mem_unit(float(np.nanmax(mem)) if np.isfinite(mem).any() else math.nan)
    mem_label = (f"peak memory ({m_unit} = 2^{int(math.log2(m_div))} bytes)\n"
                 + ("\n".join(used) if used else "none recorded"))
    panels = ((axes[0], s["time_per_1k_steps_s_mean"].to_numpy(dtype=float) / 60,
               s["time_per_1k_steps_s_std"].to_numpy(dtype=float) / 60, ["measured"] * len(s),
               "training time per 1k steps (min)"),
              (axes[1], mem / m_div, mem_sd / m_div, mem_src, mem_label))
    for ax, x, x_sd, src, xlabel in panels:
        ok = np.isfinite(x)
        if ok.any():
            ax.errorbar(x[ok], acc[ok], xerr=np.nan_to_num(x_sd[ok]), yerr=acc_sd[ok], fmt="none", ecolor="0.6",
                        capsize=2, lw=0.8)
            idx = np.flatnonzero(ok)
            _scatter_by_source(ax, x[idx], acc[idx], [col[keys[i]] for i in idx], [src[i] for i in idx])
        else:
            ax.text(0.5, 0.5, "no run recorded this value\n(neither peak_mem_bytes nor peak_mem_estimate_bytes)"
                    if ax is axes[1] else "no run recorded this value", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.margins(0.08)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    handles = [Line2D([], [], ls="", marker="o", ms=7, color=col[k]) for k in keys]
    _legend_below(fig, handles, [label(names.get(k, k)) for k in keys], "attention")
    fig.suptitle(f"{task} ({preset}): test accuracy against cost, mean ± std over seeds")
    return fig


def lra_chart_data(summary: pd.DataFrame, preset: str) -> tuple[pd.DataFrame, str]:
    """Per attention row of ``preset``: mean test accuracy over its tasks, speed, peak memory.

    Speed is tokens/s (``tokens_per_s``) when every point has it, else optimizer steps/s
    (1000 / ``time_per_1k_steps_s``); both are the mean of the per-task means. Memory is the largest
    per-task peak memory of the row, measured where every task measured it, else estimated
    (``memory``). Returns (one row per attention, speed unit)."""
    s = summary[(summary["preset"] == preset)].copy()
    s = s[np.isfinite(s["test_acc_mean"].to_numpy(dtype=float))]
    if s.empty:
        return pd.DataFrame(), ""
    s["mem"], s["mem_src"] = memory(s)
    s["steps_per_s"] = 1000 / s["time_per_1k_steps_s_mean"]
    tokens = np.isfinite(s["tokens_per_s_mean"].to_numpy(dtype=float)).all()
    speed_col, unit = ("tokens_per_s_mean", "tokens/s") if tokens else ("steps_per_s", "steps/s")
    tasks_all = sorted(set(s["task"]))
    rows = []
    for key, g in s.groupby("row", sort=True):
        measured = (g["mem_src"] == MEASURED).all()
        if measured:
            mem = g["mem"].max()
        else:  # one source per point: the estimates of all its tasks (measured only where none was estimated)
            e = g["peak_mem_estimate_bytes_mean"].to_numpy(dtype=float)
            vals = np.where(np.isfinite(e), e, g["mem"].to_numpy(dtype=float))
            mem = float(np.nanmax(vals)) if np.isfinite(vals).any() else math.nan
        speed = g[speed_col].to_numpy(dtype=float)
        rows.append({"row": key, "acc": 100 * g["test_acc_mean"].mean(), "speed": np.nanmean(speed)
                     if np.isfinite(speed).any() else math.nan, "mem": mem,
                     "mem_src": MEASURED if measured else ESTIMATED if math.isfinite(mem) else "",
                     "tasks": len(g), "of": len(tasks_all), "task_list": ",".join(sorted(g["task"]))})
    return pd.DataFrame(rows), unit


def lra_chart_figure(summary: pd.DataFrame, preset: str, names: dict | None = None):
    """(figure or None, notes): the LRA paper's Figure 3 — accuracy against speed, area = peak memory."""
    d, unit = lra_chart_data(summary, preset)
    notes = []
    if d.empty:
        return None, notes
    names = names or {}
    for r in d[~np.isfinite(d["speed"])].itertuples():
        notes.append((f"{preset} {r.row}", f"no valid {unit} in its runs: left out of the LRA chart"))
    d = d[np.isfinite(d["speed"])].reset_index(drop=True)
    if d.empty:
        return None, notes
    col = colours(set(d["row"]))
    tasks_all = sorted(set(summary.loc[summary["preset"] == preset, "task"]))
    fig = Figure(figsize=(10, 5.6 + 0.22 * len(d)), layout="constrained")
    ax = fig.subplots()
    mem = d["mem"].to_numpy(dtype=float)
    top = np.nanmax(mem) if np.isfinite(mem).any() else math.nan
    # marker AREA proportional to memory, as in LRA Fig. 3; a point without any memory value: a small ring
    area = np.where(np.isfinite(mem), 1600 * mem / top if math.isfinite(top) and top > 0 else 80, 40)
    area = np.maximum(area, 12)
    x, y = d["speed"].to_numpy(dtype=float), d["acc"].to_numpy(dtype=float)
    _scatter_by_source(ax, x, y, [col[k] for k in d["row"]], list(d["mem_src"]), sizes=area)
    if x.max() > 10 * x.min() > 0:
        ax.set_xscale("log")
    ax.margins(0.15)
    ax.set_xlabel(f"training speed ({unit}; mean over the tasks of each point)")
    ax.set_ylabel("test accuracy (%), average over the tasks present")
    ax.grid(alpha=0.3)
    size_handles = []
    if math.isfinite(top) and top > 0:
        m_div, m_unit = _mem_unit(top)
        for frac in (1.0, 0.5, 0.25):
            size_handles.append(Line2D([], [], ls="", marker="o", mfc="0.85", mec="0.4",
                                       ms=math.sqrt(1600 * frac), label=f"{top * frac / m_div:.3g} {m_unit}"))
    leg_handles = _source_handles(set(d["mem_src"])) + size_handles
    if leg_handles:
        ax.legend(handles=leg_handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, labelspacing=2.6,
                  borderpad=1.2, handlelength=3.0, handletextpad=1.2, title="peak memory (marker area)", title_fontsize=8,
                  frameon=False)
    handles = [Line2D([], [], ls="", marker="o", ms=7, color=col[k]) for k in d["row"]]
    labels = [label(names.get(r.row, r.row) + ("" if r.tasks == r.of else f" ({r.tasks} of {r.of} tasks: "
                                                f"{r.task_list})")) for r in d.itertuples()]
    _legend_below(fig, handles, labels, "attention")
    fig.suptitle(f"{preset}: accuracy, speed and memory (LRA Fig. 3); tasks: {', '.join(tasks_all)}")
    return fig, notes


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
    fig, n = lra_chart_figure(summary, preset, names)
    notes += n
    if fig is not None:
        files += save(fig, Path(out_dir) / "lra_chart")
    return files, notes
