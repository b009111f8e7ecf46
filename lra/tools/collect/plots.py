"""Figures from the run records (written by ``lra.tools.collect`` next to the tables, PNG and PDF).

Rows carry the tables' labels (``lra.tools.collect.rows.labels``: the papers' names, "Standard", "Skeinformer
w/o row normalization", with the changed keys or the run's name), memory reads in GiB (2^30 bytes) or
MiB, and no figure prints a record's field name.

* ``curves_<task>``: validation accuracy (top) and loss (bottom) against optimizer steps (left) and
  against training time (right), one curve per attention: the mean over its seeds, band ± std
  (Skeinformer Fig. 2 / Skyformer Fig. 2). The time of an evaluation is the ``time/train_s`` column
  of the run's ``metrics.csv``: training seconds up to that evaluation, evaluation excluded, summed
  over resumed restarts. Older records lack that column: their time is approximated as
  ``step × time_per_1k_steps_s / 1000``, their curves are dashed on the time panels, the legend and
  the axis say so, and each such run is reported (``plot`` issue).
* ``efficiency_<task>``: test accuracy against training minutes per 1k steps and against peak memory,
  one labelled point per attention (mean over seeds, bars: std). Memory is the measured peak (GPU
  runs) where there is one, else the planner's estimate (e.g. CPU runs): filled markers are
  measured, hollow ones estimated.
* ``lra_chart``: the LRA paper's Figure 3 (``lra.tools.collect.chart``): speed relative to the softmax
  row on the same task (geometric mean over tasks), test accuracy averaged over tasks with its 95%
  t-interval over seeds, marker area = peak memory, labels next to the points.

Only matplotlib's object API is used (no pyplot state), so importing this module never changes the
backend of a notebook; files are written atomically with fixed metadata, so reruns are byte-identical.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lra.tools.collect.chart import lra_chart_data, lra_chart_figure
from lra.tools.collect.drawing import (
    ESTIMATED,
    MEASURED,
    colours,
    full_names_legend,
    label,
    legend_below,
    mem_unit,
    memory,
    place_labels,
    preset_rows,
    readable_names,
    save,
    scatter_by_source,
    shorts,
    task_name,
    time_unit,
)
from lra.tools.collect.render import safe_name
from lra.tools.collect.rows import assign
from lra.tools.collect.rows import labels as row_labels

__all__ = [
    "colours",
    "curves_figure",
    "efficiency_figure",
    "label",
    "lra_chart_data",
    "lra_chart_figure",
    "memory",
    "plot_preset",
    "read_curve",
    "readable_names",
    "save",
]
_ALIASES = {
    "val/loss": ("val/loss", "val_loss"),
    "val/acc": ("val/acc", "val_acc"),
    "time": ("time/train_s", "time_train_s"),
}
APPROX = "approximated"


def read_curve(run_dir: Path) -> pd.DataFrame | None:
    """Validation rows of a run's metrics.csv as columns step, val/loss, val/acc, time; None if unusable.

    ``time`` is the row's ``time/train_s`` (training seconds up to that evaluation), taken from another
    row of the same step where the validation row lacks it; NaN where the file has none."""
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
    if idx["val/loss"] is None and idx["val/acc"] is None:
        return None
    i_step = head.index("step")
    by_step = {}
    for r in rows[1:]:
        step, t = _float(r, i_step), _float(r, idx["time"])
        if math.isfinite(step) and math.isfinite(t) and t >= 0:
            by_step[step] = t
    out = []
    for r in rows[1:]:
        vals = [_float(r, i_step)] + [_float(r, idx[k]) for k in ("val/loss", "val/acc", "time")]
        if math.isfinite(vals[0]) and vals[0] >= 0 and (math.isfinite(vals[1]) or math.isfinite(vals[2])):
            if not (math.isfinite(vals[3]) and vals[3] >= 0):
                vals[3] = by_step.get(vals[0], math.nan)
            out.append(vals)
    if not out:
        return None
    return pd.DataFrame(out, columns=["step", "val/loss", "val/acc", "time"]).sort_values("step", kind="stable")


def _float(row: list, i: int | None) -> float:
    if i is None or i >= len(row) or not row[i]:
        return math.nan
    try:
        return float(row[i])
    except ValueError:
        return math.nan


def _run_curve(r, root: Path, notes: list) -> tuple[pd.DataFrame | None, str]:
    """(validation rows of run ``r`` with its time, time source: measured, approximated or "")."""
    cur = read_curve(Path(root) / r.path)
    if cur is None:
        notes.append((r.path, "no validation rows in metrics.csv: left out of the curves"))
        return None, ""
    has = cur["time"].notna()
    if has.any():
        if not has.all():
            notes.append(
                (
                    r.path,
                    (
                        f"{int((~has).sum())} of {len(cur)} validation rows of metrics.csv without "
                        f"time/train_s: left out of the time panels of the curves"
                    ),
                )
            )
        return cur, MEASURED
    per_step = r.time_per_1k_steps_s / 1000
    if not math.isfinite(per_step):
        notes.append(
            (
                r.path,
                (
                    "metrics.csv has no time/train_s and the record no valid time_per_1k_steps_s: "
                    "drawn against steps only, not against time"
                ),
            )
        )
        return cur, ""
    notes.append(
        (
            r.path,
            (
                "metrics.csv has no time/train_s (older record): its training-time axis in the curves "
                "is approximated as step × time_per_1k_steps_s / 1000 (dashed)"
            ),
        )
    )
    return cur.assign(time=cur["step"] * per_step), APPROX


def _time_label(unit: str, sources: set) -> str:
    if sources == {MEASURED}:
        return f"training time ({unit}), measured at each evaluation\n(evaluation excluded)"
    if sources == {APPROX}:
        return (
            f"training time ({unit}) ≈ step × mean time per step\n(approximated: these records did not "
            f"log the time of each evaluation)"
        )
    return (
        f"training time ({unit}); solid: measured at each evaluation;\ndashed: ≈ step × mean time per "
        f"step (older records without that time)"
    )


def curves_figure(
    runs: pd.DataFrame, root: Path, preset: str, task: str, names: dict | None = None, trials: bool = False
):
    """(figure or None, notes): validation accuracy and loss against optimizer steps and training time.

    One curve per attention: the mean over its seeds at each evaluated step (band: ± std where at least
    two seeds reached that step). Time = the measured training time of each evaluation (``time/train_s``),
    or for older runs step × their mean training time per step (dashed, and said in legend and axis);
    a run with neither is drawn against steps only."""
    sel, infos = assign(runs[runs["preset"] == preset], trials=trials)
    sel = sel[sel["task"] == task]
    notes = []
    curves: dict[str, list] = {}
    sources: dict[str, list] = {}
    for r in sel.sort_values(["row", "seed", "path"], kind="stable").itertuples():
        key = r.row
        cur, src = _run_curve(r, root, notes)
        if cur is not None:
            curves.setdefault(key, []).append(cur.assign(seed=r.seed))
            sources.setdefault(key, []).append(src)
    if not curves:
        return None, notes
    names = {**row_labels(infos)[0], **(names or {})}
    col = colours(preset_rows(runs, preset, trials))
    t_max = max(
        (float(np.nanmax(c["time"])) for cs in curves.values() for c in cs if c["time"].notna().any()), default=0.0
    )
    t_div, t_unit = time_unit(t_max)
    fig = Figure(figsize=(11, 7.2 + 0.22 * len(curves)), layout="constrained")
    axes = fig.subplots(2, 2, sharey="row")
    handles, labels, used = [], [], set()
    for key in sorted(curves, key=lambda k: (names.get(k, k).casefold(), k)):
        all_seeds = pd.concat(curves[key])
        timed = [s for s in sources[key] if s]
        approx = APPROX in timed
        used |= set(timed)
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
                (line,) = ax.plot(
                    xs[ok],
                    mean[ok],
                    color=col[key],
                    marker="o",
                    ms=3,
                    lw=1.2,
                    ls="--" if x == "time" and approx else "-",
                )
                band = ok & np.isfinite(std)
                if band.any():
                    ax.fill_between(xs[band], (mean - std)[band], (mean + std)[band], color=col[key], alpha=0.15, lw=0)
                if i == 0 and j == 0:
                    handles.append(line)
        n = len(curves[key])
        why = (
            ""
            if not approx
            else "; time approximated" + ("" if set(timed) == {APPROX} else f" for {timed.count(APPROX)} of {n} seeds")
        )
        why += (
            ""
            if len(timed) == n
            else "; no training time"
            if not timed
            else f"; {n - len(timed)} of {n} seeds without training time"
        )
        labels.append(f"{label(names.get(key, key))} ({n} seed{'s' if n > 1 else ''}{why})")
    for i in range(2):
        if not used:
            axes[i, 1].text(
                0.5,
                0.5,
                "no run recorded a training time",
                ha="center",
                va="center",
                transform=axes[i, 1].transAxes,
                color="0.4",
            )
    axes[0, 0].set_ylabel("validation accuracy (%)")
    axes[1, 0].set_ylabel("validation loss")
    axes[1, 0].set_xlabel("optimizer step")
    axes[1, 1].set_xlabel(_time_label(t_unit, used) if used else "training time")
    axes[0, 0].set_title("against optimizer steps", fontsize=10)
    axes[0, 1].set_title("against training time (evaluation excluded)", fontsize=10)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    legend_below(fig, handles, labels, "attention (seeds averaged); band: ± std over seeds")
    fig.suptitle(f"{task_name(task)} ({preset}): validation accuracy and loss, mean over seeds ± std")
    return fig, notes


def efficiency_figure(summary: pd.DataFrame, preset: str, task: str, names: dict | None = None):
    """Figure or None: test accuracy against minutes per 1k steps and against peak memory."""
    s = summary[(summary["preset"] == preset) & (summary["task"] == task)]
    s = s[np.isfinite(s["test_acc_mean"].to_numpy(dtype=float))].reset_index(drop=True)
    if s.empty:
        return None
    keys = list(s["row"])
    names = {**dict(zip(s["row"], s["label"])), **(names or {})}  # the tables' labels (lra.tools.collect.rows)
    col = colours(preset_rows(summary, preset))
    fig = Figure(figsize=(12, 5.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    acc = 100 * s["test_acc_mean"].to_numpy(dtype=float)
    acc_sd = 100 * s["test_acc_std"].to_numpy(dtype=float)
    mem, mem_src = memory(s)
    mem_sd = np.where(
        [src == MEASURED for src in mem_src],
        s["peak_mem_bytes_std"].to_numpy(dtype=float),
        s["peak_mem_estimate_bytes_std"].to_numpy(dtype=float),
    )
    used = [
        text
        for src, text in (
            (MEASURED, "filled: measured"),
            (ESTIMATED, "hollow: estimated by the planner (no measurement, e.g. CPU runs)"),
        )
        if src in mem_src
    ]
    m_div, m_unit = mem_unit(float(np.nanmax(mem)) if np.isfinite(mem).any() else math.nan)
    panels = (
        (
            axes[0],
            s["time_per_1k_steps_s_mean"].to_numpy(dtype=float) / 60,
            s["time_per_1k_steps_s_std"].to_numpy(dtype=float) / 60,
            [MEASURED] * len(s),
            "training time per 1,000 optimizer steps (min), evaluation excluded",
            "no run recorded its time",
        ),
        (
            axes[1],
            mem / m_div,
            mem_sd / m_div,
            mem_src,
            f"peak memory ({m_unit})\n" + "; ".join(used),
            "no run recorded its peak memory\n(neither measured nor estimated)",
        ),
    )
    seeds = s["test_acc_n"].to_numpy(dtype=int)
    points = shorts({k: names[k] for k in keys})
    texts = [points[k] + ("" if n > 1 else " (1 seed)") for k, n in zip(keys, seeds)]
    for ax, x, x_sd, src, xlabel, empty in panels:
        ok = np.isfinite(x)
        idx = np.flatnonzero(ok)
        if ok.any():
            eb = ok & (np.isfinite(acc_sd) | np.isfinite(x_sd))  # one seed: no bar (not a bar of zero)
            if eb.any():
                ax.errorbar(
                    x[eb],
                    acc[eb],
                    xerr=np.nan_to_num(x_sd[eb]),
                    yerr=np.nan_to_num(acc_sd[eb]),
                    fmt="none",
                    ecolor="0.6",
                    capsize=2,
                    lw=0.8,
                )
            scatter_by_source(
                ax, x[idx], acc[idx], [col[keys[i]] for i in idx], [src[i] for i in idx], sizes=[49] * len(idx)
            )
        else:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.set_xlabel(xlabel if ok.any() else xlabel.split("\n")[0])
        ax.margins(0.2)
        if ok.any():
            ax.set_xlim(left=0)  # a time or a memory: the axis starts at zero, never below
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    full_names_legend(fig, keys, names, col)
    load = (
        ""
        if not s["loaded"].astype(bool).any()
        else (
            "\ntimes taken on a shared or busy machine" + ("" if s["loaded"].astype(bool).all() else " for some points")
        )
    )
    fig.suptitle(
        f"{task_name(task)} ({preset}): test accuracy against cost; points: mean over seeds, "
        f"bars: ± std over seeds" + load
    )
    for ax, x, *_ in panels:
        idx = np.flatnonzero(np.isfinite(x))
        place_labels(
            ax, x[idx], acc[idx], [texts[i] for i in idx], sizes=[49] * len(idx), edge=[col[keys[i]] for i in idx]
        )
    return fig


def plot_preset(
    runs: pd.DataFrame,
    summary: pd.DataFrame,
    root: Path,
    preset: str,
    out_dir: Path,
    names: dict | None = None,
    trials: bool = False,
) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every figure of one preset into ``out_dir``; returns (files, notes about runs left out).

    ``names``: {row key: printed name} over the tables' labels (``summary["label"]``); ``trials``: search
    trials are rows (as ``summary`` was built). Text from the records (names, presets) is drawn as written:
    no ``$...$`` mathtext, which would render a ``$`` in a backend's name as math or fail on it."""
    files, notes = [], []
    tasks = sorted(set(runs.loc[(runs["preset"] == preset) & runs["usable"] & runs["kept"], "task"]))
    with matplotlib.rc_context({"text.parse_math": False}):
        for task in tasks:
            fig, n = curves_figure(runs, root, preset, task, names, trials)
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
