"""lra.tools.bench --reference (ours against the papers' public code, side by side) and what every benchmark
report says about the machine's load. The public code is a stand-in written here: a folder laid out like the
Skeinformer checkout, whose softmax is slow on purpose, so which side is faster is known."""

import csv
import sys

import pytest
import torch

from lra import devices
from lra.tools.bench import cli as bench_cli
from lra.tools.bench import reference
from lra.tools.meter import timing

THEIR_ATTENTION = """
import time
import torch
from torch import nn

CALLS = []


class Softmax(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config["head_dim"]
        self.delay = config["delay_s"]

    def forward(self, Q, K, V, mask):
        CALLS.append(Q.shape[-2])
        time.sleep(self.delay)  # slow on purpose: this side must come out slower
        dot = Q @ K.transpose(-1, -2) / self.head_dim ** 0.5
        dot = dot.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return dot.softmax(-1) @ V


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = Softmax(config)
"""


@pytest.fixture
def checkout(tmp_path):
    """A folder laid out like https://github.com/pkuzengqi/Skeinformer (src/config.py, src/models/)."""
    root = tmp_path / "Skeinformer"
    (root / "src/models").mkdir(parents=True)
    (root / "src/models/model_LRA.py").write_text("")
    (root / "src/models/attention.py").write_text(THEIR_ATTENTION)
    (root / "src/config.py").write_text(
        'Config = {"lra-listops": {"model": {"delay_s": 0.02}, "extra_attn_config": {"softmax": {}}}}\n'
    )
    return root


def test_reference_mode_times_ours_and_theirs_interleaved_and_reports_ours_over_theirs(checkout, tmp_path, capsys):
    out = tmp_path / "out"
    rows = bench_cli.main(
        ["--reference", "--skeinformer", str(checkout), "--backends", "softmax", "--lengths", "64", "128"]
        + ["--repeats", "2", "--warmup", "0", "--out", str(out)]
    )
    assert [(r["pair"], r["n"]) for r in rows] == [
        ("skeinformer:softmax[materialized]", 64),
        ("skeinformer:softmax[materialized]", 128),
        ("skeinformer:softmax[fused]", 64),
        ("skeinformer:softmax[fused]", 128),
    ]
    for r in rows:
        assert r["ratio"] == pytest.approx(r["ours_ms"] / r["theirs_ms"])
        assert r["theirs_ms"] >= 20 and r["ratio"] < 0.5  # their 20 ms sleep: ours is the faster side
        assert r["max_abs_diff"] < 1e-5  # the same attention: outputs compared on the real query rows
    with open(out / "reference.csv", newline="") as f:
        assert [int(r["n"]) for r in csv.DictReader(f)] == [64, 128, 64, 128]
    md = (out / "reference.md").read_text()
    assert "skeinformer:softmax[fused] vs softmax" in md and "Load average" in md
    assert "Load average" in capsys.readouterr().out
    assert "config" not in sys.modules and "models" not in sys.modules  # their modules are gone again


def test_a_module_faster_than_theirs_is_measured_as_such_whichever_runs_first(checkout, monkeypatch):
    """Interleaving: each repeat alternates who goes first, and both sides get the same number of calls."""
    pair = reference.select(["softmax"], {"skeinformer": checkout})[0]
    order = []
    real_call = reference._call

    def spy(module, *args):
        order.append("theirs" if type(module).__name__ == "Softmax" else "ours")
        return real_call(module, *args)

    monkeypatch.setattr(reference, "_call", spy)
    r = reference.measure(pair, 32, {"skeinformer": checkout}, repeats=4, warmup=1, seed=0)
    assert r["ratio"] < 0.5
    ours, theirs = r["calls_ours"], r["calls_theirs"]
    assert theirs == 1 and ours > 1  # a sample lasts 20 ms: several calls of the fast side, one of theirs
    timed = order[2:]  # after the first call of each side
    assert timed.count("ours") == 5 * ours and timed.count("theirs") == 5 * theirs
    firsts, i = [], 0
    for rep in range(5):
        firsts.append(timed[i])
        i += ours + theirs
    assert firsts == ["ours", "theirs", "ours", "theirs", "ours"]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--skeinformer", "/nowhere"], "--skeinformer belongs to the reference mode: add --reference"),
        (["--reference"], "no pair to time"),
        (["--reference", "--skeinformer", "/nowhere"], "no src/models/model_LRA.py there"),
        (["--reference", "--skeinformer", "CHECKOUT", "--quick"], "--quick belongs to the layer or task mode"),
        (["--reference", "--skeinformer", "CHECKOUT", "--hardware", "v100_16gb"], "--hardware belongs to"),
        (["--reference", "--skeinformer", "CHECKOUT", "--backends", "bigbird"], "has no public counterpart"),
    ],
)
def test_reference_mode_bad_input_is_one_line_before_any_work(argv, said, checkout, capsys, tmp_path):
    argv = [str(checkout) if a == "CHECKOUT" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        bench_cli.main([*argv, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "out").exists()


def _load(monkeypatch, others_s: float, cores: int = 2):
    """Load averages 0.10 then 1.10, and ``others_s`` CPU seconds of other processes in a 10 s window."""
    averages, stats = iter([0.1, 1.1]), iter([(0.0, 100.0, 0.0), (10.0, 109.0 + others_s, 9.0)])
    monkeypatch.setattr(devices, "loadavg", lambda: next(averages))
    monkeypatch.setattr(devices, "_cpu_seconds", lambda: next(stats))
    monkeypatch.setattr(devices.os, "cpu_count", lambda: cores)


def test_the_load_line_warns_by_the_runs_rule_when_other_processes_took_the_machine(monkeypatch):
    """One rule for "loaded", the runs' records' (lra.devices.machine_loaded): others' share of the CPU time."""
    _load(monkeypatch, others_s=1.0)  # alone: 1 of 20 core-seconds went to others
    quiet = timing.Load(threads=1).stop()
    assert not quiet.loaded and quiet.warning() is None
    assert "0.10 at the start, 1.10 at the end, on 2 cores" in quiet.line()
    assert "other processes used 5% of the machine's CPU time" in quiet.line()
    _load(monkeypatch, others_s=12.0)  # others took 60% of the machine beside this thread
    busy = timing.Load(threads=1).stop()
    assert busy.loaded and busy.machine["cpu_others"] == pytest.approx(0.6)
    assert "the machine was loaded" in busy.warning() and "60%" in busy.line()


def _points(backends, lengths=(256, 512, 1024)):
    return [
        dict(
            backend=b, n=n, status="ok", time_ms=(1 + i) * n / 256, peak_mem_bytes=(1 + i) * n * 2**10, batch=2,
            heads=2, head_dim=32, dtype="float32", device_name="test CPU", flops=n * 1e6, complexity="O(n)",
        )
        for i, b in enumerate(backends)
        for n in lengths
    ]  # fmt: skip


def test_few_backends_share_a_panel_in_colours_that_do_not_repeat_and_many_get_one_panel_each(tmp_path):
    from lra.tools.bench import render

    few = ["softmax", "softmax_materialized", "skeinformer", "nystrom", "performer", "linformer", "yoso"]
    meta = {"load_line": "Load average 3.00 at the start", "load_warning": "Warning: other processes kept ..."}
    fig = render.figure(_points(few), meta)
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    colours = [ln.get_color() for ln in lines]
    assert len(lines) == len(few) and len(set(colours)) == len(colours)
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert any("Load average 3.00" in t and "Warning" in t for t in texts)

    many = few + ["linear", "bigbird"]
    fig = render.figure(_points(many), meta)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == len(many) - 2  # one panel per backend; the two softmax rows are in every panel
    assert all(len(ax.get_lines()) == 3 for ax in shown)  # the backend, fused and materialised softmax


@pytest.mark.slow  # drawing two PNGs of ten panels: seconds
def test_many_backends_write_a_time_and_a_memory_figure(tmp_path):
    from lra.tools.bench import render

    many = ["softmax", "softmax_materialized", "skeinformer", "nystrom", "performer", "linformer", "yoso"]
    files = render.plot(_points(many + ["bigbird", "linear"]), tmp_path / "bench.png", {"load_line": "Load"})
    assert [p.name for p in files] == ["bench.png", "bench_memory.png"] and all(p.stat().st_size for p in files)


def test_the_report_names_times_that_fall_as_n_grows():
    from lra.tools.bench import render

    pts = _points(["softmax", "nystrom"])
    for p in pts:
        if p["backend"] == "nystrom" and p["n"] == 512:
            p["time_ms"] = 0.5  # below its n=256 time (2.0 ms): noise, not a measurement to quote
    md = render.render_markdown(pts, {"load_line": "Load average 0.50 at the start"})
    assert "Load average 0.50" in md
    assert "`nystrom` n=256→512 (2 → 0.5 ms)" in md and "`softmax` n=" not in md.split("fall as n grows")[1]


def test_torch_threads_are_restored_after_a_reference_run(checkout, tmp_path):
    before = torch.get_num_threads()
    bench_cli.main(
        ["--reference", "--skeinformer", str(checkout), "--backends", "softmax[fused]", "--lengths", "32"]
        + ["--repeats", "1", "--warmup", "0", "--threads", "2", "--out", str(tmp_path)]
    )
    assert torch.get_num_threads() == before
