"""The LRA chart of one preset, drawn as the LRA paper draws it (Tay et al. 2021, Fig. 3).

One point per attention row: x = speed relative to the Standard (softmax) row on the same task, so
at that task's sequence length (the row's speed divided by softmax's, per task, then the geometric
mean over the tasks both have: a mean of ratios); y = test accuracy averaged over the row's tasks,
with its 95% t-interval over seeds; marker area = peak memory (GiB), filled where measured, hollow
where only estimated. Labels are written next to the points. A preset without a softmax row falls
back to absolute speed (geometric mean over tasks), and the axis says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from lra.tools.collect.drawing import (
    ESTIMATED,
    MEASURED,
    SOFTMAX,
    colours,
    full_names_legend,
    mem_unit,
    memory,
    place_labels,
    preset_rows,
    scatter_by_source,
    shorts,
    source_handles,
    task_name,
)
from lra.tools.collect.stats import MIN_SEEDS, clip, mean_of_means_half_width

BUBBLE = 1600.0  # marker area (pt²) of the largest memory


def _geomean(v: np.ndarray) -> float:
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.mean(np.log(v)))) if v.size else math.nan


def lra_chart_data(summary: pd.DataFrame, preset: str) -> tuple[pd.DataFrame, str, str]:
    """(one row per table row of ``preset``, speed unit, reference attention or "").

    Columns: ``acc`` (mean over the row's tasks of the per-task mean test accuracy, %), ``acc_lo``/``acc_hi``
    (its 95% interval over seeds, cut to [0, 100]; nan under MIN_SEEDS seeds), ``seeds`` (fewest seeds of a
    task), ``speed`` (geometric mean over tasks of the absolute speed), ``rel`` (geometric mean over tasks of
    speed ÷ the speed of the row's baseline, Standard under the same settings, on that task and the same
    device; 1 for a Standard row), ``rel_tasks`` (tasks in that mean), ``x`` (``rel`` when the preset has a
    Standard row, else ``speed``), ``loaded`` (a run timed on a shared or busy machine), ``mem``/``mem_src``,
    ``tasks``/``of``/``task_list``. Speed is tokens/s when every point has it, else optimizer steps/s."""
    s = summary[(summary["preset"] == preset)].copy()
    s = s[np.isfinite(s["test_acc_mean"].to_numpy(dtype=float))]
    if s.empty:
        return pd.DataFrame(), "", ""
    s["mem"], s["mem_src"] = memory(s)
    s["steps_per_s"] = 1000 / s["time_per_1k_steps_s_mean"]
    tokens = np.isfinite(s["tokens_per_s_mean"].to_numpy(dtype=float)).all()
    speed_col, unit = ("tokens_per_s_mean", "tokens/s") if tokens else ("steps_per_s", "steps/s")
    by = {(t, k): (float(v), d) for t, k, v, d in zip(s["task"], s["row"], s[speed_col], s["device"])}
    ref = SOFTMAX if (s["attn"] == SOFTMAX).any() else ""  # else: absolute speed
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
        base = g["base"].iloc[0] or (key if g["attn"].iloc[0] == SOFTMAX else "")
        ratio = np.array(
            [
                sp / by[(t, base)][0] if (t, base) in by and by[(t, base)][1] == d else math.nan
                for t, sp, d in zip(g["task"], speed, g["device"])
            ],
            dtype=float,
        )
        n = g["test_acc_n"].to_numpy(dtype=float)
        acc = 100 * g["test_acc_mean"].mean()
        half = (
            100 * mean_of_means_half_width(g["test_acc_std"].to_numpy(dtype=float), n)
            if n.min() >= MIN_SEEDS
            else math.nan
        )
        lo, hi = clip(acc - half, acc + half, 0.0, 100.0)
        rows.append(
            {
                "row": key,
                "acc": acc,
                "acc_lo": lo,
                "acc_hi": hi,
                "seeds": int(n.min()),
                "speed": _geomean(speed),
                "rel": _geomean(ratio),
                "base": base,
                "rel_tasks": int(np.sum(np.isfinite(ratio) & (ratio > 0))),
                "mem": mem,
                "mem_src": MEASURED if measured else ESTIMATED if math.isfinite(mem) else "",
                "loaded": bool(g["loaded"].astype(bool).any()),
                "tasks": len(g),
                "of": len(tasks_all),
                "task_list": ",".join(sorted(g["task"])),
            }
        )
    d = pd.DataFrame(rows)
    d["x"] = d["rel"] if ref else d["speed"]
    return d, unit, ref


def _x_label(unit: str, ref: str, names: dict) -> str:
    if ref:
        r = names.get(ref, ref)
        return (
            f"speed relative to {r} under the same settings, task and device: {unit} ÷ {r}'s {unit},\n"
            f"geometric mean over tasks; 1 = as fast as {r}, 2 = twice as fast"
        )
    return (
        f"training speed ({unit}), geometric mean over tasks; absolute, not relative:\n"
        f"this preset has no Standard (softmax) row with a valid speed to divide by"
    )


def lra_chart_figure(summary: pd.DataFrame, preset: str, names: dict | None = None):
    """(figure or None, notes): accuracy against relative speed, marker area = peak memory."""
    d, unit, ref = lra_chart_data(summary, preset)
    notes = []
    if d.empty:
        return None, notes
    s = summary[summary["preset"] == preset]
    names = {**dict(zip(s["row"], s["label"])), **(names or {})}  # the tables' labels (lra.tools.collect.rows)
    for r in d[~np.isfinite(d["x"])].itertuples():
        why = (
            f"no {names.get(ref, ref)} run under the same settings to divide by"
            if ref and not r.base
            else f"no task where both it and its {names.get(ref, ref)} have a valid speed ({unit}) on the same device"
            if ref and math.isfinite(r.speed)
            else f"no valid speed ({unit}) in its runs"
        )
        notes.append((f"{preset} {r.row}", f"{why}: left out of the LRA chart"))
    for r in d[np.isfinite(d["x"]) & (d["rel_tasks"] < d["tasks"])].itertuples():
        if ref:
            notes.append(
                (
                    f"{preset} {r.row}",
                    (
                        f"LRA chart: relative speed over {r.rel_tasks} of its {r.tasks} "
                        f"tasks (the others lack a speed of it or of {names.get(ref, ref)})"
                    ),
                )
            )
    d = d[np.isfinite(d["x"])].reset_index(drop=True)
    if d.empty:
        return None, notes
    col = colours(preset_rows(summary, preset))
    tasks_all = sorted(set(summary.loc[summary["preset"] == preset, "task"]))
    fig = Figure(figsize=(11, 6.4), layout="constrained")
    ax = fig.subplots()
    mem = d["mem"].to_numpy(dtype=float)
    top = np.nanmax(mem) if np.isfinite(mem).any() else math.nan
    # marker AREA proportional to memory, as in LRA Fig. 3; a point without any memory value: a small ring
    area = np.where(np.isfinite(mem), BUBBLE * mem / top if math.isfinite(top) and top > 0 else 80, 40)
    area = np.maximum(area, 12)
    x, y = d["x"].to_numpy(dtype=float), d["acc"].to_numpy(dtype=float)
    lo, hi = d["acc_lo"].to_numpy(dtype=float), d["acc_hi"].to_numpy(dtype=float)
    bars = np.isfinite(lo) & np.isfinite(hi)
    if bars.any():  # cut to [0, 100]: an interval never shows an accuracy that cannot be
        ax.errorbar(
            x[bars],
            y[bars],
            yerr=[y[bars] - lo[bars], hi[bars] - y[bars]],
            fmt="none",
            ecolor="0.25",
            capsize=3,
            lw=0.9,
            zorder=4,
        )
    scatter_by_source(ax, x, y, [col[k] for k in d["row"]], list(d["mem_src"]), sizes=area)
    if ref:
        ax.axvline(1.0, color="0.6", ls=":", lw=0.9, zorder=1)
    if x.max() > 10 * x.min() > 0:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.margins(0.18)
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, 0.0), min(high, 100.0))
    ax.set_xlabel(_x_label(unit, ref, names))
    ax.set_ylabel(
        "test accuracy (%), average over the row's tasks\n"
        + ("bars: 95% t-interval over seeds" if bars.any() else f"no interval: fewer than {MIN_SEEDS} seeds")
    )
    ax.grid(alpha=0.3)
    leg = source_handles(set(d["mem_src"]))
    if math.isfinite(top) and top > 0:
        m_div, m_unit = mem_unit(top)
        for frac in (1.0, 0.5, 0.25):
            leg.append(
                Line2D(
                    [],
                    [],
                    ls="",
                    marker="o",
                    mfc="0.85",
                    mec="0.4",
                    ms=math.sqrt(BUBBLE * frac),
                    label=f"{top * frac / m_div:.3g} {m_unit}",
                )
            )
    if bars.any():
        leg.append(Line2D([], [], color="0.25", marker="_", ms=8, lw=0.9, label="95% t-interval\nover seeds"))
    if (d["tasks"] < d["of"]).any():
        leg.append(Line2D([], [], ls="", label="(k of n tasks): averaged over\nfewer tasks, not comparable"))
    ax.legend(
        handles=leg,
        loc="upper left",
        bbox_to_anchor=(1.02, 1),
        fontsize=8,
        labelspacing=2.4,
        borderpad=1.0,
        handlelength=3.0,
        handletextpad=1.2,
        title="peak memory = marker area",
        title_fontsize=8,
        frameon=False,
    )
    all_loaded = bool(d["loaded"].all())  # said once in the title instead of at every point
    texts, points = [], shorts({k: names.get(k, k) for k in d["row"]})
    for r in d.itertuples():
        t = points[r.row]
        extra = (
            ([] if r.tasks == r.of else [f"{r.tasks} of {r.of} tasks"])
            + ([] if r.seeds > 1 else ["1 seed"])
            + (["timed under load"] if r.loaded and not all_loaded else [])
        )
        texts.append(f"{t} ({', '.join(extra)})" if extra else t)
    place_labels(ax, x, y, texts, sizes=area, edge=[col[k] for k in d["row"]])
    full_names_legend(fig, list(d["row"]), names, col)
    seeds = sorted(set(d["seeds"]))
    fig.suptitle(
        f"{preset}: accuracy, {'relative ' if ref else ''}speed and memory, as LRA (Tay et al. 2021) Fig. 3\n"
        f"tasks: {', '.join(task_name(t) for t in tasks_all)}; seeds per point: "
        f"{', '.join(map(str, seeds))}" + ("; every point timed on a shared or busy machine" if all_loaded else ""),
        fontsize=11,
    )
    return fig, notes
