"""The papers' tables: their rows, columns and units, our per-cell statistics, and the papers' numbers.

Each ``TableSpec`` lays a table out as its paper does (row order and names, column order and names);
``build`` fills it from the usable runs of one preset: every cell is mean ± sample std (ddof 1) over
the seeds of that task × attention, with the number of seeds that had a finite value and the 95%
t-interval of the mean (none with one seed). Backends the paper did not run (and runs made with extra
overrides, shown as ``name [override]``) are appended after the paper's rows; tasks the paper did not
use are appended after its columns. The Average column is the mean of our per-task means over the
paper's tasks, shown only when every one of them has a value; it has an interval only when every task
has the same seeds (then it is the t-interval of the per-seed averages).

Each measured cell is also compared, by Welch's 95% interval of the difference of means, with the same
column of the Standard row (``softmax``), and with ``compare`` against the paper's value (does our
interval cover it). lra/collect/stats.py holds the statistics; lra/collect/render.py the marks.

The papers' published numbers live in ``lra/paper_results.csv`` (one row per cell, with its source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from lra.display import SKEIN_ROWS, SKEIN_TASKS, SKY_ROWS, YOSO_ROWS

from lra.collect.stats import (
    NOT_TESTABLE,
    half_width,
    t_interval,
    verdict,
    welch_interval,
)

PAPER_CSV = Path(__file__).resolve().parents[1] / "paper_results.csv"
BASELINE = "softmax"   # the row every other row is compared with (Standard / Self-Attention / softmax)
ONE_SEED = "one seed"                 # Cell.ci_note: why a cell has no interval
SEEDS_DIFFER = "seeds differ by task"  # an Average whose tasks do not share their seeds


@dataclass(frozen=True)
class Metric:
    field: str          # run-record field
    scale: float        # table unit = field * scale
    decimals: int
    higher_better: bool
    setting: bool = False  # a setting (batch, accumulation), shown as its value(s), not mean ± std
    label: str = ""


METRICS = {
    "acc": Metric("test_acc", 100.0, 2, True, label="test accuracy (%)"),
    "steps_k": Metric("steps", 1e-3, 2, False, label="training steps (k)"),
    "min_per_1k": Metric("time_per_1k_steps_s", 1 / 60, 2, False, label="training minutes per 1k steps"),
    "train_min": Metric("train_time_s", 1 / 60, 2, False, label="total training time (min)"),
    "hours": Metric("train_time_s", 1 / 3600, 2, False, label="training time (h)"),
    "mem_gb": Metric("peak_mem_bytes", 1 / 2 ** 30, 2, False,
                     label="peak memory (GiB = 2^30 bytes, what the paper's table calls GB)"),
    "accum": Metric("accum_steps", 1.0, 0, False, setting=True, label="gradient accumulation steps"),
    "batch": Metric("micro_batch", 1.0, 0, True, setting=True, label="actual (micro-)batch"),
}

SKY_ABBR = (("text", "TC"), ("listops", "LO"), ("retrieval", "RE"), ("pathfinder", "PF"), ("image", "IC"))
YOSO_TASKS = (("listops", "listops"), ("text", "text"), ("retrieval", "retrieval"), ("image", "image"),
              ("pathfinder", "pathfinder"))
PAPERS = {"skeinformer": "Skeinformer (Chen, Zeng et al., arXiv:2112.05359v1)",
          "skyformer": "Skyformer (Chen, Zeng et al., NeurIPS 2021)",
          "yoso": "YOSO (Zeng et al., ICML 2021)"}


@dataclass(frozen=True)
class TableSpec:
    key: str                     # file stem and label
    paper: str                   # key of PAPERS
    table: str                   # "table1" ... as in paper_results.csv
    caption: str
    rows: tuple                  # ((attn label, paper's row name), ...)
    tasks: tuple                 # ((task, header), ...)
    metrics: tuple               # ((metric key, header), ...)
    group_by: str = "task"       # with several metrics: "task" (task over metrics) or "metric"
    average: str | None = None   # header of the average column, if the paper has one

    @property
    def title(self) -> str:
        return f"{PAPERS[self.paper].split(' (')[0]} Table {self.table[5:]}"


TABLES = (
    TableSpec("skeinformer_table1", "skeinformer", "table1",
              "Classification accuracy (%) on the test sets of LRA", SKEIN_ROWS, SKEIN_TASKS,
              (("acc", ""),), average="Average"),
    TableSpec("skeinformer_table2", "skeinformer", "table2",
              "Training steps (k), training time (minutes) per thousand steps, and batch accumulation steps",
              SKEIN_ROWS, SKEIN_TASKS, (("steps_k", "step"), ("min_per_1k", "time"), ("accum", "accu"))),
    TableSpec("skeinformer_table3", "skeinformer", "table3", "Training steps (k) and total training time (minutes)",
              SKEIN_ROWS, SKEIN_TASKS, (("steps_k", "steps"), ("train_min", "time"))),
    TableSpec("skeinformer_table4", "skeinformer", "table4",
              "Actual batch size (bz) and gradient accumulation steps (accu)", SKEIN_ROWS, SKEIN_TASKS,
              (("batch", "bz"), ("accum", "accu"))),
    TableSpec("skyformer_table1", "skyformer", "table1", "Classification accuracy (%) on LRA", SKY_ROWS,
              SKEIN_TASKS, (("acc", ""),), average="AVG."),
    TableSpec("skyformer_table2", "skyformer", "table2",
              "Training time (hours) and peak memory usage (GB)", SKY_ROWS, SKY_ABBR,
              (("hours", "Time (h)"), ("mem_gb", "Memory (GB)")), group_by="metric"),
    TableSpec("yoso_table3", "yoso", "table3", "Test accuracy (%) on LRA, including no attention (none)",
              YOSO_ROWS, YOSO_TASKS, (("acc", ""),), average="Avg"),
)


@dataclass(frozen=True)
class Column:
    task: str          # task name, or "average"
    metric: str        # key of METRICS
    path: tuple        # header path, outer to inner, e.g. ("Text", "step") or ("ListOps",)


@dataclass
class Cell:
    """One table cell, in the table's unit. ``ci_low``/``ci_high``: the 95% t-interval of the mean over
    seeds (nan without one: ``ci_note`` says why). ``base_*``: Welch's comparison with the same column of
    the Standard row (``base_test`` is "" where it does not apply: the Standard row itself, a setting, no
    Standard cell). ``paper_test`` and ``delta_low``/``delta_high``: the comparison with the paper."""
    mean: float = math.nan
    std: float = math.nan
    n: int = 0
    values: tuple = ()            # distinct values of a setting metric
    paper: float = math.nan
    paper_text: str | None = None
    average: bool = False
    ci_low: float = math.nan
    ci_high: float = math.nan
    ci_note: str = ""             # ONE_SEED or SEEDS_DIFFER when a measured cell has no interval
    base_diff: float = math.nan   # ours - Standard's mean
    base_low: float = math.nan    # Welch 95% interval of that difference
    base_high: float = math.nan
    base_test: str = ""           # stats.CANNOT_SEPARATE / SEPARATED / NOT_TESTABLE, or "" (not compared)

    @property
    def empty(self) -> bool:
        return not math.isfinite(self.mean)

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)

    @property
    def delta(self) -> float:
        return self.mean - self.paper if math.isfinite(self.mean) and math.isfinite(self.paper) else math.nan

    @property
    def delta_low(self) -> float:
        """Low end of the delta's 95% interval: our interval shifted by the paper's value (which has no spread)."""
        return self.ci_low - self.paper if self.has_ci and math.isfinite(self.paper) else math.nan

    @property
    def delta_high(self) -> float:
        return self.ci_high - self.paper if self.has_ci and math.isfinite(self.paper) else math.nan

    @property
    def paper_test(self) -> str:
        """Against the paper's value: CANNOT_SEPARATE (our interval covers it), SEPARATED, NOT_TESTABLE (no
        interval), or "" (no paper value, or nothing of ours)."""
        if self.empty or not math.isfinite(self.paper):
            return ""
        return verdict(self.ci_low, self.ci_high, self.paper)


@dataclass
class Row:
    key: str          # attention label (with " [variant]" for runs with extra overrides)
    name: str         # as printed: the paper's row name, or the key for rows the paper lacks
    in_paper: bool
    cells: list = field(default_factory=list)
    seeds: int = 0


@dataclass
class Built:
    spec: TableSpec
    preset: str
    columns: list
    rows: list
    compare: bool
    n_runs: int


def row_key(attn: str, variant: str) -> str:
    return f"{attn} [{variant}]" if variant else attn


@lru_cache(maxsize=1)
def paper_results() -> pd.DataFrame:
    """The papers' published numbers (lra/paper_results.csv), value kept as printed in ``text``."""
    df = pd.read_csv(PAPER_CSV, dtype=str, keep_default_na=False)
    df["text"] = df["value"]
    df["value"] = pd.to_numeric(df["value"].str.replace(",", "", regex=False))
    return df


def paper_lookup(spec: TableSpec) -> dict:
    df = paper_results()
    df = df[(df["paper"] == spec.paper) & (df["table"] == spec.table)]
    return {(r.attn, r.task, r.metric): (float(r.value), r.text) for r in df.itertuples()}


def columns(spec: TableSpec, extra_tasks: list[str]) -> list[Column]:
    tasks = list(spec.tasks) + [(t, t) for t in extra_tasks]
    cols = []
    if len(spec.metrics) == 1:
        m = spec.metrics[0][0]
        cols = [Column(t, m, (h,)) for t, h in tasks]
    elif spec.group_by == "task":
        cols = [Column(t, m, (h, mh)) for t, h in tasks for m, mh in spec.metrics]
    else:
        cols = [Column(t, m, (mh, h)) for m, mh in spec.metrics for t, h in tasks]
    if spec.average:
        cols.append(Column("average", spec.metrics[0][0], (spec.average,) + (("",) if len(spec.metrics) > 1 else ())))
    return cols


def cell_stats(runs: pd.DataFrame) -> dict:
    """{(task, row key): {field: (mean, std, n, distinct values, {seed: value})}} over usable, kept runs."""
    fields = sorted({m.field for m in METRICS.values()})
    out = {}
    ok = runs[runs["usable"] & runs["kept"]]
    for (task, attn, variant), g in ok.groupby(["task", "attn", "variant"], sort=True):
        stats = {"_seeds": int(g["seed"].nunique())}
        seeds = g["seed"].to_numpy()
        for f in fields:
            v = g[f].to_numpy(dtype=float)
            fin = np.isfinite(v)
            by_seed = {s: float(x) for s, x in zip(seeds[fin].tolist(), v[fin].tolist())}
            v = v[fin]
            n = int(v.size)
            mean = float(v.mean()) if n else math.nan
            std = float(v.std(ddof=1)) if n > 1 else math.nan
            stats[f] = (mean, std, n, tuple(sorted(set(v.tolist()))), by_seed)
        out[(task, row_key(attn, variant))] = stats
    return out


def _set_interval(cell: Cell) -> None:
    cell.ci_low, cell.ci_high = t_interval(cell.mean, cell.std, cell.n)
    cell.ci_note = "" if cell.has_ci or cell.empty else ONE_SEED


def _average(per_task: list, by_seed: list, scale: float) -> Cell:
    """The Average cell: mean of the per-task means; with an interval only when every task has the same
    seeds (two or more), then the t-interval over the per-seed averages, whose mean is that same average."""
    cell = Cell(average=True)
    means = [c.mean for c in per_task]
    if not all(math.isfinite(x) for x in means):
        return cell
    cell.mean = float(np.mean(means))
    cell.n = min(c.n for c in per_task)
    seeds = [set(b) for b in by_seed]
    if cell.n < 2:
        cell.ci_note = ONE_SEED
    elif any(s != seeds[0] for s in seeds):
        cell.ci_note = SEEDS_DIFFER
    else:
        per_seed = [float(np.mean([b[s] for b in by_seed])) * scale for s in sorted(seeds[0])]
        cell.std = float(np.std(per_seed, ddof=1))
        _set_interval(cell)
    return cell


def _compare_with_baseline(rows: list, cols: list) -> None:
    """Welch's 95% interval of (row - Standard) in every measured column of every row but Standard's."""
    base = next((r for r in rows if r.key == BASELINE), None)
    if base is None:
        return
    for row in rows:
        if row is base:
            continue
        for col, c, b in zip(cols, row.cells, base.cells):
            if METRICS[col.metric].setting or c.empty or b.empty:
                continue
            c.base_diff, c.base_low, c.base_high = welch_interval(c.mean, c.std, c.n, b.mean, b.std, b.n)
            c.base_test = verdict(c.base_low, c.base_high, 0.0)
            if c.base_test == NOT_TESTABLE:
                c.base_low = c.base_high = math.nan


def build(spec: TableSpec, runs: pd.DataFrame, preset: str, compare: bool = False,
          drop_empty: bool = False) -> Built:
    """Fill ``spec`` from the runs of ``preset`` (``runs`` holds every record; filtering happens here)."""
    runs = runs[runs["preset"] == preset]
    stats = cell_stats(runs)
    paper_tasks = [t for t, _ in spec.tasks]
    extra_tasks = sorted({t for t, _ in stats} - set(paper_tasks))
    cols = columns(spec, extra_tasks)
    paper = paper_lookup(spec) if compare else {}
    ours = sorted({k for _, k in stats})
    paper_keys = [a for a, _ in spec.rows]
    rows = [Row(a, name, True) for a, name in spec.rows]
    rows += [Row(k, k, False) for k in ours if k not in paper_keys]
    for row in rows:
        per_task = {}
        for col in cols:
            if col.task == "average":
                continue
            metric = METRICS[col.metric]
            st = stats.get((col.task, row.key), {}).get(metric.field)
            cell = Cell()
            by_seed = {}
            if st is not None and st[2]:
                mean, std, n, values, by_seed = st
                cell = Cell(mean * metric.scale, std * metric.scale, n, tuple(v * metric.scale for v in values))
                if not metric.setting:
                    _set_interval(cell)
            if row.in_paper and (row.key, col.task, col.metric) in paper:
                cell.paper, cell.paper_text = paper[(row.key, col.task, col.metric)]
            row.cells.append(cell)
            per_task[(col.task, col.metric)] = (cell, by_seed)
        row.seeds = max((s.get("_seeds", 0) for (t, k), s in stats.items() if k == row.key), default=0)
        if spec.average:
            m = spec.metrics[0][0]
            got = [per_task[(t, m)] for t in paper_tasks]
            cell = _average([c for c, _ in got], [b for _, b in got], METRICS[m].scale)
            if row.in_paper and (row.key, "average", m) in paper:
                cell.paper, cell.paper_text = paper[(row.key, "average", m)]
            row.cells.append(cell)
    if drop_empty:
        rows = [r for r in rows if any(not c.empty for c in r.cells)]
    _compare_with_baseline(rows, cols)
    n_runs = int((runs["usable"] & runs["kept"]).sum())
    return Built(spec, preset, cols, rows, compare, n_runs)


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per preset × task × attention (× variant): seeds, and mean/std/n of every metric, with
    ``<field>_ci95`` the half-width of the mean's 95% t-interval over seeds (nan with one seed)."""
    ok = runs[runs["usable"] & runs["kept"]]
    fields = ["test_acc", "best_val_acc", "majority_acc", "steps", "train_time_s", "eval_time_s",
              "time_per_1k_steps_s", "tokens_per_s", "peak_mem_bytes", "peak_mem_estimate_bytes", "micro_batch",
              "accum_steps", "effective_batch"]
    rows = []
    for (preset, task, attn, variant), g in ok.groupby(["preset", "task", "attn", "variant"], sort=True):
        r = {"preset": preset, "task": task, "attn": attn, "variant": variant, "row": row_key(attn, variant),
             "seeds": ",".join(str(int(s)) for s in sorted(g["seed"].unique())), "n_runs": len(g),
             "hardware": ",".join(sorted({str(h) for h in g["hardware"].dropna()})),
             "device": ",".join(sorted({str(h) for h in g["device"].dropna()}))}
        for f in fields:
            v = g[f].to_numpy(dtype=float)
            v = v[np.isfinite(v)]
            r[f"{f}_mean"] = float(v.mean()) if v.size else math.nan
            r[f"{f}_std"] = float(v.std(ddof=1)) if v.size > 1 else math.nan
            r[f"{f}_n"] = int(v.size)
            r[f"{f}_ci95"] = half_width(r[f"{f}_std"], int(v.size))
        rows.append(r)
    cols = ["preset", "task", "attn", "variant", "row", "seeds", "n_runs", "hardware", "device"]
    cols += [f"{f}_{s}" for f in fields for s in ("mean", "std", "n", "ci95")]
    return pd.DataFrame(rows, columns=cols)
