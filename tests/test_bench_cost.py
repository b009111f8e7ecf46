"""``python -m lra.tools.bench --cost skeinformer``: Skeinformer Tables 4 and 2 beside the paper's (issue 38), measured
and ``--predict``ed (the fit's decisions counted against the real paper_results.csv; their-code estimates with a
stand-in checkout written here). Every test runs on a CPU; the GPU path is checked up to its configuration."""

import csv

import pytest
import torch
import yaml

import lra.fit
from lra.tools import bench
from lra.tools.bench import cli as bench_cli
from lra.tools.bench import cost, paper
from lra.tools.bench import tasks as bench_tasks
from lra.tools.bench.paper import agreement, paper_cells, paper_report, their_fit
from lra.tools.collect.tables import PAPER_CSV, paper_results
from lra.tools.display import SKEIN_ROWS
from lra.tools.meter import step as meter_step

# tiny shapes: n = 64, a batch of 8 as 4 x 2 (hardware.micro_batch: no memory estimates), 1 timed step
TINY = ["task.seq_len=64", "train.batch_size=8", "hardware.micro_batch=4", "fit.cache=false"]
TASKS = cost.PAPERS["skeinformer"][1]


def paper_value(table: str, attn: str, task: str, metric: str) -> float:
    """The paper's number as lra/tools/collect/paper_results.csv has it, read apart from the code under test."""
    with open(PAPER_CSV, newline="") as f:
        (hit,) = [
            r
            for r in csv.DictReader(f)
            if (r["paper"], r["table"], r["attn"], r["task"], r["metric"]) == ("skeinformer", table, attn, task, metric)
        ]
    return float(hit["value"])


def md_row(md: str, heading: str, name: str) -> list[str]:
    """The cells of row ``name`` in the table under ``heading``, and its header before it."""
    table = md.split(heading, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| {name} |"))
    return dict(zip(head, (c.strip() for c in row.strip("|").split("|"))))


def test_cpu_rehearsal_pairs_every_cell_with_the_papers_value_and_survives_an_oom(tmp_path, monkeypatch):
    """2 rows x 2 tasks given in the opposite of the paper's order; the step of one cell raises CUDA's OOM. The
    table keeps the paper's order, pairs each cell with its own row and column of the paper, computes minutes
    from milliseconds, and reports the OOM cell as one line while the others are measured."""
    torch.set_num_threads(1)

    class OomOnce(bench_tasks.TrainStep):
        def __call__(self, net, batches):
            if self.cell == ("listops", "skeinformer"):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return super().__call__(net, batches)

        def __init__(self, model, spec, *a):
            super().__init__(model, spec, *a)
            self.cell = (spec.task, spec.attn.label)

    def plan(spec):  # a cell whose fit fails outside the step (an estimator that cannot trace it)
        if (spec.task, spec.attn.label) == ("text", "skeinformer"):
            raise RuntimeError("cannot trace\nthis backend")
        return fit_plan(spec)

    fit_plan = bench_tasks.plan
    monkeypatch.setattr(meter_step, "TrainStep", OomOnce)  # the runner the task mode times
    monkeypatch.setattr(bench_tasks, "plan", plan)
    argv = ["--cost", "skeinformer", "--device", "cpu", "--quick", "--tasks", "listops", "text"]
    argv += ["--backends", "skeinformer", "softmax", "--repeats", "1", "--out", str(tmp_path)]
    for o in TINY:
        argv += ["--override", o]
    cells = bench.main(argv)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost_skeinformer.csv", "cost_skeinformer.md"]
    with open(tmp_path / "cost_skeinformer.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # the paper's row order (Standard first) and column order (Text before ListOps), whatever was asked
    order = [("softmax", "text"), ("softmax", "listops"), ("skeinformer", "text"), ("skeinformer", "listops")]
    assert [(r["attn"], r["task"]) for r in rows] == order == [(c["attn"], c["task"]) for c in cells]
    by = {(r["attn"], r["task"]): r for r in rows}
    for (attn, task), r in by.items():
        assert float(r["paper_bz"]) == paper_value("table4", attn, task, "batch")
        assert float(r["paper_accu"]) == paper_value("table4", attn, task, "accum")
        assert float(r["paper_t2_accu"]) == paper_value("table2", attn, task, "accum")
        assert float(r["paper_min_per_1k"]) == paper_value("table2", attn, task, "min_per_1k")
    # and the numbers themselves (Skeinformer Tables 4 and 2), so a broken file cannot agree with itself
    assert [by["softmax", "text"][k] for k in ("row", "paper_bz", "paper_accu", "paper_min_per_1k")] == [
        "Standard",
        "16",
        "8",
        "51",
    ]
    assert [by["softmax", "listops"][k] for k in ("paper_bz", "paper_accu", "paper_min_per_1k")] == ["64", "4", "22"]
    assert [by["skeinformer", "listops"][k] for k in ("row", "paper_bz", "paper_accu")] == ["Skeinformer", "128", "2"]

    oom = by["skeinformer", "listops"]
    assert (oom["status"], oom["under_cap"], oom["min_per_1k"]) == ("oom", "OOM", "")
    assert "OutOfMemoryError" in oom["reason"] and (oom["micro_batch"], oom["accum_steps"]) == ("4", "2")
    failed = by["skeinformer", "text"]
    assert (failed["status"], failed["reason"], failed["paper_bz"]) == (
        "error",
        "RuntimeError: cannot trace this backend",
        "64",
    )
    for key in order[:2]:
        r = by[key]
        assert (r["status"], r["under_cap"], r["micro_batch"], r["accum_steps"]) == ("ok", "no cap", "4", "2")
        assert (r["double_micro_batch"], r["double_status"]) == ("8", "fits")  # accu 2: one step at 8 ran
        # minutes per 1,000 optimizer steps from the median step in milliseconds
        assert float(r["min_per_1k"]) == pytest.approx(float(r["time_ms"]) * 1000 / 1000 / 60, rel=1e-5)
        assert float(r["time_vs_paper"]) == pytest.approx(float(r["min_per_1k"]) / float(r["paper_min_per_1k"]), 1e-4)

    md = (tmp_path / "cost_skeinformer.md").read_text()
    assert "**eager** (the papers' 2021 PyTorch code had no torch.compile)" in md and "CPU rehearsal" in md
    assert "`python -m lra.tools.bench --cost skeinformer --tasks listops text --backends skeinformer softmax" in md
    t4 = md_row(md, "## Table 4", "Standard")
    assert list(t4) == ["Model", "Text ours", "Text paper", "ListOps ours", "ListOps paper"]
    assert (t4["Text paper"], t4["ListOps paper"]) == ("16×8", "64×4")
    assert t4["Text ours"].startswith("4×2") and "(2× fits)" in t4["Text ours"]
    sk = md_row(md, "## Table 4", "Skeinformer")
    assert (sk["Text paper"], sk["ListOps paper"]) == ("64×2", "128×2") and "**OOM**" in sk["ListOps ours"]
    t2 = md_row(md, "## Table 2", "Standard")
    assert (t2["Text paper"], t2["ListOps paper"]) == ("51 (8)", "22 (4)")
    assert md_row(md, "## Table 2", "Skeinformer")["ListOps ours"] == "oom"
    assert "- Skeinformer / ListOps: oom: OutOfMemoryError" in md
    assert "- Skeinformer / Text: error: RuntimeError: cannot trace this backend" in md and sk["Text ours"] == "error"


def test_the_allocator_is_capped_at_a_v100s_memory_less_its_cuda_context(monkeypatch):
    """15.77 - 0.75 = 15.02 GiB (as lra.tools.sweep caps a V100 run), on a CUDA device with an index: the cap's
    torch call refuses a bare "cuda". Nothing touches a GPU: the cap is recorded, not set."""
    capped = []
    monkeypatch.setattr(cost, "limit_gpu_memory", lambda device, env: capped.append((device, env)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cfg = bench_tasks.TaskConfig(tasks=("text",), backends=("softmax",), device="cuda", cost="skeinformer")
    assert cost.cap_memory(cfg) == pytest.approx(15.02)
    assert capped == [(torch.device("cuda", 0), {"LRA_MEMORY_LIMIT_GIB": "15.020000"})]
    assert cost.cap_memory(bench_tasks.TaskConfig(cost="skeinformer")) is None and len(capped) == 1  # a CPU


def test_the_gpu_configuration_is_the_papers_rows_as_their_runs_eager_under_the_v100_plan(root):
    """What `--cost skeinformer` runs on a GPU, resolved without one: Table 1's sweep rows in the paper's order, the
    tasks in its column order, the step alone, eager, preset=skeinformer_paper, whose Standard is materialised and
    recomputed (the bench's fused baseline would be another row of the paper's)."""
    sweep = yaml.safe_load((root / "conf/sweep/skeinformer_table1.yaml").read_text())
    rows, tasks = cost.PAPERS["skeinformer"]
    assert sorted(rows) == sorted(sweep["grid"]["attn"]) and rows[:2] == ("softmax", "softmax_nodrop")
    assert tasks == ("text", "listops", "retrieval", "pathfinder", "image")
    args = bench.parser().parse_args(["--cost", "skeinformer", "--backends", "softmax", "skeinformer"])
    cfg = bench_cli.task_config(args, "cuda")  # a string: nothing touches a GPU
    assert (cfg.parts, cfg.modes, cfg.compile, cfg.max_batch, cfg.hardware) == (
        ("step",),
        ("eager",),
        False,
        None,
        "v100_16gb",
    )
    assert (cfg.repeats, cfg.warmup, cfg.budget_s, cfg.tasks) == (3, 0, 270.0, tasks)
    standard = bench_tasks.spec_for(cfg, "text", "softmax")
    assert (standard.preset, standard.attn.options["impl"], standard.attn.checkpointing) == (
        "skeinformer_paper",
        "materialized",
        True,
    )
    assert bench_tasks.spec_for(bench_tasks.TaskConfig(), "text", "softmax").attn.options["impl"] == "fused"


def test_cells_not_started_within_the_budget_are_lines_of_the_table(tmp_path):
    cfg = bench_tasks.TaskConfig(tasks=("text",), backends=("vmean", "softmax"), cost="skeinformer", budget_s=1e-9)
    rows = bench_tasks.run(cfg, log=lambda s: None)
    assert [(r["backend"], r["status"]) for r in rows] == [("vmean", "skipped"), ("softmax", "skipped")]
    cs = cost.cells(rows, None)
    assert [c["row"] for c in cs] == ["Standard", "V-mean"] and all(c["min_per_1k"] == "" for c in cs)
    md = cost.render_markdown(cs, {**META, "cap_gib": None})
    assert "- V-mean / Text: skipped: not started within --budget-s 1e-09" in md


META = dict.fromkeys(("title", "command", "date", "device", "device_name", "threads", "git", "hardware"), "?")
META.update(preset="?", plans="?", precision="?", repeats=1, quick=True, load_line="", load_warning=None)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cost", "skeinformer"], ("GPU", "--device cpu --quick")),
        (["--cost", "skeinformer", "--device", "cpu"], ("rehearsal", "--quick")),
        (["--cost", "skeinformer", "--device", "cpu", "--quick", "--compile"], ("eager", "torch.compile")),
        (["--cost", "skeinformer", "--device", "cpu", "--quick", "--max-batch", "2"], ("--max-batch",)),
        (["--cost", "skeinformer", "--device", "cpu", "--quick", "--backends", "softmax_materialized"], ("rows",)),
        (["--layer", "--cost", "skeinformer"], ("--cost", "task mode")),
        (["--tasks", "--device", "cpu", "--budget-s", "5"], ("--budget-s", "--cost")),
        (["--tasks", "--device", "cpu", "--plans", "p.csv"], ("--plans", "--cost")),
        (["--cost", "skeinformer", "--device", "cpu", "--quick", "--plans", "/nonexistent.csv"], ("--plans", "CSV")),
        (["--cost", "skeinformer", "--predict", "--device", "cpu"], ("--device", "--predict")),
        (["--cost", "skeinformer", "--predict", "--plans", "p.csv"], ("--plans", "--predict")),
        (["--cost", "skeinformer", "--predict", "--skeinformer", "/nonexistent"], ("--skeinformer", "src/")),
        (["--tasks", "--skeinformer", "/nonexistent"], ("--skeinformer", "--reference")),
    ],
)
def test_cost_mode_refuses_in_one_line_before_any_work(argv, words, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only machine, whatever this one is
    monkeypatch.setattr(cost, "main_cost", lambda *a: pytest.fail("bad input ran the benchmark"))
    monkeypatch.setattr(cost, "main_predict", lambda *a: pytest.fail("bad input ran the prediction"))
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


# what the paper printed, by hand from its Table 4 (a wrong table, row or task column changes these)
PAPER = {
    ("softmax", "text"): (16, 8),
    ("softmax", "listops"): (64, 4),
    ("softmax_nodrop", "text"): (8, 16),
    ("informer", "listops"): (32, 8),
    ("linformer_jlt", "retrieval"): (4, 16),
    ("nystrom", "pathfinder"): (128, 4),
}
# our decisions where they differ from the paper's: (micro-batch, accumulation), the verdict
OURS = {
    ("performer", "listops"): (256, 1, "ours 2x"),
    ("informer", "text"): (128, 1, "ours 8x"),
    ("softmax", "retrieval"): (8, 8, "ours 1/2x"),
    ("vmean", "image"): (256, 2, "batch differs"),  # bz as the paper's, accu not: not equal
}


def rows_like_the_paper():
    """Decision rows as lra.fit's table gives them: the paper's Table 4 values except at OURS."""
    df = paper_results()
    t4 = df[(df["paper"] == "skeinformer") & (df["table"] == "table4")]
    got = {(r.attn, r.task, r.metric): int(r.value) for r in t4.itertuples()}
    rows = []
    for attn, _ in SKEIN_ROWS:
        for task in TASKS:
            bz, accu = got[(attn, task, "batch")], got[(attn, task, "accum")]
            bz, accu = OURS.get((attn, task), (bz, accu))[:2]
            rows.append({"attn": attn, "task": task, "micro_batch": bz, "accum_steps": accu, "capped": False})
    return rows


def test_cells_stand_beside_the_right_paper_cell_and_are_counted():
    cells = paper_cells(rows_like_the_paper(), TASKS)
    by = {(c["attn"], c["task"]): c for c in cells}
    assert len(cells) == 80 and [c["row"] for c in cells[::5]] == [name for _, name in SKEIN_ROWS]
    assert [c["task"] for c in cells[:5]] == ["text", "listops", "retrieval", "pathfinder", "image"]
    for key, (bz, accu) in PAPER.items():
        assert (by[key]["paper_bz"], by[key]["paper_accu"], by[key]["paper_t2_accu"]) == (bz, accu, accu)
    for key, (_, _, verdict) in OURS.items():
        assert by[key]["verdict"] == verdict
    assert agreement(cells) == {"equal": 76, "ours 2x": 1, "ours 8x": 1, "ours 1/2x": 1, "batch differs": 1}


def test_report_is_the_collectors_tables_with_the_command_on_top():
    cells = paper_cells([r for r in rows_like_the_paper() if r["task"] in ("listops", "text")], ("text", "listops"))
    files = paper_report(cells, "python -m lra.tools.bench --cost skeinformer --predict --tasks text listops")
    md = files[".md"]
    assert md.splitlines()[3] == "python -m lra.tools.bench --cost skeinformer --predict --tasks text listops"
    assert "equal 30, ours 2x 1, ours 8x 1 of 32." in md
    assert "| Performer | 128x1 / 64x2: ours 2x | 256x1 / 128x2: ours 2x |" not in md  # text is the paper's
    assert "| Performer | 64x2 / 64x2: equal | 256x1 / 128x2: ours 2x |" in md
    assert "| Performer | 64 | 64 | +0 | 2 | 2 | +0 | **256** | 128 | +128 | **1** | 2 | -1 |" in md
    assert "finished run" not in md + files[".tex"] and "run records" not in files[".tex"]
    assert files[".tex"].count(r"\begin{tabular}") == 2 and "Retrieval" not in files[".tex"]
    assert len(files[".csv"].splitlines()) == 33 and ".theirs.csv" not in files


THEIR_ATTENTION = """
import torch
from torch import nn


class Hungry(nn.Module):
    # softmax that also keeps a (b, h, n, n, 16) tensor for backward: it needs more than ours
    def forward(self, Q, K, V, mask):
        dot = (Q @ K.transpose(-1, -2)).unsqueeze(-1).expand(-1, -1, -1, -1, 16).mean(-1)
        return (dot - 1e6 * (1 - mask[:, None, None, :])).softmax(-1) @ V


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, h = config["transformer_dim"], config["num_head"] * config["head_dim"]
        self.W_q, self.W_k, self.W_v, self.ff = (nn.Linear(*s) for s in ((d, h), (d, h), (d, h), (h, d)))
        self.heads, self.attn = config["num_head"], Hungry()

    def forward(self, X, mask):
        split = lambda t: t.reshape(*t.shape[:2], self.heads, -1).transpose(1, 2)
        with torch.cuda.amp.autocast(enabled=False):
            out = self.attn(*(split(w(X)).float() for w in (self.W_q, self.W_k, self.W_v)), mask.float())
        return self.ff(out.transpose(1, 2).reshape(*X.shape[:2], -1))
"""


@pytest.fixture
def checkout(tmp_path):
    """A folder laid out like https://github.com/pkuzengqi/Skeinformer (src/config.py, src/models/)."""
    root = tmp_path / "Skeinformer"
    (root / "src/models").mkdir(parents=True)
    (root / "src/models/__init__.py").write_text("")
    (root / "src/models/attention.py").write_text(THEIR_ATTENTION)
    model = {"transformer_dim": 64, "head_dim": 32, "num_head": 2}
    (root / "src/config.py").write_text(
        f'Config = {{"lra-listops": {{"model": {model}, "extra_attn_config": {{}}}}}}\n'
    )
    return root


def test_their_module_decides_which_code_explains_a_difference(checkout, tmp_path, monkeypatch):
    load, budget = paper.load, {"gib": 100.0}

    def small(args):  # ListOps at n=128 under a budget the test sets
        total = budget["gib"] * 1.1 + 0.75
        return load([*args, f"runs_root={tmp_path}", "task.seq_len=128", f"hardware.total_gib={total}"])

    monkeypatch.setattr(paper, "load", small)
    cell = {"row": "V-mean", "attn": "vmean", "task": "listops", "micro_batch": 8, "paper_bz": 4}
    (free,) = their_fit(cell, checkout)
    assert free["their_bz"] == 8 and free["explains"] == "not their code" and free["theirs"] == "vmean"
    assert free["theirs_at_ours_gib"] > free["ours_at_ours_gib"] > free["ours_at_paper_gib"]
    budget["gib"] = free["theirs_at_paper_gib"] * 1.01  # their module fits the paper's 4, not our 8
    (tight,) = their_fit(cell, checkout)
    assert (tight["their_bz"], tight["explains"]) == (4, "their code")


def test_plans_force_the_predicted_micro_batch_and_no_fit_runs(tmp_path, monkeypatch):
    """--plans: each cell at its own line's micro-batch of a --predict CSV (not its neighbour's, not the fit's), with
    the accumulation that keeps the batch; a memory fit or lra.fit.plan's search would fail the test."""
    torch.set_num_threads(1)
    monkeypatch.setattr(lra.fit, "plan", lambda *a, **k: pytest.fail("lra.fit.plan ran"))
    monkeypatch.setattr(lra.fit, "train_step_peak", lambda *a, **k: pytest.fail("a memory fit ran"))
    plans = tmp_path / "predicted.csv"
    lines = ["row,attn,task,micro_batch,accum_steps", "Standard,softmax,text,2,4", "Standard,softmax,listops,8,1"]
    plans.write_text("\n".join([*lines, "V-mean,vmean,text,1,8", "V-mean,vmean,listops,4,2"]) + "\n")
    argv = ["--cost", "skeinformer", "--device", "cpu", "--quick", "--tasks", "listops", "text"]
    argv += ["--backends", "vmean", "softmax", "--repeats", "1", "--plans", str(plans), "--out", str(tmp_path / "o")]
    for o in TINY[:2] + TINY[3:]:  # no hardware.micro_batch of ours: the CSV's is the only one
        argv += ["--override", o]
    cells = bench.main(argv)
    got = {(c["attn"], c["task"]): (c["status"], c["micro_batch"], c["accum_steps"], c["plan_source"]) for c in cells}
    assert got == {
        ("softmax", "text"): ("ok", 2, 4, "hardware.micro_batch"),
        ("softmax", "listops"): ("ok", 8, 1, "hardware.micro_batch"),
        ("vmean", "text"): ("ok", 1, 8, "hardware.micro_batch"),
        ("vmean", "listops"): ("ok", 4, 2, "hardware.micro_batch"),
    }
    md = (tmp_path / "o/cost_skeinformer.md").read_text()
    assert f"--plans {plans}" in md and f"micro-batches from `{plans}` (forced; no fit ran here)" in md


def test_predict_writes_the_comparison_with_the_command_as_typed_and_no_local_path(tmp_path, monkeypatch, capsys):
    """--predict on a CPU: the fit's decisions (forced here: instant) beside the paper, PATH.md/.csv/.tex, the
    command as typed on the .md's fourth line (after the heading, in a code block) with no checkout path."""
    monkeypatch.setattr(paper, "their_fit", lambda cell, root: [{"row": cell["row"], "root": str(root)}])
    (tmp_path / "Sk/src/models").mkdir(parents=True)
    (tmp_path / "Sk/src/models/model_LRA.py").write_text("")  # what check_roots looks for
    out = tmp_path / "p/table4"
    argv = ["--cost", "skeinformer", "--predict", "--tasks", "listops", "--backends", "vmean", "softmax"]
    argv += ["--skeinformer", str(tmp_path / "Sk"), "--override", "hardware.micro_batch=64", "--out", str(out)]
    files = bench.main(argv)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        f"table4{s}" for s in (".csv", ".md", ".tex", ".theirs.csv")
    ]
    md = (out.parent / "table4.md").read_text()
    assert md == files[".md"]
    assert md.splitlines()[3] == (
        "python -m lra.tools.bench --cost skeinformer --predict --tasks listops --backends vmean softmax "
        f"--skeinformer <checkout of github.com/pkuzengqi/Skeinformer> --override hardware.micro_batch=64 --out {out}"
    )
    # Standard's listops: the paper's 64 x 4; V-mean's: 256 x 1, so ours (64 x 4) is a quarter of it
    assert "| Standard | 64x4 / 64x4: equal |" in md and "| V-mean | 64x4 / 256x1: ours 1/4x |" in md
    assert "equal 1, ours 1/4x 1 of 2." in md and (out.parent / "table4.theirs.csv").read_text().count("Sk") == 1
