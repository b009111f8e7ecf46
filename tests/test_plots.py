"""lra.tools.collect's figures on synthetic run records: time axes, the LRA chart, labels, names and units."""

import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.text import Annotation, Text
from test_collect import make_record

from lra.tools.collect.chart import lra_chart_data, lra_chart_figure
from lra.tools.collect.drawing import readable_names
from lra.tools.collect.plots import curves_figure, efficiency_figure, plot_preset, read_curve
from lra.tools.collect.records import load_runs
from lra.tools.collect.tables import summary

LONG = "protocol.listops.data.n_test=64,protocol.listops.data.n_train=256,train.lr=0.001"
STEPS = (149, 299, 449, 599)
# what a reader must never see in a figure: record field names, code keys, GB for 2^30 bytes
FORBIDDEN = (
    "peak_mem",
    "tokens_per_s",
    "_mean",
    "GB =",
    "GB)",
    "time_per_1k",
    "time/train_s",
    "steps_s",
    "skeinformer_no_rownorm",
    "test_acc",
)


def timed_record(root, attn, seed=0, times=(30.0, 200.0, 210.0, 900.0), task="listops", **fields) -> Path:
    """A run whose metrics.csv carries ``time/train_s`` on its validation rows (lra.train's newer layout)."""
    run = make_record(root, attn, seed, task=task, **fields)
    lines = ["epoch,step,train/acc,train/loss,val/acc,val/count,val/loss,time/train_s"]
    for i, (step, t) in enumerate(zip(STEPS, times)):
        lines.append(f"0,{step},0.3,2.0,,,,")
        lines.append(f"0,{step},,,{0.2 + 0.05 * i + 0.01 * seed},1000.0,{2.2 - 0.1 * i},{t}")
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    return run


def texts_of(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text)]


def line_of(ax, colour):
    return next(line for line in ax.get_lines() if line.get_color() == colour)


def _points(ax):
    return np.concatenate(
        [
            c.get_offsets()
            for c in ax.collections
            if len(c.get_offsets()) and c.get_offsets().shape[1] == 2 and type(c).__name__ == "PathCollection"
        ]
    )


# ----------------------------------------------------------------------------- names
def test_readable_names_are_the_papers_row_names():
    got = readable_names(["softmax", "skeinformer_no_rownorm", "nystrom", f"softmax [{LONG}]", "my_attn", "kernelized"])
    assert got == {
        "softmax": "Standard",
        "skeinformer_no_rownorm": "Skeinformer w/o row normalization",
        "nystrom": "Nyströmformer",
        f"softmax [{LONG}]": f"Standard [{LONG}]",
        "my_attn": "my_attn",
        "kernelized": "Kernelized Attention",
    }
    # two keys never share a printed name
    assert len(set(readable_names(["softmax", "Standard"]).values())) == 2


# ----------------------------------------------------------------------------- curves
def test_curves_time_axis_is_the_measured_train_time(tmp_path):
    times = (30.0, 200.0, 210.0, 900.0)  # deliberately not linear in the step: a slow start, a resumed restart
    timed_record(tmp_path, "softmax", 0, times=times)
    runs, _ = load_runs(tmp_path)
    fig, notes = curves_figure(runs, tmp_path, "quick", "listops")
    assert notes == []
    (acc_step, acc_time), (_, loss_time) = fig.axes[0:2], fig.axes[2:4]
    line = acc_time.get_lines()[0]
    assert list(line.get_xdata()) == pytest.approx([t / 60 for t in times])  # minutes: the longest is 15 min
    assert list(loss_time.get_lines()[0].get_xdata()) == pytest.approx([t / 60 for t in times])
    assert line.get_linestyle() == "-"
    assert "measured" in loss_time.get_xlabel() and "≈" not in loss_time.get_xlabel()
    assert "(min)" in loss_time.get_xlabel()
    assert list(acc_step.get_lines()[0].get_xdata()) == list(STEPS)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["Standard (1 seed)"]


def test_time_from_another_row_of_the_same_step(tmp_path):
    """Lightning may log the time on its own row of the step: it still belongs to that evaluation."""
    run = make_record(tmp_path, "softmax", 0)
    (run / "metrics.csv").write_text("step,val/acc,val/loss,time/train_s\n10,,,5.5\n10,0.5,1.0,\n20,0.6,0.9,\n")
    cur = read_curve(run)
    assert list(cur["step"]) == [10, 20] and cur["time"].iloc[0] == 5.5 and math.isnan(cur["time"].iloc[1])


def test_curves_without_measured_time_are_approximated_and_say_so(tmp_path):
    for seed in (0, 1):
        make_record(tmp_path, "softmax", seed, time_per_1k_steps_s=100.0 * (seed + 1))  # older: no time column
        make_record(tmp_path, "softmax", seed, sub=LONG)
    make_record(tmp_path, "none", 0, time_per_1k_steps_s=None)  # no time at all: drawn against steps only
    timed_record(tmp_path, "nystrom", 0)
    runs, _ = load_runs(tmp_path)
    fig, notes = curves_figure(runs, tmp_path, "quick", "listops")
    (acc_step, acc_time), (_, loss_time) = fig.axes[0:2], fig.axes[2:4]
    labels = [t.get_text().replace("\n", "") for t in fig.legends[0].get_texts()]
    assert labels == [
        "none (no attention) (1 seed; no training time)",
        "Nyströmformer (1 seed)",
        "Standard (2 seeds; time approximated)",
        "Standard [n_test=64, n_train=256, lr=0.001] (2 seeds; time approximated)",
    ]  # changed keys
    soft = acc_step.get_lines()[2].get_color()
    # time = step x the seeds' mean time per step (100 and 200 s per 1k steps), in minutes (Nyströmformer: 15 min)
    assert line_of(acc_time, soft).get_xdata() == pytest.approx([s * 0.15 / 60 for s in STEPS])
    assert line_of(acc_time, soft).get_linestyle() == "--"  # approximated: dashed, measured: solid
    assert line_of(acc_time, acc_step.get_lines()[1].get_color()).get_linestyle() == "-"
    assert line_of(acc_step, soft).get_ydata() == pytest.approx([100 * (0.2 + 0.05 * i + 0.005) for i in range(4)])
    assert len(acc_step.get_lines()) == 4 and len(acc_time.get_lines()) == 3
    xlabel = loss_time.get_xlabel()
    assert "measured" in xlabel and "dashed" in xlabel and "≈ step × mean time per step" in xlabel
    approx = sorted(p for p, n in notes if "approximated" in n)
    assert approx == [f"quick/clean/listops/softmax/seed{s}{sub}" for s in (0, 1) for sub in ("", f"/{LONG}")]
    assert [p for p, n in notes if "steps only" in n] == ["quick/clean/listops/none/seed0"]


def test_curves_all_approximated_say_so_on_the_axis(tmp_path):
    make_record(tmp_path, "softmax", 0)
    runs, _ = load_runs(tmp_path)
    fig, notes = curves_figure(runs, tmp_path, "quick", "listops")
    assert "≈ step × mean time per step" in fig.axes[3].get_xlabel() and "approximated" in fig.axes[3].get_xlabel()
    assert len(notes) == 1 and "approximated" in notes[0][1]


# ----------------------------------------------------------------------------- efficiency
def test_efficiency_memory_estimate_in_gib_and_labels_at_points(tmp_path):
    make_record(tmp_path, "softmax", 0, device="cpu", peak_mem_bytes=None, peak_mem_estimate_bytes=3 * 2**30)
    make_record(tmp_path, "skeinformer_no_rownorm", 0, peak_mem_bytes=2**30, peak_mem_estimate_bytes=5 * 2**30)
    runs, _ = load_runs(tmp_path)
    fig = efficiency_figure(summary(runs), "quick", "listops")
    mem_ax = fig.axes[1]
    assert sorted(_points(mem_ax)[:, 0]) == [1.0, 3.0]  # measured where present, else the estimate (GiB)
    assert "peak memory (GiB)" in mem_ax.get_xlabel() and "filled: measured" in mem_ax.get_xlabel()
    assert "hollow: estimated" in mem_ax.get_xlabel()
    labels = {a.get_text(): a.xy for a in mem_ax.texts if isinstance(a, Annotation)}
    assert labels == {
        "Standard (1 seed)": (3.0, pytest.approx(40.0)),
        "Skeinformer w/o row normalization (1 seed)": (1.0, pytest.approx(40.0)),
    }
    assert not [t for t in texts_of(fig) if any(f in t for f in FORBIDDEN)]


# ----------------------------------------------------------------------------- the LRA chart
def _speed_records(root, rows, seeds=(0,), **fields):
    """rows: {attn: {task: steps per second}}."""
    for attn, per_task in rows.items():
        for task, sps in per_task.items():
            for seed in seeds:
                make_record(
                    root, attn, seed, task=task, time_per_1k_steps_s=1000.0 / sps, test_acc=0.4 + 0.01 * seed, **fields
                )


def test_lra_chart_speed_is_relative_to_softmax_per_task(tmp_path):
    _speed_records(
        tmp_path,
        {
            "softmax": {"listops": 10.0, "text": 5.0},
            "nystrom": {"listops": 30.0, "text": 20.0},
            "performer": {"listops": 15.0},
        },
    )
    runs, _ = load_runs(tmp_path)
    d, unit, ref = lra_chart_data(summary(runs), "quick")
    assert unit == "steps/s" and ref == "softmax"
    rel = d.set_index("row")["x"]
    assert rel["softmax"] == 1.0
    assert rel["nystrom"] == pytest.approx(math.sqrt(3.0 * 4.0))  # geometric mean of 30/10 and 20/5
    assert rel["performer"] == pytest.approx(1.5)
    fig, _ = lra_chart_figure(summary(runs), "quick")
    ax = fig.axes[0]
    assert sorted(_points(ax)[:, 0]) == pytest.approx(sorted([1.0, math.sqrt(12.0), 1.5]))
    assert "relative to Standard" in ax.get_xlabel() and "geometric mean" in ax.get_xlabel()
    # labels as text next to their point, the papers' names, partial rows marked
    ann = {a.get_text(): a for a in ax.texts if isinstance(a, Annotation)}
    assert set(ann) == {"Standard (1 seed)", "Nyströmformer (1 seed)", "Performer (1 of 2 tasks, 1 seed)"}
    for text, x in (("Standard (1 seed)", 1.0), ("Nyströmformer (1 seed)", math.sqrt(12.0))):
        assert ann[text].xy[0] == pytest.approx(x)
        off = np.hypot(*ann[text].xyann)
        assert 0 < off < 60  # points from the marker: next to it
    assert not [t for t in texts_of(fig) if any(f in t for f in FORBIDDEN)]


def test_lra_chart_without_softmax_falls_back_to_absolute_speed(tmp_path):
    _speed_records(tmp_path, {"nystrom": {"listops": 30.0, "text": 20.0}, "performer": {"listops": 15.0}})
    runs, _ = load_runs(tmp_path)
    d, _, ref = lra_chart_data(summary(runs), "quick")
    assert ref == "" and d.set_index("row")["x"]["nystrom"] == pytest.approx(math.sqrt(600.0))
    fig, _ = lra_chart_figure(summary(runs), "quick")
    assert "absolute, not relative" in fig.axes[0].get_xlabel() and "steps/s" in fig.axes[0].get_xlabel()


def test_lra_chart_bars_are_the_95_t_interval_of_the_average(tmp_path):
    for seed, acc in enumerate((0.30, 0.40, 0.50)):
        for task in ("listops", "text"):
            make_record(tmp_path, "softmax", seed, task=task, test_acc=acc)
    runs, _ = load_runs(tmp_path)
    d, _, _ = lra_chart_data(summary(runs), "quick")
    # two tasks, std 10 each over 3 seeds: se = sqrt(2 * 100 / 3) / 2, Welch-Satterthwaite df = 4
    half = 2.776445 * math.sqrt(200 / 3) / 2
    assert (d["acc_lo"].iloc[0], d["acc_hi"].iloc[0]) == pytest.approx((40 - half, 40 + half), rel=1e-5)
    fig, _ = lra_chart_figure(summary(runs), "quick")
    ax = fig.axes[0]
    assert "95% t-interval" in ax.get_ylabel()
    segs = [c.get_segments() for c in ax.collections if type(c).__name__ == "LineCollection"]
    lo, hi = sorted(segs[0][0][:, 1])
    assert (lo, hi) == pytest.approx((40 - half, 40 + half), rel=1e-5)


def test_lra_chart_interval_never_leaves_0_to_100(tmp_path):
    """Bug caught: with three spread seeds near 0 %, the average's interval ran below zero and the
    accuracy axis with it (the chart drew -20 %)."""
    for seed, acc in enumerate((0.01, 0.02, 0.30)):
        make_record(tmp_path, "softmax", seed, test_acc=acc)
    runs, _ = load_runs(tmp_path)
    d, _, _ = lra_chart_data(summary(runs), "quick")
    assert d["acc_lo"].iloc[0] == 0.0 and d["acc_hi"].iloc[0] < 100.0
    fig, _ = lra_chart_figure(summary(runs), "quick")
    ax = fig.axes[0]
    assert ax.get_ylim()[0] >= 0.0
    segs = [c.get_segments() for c in ax.collections if type(c).__name__ == "LineCollection"]
    assert min(segs[0][0][:, 1]) == 0.0


def test_lra_chart_memory_and_throughput(tmp_path):
    for task, acc, tok in (("listops", 0.4, 1000.0), ("text", 0.6, 4000.0)):
        for seed in (0, 1):
            make_record(
                tmp_path,
                "softmax",
                seed,
                task=task,
                test_acc=acc + 0.02 * seed,
                tokens_per_s=tok,
                peak_mem_bytes=(2 if task == "text" else 1) * 2**30,
            )
    make_record(
        tmp_path,
        "none",
        0,
        task="listops",
        test_acc=0.2,
        tokens_per_s=9000.0,
        device="cpu",
        peak_mem_bytes=None,
        peak_mem_estimate_bytes=3 * 2**30,
    )
    make_record(
        tmp_path,
        "vmean",
        0,
        task="listops",
        test_acc=0.2,
        tokens_per_s=3000.0,
        peak_mem_bytes=None,
        peak_mem_estimate_bytes=3 * 2**30,
    )
    runs, _ = load_runs(tmp_path)
    d, unit, ref = lra_chart_data(summary(runs), "quick")
    assert unit == "tokens/s" and ref == "softmax"
    soft, none = d.set_index("row").loc["softmax"], d.set_index("row").loc["none"]
    assert soft["acc"] == pytest.approx(51.0) and soft["speed"] == pytest.approx(2000.0)  # geometric mean
    assert soft["mem"] == 2 * 2**30 and soft["mem_src"] == "measured" and soft["tasks"] == 2
    # timed on a CPU against Standard on a V100: no ratio (it would read 9x), left out and said
    assert math.isnan(none["x"]) and none["mem_src"] == "estimated" and none["tasks"] == 1
    fig, notes = lra_chart_figure(summary(runs), "quick")
    assert [n for _, n in notes if "same device" in n]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "filled: peak memory measured" in legend and any(
        t.startswith("hollow: peak memory estimated") for t in legend
    )
    assert d.set_index("row").loc["vmean", "x"] == pytest.approx(3.0)  # the same device: 3000 / 1000 tokens/s
    assert "3 GiB" in legend and "1.5 GiB" in legend  # reference sizes in GiB, the largest first
    assert not [t for t in texts_of(fig) if any(f in t for f in FORBIDDEN)]


# ----------------------------------------------------------------------------- every figure, on disk
def test_plot_preset_writes_every_figure_byte_identically_without_field_names(tmp_path):
    runs_root = tmp_path / "runs"
    for seed in (0, 1, 2):
        for task in ("listops", "text"):
            timed_record(runs_root, "softmax", seed, task=task, tokens_per_s=1000.0)
            make_record(
                runs_root,
                "skeinformer_no_rownorm",
                seed,
                task=task,
                tokens_per_s=3000.0,
                device="cpu",
                peak_mem_bytes=None,
                peak_mem_estimate_bytes=2**29,
            )
        make_record(runs_root, "nystrom", seed, sub=LONG, tokens_per_s=2500.0)  # one task only, an override
    runs, _ = load_runs(runs_root)
    summ = summary(runs)
    a, notes = plot_preset(runs, summ, runs_root, "quick", tmp_path / "a")
    plot_preset(runs, summ, runs_root, "quick", tmp_path / "b")
    names = sorted(p.name for p in a)
    assert names == sorted(
        f"{s}.{e}"
        for s in ("curves_listops", "curves_text", "efficiency_listops", "efficiency_text", "lra_chart")
        for e in ("png", "pdf")
    )
    assert all(p.read_bytes() == (tmp_path / "b" / p.name).read_bytes() for p in a)
    assert not list(tmp_path.rglob("*.tmp"))
    assert any("approximated" in n for _, n in notes)
    for fig in (
        curves_figure(runs, runs_root, "quick", "listops")[0],
        efficiency_figure(summ, "quick", "text"),
        lra_chart_figure(summ, "quick")[0],
    ):
        bad = [t for t in texts_of(fig) if any(f in t for f in FORBIDDEN)]
        assert bad == []


@pytest.mark.slow  # 3 figures drawn; the escaping of every other format is in the main suite (test_collect)
def test_a_dollar_in_a_record_name_is_drawn_as_written_not_as_math(tmp_path):
    """Matplotlib reads ``$...$`` as math: a backend named ``a$\\frac{$b`` once stopped the collection."""
    runs_root = tmp_path / "runs"
    for attn in ("softmax", "a$\\frac{$b"):
        timed_record(runs_root, attn, 0)
    runs, _ = load_runs(runs_root)
    files, _ = plot_preset(runs, summary(runs), runs_root, "quick", tmp_path / "out")
    assert {p.suffix for p in files} == {".png", ".pdf"}


def test_point_labels_cut_alike_keep_their_whole_names(tmp_path):
    """Bug caught (issue 40): two rows whose labels share their first 34 characters got the same point label, in
    the efficiency figure and in the LRA chart."""
    for seed in range(2):
        make_record(tmp_path, "softmax", seed)
        make_record(tmp_path, "performer", seed)
    runs, _ = load_runs(tmp_path)
    names = {
        k: f"Standard [lr=0.001, max_steps=150, warmup=30, dropout=0.{i}]"
        for i, k in enumerate(("softmax", "performer"))
    }
    fig = efficiency_figure(summary(runs), "quick", "listops", names)
    labels = sorted(a.get_text() for a in fig.axes[0].texts if isinstance(a, Annotation))
    assert labels == sorted(names.values())
    fig, _ = lra_chart_figure(summary(runs), "quick", names)
    assert sorted(a.get_text() for a in fig.axes[0].texts if isinstance(a, Annotation)) == labels
