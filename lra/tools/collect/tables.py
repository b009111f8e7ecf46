"""The papers' tables: their rows, columns and units, our per-cell statistics, and the papers' numbers.

Each ``TableSpec`` lays a table out as its paper does (row order and names, column order and names);
``build`` fills it from the usable runs of one table set (a preset and its semantics). Which row a run
belongs to, its label and its baseline come from lra/tools/collect/rows.py: one row per configuration (the
attention, the overrides, the display name, the data), search trials left out unless asked for. Every
cell is mean ± sample std (ddof 1) over the seeds of that task × row, with the number of seeds that had
a finite value; with :data:`~lra.tools.collect.stats.MIN_SEEDS` seeds or more, the 95% t-interval of the mean,
cut to what the quantity allows (accuracy in [0, 100], times and memory >= 0). Rows the paper does not
have (other backends, overrides, other data) come after the paper's rows, which are dropped when empty
unless asked for; tasks the paper did not use are appended after its columns. The Average column is the
mean of our per-task means over the paper's tasks, shown only when every one of them has a value; it has
an interval only when every task has the same seeds (then it is the t-interval of the per-seed averages).

Each measured cell is compared, by Welch's 95% interval of the difference of means, with the same
column of the row's baseline: Standard (``softmax``) run under the same settings and data; a time only
where both were timed on the same device. The paper's value (``compare``) stands beside a cell only in
the paper's own preset (its protocol and task settings) and only for the rows that ran it unchanged.

The papers' published numbers live in ``lra/tools/collect/paper_results.csv`` (one row per cell, with its source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from lra.record import Record
from lra.tools.collect import rows as R
from lra.tools.collect.stats import (
    MIN_SEEDS,
    NOT_COMPARABLE,
    NOT_TESTABLE,
    clip,
    half_width,
    t_interval,
    verdict,
    welch_interval,
)
from lra.tools.display import SKEIN_ROWS, SKEIN_TASKS, SKY_ROWS, YOSO_ROWS, task_name

PAPER_CSV = Path(__file__).resolve().parent / "paper_results.csv"
BASELINE = R.BASELINE
FEW_SEEDS = "few seeds"  # Cell.ci_note: fewer than MIN_SEEDS seeds, no interval
SEEDS_DIFFER = "seeds differ by task"  # an Average whose tasks do not share their seeds
INF = math.inf


@dataclass(frozen=True)
class Metric:
    field: str  # run-record field
    scale: float  # table unit = field * scale
    decimals: int
    higher_better: bool
    setting: bool = False  # a setting (batch, accumulation), shown as its value(s), not mean ± std
    label: str = ""
    lo: float = 0.0  # what the quantity allows: intervals are cut to [lo, hi]
    hi: float = INF
    timing: bool = False  # depends on the machine: compared only between runs on the same device


METRICS = {
    "acc": Metric("test_acc", 100.0, 2, True, label="test accuracy (%)", hi=100.0),
    "steps_k": Metric("steps", 1e-3, 2, False, label="training steps (k)"),
    "min_per_1k": Metric("time_per_1k_steps_s", 1 / 60, 2, False, label="training minutes per 1k steps", timing=True),
    "train_min": Metric("train_time_s", 1 / 60, 2, False, label="total training time (min)", timing=True),
    "hours": Metric("train_time_s", 1 / 3600, 2, False, label="training time (h)", timing=True),
    "mem_gb": Metric(
        "peak_mem_bytes",
        1 / 2**30,
        2,
        False,
        label="peak memory (GiB = 2^30 bytes, what the paper's table calls GB)",
        timing=True,
    ),
    "accum": Metric("accum_steps", 1.0, 0, False, setting=True, label="gradient accumulation steps"),
    "batch": Metric("micro_batch", 1.0, 0, True, setting=True, label="actual (micro-)batch"),
}

# what the memory plan decides or costs (Tables 2-4, Skyformer Table 2): from execution=paper runs only
PLAN_FIELDS = {m.field for m in METRICS.values() if m.setting or m.timing}

SKY_ABBR = (("text", "TC"), ("listops", "LO"), ("retrieval", "RE"), ("pathfinder", "PF"), ("image", "IC"))
YOSO_TASKS = (
    ("listops", "listops"),
    ("text", "text"),
    ("retrieval", "retrieval"),
    ("image", "image"),
    ("pathfinder", "pathfinder"),
)
PAPERS = {
    "skeinformer": "Skeinformer (Chen, Zeng et al., arXiv:2112.05359v1)",
    "skyformer": "Skyformer (Chen, Zeng et al., NeurIPS 2021)",
    "yoso": "YOSO (Zeng et al., ICML 2021)",
}
# the preset that runs each paper's protocol and task settings (conf/preset/*_paper.yaml; YOSO's LRA
# configs are the Nystromformer code's): only its runs are compared with that paper
PAPER_PRESET = {"skeinformer": "skeinformer_paper", "skyformer": "skyformer_paper", "yoso": "nystromformer_paper"}
STYLES = ("paper", "full")  # paper: mean as the paper prints it; full: mean ± std (n) [interval] marks


@dataclass(frozen=True)
class TableSpec:
    key: str  # file stem and label
    paper: str  # key of PAPERS
    table: str  # "table1" ... as in paper_results.csv
    caption: str
    rows: tuple  # ((attn label, paper's row name), ...)
    tasks: tuple  # ((task, header), ...)
    metrics: tuple  # ((metric key, header), ...)
    group_by: str = "task"  # with several metrics: "task" (task over metrics) or "metric"
    average: str | None = None  # header of the average column, if the paper has one

    @property
    def title(self) -> str:
        return f"{PAPERS[self.paper].split(' (')[0]} Table {self.table[5:]}"


TABLES = (
    TableSpec(
        "skeinformer_table1",
        "skeinformer",
        "table1",
        "Classification accuracy (%) on the test sets of LRA",
        SKEIN_ROWS,
        SKEIN_TASKS,
        (("acc", ""),),
        average="Average",
    ),
    TableSpec(
        "skeinformer_table2",
        "skeinformer",
        "table2",
        "Training steps (k), training time (minutes) per thousand steps, and batch accumulation steps",
        SKEIN_ROWS,
        SKEIN_TASKS,
        (("steps_k", "step"), ("min_per_1k", "time"), ("accum", "accu")),
    ),
    TableSpec(
        "skeinformer_table3",
        "skeinformer",
        "table3",
        "Training steps (k) and total training time (minutes)",
        SKEIN_ROWS,
        SKEIN_TASKS,
        (("steps_k", "steps"), ("train_min", "time")),
    ),
    TableSpec(
        "skeinformer_table4",
        "skeinformer",
        "table4",
        "Actual batch size (bz) and gradient accumulation steps (accu)",
        SKEIN_ROWS,
        SKEIN_TASKS,
        (("batch", "bz"), ("accum", "accu")),
    ),
    TableSpec(
        "skyformer_table1",
        "skyformer",
        "table1",
        "Classification accuracy (%) on LRA",
        SKY_ROWS,
        SKEIN_TASKS,
        (("acc", ""),),
        average="AVG.",
    ),
    TableSpec(
        "skyformer_table2",
        "skyformer",
        "table2",
        "Training time (hours) and peak memory usage (GB)",
        SKY_ROWS,
        SKY_ABBR,
        (("hours", "Time (h)"), ("mem_gb", "Memory (GB)")),
        group_by="metric",
    ),
    TableSpec(
        "yoso_table3",
        "yoso",
        "table3",
        "Test accuracy (%) on LRA, including no attention (none)",
        YOSO_ROWS,
        YOSO_TASKS,
        (("acc", ""),),
        average="Avg",
    ),
)


def own_paper(preset: str) -> str | None:
    """The paper whose protocol the table set ``preset`` runs (``skeinformer_paper+clean`` too), or None."""
    base = preset.split("+", 1)[0]
    return next((p for p, pr in PAPER_PRESET.items() if pr == base), None)


@dataclass(frozen=True)
class Column:
    task: str  # task name, or "average"
    metric: str  # key of METRICS
    path: tuple  # header path, outer to inner, e.g. ("Text", "step") or ("ListOps",)


@dataclass
class Cell:
    """One table cell, in the table's unit. ``ci_low``/``ci_high``: the 95% t-interval of the mean over
    seeds, cut to what the quantity allows (nan with fewer than MIN_SEEDS seeds: ``ci_note`` says why).
    ``base_*``: Welch's comparison with the same column of the row's baseline (``base_test`` is "" where it
    does not apply: the baseline itself, a setting, no baseline cell; NOT_COMPARABLE for a timing on
    another device). ``paper_test`` and ``delta_low``/``delta_high``: the comparison with the paper."""

    mean: float = math.nan
    std: float = math.nan
    n: int = 0
    values: tuple = ()  # distinct values of a setting metric
    paper: float = math.nan
    paper_text: str | None = None
    average: bool = False
    ci_low: float = math.nan
    ci_high: float = math.nan
    ci_note: str = ""  # FEW_SEEDS or SEEDS_DIFFER when a measured cell has no interval
    base_diff: float = math.nan  # ours - baseline's mean
    base_low: float = math.nan  # Welch 95% interval of that difference
    base_high: float = math.nan
    base_test: str = ""  # stats.CANNOT_SEPARATE / SEPARATED / NOT_TESTABLE / NOT_COMPARABLE, or ""
    loaded: bool = False  # a timing with a run on a shared or busy machine (records.loaded)
    devices: tuple = ()  # the devices its runs ran on
    stuck: int = 0  # an accuracy: its seeds that ended at the majority-class rate (records: stuck)

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
    key: str  # rows.RowInfo.key (attention, overrides, name, data, trial)
    name: str  # as printed: the paper's row name, or the label of rows the paper lacks
    in_paper: bool  # the paper's row, run as the paper ran it (the preset's own configuration)
    cells: list = field(default_factory=list)
    seeds: int = 0
    info: R.RowInfo | None = None
    base: str | None = None  # key of the baseline row, None: no Standard under the same settings
    base_name: str = ""  # its printed name
    settings: str = ""  # the full override text where the label shortened it (a footnote)


@dataclass
class Built:
    spec: TableSpec
    preset: str
    columns: list
    rows: list
    compare: bool  # the paper's value and Δ are printed
    n_runs: int
    style: str = "full"
    own: bool = False  # the preset runs this table's paper's protocol: the paper's caption
    about: list = field(default_factory=list)  # what the cells are: protocol, task settings, data
    refused: str = ""  # why a comparison asked for is not printed
    shared: list = field(default_factory=list)  # the overrides (key, value) every row has (rows.shared)


@lru_cache(maxsize=1)
def paper_results() -> pd.DataFrame:
    """The papers' published numbers (lra/tools/collect/paper_results.csv), value kept as printed in ``text``."""
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


def cell_stats(assigned: pd.DataFrame) -> dict:
    """{(task, row key): {field: (mean, std, n, distinct values, {seed: value})}, "_seeds", "_loaded",
    "_devices"} over the runs of :func:`lra.tools.collect.rows.assign`."""
    fields = sorted({m.field for m in METRICS.values()})
    out = {}
    for (task, key), g in assigned.groupby(["task", "row"], sort=True):
        stats = {
            "_seeds": int(g["seed"].nunique()),
            "_loaded": bool(g["loaded"].eq(True).any()),
            "_devices": tuple(sorted({str(d) for d in g["device"].dropna()})),
            "_stuck": int(g["stuck"].sum()),
        }
        seeds = g["seed"].to_numpy()
        fast = g["execution"].eq("fast").to_numpy() if "execution" in g else np.zeros(len(g), dtype=bool)
        for f in fields:
            v = g[f].to_numpy(dtype=float)
            if f in PLAN_FIELDS:  # an execution=fast run's batch, memory and times are not the paper plan's
                v = np.where(fast, np.nan, v)
            fin = np.isfinite(v)
            by_seed = {s: float(x) for s, x in zip(seeds[fin].tolist(), v[fin].tolist())}
            v = v[fin]
            n = int(v.size)
            mean = float(v.mean()) if n else math.nan
            std = float(v.std(ddof=1)) if n > 1 else math.nan
            stats[f] = (mean, std, n, tuple(sorted(set(v.tolist()))), by_seed)
        out[(task, key)] = stats
    return out


def _set_interval(cell: Cell, metric: Metric) -> None:
    lo, hi = t_interval(cell.mean, cell.std, cell.n) if cell.n >= MIN_SEEDS else (math.nan, math.nan)
    cell.ci_low, cell.ci_high = clip(lo, hi, metric.lo, metric.hi)
    cell.ci_note = "" if cell.has_ci or cell.empty else FEW_SEEDS


def _average(per_task: list, by_seed: list, metric: Metric) -> Cell:
    """The Average cell: mean of the per-task means; with an interval only when every task has the same
    seeds (MIN_SEEDS or more), then the t-interval over the per-seed averages, whose mean is that average."""
    cell = Cell(average=True)
    means = [c.mean for c in per_task]
    if not all(math.isfinite(x) for x in means):
        return cell
    cell.mean = float(np.mean(means))
    cell.n = min(c.n for c in per_task)
    seeds = [set(b) for b in by_seed]
    if cell.n < MIN_SEEDS:
        cell.ci_note = FEW_SEEDS
    elif any(s != seeds[0] for s in seeds):
        cell.ci_note = SEEDS_DIFFER
    else:
        per_seed = [float(np.mean([b[s] for b in by_seed])) * metric.scale for s in sorted(seeds[0])]
        cell.std = float(np.std(per_seed, ddof=1))
        _set_interval(cell, metric)
    return cell


def _compare_with_baseline(rows: list, cols: list) -> None:
    """Welch's 95% interval of (row - its baseline) in every measured column; timings only on one device."""
    by_key = {r.key: r for r in rows}
    for row in rows:
        base = by_key.get(row.base)
        if base is None:
            continue
        for col, c, b in zip(cols, row.cells, base.cells):
            metric = METRICS[col.metric]
            if metric.setting or c.empty or b.empty:
                continue
            if metric.timing and (c.devices != b.devices or not c.devices):
                c.base_test = NOT_COMPARABLE
                continue
            span = metric.hi - metric.lo
            c.base_diff, lo, hi = welch_interval(c.mean, c.std, c.n, b.mean, b.std, b.n, min_n=MIN_SEEDS)
            c.base_low, c.base_high = clip(lo, hi, -span, span)
            c.base_test = verdict(c.base_low, c.base_high, 0.0)
            if c.base_test == NOT_TESTABLE:
                c.base_low = c.base_high = math.nan


def _about(spec: TableSpec, assigned: pd.DataFrame, preset: str, own: bool) -> list[str]:
    """What the table's cells are: the protocol and task settings of its runs, and the data per task."""
    lines = []
    plain = assigned[assigned["overrides"].fillna("") == ""] if len(assigned) else assigned
    tasks = (
        [t for t, _ in spec.tasks if t in set(assigned["task"])]
        + sorted(set(assigned["task"]) - {t for t, _ in spec.tasks})
        if len(assigned)
        else []
    )
    settings = []
    for t in tasks:
        g = plain[plain["task"] == t] if len(plain) else plain
        g = g if len(g) else assigned[assigned["task"] == t]
        lengths = sorted({int(x) for x in g["max_length"].dropna()})
        steps = sorted({int(x) for x in g["max_steps"].dropna()})
        bits = [f"length {'/'.join(map(str, lengths))}"] if lengths else []
        bits += [f"up to {'/'.join(f'{s:,}' for s in steps)} steps"] if steps else []
        settings.append(f"{task_name(t)} at {', '.join(bits)}" if bits else task_name(t))
    if own:
        lines.append(f"Preset `{preset}`: the protocol of {PAPERS[spec.paper]} ({'; '.join(settings)}).")
    else:
        lines.append(
            f"Preset `{preset}`: {'; '.join(settings) or 'no runs'} — not the paper's protocol; laid out "
            f"as {spec.title}, without its numbers."
        )
    main = R.main_data(assigned) if len(assigned) else {}
    for t in tasks:
        g = assigned[(assigned["task"] == t) & (assigned["data_id"].fillna("") == main.get(t, ""))]
        desc = next((d for d in g["data_desc"] if d), "")
        did = main.get(t, "")
        generated = own and "generated" in set(g["data_kind"])  # the papers read the released files
        lines.append(
            f"Data, {task_name(t)}: "
            + (
                f"{desc} (id {did})"
                if desc
                else f"id {did}"
                if did
                else "not recorded (records from before the data field)"
            )
            + (" — generated here, not the released files the paper read" if generated else "")
            + "."
        )
    return lines


def build(
    spec: TableSpec,
    runs: pd.DataFrame,
    preset: str,
    compare: bool = False,
    drop_empty: bool = True,
    trials: bool = False,
    style: str | None = None,
) -> Built:
    """Fill ``spec`` from the runs of the table set ``preset`` (``runs`` holds every record).

    Args:
        compare: print the paper's value and Δ where they mean something (the paper's own preset, the
            rows that ran its configuration); elsewhere the table says why not.
        drop_empty: leave out the paper's rows that have no run.
        trials: also show search trials as rows (else :func:`lra.tools.collect.rows.searches` summarises them).
        style: ``paper`` or ``full`` for Markdown and LaTeX (default: paper for a paper's own preset).
    """
    runs = runs[runs["preset"] == preset]
    assigned, infos = R.assign(runs, trials=trials)
    stats = cell_stats(assigned)
    own = own_paper(preset) == spec.paper
    paper_tasks = [t for t, _ in spec.tasks]
    extra_tasks = sorted({t for t, _ in stats} - set(paper_tasks))
    cols = columns(spec, extra_tasks)
    refused = ""
    if compare and not own:
        refused = (
            f"Not compared with {PAPERS[spec.paper]}: preset `{preset}` does not run that paper's protocol "
            f"and task settings (`{PAPER_PRESET[spec.paper]}` does)."
        )
    shown = compare and own
    paper = paper_lookup(spec) if shown else {}
    names = dict(spec.rows)
    label, settings = R.labels(infos, names)
    base_of = R.baselines(infos)
    # the paper's rows: its attentions under the preset's own configuration, unnamed (rows.assign keys them so)
    rows = [Row(attn, name, True, info=infos.get(attn)) for attn, name in spec.rows]
    taken, order = {r.key for r in rows}, {attn: i for i, (attn, _) in enumerate(spec.rows)}
    extra = sorted(  # in the paper's order of their attentions (Standard first), then by label
        (k for k in infos if k not in taken), key=lambda k: (order.get(infos[k].attn, len(order)), label[k].lower(), k)
    )
    rows += [Row(k, label[k], False, info=infos[k], settings=settings.get(k, "")) for k in extra]
    for row in rows:
        row.base = base_of.get(row.key)
        row.base_name = (
            ""
            if row.base is None
            else (names.get(BASELINE) if infos[row.base].plain and not infos[row.base].name else label[row.base])
        )
        per_task = {}
        for col in cols:
            if col.task == "average":
                continue
            metric = METRICS[col.metric]
            st = stats.get((col.task, row.key), {})
            got = st.get(metric.field)
            cell = Cell()
            by_seed = {}
            if got is not None and got[2]:
                mean, std, n, values, by_seed = got
                cell = Cell(
                    mean * metric.scale,
                    std * metric.scale,
                    n,
                    tuple(v * metric.scale for v in values),
                    loaded=metric.timing and st["_loaded"],
                    devices=st["_devices"],
                    stuck=st["_stuck"] if metric.field == "test_acc" else 0,
                )
                if not metric.setting:
                    _set_interval(cell, metric)
            if row.in_paper and (row.key, col.task, col.metric) in paper:
                cell.paper, cell.paper_text = paper[(row.key, col.task, col.metric)]
            row.cells.append(cell)
            per_task[(col.task, col.metric)] = (cell, by_seed)
        row.seeds = max((s.get("_seeds", 0) for (t, k), s in stats.items() if k == row.key), default=0)
        if spec.average:
            m = spec.metrics[0][0]
            got = [per_task[(t, m)] for t in paper_tasks]
            cell = _average([c for c, _ in got], [b for _, b in got], METRICS[m])
            if row.in_paper and (row.key, "average", m) in paper:
                cell.paper, cell.paper_text = paper[(row.key, "average", m)]
            row.cells.append(cell)
    if drop_empty:
        rows = [r for r in rows if any(not c.empty for c in r.cells)]
    if shown and not any(math.isfinite(c.paper) for r in rows for c in r.cells):
        shown = False  # no paper value beside any row: no columns of "--"
        refused = (
            f"Not compared with {PAPERS[spec.paper]}: no row ran the paper's configuration unchanged (each has "
            f"overrides, a name or other data)."
        )
    _compare_with_baseline(rows, cols)
    style = style or ("paper" if own else "full")
    about = _about(spec, assigned, preset, own)
    return Built(spec, preset, cols, rows, shown, len(assigned), style, own, about, refused, R.shared(infos))


def summary(runs: pd.DataFrame, trials: bool = False) -> pd.DataFrame:
    """One row per table set × task × row (lra/tools/collect/rows.py): seeds, and mean/std/n of every metric, with
    ``<field>_ci95`` the half-width of the mean's 95% t-interval over seeds (nan under MIN_SEEDS seeds),
    the row's label, overrides, data, baseline row and whether a run of it was timed under load."""
    fields = Record.fields_in("measured")
    out = []
    for preset in sorted(set(runs["preset"].dropna())):
        assigned, infos = R.assign(runs[runs["preset"] == preset], trials=trials)
        label, _ = R.labels(infos)
        base_of = R.baselines(infos)
        for (task, key), g in assigned.groupby(["task", "row"], sort=True):
            info = infos[key]
            r = {
                "preset": preset,
                "task": task,
                "attn": info.attn,
                "variant": info.over,
                "row": key,
                "label": label[key],
                "name": info.name,
                "data_id": next(iter(sorted(set(g["data_id"].fillna("")))), ""),
                "base": base_of.get(key) or "",
                "seeds": ",".join(str(int(s)) for s in sorted(g["seed"].unique())),
                "n_runs": len(g),
                "hardware": ",".join(sorted({str(h) for h in g["hardware"].dropna()})),
                "device": ",".join(sorted({str(h) for h in g["device"].dropna()})),
                "loaded": bool(g["loaded"].eq(True).any()),
            }
            for f in fields:
                v = g[f].to_numpy(dtype=float)
                v = v[np.isfinite(v)]
                r[f"{f}_mean"] = float(v.mean()) if v.size else math.nan
                r[f"{f}_std"] = float(v.std(ddof=1)) if v.size > 1 else math.nan
                r[f"{f}_n"] = int(v.size)
                r[f"{f}_ci95"] = half_width(r[f"{f}_std"], int(v.size)) if v.size >= MIN_SEEDS else math.nan
            out.append(r)
    cols = [
        "preset",
        "task",
        "attn",
        "variant",
        "row",
        "label",
        "name",
        "data_id",
        "base",
        "seeds",
        "n_runs",
        "hardware",
        "device",
        "loaded",
    ]
    cols += [f"{f}_{s}" for f in fields for s in ("mean", "std", "n", "ci95")]
    return pd.DataFrame(out, columns=cols)
