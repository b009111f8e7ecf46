"""Results collector: run records → the papers' tables, plots and reports (``make tables``).

    python -m lra.tools.collect [--runs DIR] [--out DIR] [--format csv,tex,md] [--compare PAPER[,PAPER]|all]
                          [--style paper|full] [--preset NAME] [--all-rows] [--trials] [--labels FILE]
                          [--no-plots] [--no-html]

Reads every ``result.json`` under the runs root (default ``$LRA_RUNS`` or ``runs/``), groups the
finished runs by preset × task × row (one row per configuration: attention, overrides, name, data;
lra/tools/collect/rows.py), and writes under ``--out`` (default ``<runs>/tables``):

    index.html               the results page: every table (deltas, marks), the figures inline, each cell
                             linking to its runs' records, failed runs and problems; self-contained (offline)
    index.md                 what was read, per preset, failed runs and every problem found (debug runs apart)
    runs.csv                 one normalised row per record (``usable``: finished; ``kept``: not a duplicate)
    failed.{csv,md}          runs that did not finish (failed, interrupted, running), with their reason
    issues.{csv,md}          old-schema records, duplicates, folders without a record, NaN metrics ...
    <preset>/summary.csv     mean/std/n and 95% interval half-width of every metric per task × row
    <preset>/searches.{csv,md}  each search's best trial (its trials are rows only with ``--trials``)
    <preset>/<table>.{csv,tex,md}, <preset>/tables.md
                             Skeinformer Tables 1-4, Skyformer Tables 1-2, YOSO Table 3
    <preset>/curves_<task>.{png,pdf}, <preset>/efficiency_<task>.{png,pdf}, <preset>/lra_chart.{png,pdf}

Presets (``quick``, ``skeinformer_paper`` ...) are never mixed in one table. ``--compare skeinformer``
adds the paper's number and our delta beside the rows that ran the paper's configuration in the
paper's own preset (numbers in ``lra/tools/collect/paper_results.csv`` with their source); other presets get their own
caption and no paper column. A labels file (``<runs>/labels.yaml``, or ``--labels FILE``) names rows
without retraining: ``"<run folder pattern>": <name>``, as ``name=`` would have. Every file is written
atomically and holds nothing time-dependent: the same runs give byte-identical files. Layout and reading
rules: docs/results.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

import pandas as pd

from lra.cli import Parser
from lra.files import runs_root, write_text
from lra.interrupts import Interrupted, signal_of, sigterm_raises
from lra.tools.collect.escape import console, md, md_code
from lra.tools.collect.page import page_html
from lra.tools.collect.plots import plot_preset
from lra.tools.collect.records import Issue, failed_frame, issues_frame, load_runs
from lra.tools.collect.render import frame_csv, frame_markdown, safe_name, to_csv, to_latex, to_markdown
from lra.tools.collect.rows import searches as search_frame
from lra.tools.collect.tables import METRICS, PAPERS, STYLES, TABLES, build, own_paper, summary

FORMATS = ("csv", "tex", "md")
LABELS = "labels.yaml"  # <runs root>/labels.yaml: display names of rows, read by every collection
DEBUG = "skipped"  # the issue kind of a debug run's record: a check of the pipeline, no problem


class CollectError(ValueError):
    """Bad input found before anything is written; its message is the one line shown to the user."""


@dataclass
class Result:
    out: Path
    runs: pd.DataFrame
    issues: list
    files: list = field(default_factory=list)
    tables: dict = field(default_factory=dict)  # (preset, table key) -> Built


def default_runs_root() -> Path:
    return runs_root()


def collect(
    runs_root: Path,
    out: Path | None = None,
    formats=FORMATS,
    compare=(),
    presets=None,
    all_rows: bool = False,
    plots: bool = True,
    html: bool = True,
    trials: bool = False,
    style: str | None = None,
    labels: Path | None = None,
) -> Result:
    """Read the records under ``runs_root`` and write every table, report and figure into ``out``.

    Args:
        runs_root: the runs root (``LRA_RUNS``); every ``result.json`` under it is read.
        out: where the tables go (default ``<runs_root>/tables``; a folder the collector owns).
        formats: any of ``csv``, ``tex``, ``md``.
        compare: extra papers to put beside each table's own (keys of ``PAPERS``).
        presets: only these presets (an unknown one raises :class:`CollectError`).
        all_rows: keep the paper's rows that have no run (the paper's full layout).
        plots: also draw the figures (lra/tools/collect/plots.py).
        html: also write the results page ``index.html`` (lra/tools/collect/page.py).
        trials: show search trials as rows (else each search is summarised by its best trial).
        style: ``paper`` or ``full`` for Markdown and LaTeX (default: paper in a paper's own preset).
        labels: a labels file (:func:`read_labels`; default ``<runs_root>/labels.yaml`` where it exists).

    Returns:
        A :class:`Result`: the runs read, the problems found (a run folder without a record, a failed
        run), the files written.

    Example::

        res = collect(Path("runs"), formats=("md",), presets=["quick"])
        print(res.out / "quick" / "tables.md")
    """
    runs_root = Path(runs_root)
    out = Path(out) if out is not None else runs_root / "tables"
    runs, issues = load_runs(runs_root, exclude=(out,))
    if labels is not None or (runs_root / LABELS).is_file():
        issues += relabel(runs, read_labels(Path(labels or runs_root / LABELS)))
    res = Result(out, runs, issues)
    all_presets = sorted(set(runs["preset"]))
    unknown = sorted(set(presets or ()) - set(all_presets))
    if unknown:  # a typo would otherwise give no tables and no word about it
        raise CollectError(
            f"--preset {', '.join(unknown)}: no run records of that preset under {runs_root}; "
            f"presets found: {', '.join(all_presets) or '(none)'}"
        )
    chosen = [p for p in all_presets if presets is None or p in presets]
    summ = summary(runs, trials=trials)
    found = search_frame(runs)
    figures = {}

    def emit(rel: str, text: str):
        res.files.append(write_text(out / rel, text))

    for preset in chosen:
        folder = safe_name(preset)
        md_all = [f"# Tables for preset {md_code(preset)}", ""]
        own = own_paper(preset)  # the paper whose protocol the preset runs: its tables first
        for spec in sorted(TABLES, key=lambda t: t.paper != own):
            built = build(
                spec, runs, preset, compare=spec.paper in compare, drop_empty=not all_rows, trials=trials, style=style
            )
            res.tables[(preset, spec.key)] = built
            if "csv" in formats:
                emit(f"{folder}/{spec.key}.csv", to_csv(built))
            if "tex" in formats:
                emit(f"{folder}/{spec.key}.tex", to_latex(built))
            md = to_markdown(built)
            md_all.append(md)
            if "md" in formats:
                emit(f"{folder}/{spec.key}.md", md)
        mine = found[found["preset"] == preset].drop(columns="preset")
        if len(mine):
            emit(f"{folder}/searches.csv", frame_csv(mine))
            md = frame_markdown(
                mine.drop(columns=["best_params", "best_path"]),  # in searches.csv and on the page
                f"## Searches of preset {md_code(preset)} (best trial each; --trials shows them all)",
            )
            md_all.append(md)
            if "md" in formats:
                emit(f"{folder}/searches.md", md)
        if "md" in formats:
            emit(f"{folder}/tables.md", "\n".join(md_all))
        emit(f"{folder}/summary.csv", frame_csv(summ[summ["preset"] == preset].reset_index(drop=True)))
        if plots:
            files, notes = plot_preset(runs, summ, runs_root, preset, out / folder, trials=trials)
            res.files += files
            figures[preset] = files
            issues += [Issue(p, "plot", n) for p, n in notes]
    issues.sort(key=lambda i: (i.path, i.kind, i.detail))
    problems = [i for i in issues if i.kind != DEBUG]
    debug = issues_frame([i for i in issues if i.kind == DEBUG]).drop(columns="kind")

    failed = failed_frame(runs)
    iss = issues_frame(problems)
    emit("runs.csv", frame_csv(runs.drop(columns="tag")))  # the folder's tag: in path; the row's: overrides
    emit("failed.csv", frame_csv(failed))
    emit("issues.csv", frame_csv(iss))
    failed_md = frame_markdown(failed, "## Failed or unfinished runs (never in a mean)", "No failed runs.")
    issues_md = frame_markdown(iss, "## Problems found in the records", "No problems found.")
    if len(debug):
        issues_md += "\n" + frame_markdown(debug, "## Debug runs: skipped (checks of the pipeline, not results)")
    emit("failed.md", failed_md)
    emit("issues.md", issues_md)
    emit("index.md", _index(runs, problems, chosen, summ, failed_md, issues_md, compare))
    if html:
        emit("index.html", page_html(res.tables, runs, problems, runs_root, out, figures, compare, trials, found))
    res.files = sorted(set(res.files))
    return res


def _index(runs, issues, presets, summ, failed_md, issues_md, compare) -> str:
    ok = runs["usable"] & runs["kept"]
    kinds = pd.Series([i.kind for i in issues], dtype=str).value_counts().sort_index()
    lines = [
        "# LRA results",
        "",
        f"{len(runs)} run records read: {int(ok.sum())} finished and counted, "
        f"{int((~runs['usable']).sum())} not finished, {int((runs['usable'] & ~runs['kept']).sum())} "
        f"superseded duplicates. Problems: " + (", ".join(f"{k} {v}" for k, v in kinds.items()) or "none") + ".",
        "",
    ]
    if compare:
        lines += ["Compared with: " + ", ".join(PAPERS[c] for c in compare) + ".", ""]
    for preset in presets:
        s = summ[summ["preset"] == preset]
        lines += [
            f"## Preset {md_code(preset)}",
            "",
            f"Tables: [{md(safe_name(preset))}/tables.md]({safe_name(preset)}/tables.md); per task × attention: "
            f"[{md(safe_name(preset))}/summary.csv]({safe_name(preset)}/summary.csv).",
            "",
        ]
        if len(s):
            view = s[["task", "label", "seeds", "test_acc_mean", "test_acc_std", "test_acc_ci95", "test_acc_n"]].copy()
            for c in ("test_acc_mean", "test_acc_std", "test_acc_ci95"):  # as the tables print them
                view[c] = [f"{100 * x:.{METRICS['acc'].decimals}f}" if math.isfinite(x) else "" for x in view[c]]
            # the half-width of the 95% t-interval over seeds (empty under 3 seeds: docs/results.md)
            view.columns = ["task", "row", "seeds", "test acc (%)", "std", "95% ±", "n"]
            lines.append(frame_markdown(view))
    lines += [failed_md, issues_md]
    return "\n".join(lines)


def read_labels(path: Path) -> dict:
    """{run-folder pattern: display name} from a labels file: a YAML mapping such as
    ``"quick/clean/*/performer/seed*/train.max_steps=40": Performer, 40 steps``; :class:`CollectError` if none."""
    from omegaconf import DictConfig, OmegaConf

    try:
        data = OmegaConf.load(path)
    except Exception as e:  # missing, unreadable, not YAML: one line
        raise CollectError(f"--labels {path}: cannot read it ({type(e).__name__}: {str(e)[:120]})") from None
    data = OmegaConf.to_container(data) if isinstance(data, DictConfig) else None
    if not data or not all(isinstance(v, str) and v.strip() for v in data.values()):
        raise CollectError(f'--labels {path}: not a mapping of run-folder pattern to name ("quick/*/performer": Mine)')
    return {str(k): v.strip() for k, v in data.items()}


def relabel(runs: pd.DataFrame, labels: dict) -> list[Issue]:
    """Name the runs whose folder (its path under the runs root) or a folder above it matches a pattern
    (``fnmatch``; a later pattern wins), as ``name=`` would have; a pattern that matches no run is an issue."""
    issues = []
    for pattern, name in labels.items():
        hit = runs["path"].map(lambda p, pat=pattern: fnmatchcase(p, pat) or fnmatchcase(p, pat.rstrip("/") + "/*"))
        runs.loc[hit, "name"] = name
        if not hit.any():
            issues.append(Issue(pattern, "labels", f"a labels-file pattern that matches no run folder ({name!r})"))
    return issues


def out_problem(out: Path) -> str | None:
    """Why ``out`` cannot be the output folder (it, or the nearest existing parent, is no folder)."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                return f"{p} is a file, not a folder; pass a folder (created if missing)"
            return (
                None
                if os.access(p, os.W_OK | os.X_OK)
                else f"{p} cannot be written; pass --out DIR to a " f"folder you can write"
            )
    return None


EXAMPLES = """examples:
  python -m lra.tools.collect                                  # every run under runs/ -> runs/tables (make tables)
  python -m lra.tools.collect --preset quick --no-plots        # the quick preset's tables only
  python -m lra.tools.collect --compare skeinformer --runs /scratch/runs --out report/
  python -m lra.tools.collect --style full --all-rows --trials  # every statistic, every paper row, every trial
  python -m lra.tools.collect --labels names.yaml              # rows named by run folder, without retraining"""


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(
        prog="python -m lra.tools.collect",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=Path, default=None, help="runs root (default $LRA_RUNS or runs/)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default <runs>/tables)")
    p.add_argument("--format", default="csv,tex,md", help="comma list of csv, tex, md (default all)")
    p.add_argument("--compare", default="", help=f"paper(s) to compare with: {', '.join(PAPERS)} or all")
    p.add_argument("--preset", action="append", default=None, help="only this preset (repeatable)")
    p.add_argument(
        "--style",
        choices=STYLES,
        default=None,
        help="Markdown and LaTeX cells: paper (the mean, as the paper prints it) or full (mean ± std (n) "
        "[95%% interval] and marks); default paper in a paper's own preset, else full",
    )
    p.add_argument("--all-rows", action="store_true", help="keep the paper's rows that have no run")
    p.add_argument("--drop-empty", action="store_true", help=argparse.SUPPRESS)  # the default since --all-rows
    p.add_argument(
        "--trials",
        action="store_true",
        help="show every search trial as a row (default: each " "search's best trial in searches.md)",
    )
    p.add_argument(
        "--labels",
        type=Path,
        default=None,
        help=f'row names by run folder: a YAML mapping such as "quick/*/performer": Mine (default <runs>/{LABELS})',
    )
    p.add_argument("--no-plots", action="store_true", help="tables and reports only")
    p.add_argument("--no-html", action="store_true", help="no results page (index.html)")
    args = p.parse_args(argv)
    args.formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    bad = [f for f in args.formats if f not in FORMATS]
    if bad or not args.formats:
        p.error(f"--format: unknown {bad or '(empty)'}; choose from {', '.join(FORMATS)}")
    comp = [c.strip().lower() for c in args.compare.split(",") if c.strip()]
    comp = list(PAPERS) if comp == ["all"] else comp
    bad = [c for c in comp if c not in PAPERS]
    if bad:
        p.error(f"--compare: unknown paper {bad}; choose from {', '.join(PAPERS)} or all")
    args.compare_papers = tuple(comp)
    return args


SHOW_SKIPPED = 20  # skipped records printed one line each; the rest in issues.md


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.drop_empty:
        print(
            "lra.tools.collect: --drop-empty is the default now (empty paper rows are left out); --all-rows keeps them",
            file=sys.stderr,
        )
    root = args.runs or default_runs_root()
    if not root.is_dir():
        print(
            f"lra.tools.collect: no runs folder at {root}. Train first (make lra task=listops attn=softmax "
            f"ARGS='preset=quick') or pass --runs DIR.",
            file=sys.stderr,
        )
        return 1
    out = args.out if args.out is not None else root / "tables"
    problem = out_problem(out)
    if problem:
        print(f"lra.tools.collect: --out {out}: {problem}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        with sigterm_raises():
            res = collect(
                root,
                out,
                args.formats,
                args.compare_papers,
                args.preset,
                args.all_rows,
                plots=not args.no_plots,
                html=not args.no_html,
                trials=args.trials,
                style=args.style,
                labels=args.labels,
            )
    except (KeyboardInterrupt, Interrupted) as e:
        sig = signal.Signals(signal_of(e))
        print(
            f"lra.tools.collect: interrupted by {sig.name}: the files written into {out} so far are whole (no "
            f"temporary file is left), the others are the previous collection's or missing; run it again",
            file=sys.stderr,
        )
        return 128 + sig
    except CollectError as e:
        print(f"lra.tools.collect: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only file system, a full disk: what was written is whole (atomic), the rest not
        print(
            f"lra.tools.collect: cannot write into {out} ({type(e).__name__}: {e.strerror or e}); pass --out DIR to a "
            f"folder you can write",
            file=sys.stderr,
        )
        return 2
    runs = res.runs
    ok = runs["usable"] & runs["kept"]
    print(
        f"read {len(runs)} run records under {root}: {int(ok.sum())} finished and counted, "
        f"{int((~runs['usable']).sum())} not finished"
    )
    for kind, n in sorted(pd.Series([i.kind for i in res.issues], dtype=str).value_counts().items()):
        print(f"  {n} x {kind}")
    skipped = [i for i in res.issues if i.kind == "unreadable"]
    for i in skipped[:SHOW_SKIPPED]:  # a record it cannot use: one line each, with why
        print(f"  {console(i.path)}: {console(i.detail)}")
    if len(skipped) > SHOW_SKIPPED:
        print(f"  ... and {len(skipped) - SHOW_SKIPPED} more records skipped")
    if res.issues:
        print(f"  details: {res.out / 'issues.md'}")
    for preset in sorted({p for p, _ in res.tables}):
        g = runs[ok & (runs["preset"] == preset)]
        print(
            console(
                f"preset {preset}: {len(g)} runs, tasks {', '.join(sorted(set(g['task']))) or '-'}, "
                f"attentions {', '.join(sorted(set(g['attn']))) or '-'} -> {res.out / safe_name(preset)}"
            )
        )
    if len(runs) == 0:
        print(f"no result.json under {root}: nothing to tabulate", file=sys.stderr)
    start = res.out / ("index.html" if not args.no_html else "index.md")
    print(f"wrote {len(res.files)} files into {res.out} ({time.perf_counter() - t0:.1f} s); start at {start}")
    return 0
