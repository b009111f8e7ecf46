"""Figures from the run records (written by ``lra.collect`` next to the tables, PNG and PDF).

* ``curves_<task>``: validation loss and accuracy against training time, one line per run, one colour
  per attention (Skeinformer Fig. 2 / Skyformer Fig. 2). The run's ``metrics.csv`` (Lightning's
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

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lra.collect.render import write_atomic

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
    if not f.is_file():
        return None
    try:
        df = pd.read_csv(f)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    out = {}
    for name, aliases in _ALIASES.items():
        col = next((a for a in aliases if a in df.columns), None)
        out[name] = pd.to_numeric(df[col], errors="coerce") if col else pd.Series(np.nan, index=df.index)
    if "step" not in df.columns:
        return None
    cur = pd.DataFrame({"step": pd.to_numeric(df["step"], errors="coerce"), **out})
    cur = cur[cur["val/acc"].notna() | cur["val/loss"].notna()].dropna(subset=["step"])
    return cur.sort_values("step", kind="stable") if len(cur) else None


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.png and ``stem``.pdf, each written atomically."""
    paths = []
    for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
        path = Path(f"{stem}.{ext}")
        write_atomic(path, lambda tmp, ext=ext, meta=meta: fig.savefig(tmp, format=ext, metadata=meta, dpi=120))
        paths.append(path)
    return paths


def curves_figure(runs: pd.DataFrame, root: Path, preset: str, task: str, names: dict | None = None):
    """(figure or None, notes): validation loss/accuracy against approximate training time."""
    sel = runs[(runs["preset"] == preset) & (runs["task"] == task) & runs["usable"] & runs["kept"]]
    notes = []
    lines = []
    for r in sel.sort_values(["attn", "variant", "seed", "path"], kind="stable").itertuples():
        key = f"{r.attn} [{r.variant}]" if r.variant else r.attn
        cur = read_curve(Path(root) / r.path)
        if cur is None:
            notes.append((r.path, "no validation rows in metrics.csv: left out of the curves"))
            continue
        if not math.isfinite(r.time_per_1k_steps_s):
            notes.append((r.path, "no time_per_1k_steps_s: left out of the curves"))
            continue
        lines.append((key, cur["step"].to_numpy() * r.time_per_1k_steps_s / 1000, cur))
    if not lines:
        return None, notes
    names = names or {}
    col = colours({k for k, _, _ in lines})
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    seen = set()
    for key, t, cur in lines:
        label = None if key in seen else short(names.get(key, key))
        seen.add(key)
        axes[0].plot(t, cur["val/loss"].to_numpy(), color=col[key], marker="o", ms=3, lw=1.2, alpha=0.8, label=label)
        axes[1].plot(t, 100 * cur["val/acc"].to_numpy(), color=col[key], marker="o", ms=3, lw=1.2, alpha=0.8)
    axes[0].set_ylabel("validation loss")
    axes[1].set_ylabel("validation accuracy (%)")
    for ax in axes:
        ax.set_xlabel("training time (s) ≈ step × time per step (evaluation excluded)")
        ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8)
    fig.suptitle(f"{task}: validation against training time (preset {preset}; one line per seed)")
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
        for i in np.flatnonzero(ok):
            key = s["row"].iloc[i]
            ax.errorbar(x[i], acc[i], xerr=x_sd[i], yerr=acc_sd[i], fmt="o", color=col[key], capsize=3,
                        label=short(names.get(key, key)))
            ax.annotate(short(names.get(key, key), 24), (x[i], acc[i]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        if not ok.any():
            ax.text(0.5, 0.5, "no measured value in these runs\n(CPU runs record no peak memory)"
                    if field == "peak_mem_bytes" else "no measured value in these runs",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{task}: accuracy against cost (preset {preset}; mean ± std over seeds)")
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
            files += save(fig, Path(out_dir) / f"curves_{task}")
        fig = efficiency_figure(summary, preset, task, names)
        if fig is not None:
            files += save(fig, Path(out_dir) / f"efficiency_{task}")
    return files, notes
