"""The tables' 95% intervals and marks (lra/tools/collect/stats.py, tables.py, render.py), checked against
hand computations and scipy's own t-test, never against numbers copied from the implementation."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from lra.tools.collect import collect
from lra.tools.collect.records import load_runs
from lra.tools.collect.render import (
    BASELINE_MARK,
    PAPER_MARK,
    UNTESTED_MARK,
    delta_interval_text,
    interval_text,
    legend,
    marks,
    to_csv,
    to_latex,
    to_markdown,
)
from lra.tools.collect.stats import (
    CANNOT_SEPARATE,
    NOT_TESTABLE,
    SEPARATED,
    t_interval,
    t_quantile,
    welch_interval,
)
from lra.tools.collect.tables import TABLES, build, paper_results, summary
from tests.test_collect import cell, make_record

SPEC = {s.key: s for s in TABLES}
T_975_2 = 4.302652729749464  # Student's t, 97.5% quantile, 2 degrees of freedom (any t table)


P = "skeinformer_paper"  # the preset whose tables are compared with the Skeinformer paper


def paper_value(paper, table, attn, task):
    df = paper_results()
    row = df[(df["paper"] == paper) & (df["table"] == table) & (df["attn"] == attn) & (df["task"] == task)]
    return float(row["value"].iloc[0])


def md_row(md: str, name: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def scipy_welch(a, b):
    """(low, high) of Welch's 95% interval of mean(a) - mean(b), by scipy's t-test."""
    ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return ci.low, ci.high


# ----------------------------------------------------------------------------- the statistics
def test_t_interval_by_hand():
    assert t_quantile(2) == pytest.approx(T_975_2, rel=1e-9)
    xs = [30.0, 40.0, 50.0]  # mean 40, sample std 10
    lo, hi = t_interval(40.0, 10.0, 3)
    half = T_975_2 * 10.0 / math.sqrt(3)  # 24.8414...
    assert (lo, hi) == (pytest.approx(40 - half), pytest.approx(40 + half))
    sem = st.sem(xs)  # scipy's own interval agrees
    assert (lo, hi) == pytest.approx(st.t.interval(0.95, 2, loc=np.mean(xs), scale=sem))
    assert all(math.isnan(x) for x in t_interval(40.0, math.nan, 1))  # one seed: no interval
    assert all(math.isnan(x) for x in t_interval(40.0, 0.0, 1))  # not even with a std given


def test_welch_interval_against_scipy():
    a, b = [40.0, 42.0, 38.0], [35.0, 41.0]
    diff, lo, hi = welch_interval(np.mean(a), np.std(a, ddof=1), 3, np.mean(b), np.std(b, ddof=1), 2)
    assert diff == pytest.approx(2.0)
    assert (lo, hi) == pytest.approx(scipy_welch(a, b))
    # by hand: se^2 = 4/3 + 18/2 = 31/3; df = se^4 / ((4/3)^2/2 + 9^2/1)
    v1, v2 = 4 / 3, 9.0
    df = (v1 + v2) ** 2 / (v1**2 / 2 + v2**2 / 1)
    half = st.t.ppf(0.975, df) * math.sqrt(v1 + v2)
    assert (lo, hi) == pytest.approx((2 - half, 2 + half))
    d, lo, hi = welch_interval(40.0, 1.0, 3, 38.0, math.nan, 1)  # one seed on a side
    assert d == 2.0 and math.isnan(lo) and math.isnan(hi)


# ----------------------------------------------------------------------------- cells and text
def test_cells_carry_the_interval_and_fewer_than_three_seeds_none(tmp_path):
    """Bug caught: two quick seeds printed accuracy [-22.07, 57.97] (t(0.975, 1) = 12.7)."""
    for seed, acc in enumerate((0.30, 0.40, 0.50)):
        make_record(tmp_path, "softmax", seed, test_acc=acc)
    make_record(tmp_path, "none", 0, test_acc=0.2)
    for seed, acc in enumerate((0.05, 0.30)):
        make_record(tmp_path, "performer", seed, test_acc=acc)
    runs, _ = load_runs(tmp_path)
    t1 = build(SPEC["skeinformer_table1"], runs, "quick")
    c = cell(t1, "softmax")
    half = T_975_2 * 10.0 / math.sqrt(3)
    assert (c.ci_low, c.ci_high) == (pytest.approx(40 - half), pytest.approx(40 + half)) and c.ci_note == ""
    assert interval_text(c, "acc") == f"[{40 - half:.2f}, {40 + half:.2f}]"
    one = cell(t1, "none")
    assert math.isnan(one.ci_low) and math.isnan(one.ci_high) and one.ci_note == "few seeds"
    assert interval_text(one, "acc") == "" and marks(one) == []
    two = cell(t1, "performer")
    assert two.n == 2 and math.isnan(two.ci_low) and interval_text(two, "acc") == "" and marks(two) == []
    md = to_markdown(t1)
    assert "| 20.00 (1) |" in md and "± 0.00" not in md  # never a fake ± 0
    assert "| 17.50 ± 17.68 (2) |" in md and "-" not in md_row(md, "Performer")[2]  # std only, never below 0
    # settings (batch, accumulation) have no interval at all
    t4 = build(SPEC["skeinformer_table4"], runs, "quick")
    assert all(math.isnan(x.ci_low) and x.ci_note == "" for x in t4.rows[0].cells)
    assert interval_text(t4.rows[0].cells[2], "batch") == ""
    # steps fixed by the protocol: every seed ran the same number; no interval, and no mark against Standard
    t2 = build(SPEC["skeinformer_table2"], runs, "quick")
    steps = cell(t2, "softmax")
    assert steps.std == 0 and interval_text(steps, "steps_k") == "" and marks(steps) == []


def test_delta_interval_and_paper_mark(tmp_path):
    """A delta whose interval covers the paper is marked ≈; one whose interval misses it is not."""
    near = (0.37, 0.39, 0.40)  # Standard, ListOps; the paper prints 38.15
    far = (0.300, 0.302, 0.304)  # Skeinformer, ListOps; the paper prints 38.73: a tight interval far below
    for seed, (a, b) in enumerate(zip(near, far)):
        make_record(tmp_path, "softmax", seed, preset=P, test_acc=a)
        make_record(tmp_path, "skeinformer", seed, preset=P, test_acc=b)
    make_record(tmp_path, "performer", 0, preset=P, test_acc=0.38)  # one seed: not testable, no mark
    res = collect(tmp_path, tmp_path / "out", compare=("skeinformer",), plots=False, style="full")
    t1 = res.tables[(P, "skeinformer_table1")]
    for attn, accs in (("softmax", near), ("skeinformer", far)):
        xs = 100 * np.array(accs)
        lo, hi = st.t.interval(0.95, len(xs) - 1, loc=xs.mean(), scale=st.sem(xs))
        p = paper_value("skeinformer", "table1", attn, "listops")
        c = cell(t1, attn)
        assert (c.delta_low, c.delta_high) == (pytest.approx(lo - p), pytest.approx(hi - p))
        covered = lo <= p <= hi
        assert covered == (attn == "softmax")  # the data were chosen so
        assert c.paper_test == (CANNOT_SEPARATE if covered else SEPARATED)
        assert [m for m, _ in marks(c, standard=False)] == ([PAPER_MARK] if covered else [])
    md = (tmp_path / "out" / P / "skeinformer_table1.md").read_text()
    j = 6  # Model | Text ours, paper, Δ | ListOps ours, paper, Δ: ListOps Δ is the 7th cell
    soft, skein, perf = md_row(md, "Standard"), md_row(md, "Skeinformer"), md_row(md, "Performer")
    assert soft[j].endswith(f" {PAPER_MARK}") and PAPER_MARK not in skein[j]
    c = cell(t1, "softmax")
    assert soft[j] == f"{c.delta:+.2f} [{c.delta_low:+.2f}, {c.delta_high:+.2f}] {PAPER_MARK}"
    p = paper_value("skeinformer", "table1", "performer", "listops")
    assert perf[j] == f"{38.0 - p:+.2f}"  # no interval, so no mark either
    assert cell(t1, "performer").paper_test == NOT_TESTABLE and marks(cell(t1, "performer")) == []
    assert delta_interval_text(cell(t1, "performer"), "acc") == ""


def test_standard_row_comparison_is_welch(tmp_path):
    soft = (0.40, 0.42, 0.38)
    close = (0.39, 0.41, 0.40)  # Performer: cannot be told apart from Standard
    far = (0.30, 0.31, 0.30)  # Skeinformer: clearly below
    for seed, a in enumerate(soft):
        make_record(tmp_path, "softmax", seed, test_acc=a)
        make_record(tmp_path, "skeinformer", seed, test_acc=far[seed])
    for seed, a in enumerate(close):
        make_record(tmp_path, "performer", seed, test_acc=a)
    make_record(tmp_path, "bigbird", 0, test_acc=0.41)  # one seed: no claim
    make_record(tmp_path, "softmax", 0, task="text", test_acc=0.6)  # Standard has one seed on Text ...
    for seed, a in enumerate((0.55, 0.57, 0.56)):  # ... Performer three: not testable
        make_record(tmp_path, "performer", seed, task="text", test_acc=a)
    runs, _ = load_runs(tmp_path)
    t1 = build(SPEC["skeinformer_table1"], runs, "quick")
    base = cell(t1, "softmax")
    assert base.base_test == "" and marks(base) == []  # the reference itself
    for attn, accs, want in (("performer", close, CANNOT_SEPARATE), ("skeinformer", far, SEPARATED)):
        c = cell(t1, attn)
        lo, hi = scipy_welch(100 * np.array(accs), 100 * np.array(soft))
        assert (c.base_low, c.base_high) == (pytest.approx(lo), pytest.approx(hi))
        assert c.base_diff == pytest.approx(100 * (np.mean(accs) - np.mean(soft)))
        assert c.base_test == want and (lo <= 0 <= hi) == (want == CANNOT_SEPARATE)
    assert [m for m, _ in marks(cell(t1, "performer"))] == [BASELINE_MARK]
    assert "cannot separate this row from Standard" in marks(cell(t1, "performer"))[0][1]
    assert marks(cell(t1, "skeinformer")) == []
    one = cell(t1, "bigbird")
    assert one.base_test == NOT_TESTABLE and marks(one) == []  # its own text says "one seed"
    text = cell(t1, "performer", "text")
    assert text.base_test == NOT_TESTABLE and [m for m, _ in marks(text)] == [UNTESTED_MARK]
    md = to_markdown(t1)
    perf = md_row(md, "Performer")
    assert perf[2].endswith(f"] {BASELINE_MARK}") and perf[1].endswith(f"] {UNTESTED_MARK}")
    assert not md_row(md, "Skeinformer")[2].endswith(BASELINE_MARK)
    # Skyformer names the same row Self-Attention, and the marks say so
    sky = build(SPEC["skyformer_table1"], runs, "quick")
    assert "from Self-Attention" in marks(cell(sky, "performer"), "Self-Attention")[0][1]
    assert any("Self-Attention" in x for x in legend(sky))


def test_legend_under_markdown_and_latex(tmp_path):
    for seed, a in enumerate((0.40, 0.42, 0.41)):
        make_record(tmp_path, "softmax", seed, preset=P, test_acc=a)
        make_record(tmp_path, "performer", seed, preset=P, test_acc=a + 0.01)
    runs, _ = load_runs(tmp_path)
    plain = build(SPEC["skeinformer_table1"], runs, P, style="full")
    comp = build(SPEC["skeinformer_table1"], runs, P, compare=True, style="full")
    for built in (plain, comp):
        md, tex = to_markdown(built), to_latex(built)
        lines = legend(built)
        assert lines and all(f"- {x}" in md for x in lines)
        assert md.index(lines[0]) > md.index("| Performer |")  # under the table
        assert "95\\% t-interval" in tex and r"\textdagger{}" in tex
        assert tex.index(r"\end{tabular}") < tex.index("95\\% t-interval") < tex.index(r"\end{table}")
        assert ("Δ [low, high]" in md) == built.compare and (r"$\approx$ after" in tex) == built.compare
        assert f"{BASELINE_MARK} after our value" in md and "Welch" in md
    assert "Average: an interval only when every task has the same seeds" in to_markdown(plain)
    t4 = build(SPEC["skeinformer_table4"], runs, P, style="full")  # settings only: nothing to explain
    assert legend(t4) == [] and "95% t-interval" not in to_markdown(t4)


def test_csv_bounds_are_numeric(tmp_path):
    for seed, a in enumerate((0.40, 0.42, 0.38)):
        make_record(tmp_path, "softmax", seed, preset=P, test_acc=a)
        make_record(tmp_path, "performer", seed, preset=P, test_acc=a - 0.01)
    make_record(tmp_path, "none", 0, preset=P, test_acc=0.2)
    res = collect(tmp_path, tmp_path / "out", compare=("skeinformer",), plots=False, formats=("csv",))
    df = pd.read_csv(tmp_path / "out" / P / "skeinformer_table1.csv").set_index("attn")
    for col in (
        "listops:acc:ci95_low",
        "listops:acc:ci95_high",
        "listops:acc:delta_ci95_low",
        "listops:acc:delta_ci95_high",
        "listops:acc:vs_baseline_ci95_low",
        "listops:acc:vs_baseline_ci95_high",
        "listops:acc:vs_baseline_diff",
        "average:acc:ci95_low",
    ):
        assert pd.api.types.is_float_dtype(df[col]), col
    xs = np.array([40.0, 42.0, 38.0])
    lo, hi = st.t.interval(0.95, 2, loc=xs.mean(), scale=st.sem(xs))
    p = paper_value("skeinformer", "table1", "softmax", "listops")
    s = df.loc["softmax"]
    assert (s["listops:acc:ci95_low"], s["listops:acc:ci95_high"]) == (
        pytest.approx(lo, abs=1e-6),
        pytest.approx(hi, abs=1e-6),
    )
    assert s["listops:acc:delta_ci95_low"] == pytest.approx(lo - p, abs=1e-6)
    assert s["listops:acc:vs_paper"] == (CANNOT_SEPARATE if lo <= p <= hi else SEPARATED)
    assert pd.isna(s["listops:acc:vs_baseline"])  # the reference is not compared
    perf = df.loc["performer"]
    wl, wh = scipy_welch(xs - 1, xs)
    assert perf["listops:acc:vs_baseline_ci95_low"] == pytest.approx(wl, abs=1e-6)
    assert perf["listops:acc:vs_baseline_ci95_high"] == pytest.approx(wh, abs=1e-6)
    assert perf["listops:acc:vs_baseline"] == CANNOT_SEPARATE and perf["listops:acc:vs_baseline_diff"] == -1
    none = df.loc["none"]
    assert pd.isna(none["listops:acc:ci95_low"]) and none["listops:acc:vs_baseline"] == NOT_TESTABLE
    t4 = pd.read_csv(tmp_path / "out" / P / "skeinformer_table4.csv")
    assert not [c for c in t4.columns if "ci95" in c]  # settings: no interval columns
    assert res.tables[(P, "skeinformer_table1")].compare
    assert set(df["baseline"].fillna("")) == {"", "softmax"}  # which row each comparison used


def test_average_interval_only_over_the_same_seeds(tmp_path):
    tasks = ("text", "listops", "retrieval", "pathfinder", "image")
    acc = {t: (0.5 + 0.05 * i, 0.52 + 0.04 * i, 0.49 + 0.06 * i) for i, t in enumerate(tasks)}
    for t in tasks:
        for seed, a in enumerate(acc[t]):
            make_record(tmp_path, "softmax", seed, task=t, test_acc=a)
            make_record(tmp_path, "performer", seed, task=t, test_acc=a)
        if t != "image":  # Performer has a 4th seed but on Image
            make_record(tmp_path, "performer", 3, task=t, test_acc=acc[t][0])
    runs, _ = load_runs(tmp_path)
    t1 = build(SPEC["skeinformer_table1"], runs, "quick")
    avg = cell(t1, "softmax", "average")
    per_seed = 100 * np.array([[acc[t][s] for t in tasks] for s in range(3)]).mean(axis=1)
    assert avg.mean == pytest.approx(per_seed.mean())  # the same number as before
    lo, hi = st.t.interval(0.95, 2, loc=per_seed.mean(), scale=st.sem(per_seed))
    assert (avg.ci_low, avg.ci_high) == (pytest.approx(lo), pytest.approx(hi))
    pavg = cell(t1, "performer", "average")
    assert pavg.mean == pytest.approx(
        np.mean([100 * np.mean(acc[t] + (() if t == "image" else acc[t][:1])) for t in tasks])
    )
    assert math.isnan(pavg.ci_low) and pavg.ci_note == "seeds differ by task"
    assert interval_text(pavg, "acc") == ""
    assert pavg.base_test == NOT_TESTABLE and marks(pavg) == []  # no interval, no claim


def test_summary_has_interval_half_widths(tmp_path):
    for seed, a in enumerate((0.30, 0.40, 0.50)):
        make_record(tmp_path, "softmax", seed, test_acc=a, train_time_s=100.0 * (seed + 1))
    make_record(tmp_path, "none", 0, test_acc=0.2)
    runs, _ = load_runs(tmp_path)
    s = summary(runs).set_index("attn")
    assert s.loc["softmax", "test_acc_ci95"] == pytest.approx(T_975_2 * 0.1 / math.sqrt(3))
    assert s.loc["softmax", "train_time_s_ci95"] == pytest.approx(T_975_2 * 100.0 / math.sqrt(3))
    assert math.isnan(s.loc["none", "test_acc_ci95"])
    cols = list(s.columns)
    assert cols.index("test_acc_ci95") == cols.index("test_acc_n") + 1


def test_marked_tables_are_byte_identical_on_rerun(tmp_path):
    for seed, a in enumerate((0.40, 0.42, 0.38)):
        make_record(tmp_path / "runs", "softmax", seed, test_acc=a)
        make_record(tmp_path / "runs", "performer", seed, test_acc=a + 0.003 * seed)
    kw = {"compare": ("skeinformer", "skyformer", "yoso"), "plots": False}
    collect(tmp_path / "runs", tmp_path / "a", **kw)
    collect(tmp_path / "runs", tmp_path / "b", **kw)
    names = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "quick").rglob("*") if p.is_file())
    assert names and all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
    assert BASELINE_MARK in (tmp_path / "a" / "quick" / "skeinformer_table1.md").read_text()
    assert (
        to_csv(build(SPEC["skeinformer_table1"], load_runs(tmp_path / "runs")[0], "quick", compare=True))
        == (tmp_path / "a" / "quick" / "skeinformer_table1.csv").read_text()
    )


F32_52 = 0.5199999809265137  # 0.52 as the run's float32 accuracy writes it into result.json


def test_bold_only_where_same_seeds_separate_the_best_and_never_at_chance(tmp_path):
    """Bugs caught (issue 40): a one-seed row was bold against a two-seed Standard; all three Pathfinder cells of
    the quick table were bold at 52.00 ± 0.00 (2), the majority-class rate every record calls stuck_at_end; and
    a best by 1 point that three seeds cannot tell from the next was bold too."""
    cells = {
        "listops": {"softmax": (0.33, 0.34), "performer": (0.36,)},  # one seed against two: nothing to crown
        "pathfinder": {"softmax": (F32_52,) * 2, "performer": (F32_52,) * 2},  # at the majority-class rate
        "text": {"softmax": (0.60, 0.61, 0.62), "skeinformer": (0.70, 0.71, 0.72)},  # separated by 9 std
        "retrieval": {"softmax": (0.60, 0.62, 0.64), "skeinformer": (0.61, 0.63, 0.65)},  # within the noise
        "image": {"softmax": (0.50, 0.51, 0.52), "skeinformer": (0.70, 0.71, 0.72, 0.73)},  # 3 seeds against 4
    }
    for task, by_attn in cells.items():
        for attn, accs in by_attn.items():
            for seed, acc in enumerate(accs):
                stuck = {"majority_acc": 0.52, "stuck_at_end": True} if task == "pathfinder" else {}
                make_record(tmp_path, attn, seed, task=task, test_acc=acc, **stuck)
    runs, _ = load_runs(tmp_path)
    for style in ("full", "paper"):
        md = to_markdown(build(SPEC["skeinformer_table1"], runs, "quick", style=style))
        bold = [ln.split(" | ")[0] + ": " + c for ln in md.splitlines() for c in ln.split(" | ") if "**" in c]
        assert bold == ["| Skeinformer: **71.00" + (" ± 1.00 (3)** [68.52, 73.48]" if style == "full" else "**")]
        pf = [ln.split(" | ")[4] for ln in md.splitlines() if ln.startswith(("| Standard", "| Performer"))]
        assert pf == (["52.00 ± 0.00 (2) §"] * 2 if style == "full" else ["52.00 §"] * 2)
        assert "§ after our value: its seeds ended at the majority-class rate (their records say stuck)" in md
        assert "Bold: the best mean of a column" in md and "the same number of seeds" in md
