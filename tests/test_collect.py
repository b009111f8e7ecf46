"""lra.tools.collect on synthetic run records: statistics, bad input, paper layout, formats, determinism."""

import csv
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from lra.config import attn_configs
from lra.files import write_atomic, write_text
from lra.tools.collect import collect, main
from lra.tools.collect.records import load_runs
from lra.tools.collect.render import frame_markdown, to_latex, to_markdown
from lra.tools.collect.tables import PAPER_CSV, SKEIN_ROWS, TABLES, build, paper_results, summary

SPEC = {s.key: s for s in TABLES}


def make_record(
    root: Path,
    attn="softmax",
    seed=0,
    task="listops",
    preset="quick",
    sub="",
    metrics=True,
    raw: str | None = None,
    drop=(),
    semantics=None,
    **fields,
) -> Path:
    """Write a run folder like lra.train does (result.json, optional metrics.csv); returns the folder.
    ``semantics``: the preset's own by default (paper for *_paper presets)."""
    semantics = semantics or ("paper" if preset.endswith("_paper") else "clean")
    run = Path(root) / preset / semantics / task / attn / f"seed{seed}"
    if sub:
        run = run / sub
    run.mkdir(parents=True, exist_ok=True)
    rec = {
        "schema_version": 1,
        "task": task,
        "attn": attn,
        "attn_backend": attn,
        "seed": seed,
        "preset": preset,
        "semantics": semantics,
        "status": "completed",
        "reason": None,
        "test_acc": 0.4,
        "best_val_acc": 0.41,
        "majority_acc": 0.17,
        "steps": 600,
        "train_time_s": 120.0,
        "eval_time_s": 5.0,
        "time_per_1k_steps_s": 200.0,
        "peak_mem_bytes": 2**30,
        "micro_batch": 32,
        "accum_steps": 1,
        "effective_batch": 32,
        "hardware": "v100_16gb",
        "device": "Tesla V100",
        "git_commit": "abc",
        "config": {
            "task": {"name": task},
            "attn": {"name": attn, "label": attn},
            "seed": seed,
            "preset": preset,
            "semantics": semantics,
            "train": {"batch_size": 32},
        },
    }
    rec.update(fields)
    for k in drop:
        rec.pop(k, None)
    (run / "result.json").write_text(raw if raw is not None else json.dumps(rec))
    if metrics:
        lines = ["epoch,step,train/acc,train/loss,val/acc,val/count,val/loss"]
        for i, step in enumerate((149, 299, 449, 599)):
            lines.append(f"0,{step},0.3,2.0,,,")
            lines.append(f"0,{step},,,{0.2 + 0.05 * i + 0.01 * seed},1000.0,{2.2 - 0.1 * i}")
        (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    return run


def cell(built, attn, task="listops"):
    row = next(r for r in built.rows if r.key == attn)
    j = next(i for i, c in enumerate(built.columns) if c.task == task)
    return row.cells[j]


def issues_of(issues, kind):
    return [i for i in issues if i.kind == kind]


def test_mean_std_and_seed_count(tmp_path):
    for seed, acc in enumerate((0.30, 0.40, 0.50)):
        make_record(tmp_path, "softmax", seed, test_acc=acc)
    make_record(tmp_path, "none", 0, test_acc=0.2)
    runs, issues = load_runs(tmp_path)
    assert not issues
    t1 = build(SPEC["skeinformer_table1"], runs, "quick")
    c = cell(t1, "softmax")
    assert c.mean == pytest.approx(40.0) and c.std == pytest.approx(10.0) and c.n == 3
    one = cell(t1, "none")
    assert one.n == 1 and math.isnan(one.std)
    md = to_markdown(t1)
    half = 4.302652729749464 * 10.0 / math.sqrt(3)  # t(0.975, 2), from a t table, x std / sqrt(n)
    # the mean's 95% interval over the seeds; no bold against one seed
    assert f"| Standard | -- | 40.00 ± 10.00 (3) [{40 - half:.2f}, {40 + half:.2f}] | -- |" in md
    assert "| none (no attention) | -- | 20.00 (1) | -- |" in md  # one seed: no std, no interval, count shown
    assert "Intervals and tests need 3 seeds or more" in md  # said once, under the table
    # units of the other tables: steps in k, minutes per 1k steps, hours, GB, batch and accumulation
    t2 = build(SPEC["skeinformer_table2"], runs, "quick")
    row = next(r for r in t2.rows if r.key == "softmax")
    got = {(col.task, col.metric): c for col, c in zip(t2.columns, row.cells)}
    assert got[("listops", "steps_k")].mean == pytest.approx(0.6)
    assert got[("listops", "min_per_1k")].mean == pytest.approx(200 / 60)
    assert got[("listops", "accum")].values == (1.0,)
    sky2 = build(SPEC["skyformer_table2"], runs, "quick", drop_empty=False)
    got = {(col.task, col.metric): c for col, c in zip(sky2.columns, sky2.rows[0].cells)}
    assert got[("listops", "hours")].mean == pytest.approx(120 / 3600) and got[("listops", "mem_gb")].mean == 1.0


def test_failed_runs_excluded_from_means_and_listed_with_reason(tmp_path):
    make_record(tmp_path, "softmax", 0, test_acc=0.3)
    make_record(tmp_path, "softmax", 1, test_acc=0.5)
    make_record(tmp_path, "softmax", 2, test_acc=0.99, status="failed", reason="OutOfMemoryError: CUDA out of memory")
    make_record(tmp_path, "softmax", 3, test_acc=None, status="interrupted", reason="KeyboardInterrupt", metrics=False)
    make_record(tmp_path, "softmax", 4, test_acc=None, status="running", metrics=False)
    make_record(tmp_path, "none", 0, test_acc=0.1, status="stuck", reason="val loss at chance after 1000 steps")
    res = collect(tmp_path, tmp_path / "out", plots=False)
    c = cell(res.tables[("quick", "skeinformer_table1")], "softmax")
    assert c.mean == pytest.approx(40.0) and c.n == 2
    failed = pd.read_csv(tmp_path / "out" / "failed.csv")
    assert list(failed["seed"]) == [2, 3, 4] and list(failed["status"]) == ["failed", "interrupted", "running"]
    assert "CUDA out of memory" in failed["reason"].iloc[0] and "still training" in failed["reason"].iloc[2]
    assert "OutOfMemoryError" in (tmp_path / "out" / "failed.md").read_text()
    assert "3 not finished" in (tmp_path / "out" / "index.md").read_text()
    # a stuck run (trained, at chance) is a real outcome: counted, and listed among the issues
    assert cell(res.tables[("quick", "skeinformer_table1")], "none").mean == pytest.approx(10.0)
    assert [(i.path, i.kind) for i in res.issues] == [("quick/clean/listops/none/seed0", "stuck")]


def test_older_schema_is_read_and_reported(tmp_path):
    # no schema_version, no task/attn/seed/preset fields (config and path tell), no time per 1k steps
    make_record(
        tmp_path,
        "softmax",
        0,
        test_acc=0.3,
        drop=("schema_version", "task", "attn", "preset", "time_per_1k_steps_s", "peak_mem_bytes"),
    )
    # no status either: finished if it has a test accuracy
    make_record(tmp_path, "softmax", 1, test_acc=0.5, drop=("schema_version", "status"))
    # nothing tells the task: reported, not counted
    odd = tmp_path / "elsewhere"
    odd.mkdir()
    (odd / "result.json").write_text(json.dumps({"test_acc": 0.9, "seed": 0}))
    runs, issues = load_runs(tmp_path)
    old = {i.path: i.detail for i in issues_of(issues, "old_schema")}
    assert set(old) == {"quick/clean/listops/softmax/seed0", "quick/clean/listops/softmax/seed1", "elsewhere"}
    assert "derived task, attn, preset, time_per_1k_steps_s" in old["quick/clean/listops/softmax/seed0"]
    assert "missing peak_mem_bytes" in old["quick/clean/listops/softmax/seed0"]
    assert "status='completed' (from test_acc)" in old["quick/clean/listops/softmax/seed1"]
    # what every record has had since schema 1 (lra/record.py's core group), each named where it lacks
    assert old["elsewhere"].endswith(
        "missing task, attn, status, best_val_acc, steps, train_time_s, time_per_1k_steps_s, peak_mem_bytes, "
        "micro_batch, accum_steps, effective_batch, hardware, config, git_commit, preset"
    )
    r0 = runs[runs["path"] == "quick/clean/listops/softmax/seed0"].iloc[0]
    assert r0["time_per_1k_steps_s"] == pytest.approx(200.0) and r0["usable"]
    assert [i.path for i in issues_of(issues, "unusable")] == ["elsewhere"]
    c = cell(build(SPEC["skeinformer_table1"], runs, "quick"), "softmax")
    assert c.mean == pytest.approx(40.0) and c.n == 2


def test_duplicates_keep_newest_finished_and_are_reported(tmp_path):
    old = make_record(tmp_path, "softmax", 0, test_acc=0.1)
    new = make_record(tmp_path / "copy", "softmax", 0, test_acc=0.3)
    failed_newest = make_record(tmp_path / "retry", "softmax", 0, test_acc=None, status="failed", reason="boom")
    for path, t in ((old, 1_000_000), (new, 2_000_000), (failed_newest, 3_000_000)):
        os.utime(path / "result.json", (t, t))
    runs, issues = load_runs(tmp_path)
    kept = runs[runs["kept"]]
    assert list(kept["path"]) == ["copy/quick/clean/listops/softmax/seed0"]
    dup = {i.path: i.detail for i in issues_of(issues, "duplicate")}
    assert set(dup) == {"quick/clean/listops/softmax/seed0", "retry/quick/clean/listops/softmax/seed0"}
    assert all("copy/quick/clean/listops/softmax/seed0, which is kept" in d for d in dup.values())
    c = cell(build(SPEC["skeinformer_table1"], runs, "quick"), "softmax")
    assert c.mean == pytest.approx(30.0) and c.n == 1


def test_folder_without_record_and_unreadable_record_are_reported(tmp_path):
    make_record(tmp_path, "softmax", 0)
    running = tmp_path / "quick" / "clean" / "listops" / "softmax" / "seed1"
    (running / ".hydra").mkdir(parents=True)
    (running / "train.log").write_text("...")
    make_record(tmp_path, "softmax", 2, raw='{"task": "listops", "test_acc": 0.')  # half-written by a crash
    res = collect(tmp_path, tmp_path / "out", plots=False)
    kinds = {(i.path, i.kind) for i in res.issues}
    assert ("quick/clean/listops/softmax/seed1", "no_record") in kinds
    assert ("quick/clean/listops/softmax/seed2", "unreadable") in kinds
    assert cell(res.tables[("quick", "skeinformer_table1")], "softmax").n == 1
    text = (tmp_path / "out" / "issues.md").read_text()
    assert "run folder without result.json" in text and "JSONDecodeError" in text


def test_nan_metrics_are_not_averaged_silently(tmp_path):
    make_record(tmp_path, "softmax", 0, test_acc=0.3)
    make_record(tmp_path, "softmax", 1, test_acc=0.5)
    make_record(tmp_path, "softmax", 2, test_acc=None)  # null (the writer's NaN)
    run = make_record(tmp_path, "softmax", 3)
    (run / "result.json").write_text((run / "result.json").read_text().replace('"test_acc": 0.4', '"test_acc": NaN'))
    make_record(tmp_path, "softmax", 4, test_acc="n/a", train_time_s=float("inf"))
    make_record(tmp_path, "softmax", 5, test_acc=38.5)  # a percentage: not a fraction
    runs, issues = load_runs(tmp_path)
    nan = {i.path: i.detail for i in issues_of(issues, "nan_metric")}
    assert set(nan) == {f"quick/clean/listops/softmax/seed{s}" for s in (2, 3, 4, 5)}
    assert (
        "test_acc null" in nan["quick/clean/listops/softmax/seed2"]
        and "test_acc nan" in nan["quick/clean/listops/softmax/seed3"]
    )
    assert (
        "not a number" in nan["quick/clean/listops/softmax/seed4"]
        and "train_time_s inf" in nan["quick/clean/listops/softmax/seed4"]
    )
    assert "outside [0, 1]" in nan["quick/clean/listops/softmax/seed5"]
    t1 = build(SPEC["skeinformer_table1"], runs, "quick")
    c = cell(t1, "softmax")
    assert c.mean == pytest.approx(40.0) and c.n == 2  # only the two finite accuracies
    assert "40.00 ± 14.14 (2)" in to_markdown(t1)
    t3 = build(SPEC["skeinformer_table3"], runs, "quick")
    j = next(i for i, col in enumerate(t3.columns) if col.task == "listops" and col.metric == "train_min")
    assert t3.rows[0].cells[j].n == 5  # the infinite time left out, the rest kept
    assert t3.rows[0].seeds == 6


def test_a_runs_root_without_records(tmp_path):
    (tmp_path / "runs" / "quick" / "listops" / "softmax" / "seed0" / ".hydra").mkdir(parents=True)
    res = collect(tmp_path / "runs", tmp_path / "out")
    assert len(res.runs) == 0 and [i.kind for i in res.issues] == ["no_record"]
    assert "0 run records read" in (tmp_path / "out" / "index.md").read_text()
    assert (tmp_path / "out" / "failed.md").read_text().strip().endswith("No failed runs.")


def test_cpu_runs_without_peak_memory_are_not_flagged(tmp_path):
    make_record(tmp_path, "softmax", 0, peak_mem_bytes=None, device="cpu")
    make_record(tmp_path, "softmax", 1, peak_mem_bytes=None, device="Tesla V100")
    _, issues = load_runs(tmp_path)
    assert [i.path for i in issues_of(issues, "nan_metric")] == ["quick/clean/listops/softmax/seed1"]


def test_a_finished_run_without_a_metric_the_tables_need_is_flagged(tmp_path):
    """Bug caught: a metric dropped from the record's ``expected`` group (lra/record.py): a run without its batch
    or its time would pass as whole, a null optional (throughput, majority rate, memory estimate) is no issue."""
    expected = "test_acc best_val_acc steps train_time_s time_per_1k_steps_s micro_batch accum_steps peak_mem_bytes"
    make_record(tmp_path, "softmax", 0, **dict.fromkeys(expected.split()), device="Tesla V100")
    make_record(tmp_path, "softmax", 1, tokens_per_s=None, majority_acc=None, peak_mem_estimate_bytes=None)
    _, issues = load_runs(tmp_path)
    (issue,) = issues_of(issues, "nan_metric")
    assert issue.path == "quick/clean/listops/softmax/seed0"
    in_order = "test_acc best_val_acc steps train_time_s time_per_1k_steps_s peak_mem_bytes micro_batch accum_steps"
    assert issue.detail.startswith("finished run with " + ", ".join(f"{k} null" for k in in_order.split()) + ":")


def test_a_missing_value_in_a_markdown_list_is_an_empty_cell():
    """Bug caught: a null (a failed run's seed, a search's missing value) printed as "None" or "nan"."""
    text = frame_markdown(pd.DataFrame({"run": ["a|b", None], "acc": [0.123456789, math.nan]}))
    assert text.splitlines()[2:] == ["| a\\|b | 0.1235 |", "|  |  |"]


def test_paper_order_of_rows_and_columns(tmp_path):
    for attn in ("skeinformer", "polysketch", "softmax", "none"):
        make_record(tmp_path, attn, 0)
    make_record(tmp_path, "softmax", 0, task="text")
    make_record(tmp_path, "softmax", 0, task="pathfinder128")  # a task the paper lacks
    make_record(tmp_path, "softmax", 0, sub="train.lr=0.01", test_acc=0.9)  # an extra override: its own row
    runs, _ = load_runs(tmp_path)
    t1 = build(SPEC["skeinformer_table1"], runs, "quick", drop_empty=False)
    names = [r.name for r in t1.rows]
    assert names[:16] == [n for _, n in SKEIN_ROWS]
    assert names[16:] == ["Standard [lr=0.01]", "none (no attention)", "polysketch"]  # the paper's attentions first
    assert [c.path[0] for c in t1.columns] == [
        "Text",
        "ListOps",
        "Retrieval",
        "Pathfinder",
        "Image",
        "pathfinder128",
        "Average",
    ]
    assert cell(t1, "softmax").mean == pytest.approx(40.0)  # the override run is not mixed in
    yoso = build(SPEC["yoso_table3"], runs, "quick", drop_empty=False)
    assert [r.name for r in yoso.rows][:3] == ["none", "softmax", "YOSO-E"]
    assert [c.path[0] for c in yoso.columns][:6] == [
        "listops",
        "text",
        "retrieval",
        "image",
        "pathfinder",
        "pathfinder128",
    ]
    sky2 = build(SPEC["skyformer_table2"], runs, "quick", drop_empty=False)
    assert [c.path for c in sky2.columns][:6] == [("Time (h)", t) for t in ("TC", "LO", "RE", "PF", "IC")] + [
        ("Time (h)", "pathfinder128")
    ]
    assert [r.name for r in sky2.rows][:2] == ["Self-Attention", "Kernelized Attention"]
    # Average only over the paper's five tasks, and only when all five have a value
    assert t1.rows[0].cells[-1].empty
    for task in ("retrieval", "pathfinder", "image"):
        make_record(tmp_path, "softmax", 0, task=task, test_acc=0.6)
    runs, _ = load_runs(tmp_path)
    t1 = build(SPEC["skeinformer_table1"], runs, "quick", drop_empty=False)
    assert t1.rows[0].cells[-1].mean == pytest.approx((40 + 40 + 60 * 3) / 5)


def test_empty_rows_dropped_unless_asked_and_presets_not_mixed(tmp_path):
    """Bugs caught: sixteen empty paper rows by default; a quick run averaged into the paper preset."""
    make_record(tmp_path, "softmax", 0, test_acc=0.3)
    make_record(tmp_path, "softmax", 0, preset="skeinformer_paper", test_acc=0.5)
    res = collect(tmp_path, tmp_path / "out", formats=("md",), plots=False)
    quick = (tmp_path / "out" / "quick" / "skeinformer_table1.md").read_text()
    paper = (tmp_path / "out" / "skeinformer_paper" / "skeinformer_table1.md").read_text()
    assert "30.00 (1)" in quick and "50.00" not in quick and "| Standard | -- | 50.00 |" in paper
    assert [r.name for r in res.tables[("quick", "skeinformer_table1")].rows] == ["Standard"]
    res = collect(tmp_path, tmp_path / "all", formats=("md",), plots=False, all_rows=True)
    assert len(res.tables[("quick", "skeinformer_table1")].rows) == 16


def test_the_old_drop_empty_flag_says_it_is_the_default(tmp_path, capsys):
    """Bug caught: a script with --drop-empty failing after empty rows became the default."""
    make_record(tmp_path, "softmax", 0)
    assert main(["--runs", str(tmp_path), "--no-plots", "--no-html", "--drop-empty"]) == 0
    assert "--drop-empty is the default now" in capsys.readouterr().err
    assert not list((tmp_path / "out" / "quick").glob("*.csv"))[1:]  # only summary.csv with --format md


def test_paper_and_clean_semantics_never_share_a_cell(tmp_path):
    """A *_paper preset's runs with the public code's semantics and with the harness's corrections are
    two table sets; an old record without the field ran the corrections (clean)."""
    make_record(tmp_path, "softmax", 0, preset="skeinformer_paper", test_acc=0.5)
    make_record(tmp_path, "softmax", 0, preset="skeinformer_paper", semantics="clean", test_acc=0.3)
    old = make_record(tmp_path / "old", "softmax", 1, preset="skeinformer_paper", test_acc=0.2, drop=("semantics",))
    rec = json.loads((old / "result.json").read_text())
    del rec["config"]["semantics"]
    (old / "result.json").write_text(json.dumps(rec))
    (tmp_path / "old" / "skeinformer_paper" / "listops" / "softmax").mkdir(parents=True)
    old = old.rename(tmp_path / "old" / "skeinformer_paper" / "listops" / "softmax" / "seed1")  # the layout before
    res = collect(tmp_path, tmp_path / "out", formats=("md",), plots=False, compare=("skeinformer",), style="full")
    paper = (tmp_path / "out" / "skeinformer_paper" / "skeinformer_table1.md").read_text()
    clean = (tmp_path / "out" / "skeinformer_paper+clean" / "skeinformer_table1.md").read_text()
    assert "50.00 (1)" in paper and "30.00" not in paper and "20.00" not in paper
    assert "25.00 ± 7.07 (2)" in clean and "50.00" not in clean  # the new clean run and the old record
    assert "do not have the paper code's semantics" in clean and "do not have" not in paper
    rows = res.runs.set_index("path")
    assert rows.loc[old.relative_to(tmp_path).as_posix(), "semantics"] == "clean"


def test_odd_preset_and_task_names_stay_inside_the_output_folder(tmp_path):
    run = make_record(tmp_path / "runs", "softmax", 0, preset="x", task="a/b")
    rec = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**rec, "preset": "../../escape", "task": "../t"}))
    collect(tmp_path / "runs", tmp_path / "out")
    written = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()]
    assert all(w.startswith(("runs/", "out/")) for w in written)
    assert (tmp_path / "out" / "_.._escape" / "skeinformer_table1.md").is_file()
    assert (tmp_path / "out" / "_.._escape" / "curves__t.png").is_file()


def test_latex_booktabs_bold_best_per_column(tmp_path):
    for seed in range(3):  # three seeds each: the best accuracy and time are bold where the seeds separate them
        make_record(tmp_path, "softmax", seed, test_acc=0.30, time_per_1k_steps_s=600.0, micro_batch=16, accum_steps=2)
        make_record(tmp_path, "skeinformer", seed, test_acc=0.35 + seed / 100, time_per_1k_steps_s=120.0)
        make_record(tmp_path, "none", seed, test_acc=0.20, time_per_1k_steps_s=120.0)  # tie on time: none bold
    make_record(tmp_path, "softmax", 0, task="text", test_acc=0.6)  # alone in its column: nothing to crown
    runs, _ = load_runs(tmp_path)
    tex = to_latex(build(SPEC["skeinformer_table1"], runs, "quick", drop_empty=False))
    for cmd in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}{lrrrrrr}"):
        assert cmd in tex
    lines = {ln.split(" & ")[0]: ln for ln in tex.splitlines() if " & " in ln}
    assert r"\textbf{36.00 $\pm$ 1.00 (3)}" in lines["Skeinformer"] and "textbf" not in lines["Standard"]
    assert "textbf" not in lines["none (no attention)"] and lines["V-mean"].count("--") == 6
    assert tex.count(r"\midrule") == 2  # header rule, then the rule before rows the paper lacks
    t2 = to_latex(build(SPEC["skeinformer_table2"], runs, "quick", drop_empty=False))
    lines = {ln.split(" & ")[0]: ln.split(" & ") for ln in t2.splitlines() if " & " in ln}
    # ListOps columns are 4..6 (step, time, accu): a tie on the lowest time is no best; the fewest accumulation is
    assert (
        lines["Skeinformer"][5] == "2.00 $\\pm$ 0.00 (3)" and lines["none (no attention)"][5] == lines["Skeinformer"][5]
    )
    assert lines["Standard"][5] == "10.00 $\\pm$ 0.00 (3)" and lines["Standard"][6] == "2"
    assert lines["Skeinformer"][6] == r"\textbf{1}"
    assert r"\multicolumn{3}{c}{ListOps}" in t2 and r"\cmidrule(lr){5-7}" in t2
    t4 = to_latex(build(SPEC["skeinformer_table4"], runs, "quick", drop_empty=False))
    lines = {ln.split(" & ")[0]: ln.split(" & ") for ln in t4.splitlines() if " & " in ln}
    assert lines["Skeinformer"][3] == r"\textbf{32}" and lines["Standard"][3] == "16"  # larger batch wins
    assert lines["Standard"][1] not in ("--", "") and "textbf" not in lines["Standard"][1]  # alone (Text): no best
    md = to_markdown(build(SPEC["skeinformer_table1"], runs, "quick"))
    assert "| **36.00 ± 1.00 (3)** [33.52, 38.48] |" in md


def test_a_fast_execution_run_counts_in_table1_and_never_in_the_cost_tables(tmp_path):
    """execution=fast computes the paper's function (accuracy, steps) on another memory plan: its accuracy is a
    Table 1 value, its micro-batch, accumulation, time and memory are no Table 2/4 value (lra/execution.py)."""
    make_record(tmp_path, "softmax", 0, test_acc=0.30, time_per_1k_steps_s=600.0, micro_batch=16, accum_steps=2)
    make_record(
        tmp_path, "softmax", 1, test_acc=0.40, time_per_1k_steps_s=60.0, micro_batch=32, accum_steps=1, execution="fast"
    )
    runs, _ = load_runs(tmp_path)
    t1 = build(SPEC["skeinformer_table1"], runs, "quick")
    assert next(r for r in t1.rows if r.key == "softmax").cells[1].values == (30.0, 40.0)
    t2 = build(SPEC["skeinformer_table2"], runs, "quick")
    cells = {
        c.metric: cell
        for c, cell in zip(t2.columns, next(r for r in t2.rows if r.key == "softmax").cells)
        if c.task == "listops"
    }
    assert cells["steps_k"].values == (0.6,) and cells["steps_k"].n == 2  # steps: the same function's
    assert cells["min_per_1k"].values == (10.0,) and cells["accum"].values == (2.0,)
    t4 = build(SPEC["skeinformer_table4"], runs, "quick")
    cells = [
        cell for c, cell in zip(t4.columns, next(r for r in t4.rows if r.key == "softmax").cells) if c.task == "listops"
    ]
    assert [c.values for c in cells] == [(16.0,), (2.0,)]


def test_compare_adds_paper_value_and_delta(tmp_path):
    P = "skeinformer_paper"
    for seed, acc in enumerate((0.40, 0.42, 0.44)):
        make_record(tmp_path, "softmax", seed, preset=P, test_acc=acc)
    make_record(tmp_path, "polysketch", 0, preset=P, test_acc=0.30)
    make_record(tmp_path, "softmax", 0, preset=P, task="text", micro_batch=16, accum_steps=8)
    res = collect(tmp_path, tmp_path / "out", compare=("skeinformer",), plots=False, style="full")
    t1 = res.tables[(P, "skeinformer_table1")]
    c = cell(t1, "softmax")
    assert c.paper == 38.15 and c.delta == pytest.approx(42.0 - 38.15)
    md = (tmp_path / "out" / P / "skeinformer_table1.md").read_text()
    assert "| Model | Text ours | Text paper | Text Δ | ListOps ours |" in md
    std_row = next(ln for ln in md.splitlines() if ln.startswith("| Standard |"))
    half = 4.302652729749464 * 2.0 / math.sqrt(3)  # t(0.975, 2) x std / sqrt(n), std = 2
    lo, hi = 42 - half, 42 + half  # covers the paper's 38.15: marked
    assert (
        f"| 42.00 ± 2.00 (3) [{lo:.2f}, {hi:.2f}] | 38.15 | +3.85 [{lo - 38.15:+.2f}, {hi - 38.15:+.2f}] ≈ |" in std_row
    )
    assert "| 40.00 (1) | 57.69 | -17.69 |" in std_row  # one seed: no interval, no mark, no bold
    assert "| 57.50 | -- |" in std_row  # paper average, no average of ours (tasks missing)
    poly = next(ln for ln in md.splitlines() if ln.startswith("| polysketch |"))
    assert "| 30.00 (1) | -- | -- |" in poly
    with open(tmp_path / "out" / P / "skeinformer_table1.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["attn"] == "softmax")
    assert row["listops:acc:paper"] == "38.15" and float(row["listops:acc:delta"]) == pytest.approx(3.85)
    t4 = (tmp_path / "out" / P / "skeinformer_table4.md").read_text()
    std_row = next(ln for ln in t4.splitlines() if ln.startswith("| Standard |"))
    assert std_row.startswith("| Standard | 16 | 16 | +0 | 8 | 8 | +0 | 32 | 64 | -32 |")  # one row: no bold
    # tables of other papers are not compared unless asked
    assert "paper" not in (tmp_path / "out" / P / "yoso_table3.md").read_text().splitlines()[2]
    tex = (tmp_path / "out" / P / "skeinformer_table1.tex").read_text()
    assert r"$\Delta$" in tex and r"\multicolumn{3}{c}{ListOps}" in tex
    assert "Δ" not in tex  # pdflatex stops at a raw Δ (headers included)


def test_output_is_byte_identical_on_rerun(tmp_path):
    for attn in ("softmax", "none"):
        for seed in (0, 1):
            make_record(tmp_path / "runs", attn, seed, test_acc=0.3 + 0.01 * seed, time_per_1k_steps_s=100.0 + seed)
    make_record(tmp_path / "runs", "softmax", 2, status="failed", reason="x", test_acc=None)
    make_record(tmp_path / "runs" / "dup", "none", 0)

    def snapshot(d):
        return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}

    a = collect(tmp_path / "runs", tmp_path / "a", compare=("skeinformer",))
    collect(tmp_path / "runs", tmp_path / "b", compare=("skeinformer",))
    sa, sb = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert sa == sb
    assert {
        "quick/curves_listops.png",
        "quick/curves_listops.pdf",
        "quick/efficiency_listops.png",
        "quick/efficiency_listops.pdf",
        "index.md",
        "runs.csv",
    } <= set(sa)
    # the default output folder sits inside the runs root and is not read back as runs
    collect(tmp_path / "runs", plots=False)
    first = snapshot(tmp_path / "runs" / "tables")
    res = collect(tmp_path / "runs", plots=False)
    assert snapshot(tmp_path / "runs" / "tables") == first and len(res.runs) == len(a.runs) == 6
    assert not [p for p in (tmp_path / "runs").rglob("*.tmp")]


def test_writes_are_atomic(tmp_path):
    target = tmp_path / "t.md"
    write_text(target, "old\n")

    def crash(tmp):
        tmp.write_text("half a ta")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(target, crash)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["t.md"]


def test_a_failing_renderer_leaves_previous_tables_intact(tmp_path, monkeypatch):
    make_record(tmp_path / "runs", "softmax", 0)
    collect(tmp_path / "runs", tmp_path / "out", plots=False)
    before = (tmp_path / "out" / "quick" / "skeinformer_table1.tex").read_bytes()
    import lra.tools.collect as lc

    monkeypatch.setattr(lc, "to_latex", lambda built: (_ for _ in ()).throw(RuntimeError("render bug")))
    make_record(tmp_path / "runs", "softmax", 1, test_acc=0.9)
    with pytest.raises(RuntimeError):
        collect(tmp_path / "runs", tmp_path / "out", plots=False)
    assert (tmp_path / "out" / "quick" / "skeinformer_table1.tex").read_bytes() == before
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_cli(tmp_path, capsys):
    make_record(tmp_path / "runs", "softmax", 0)
    assert (
        main(
            [
                "--runs",
                str(tmp_path / "runs"),
                "--out",
                str(tmp_path / "o"),
                "--format",
                "md,csv",
                "--compare",
                "yoso",
                "--no-plots",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "1 finished and counted" in out and "preset quick" in out
    files = {p.name for p in (tmp_path / "o" / "quick").iterdir()}
    assert "yoso_table3.md" in files and "yoso_table3.csv" in files and not any(f.endswith(".tex") for f in files)
    assert not any(f.endswith(".png") for f in files)
    yoso = (tmp_path / "o" / "quick" / "yoso_table3.md").read_text()
    assert "Δ" not in yoso and "Not compared with YOSO" in yoso  # quick is not the paper's protocol: said
    assert main(["--runs", str(tmp_path / "nowhere")]) == 1
    assert "no runs folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--runs", str(tmp_path / "runs"), "--compare", "longformer"])
    assert "choose from skeinformer, skyformer, yoso" in capsys.readouterr().err


def test_module_entry_point(tmp_path):
    make_record(tmp_path / "runs", "none", 0)
    env = {**os.environ, "LRA_RUNS": str(tmp_path / "runs")}
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.collect", "--no-plots", "--format", "md"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs" / "tables" / "quick" / "yoso_table3.md").is_file()


# ----------------------------------------------------------------------------- the papers' numbers
def test_paper_results_are_consistent_and_sourced():
    df = paper_results()
    assert set(df["paper"]) == {"skeinformer", "skyformer", "yoso"} and df["source"].str.len().min() > 20
    assert not df.duplicated(["paper", "table", "attn", "task", "metric"]).any()
    counts = df.groupby(["paper", "table"]).size().to_dict()
    assert counts == {
        ("skeinformer", "table1"): 16 * 6,
        ("skeinformer", "table2"): 16 * 15,
        ("skeinformer", "table3"): 16 * 10,
        ("skeinformer", "table4"): 16 * 10,
        ("skyformer", "table1"): 9 * 6,
        ("skyformer", "table2"): 9 * 10,
        ("yoso", "table3"): 10 * 6,
    }
    sk = df[df["paper"] == "skeinformer"].pivot_table(
        index=["attn", "task"], columns=["table", "metric"], values="value", aggfunc="first"
    )
    batch = {"text": 128, "listops": 256, "retrieval": 64, "pathfinder": 512, "image": 256}
    for (attn, task), r in sk.iterrows():
        if task == "average":
            continue
        # Table 4: actual batch x accumulation = the protocol's batch; Table 2 repeats Table 4's accumulation
        assert r[("table4", "batch")] * r[("table4", "accum")] == batch[task], (attn, task)
        assert r[("table2", "accum")] == r[("table4", "accum")], (attn, task)
        # Table 3 total minutes / steps (k) = Table 2's minutes per 1k steps (printed rounded)
        assert abs(r[("table3", "train_min")] / r[("table3", "steps_k")] - r[("table2", "min_per_1k")]) < 1.0
        assert math.floor(r[("table3", "steps_k")] + 0.5) == r[("table2", "steps_k")], (attn, task)
    for (paper, table), g in df[df["metric"] == "acc"].groupby(["paper", "table"]):
        p = g.pivot(index="attn", columns="task", values="value")
        assert ((p.drop(columns="average").mean(axis=1) - p["average"]).abs() < 0.01).all(), (paper, table)
    # every attention named in the papers is a config we can run
    assert set(df["attn"]) <= set(attn_configs())


FACTS = Path(__file__).resolve().parents[1] / "docs" / "facts.md"
# docs/facts.md §5: sub-section -> (paper, table) of lra/tools/collect/paper_results.csv
FACT_TABLES = {
    "5.1": ("skeinformer", "table1"),
    "5.2": ("skyformer", "table1"),
    "5.3": ("skyformer", "table2"),
    "5.4": ("yoso", "table3"),
}
FACT_TASKS = {
    "Text": "text",
    "ListOps": "listops",
    "Retrieval": "retrieval",
    "Pathfinder": "pathfinder",
    "Image": "image",
    "Avg": "average",
}


def facts_tables() -> dict:
    """{"5.n": (header, rows)}: the Markdown table under each ### 5.n heading of docs/facts.md."""
    section = FACTS.read_text(encoding="utf-8").split("\n## 5.")[1].split("\n## 6.")[0]
    tables = {}
    for block in section.split("\n### ")[1:]:
        lines = [line for line in block.splitlines() if line.startswith("|")]
        cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
        tables[block.split()[0]] = (cells[0], cells[2:]) if cells else ([], [])
    return tables


def test_paper_results_match_docs_facts():
    """Every cell of the tables in docs/facts.md §5 is in lra/tools/collect/paper_results.csv, printed the same."""
    tables = facts_tables()
    assert set(tables) == set(FACT_TABLES), sorted(tables)
    df = paper_results()
    checked = 0
    for section, (paper, table) in FACT_TABLES.items():
        header, rows = tables[section]
        g = df[(df["paper"] == paper) & (df["table"] == table)]
        csv_cells = {(r.row, r.task, r.metric): r.text for r in g.itertuples()}
        by_metric = header[1] == "metric"  # one row per (name, metric) instead of accuracy only
        tasks = header[2:] if by_metric else header[1:]
        for cells in rows:
            name, metric = cells[0], cells[1] if by_metric else "acc"
            values = cells[2:] if by_metric else cells[1:]
            assert len(values) == len(tasks), (section, name)
            for head, value in zip(tasks, values):
                key = (name, FACT_TASKS[head], metric)
                assert csv_cells.get(key) == value, (paper, table, key, value, csv_cells.get(key))
                checked += 1
        # the CSV names the same table as its source, and no file
        assert (g["source"].str.extract(r", Table (\d+)$")[0] == table[len("table") :]).all(), (paper, table)
    assert not df["source"].str.contains("/").any()
    # every row the facts print: Skeinformer Table 1 (16 x 6), Skyformer Table 1 (9 x 6), two rows of
    # Skyformer Table 2 (hours and GB x 5 tasks), YOSO Table 3 (10 x 6)
    assert checked == 16 * 6 + 9 * 6 + 2 * 2 * 5 + 10 * 6


def test_paper_results_are_package_data():
    root = Path(__file__).resolve().parents[1]
    assert PAPER_CSV == root / "lra" / "tools" / "collect" / "paper_results.csv" and PAPER_CSV.is_file()
    text = (root / "pyproject.toml").read_text()
    assert '\n"lra.tools.collect" = ["*.csv"]\n' in text.split("[tool.setuptools.package-data]")[1]


# ----------------------------------------------------------------------------- bad input on the command line
def test_out_that_is_a_file_is_one_line_error(tmp_path, capsys):
    make_record(tmp_path / "runs", "softmax", 0)
    (tmp_path / "afile").write_text("mine\n")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        assert main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--no-plots"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(tmp_path / "afile") in err and "not a folder" in err
    assert (tmp_path / "afile").read_text() == "mine\n"  # the user's file is untouched


def test_unknown_preset_is_one_line_error_listing_the_presets(tmp_path, capsys):
    make_record(tmp_path / "runs", "softmax", 0)
    make_record(tmp_path / "runs", "softmax", 0, preset="skeinformer_paper")
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "o"), "--preset", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--preset nosuch" in err and "presets found: quick, skeinformer_paper" in err
    assert not (tmp_path / "o").exists()  # nothing written before the error
    assert (
        main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "o"), "--preset", "quick", "--no-plots"]) == 0
    )
    assert (tmp_path / "o" / "quick").is_dir() and not (tmp_path / "o" / "skeinformer_paper").exists()


# ----------------------------------------------------------------------------- values that cannot be
def test_impossible_values_are_excluded_and_reported(tmp_path):
    make_record(
        tmp_path,
        "softmax",
        0,
        steps=600,
        train_time_s=120.0,
        time_per_1k_steps_s=200.0,
        tokens_per_s=1000.0,
        peak_mem_estimate_bytes=2**30,
    )
    make_record(
        tmp_path,
        "softmax",
        1,
        steps=1000,
        train_time_s=240.0,
        time_per_1k_steps_s=240.0,
        tokens_per_s=3000.0,
        peak_mem_estimate_bytes=2**31,
    )
    make_record(
        tmp_path,
        "softmax",
        2,
        steps=-5,
        train_time_s=-1.0,
        time_per_1k_steps_s=0.0,
        tokens_per_s=-3.0,
        peak_mem_bytes=-1,
        peak_mem_estimate_bytes=float("inf"),
    )
    make_record(tmp_path, "softmax", 3, time_per_1k_steps_s=-200.0, tokens_per_s=None, peak_mem_estimate_bytes=None)
    runs, issues = load_runs(tmp_path)
    bad = {i.path: i.detail for i in issues_of(issues, "nan_metric")}
    assert set(bad) == {
        "quick/clean/listops/softmax/seed2",
        "quick/clean/listops/softmax/seed3",
    }  # a null optional is fine
    for text in (
        "steps -5.0 negative",
        "train_time_s -1.0 negative",
        "time_per_1k_steps_s 0.0 not positive",
        "tokens_per_s -3.0 not positive",
        "peak_mem_bytes -1.0 negative",
        "peak_mem_estimate_bytes inf",
    ):
        assert text in bad["quick/clean/listops/softmax/seed2"], text
    assert "time_per_1k_steps_s -200.0 not positive" in bad["quick/clean/listops/softmax/seed3"]
    s = summary(runs).iloc[0]
    assert s["steps_mean"] == pytest.approx((600 + 1000 + 600) / 3) and s["steps_n"] == 3
    assert s["train_time_s_mean"] == pytest.approx(160.0) and s["time_per_1k_steps_s_n"] == 2
    assert s["time_per_1k_steps_s_mean"] == pytest.approx(220.0)
    assert s["tokens_per_s_mean"] == pytest.approx(2000.0) and s["tokens_per_s_n"] == 2
    assert s["peak_mem_bytes_n"] == 3 and s["peak_mem_estimate_bytes_mean"] == pytest.approx(1.5 * 2**30)
    assert s["test_acc_n"] == 4  # the other metrics of those runs still count


def test_non_integer_seed_is_reported_and_not_averaged(tmp_path):
    make_record(tmp_path, "softmax", 0, test_acc=0.3)
    make_record(tmp_path, "softmax", 1, test_acc=0.5)
    make_record(tmp_path, "softmax", 1.5, test_acc=0.99)  # folder seed1.5, record seed 1.5
    odd = make_record(tmp_path, "softmax", 2.5, test_acc=0.98)  # folder seed2.5, record says seed 2
    rec = json.loads((odd / "result.json").read_text())
    (odd / "result.json").write_text(json.dumps({**rec, "seed": 2}))
    make_record(tmp_path, "softmax", 3, test_acc=0.97)
    bad = make_record(tmp_path, "none", 4, test_acc=0.1)  # folder seed4, record seed 4.25
    (bad / "result.json").write_text(json.dumps({**json.loads((bad / "result.json").read_text()), "seed": 4.25}))
    res = collect(tmp_path, tmp_path / "out", plots=False)
    unusable = {i.path: i.detail for i in issues_of(res.issues, "unusable")}
    assert set(unusable) == {
        "quick/clean/listops/softmax/seed1.5",
        "quick/clean/listops/softmax/seed2.5",
        "quick/clean/listops/none/seed4",
    }
    assert "'seed1.5' names a seed that is not an integer" in unusable["quick/clean/listops/softmax/seed1.5"]
    assert "seed 4.25 is not an integer" in unusable["quick/clean/listops/none/seed4"]
    c = cell(res.tables[("quick", "skeinformer_table1")], "softmax")
    assert c.n == 3 and c.mean == pytest.approx((30 + 50 + 97) / 3)
    assert "none" not in [r.key for r in res.tables[("quick", "yoso_table3")].rows]  # its only run is not counted
    failed = pd.read_csv(tmp_path / "out" / "failed.csv")
    assert "seeds are integers" in " ".join(failed["reason"])


HOSTILE = (
    '<script>alert(1)</script><img src=x onerror=alert(1)> | =HYPERLINK("h") & % $ # _ { } ~ ^ \\ `c` '
    "[l](javascript:x)\n\n"
)


class _Tags(HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.tags, self.handlers = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.handlers += [k for k, _ in attrs if k.startswith("on")]


def _tex_body(line: str) -> str:
    """A LaTeX line with its commands and escaped characters taken out: what is left is plain text."""
    return re.sub(r"\\([A-Za-z]+|.)", "", line)


def test_record_text_is_escaped_in_markdown_latex_csv_and_html(tmp_path):
    """Record fields (backend, exception, name, preset, folder) reach every output as text: no raw HTML in
    Markdown, no broken table, no LaTeX special character, no spreadsheet formula, no element on the page."""
    for seed in range(2):
        make_record(tmp_path, "softmax", seed, attn_backend=HOSTILE)
        make_record(tmp_path, "=cmd|' /C calc'!A0", seed, name=HOSTILE, test_acc=-0.5 + 0.9)
    make_record(tmp_path, "softmax", 0, sub='=x<b>|`"y', test_acc=0.3)  # an odd run folder: its tag
    make_record(tmp_path, "performer", 0, status="failed", reason=HOSTILE, test_acc=None)
    run = make_record(tmp_path, "softmax", 0, preset="odd")
    rec = json.loads((run / "result.json").read_text())
    rec["preset"] = rec["config"]["preset"] = "p&_%{x}<i>|" + HOSTILE
    (run / "result.json").write_text(json.dumps(rec))
    (tmp_path / "quick" / "clean" / "listops" / "nystrom" / "seed0").mkdir(parents=True)
    (tmp_path / "quick" / "clean" / "listops" / "nystrom" / "seed0" / "result.json").write_text("{" + HOSTILE)
    res = collect(tmp_path, tmp_path / "out", plots=False, style="full")
    files = {p: p.read_text() for p in res.files}
    md = {p: t for p, t in files.items() if p.suffix == ".md"}
    assert any("&lt;script&gt;" in t for t in md.values())  # the text is there, as text
    for p, text in md.items():
        plain = re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", text)  # code spans show their text verbatim
        assert not re.search(r"<(?!/?sup>)[A-Za-z/!?]", plain), p  # no HTML but the footnote numbers
        assert not re.search(r"(?<!\\)\]\(javascript", plain), p  # no link
        for table in re.findall(r"(?:^\|.*\n)+", text, flags=re.M):  # each table: every row as many cells as its head
            assert len({len(re.findall(r"(?<!\\)\|", ln)) for ln in table.splitlines()}) == 1, (p, table)
    tex = {p: t for p, t in files.items() if p.suffix == ".tex"}
    assert tex
    for p, text in tex.items():
        for ln in text.splitlines():
            if ln.startswith(("%", "\\label{")):  # a comment; a label (safe_name: _ is allowed there)
                continue
            body = _tex_body(ln.replace("\\resizebox{\\textwidth}{!}{%", "").replace("\\end{tabular}}", ""))
            assert not set(body.replace("$$", "")) & set("#%_^~$"), (p, ln)  # only our $\\pm$ and the like
            assert body.count("{") == body.count("}"), (p, ln)
            assert "&" not in body or ln.endswith("\\\\"), (p, ln)  # column breaks only in table rows
        rows = [ln for ln in text.split("\\midrule", 1)[1].split("\\bottomrule")[0].splitlines() if ln.endswith("\\\\")]
        assert len({_tex_body(ln).count("&") for ln in rows}) == 1, p
    cells = [c for p, t in files.items() if p.suffix == ".csv" for row in csv.reader(io.StringIO(t)) for c in row]
    assert "'=cmd|' /C calc'!A0" in cells and "0.4" in cells
    for c in cells:
        if c.startswith(("=", "+", "-", "@", "\t", "\r")):
            float(c)  # a number (-0.5), never a formula
    page = _Tags(files[res.out / "index.html"])
    assert not {"script", "img", "i", "b"} & set(page.tags) and not page.handlers


def test_a_record_the_collector_cannot_use_is_skipped_with_one_line_and_the_rest_is_collected(tmp_path, capsys):
    for seed in range(2):
        make_record(tmp_path, "softmax", seed)
    bad = {
        "seed3": ("is a folder, not a file", None),
        "seed4": ("is no valid record", "[1, 2]"),
        "seed5": ("is no valid record", "{not json"),
        "seed6": ("is no valid record", "[" * 100_000),  # nested too deep for the parser
    }
    for seed, (_, raw) in bad.items():
        run = tmp_path / "quick" / "clean" / "listops" / "softmax" / seed
        run.mkdir(parents=True)
        if raw is None:
            (run / "result.json").mkdir()
            (run / "metrics.csv").write_text("step\n")
        else:
            (run / "result.json").write_text(raw)
    assert main(["--runs", str(tmp_path), "--no-plots", "--no-html"]) == 0
    out = capsys.readouterr().out.splitlines()
    for seed, (why, _) in bad.items():
        lines = [ln for ln in out if ln.strip().startswith(f"quick/clean/listops/softmax/{seed}: result.json {why}")]
        assert len(lines) == 1, (seed, out)
    assert any("preset quick: 2 runs" in ln for ln in out)
    issues = (tmp_path / "tables" / "issues.md").read_text()
    assert "seed3 | unreadable | result.json is a folder, not a file" in issues


def test_a_300_character_preset_is_collected_under_a_bounded_folder_name(tmp_path, capsys):
    """The preset names the output folder: a long one once stopped everything with "cannot write"."""
    make_record(tmp_path, "softmax", 0)
    run = make_record(tmp_path, "softmax", 1, preset="long")
    rec = json.loads((run / "result.json").read_text())
    rec["preset"] = rec["config"]["preset"] = long = "p" * 299 + "q"
    (run / "result.json").write_text(json.dumps(rec))
    assert main(["--runs", str(tmp_path), "--no-plots", "--no-html"]) == 0, capsys.readouterr().err
    folders = [p for p in (tmp_path / "tables").iterdir() if p.is_dir()]
    assert len(folders) == 2 and all(len(p.name) <= 96 for p in folders)
    (mine,) = [p for p in folders if p.name.startswith("ppp")]
    assert long in (mine / "tables.md").read_text()


def test_sigterm_while_collecting_leaves_no_temporary_file_and_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import lra.tools.collect as C

    for seed in range(2):
        make_record(tmp_path, "softmax", seed)
    written = []

    def write_then_signal(path, text, **kw):  # the third file: SIGTERM while it is half written
        written.append(path)
        if len(written) < 3:
            return write_text(path, text, **kw)

        def write(tmp):
            tmp.write_text(text[:10])
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("SIGTERM did not stop the collection")

        return write_atomic(path, write)

    monkeypatch.setattr(C, "write_text", write_then_signal)
    before = signal.getsignal(signal.SIGTERM)
    try:  # without the collector's own handler the test's fallback stops it (the default would end pytest)
        signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(RuntimeError("SIGTERM not handled")))
        rc = main(["--runs", str(tmp_path), "--no-plots"])
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 128 + signal.SIGTERM
    assert len(err) == 1 and "interrupted by SIGTERM" in err[0] and "run it again" in err[0]
    assert not [p for p in (tmp_path / "tables").rglob("*") if p.name.endswith(".tmp")]
    assert not (tmp_path / "tables" / written[2].relative_to(tmp_path / "tables")).exists()


def test_rows_with_overrides_everywhere_keep_the_papers_order_one_rule_and_no_empty_comparison(tmp_path):
    """Bugs caught (issue 40): with overrides on every row, Standard sorted 5th of 7 and the LaTeX opened with
    \\midrule\\midrule; in the paper's preset under --compare such a table was 12 of its 18 columns of --."""
    from test_tables_rows import tagged

    P = "skeinformer_paper"
    for attn in ("performer", "linformer", "nystrom", "softmax", "skeinformer", "bigbird", "reformer"):
        tagged(tmp_path, attn, 0, "train.max_steps=40", preset=P)
    res = collect(tmp_path, tmp_path / "out", formats=("md", "tex"), compare=("skeinformer",), plots=False)
    assert 'class="extra-first"' not in (tmp_path / "out" / "index.html").read_text()  # no rule above the first row
    t1 = res.tables[(P, "skeinformer_table1")]
    names = ["Standard", "BigBird", "Performer", "Nyströmformer", "Reformer", "Linformer", "Skeinformer"]
    assert [r.name for r in t1.rows] == names and not t1.compare
    md = (tmp_path / "out" / P / "skeinformer_table1.md").read_text()
    assert "| Model | Text | ListOps | Retrieval | Pathfinder | Image | Average |" in md
    assert "no row ran the paper's configuration unchanged" in md and "Every row: train.max_steps=40 (" in md
    tex = (tmp_path / "out" / P / "skeinformer_table1.tex").read_text()
    assert tex.count(r"\midrule") == 1


def test_numbers_are_rounded_once_and_alike_everywhere_and_a_debug_run_is_no_problem(tmp_path):
    """Bugs caught (issue 40): float32 accuracies reached the CSVs as 51.999998; index.md printed 52 and 0.3536
    where the table printed 52.00 and ± 0.35; a debug run was listed under the problems."""
    for seed, acc in enumerate((0.33899998664855957, 0.3440000116825104)):  # 0.339 and 0.344 as float32 writes them
        make_record(tmp_path, "softmax", seed, task="pathfinder", test_acc=0.5199999809265137)
        make_record(tmp_path, "performer", seed, test_acc=acc)
    make_record(tmp_path / "debug" / "fast", "softmax", 0, debug="fast")
    collect(tmp_path, tmp_path / "out", formats=("csv", "md"), plots=False, html=False)
    out = tmp_path / "out"
    rows = {r["row"]: r for r in csv.DictReader(open(out / "quick" / "skeinformer_table1.csv"))}
    assert rows["Standard"]["pathfinder:acc"] == "52" and rows["Standard"]["pathfinder:acc:std"] == "0"
    assert (rows["Performer"]["listops:acc"], rows["Performer"]["listops:acc:std"]) == ("34.15", "0.353553")
    summ = pd.read_csv(out / "quick" / "summary.csv", dtype=str).set_index("attn")
    assert summ.loc["softmax", "test_acc_mean"] == "0.52" and summ.loc["performer", "test_acc_std"] == "0.003536"
    assert set(pd.read_csv(out / "runs.csv", dtype=str)["test_acc"].dropna()) == {"0.52", "0.339", "0.344"}
    index = (out / "index.md").read_text()
    assert "| pathfinder | Standard | 0,1 | 52.00 | 0.00 |  | 2 |" in index
    assert "| listops | Performer | 0,1 | 34.15 | 0.35 |  | 2 |" in index
    assert "34.15 ± 0.35 (2)" in (out / "quick" / "skeinformer_table1.md").read_text()
    assert "Problems: none." in index and "debug" not in (out / "issues.csv").read_text()
    issues = (out / "issues.md").read_text()
    assert issues.index("No problems found.") < issues.index("debug/fast/quick/clean/listops/softmax/seed0")


def test_every_latex_table_fits_an_article_page(tmp_path):
    """Bug caught (issue 40): the quick Table 1 ran 375 pt past an article page's 345 pt text width, Table 2 in full
    style 385 pt: overfull boxes. A table wider than the page is scaled to it; one that fits keeps its size."""
    from lra.tools.collect.render import TEXT_WIDTH_PT, tabular_width, tex_width

    # the measure is TeX's own metrics: cmr10.tfm's S .555557 t .388891 a .5 n .555557 d .555557 r .391668 em
    assert tex_width("Standard", size=10) == pytest.approx(40.03, abs=0.05)
    assert tex_width("0.00", size=10) == pytest.approx(17.78, abs=0.05)  # digits .5 em, the period .277779 em
    for seed in range(3):
        make_record(tmp_path, "softmax", seed, test_acc=0.3 + seed / 100)
        make_record(tmp_path, "skeinformer", seed, task="text", test_acc=0.6 + seed / 100)
        make_record(tmp_path, "performer", seed, test_acc=0.3, name="Performer with 256 random features, redrawn")
    res = collect(tmp_path, tmp_path / "out", formats=("tex",), plots=False, html=False, style="full")
    widths = {k: tabular_width(b) for (_, k), b in res.tables.items()}
    assert widths["skeinformer_table2"] > TEXT_WIDTH_PT  # 15 columns of mean ± std (n) [interval]
    for key, width in widths.items():
        tex = (tmp_path / "out" / "quick" / f"{key}.tex").read_text()
        assert (r"\resizebox{\textwidth}{!}{%" in tex) == (width > TEXT_WIDTH_PT), key
    runs = res.runs[res.runs["name"] == ""]  # short names, the paper's style: Table 1 fits as it is
    small = build(SPEC["skeinformer_table1"], runs, "quick", style="paper")
    assert 300 < tabular_width(small) < TEXT_WIDTH_PT and "resizebox" not in to_latex(small)
    if not shutil.which("pdflatex"):
        pytest.skip("pdflatex is not installed: the compile check needs it (the width check above ran)")
    for tex in sorted((tmp_path / "out" / "quick").glob("*.tex")):
        doc = tmp_path / f"{tex.stem}_doc.tex"
        doc.write_text(
            "\\documentclass{article}\\usepackage{booktabs,graphicx}\n"
            f"\\begin{{document}}\\input{{{tex.as_posix()}}}\\end{{document}}\n"
        )
        proc = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        log = (tmp_path / f"{tex.stem}_doc.log").read_text(errors="replace")
        assert proc.returncode == 0 and "Overfull \\hbox" not in log, (tex.name, log[-3000:])
