"""lra.tools.bench. Layer mode: the quick run's outputs, the CPU memory measurement, the fused-SDPA FLOP formula,
errors. Task mode: the quick run's tables and ratios, accumulation as the plan says, errors."""

import csv
import math

import pytest
import torch
import torch.nn.functional as F

import attention
from lra.tools import bench
from lra.tools.bench import cli as bench_cli
from lra.tools.bench import tasks as bench_tasks
from lra.tools.meter import LIVE, LiveTensorBytes, measure_peak, storage_bytes
from lra.tools.meter import step as meter_step

CPU_FUSED_SDPA = "_scaled_dot_product_flash_attention_for_cpu"


def _other_backend() -> str | None:
    """A third registered backend that runs at n=256/512 (prefer cheap ones), or None."""
    others = [n for n in attention.available() if n not in ("softmax", "none")]
    fits = [
        n
        for n in others
        if not attention.capabilities(n).block_multiple or 256 % attention.capabilities(n).block_multiple == 0
    ]
    for pick in ("vmean", "linear", "performer", "linformer"):
        if pick in fits:
            return pick
    return fits[0] if fits else None


def _cfg(**kw) -> bench.Config:
    base = dict(batch=1, heads=2, head_dim=32, repeats=1, min_repeats=1, warmup=0, threads=1)
    base.update(kw)
    return bench.Config(**base)


def test_quick_run_writes_csv_markdown_and_plot(tmp_path):
    names = ["softmax", "none"] + ([_other_backend()] if _other_backend() else [])
    # --layer --device cpu: the CPU micro-benchmark on any machine (on CUDA the default is the task mode)
    results = bench.main(
        [
            "--layer",
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(tmp_path),
            "--backends",
            *names,
            "--threads",
            "1",
            "--repeats",
            "2",
        ]
    )
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["bench.csv", "bench.md", "bench.png"]  # no temp files

    with open(tmp_path / "bench.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == bench.CSV_COLUMNS
        rows = list(reader)
    assert {(r["backend"], int(r["n"])) for r in rows} == {(b, n) for b in names for n in bench.QUICK_LENGTHS}
    for r in rows:
        assert r["device"] == "cpu" and r["torch_version"] == torch.__version__ and r["threads"] == "1"
    base = [r for r in rows if r["backend"] == "softmax"]
    assert all(r["status"] == "ok" for r in base)
    assert all(float(r["time_ms"]) > 0 and int(r["peak_mem_bytes"]) > 0 and int(r["flops"]) > 0 for r in base)
    assert all(CPU_FUSED_SDPA in r["sdpa_ops"] for r in base)  # the fused kernel really ran
    none = [r for r in rows if r["backend"] == "none"]
    assert all(r["status"] == "ok" and int(r["flops"]) == 0 for r in none)

    for key in ("time_ms", "peak_mem_bytes"):
        assert bench.ratios(results, key)["softmax"] == {n: 1.0 for n in bench.QUICK_LENGTHS}
    md = (tmp_path / "bench.md").read_text()
    assert md.startswith("# Attention micro-benchmark: one layer at batch 2 (CPU;")  # says what it is
    for heading in (
        "## Time ratio to fused softmax",
        "## Peak-memory ratio to fused softmax",
        "## Sanity: memory growth with n",
        "crossover",
    ):
        assert heading in md
    assert md.count("| softmax | 1 | 1 |") == 2  # time and memory: the baseline against itself
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _peak(label: str, n: int, **options) -> int:
    row = {
        "softmax": bench.Row("softmax", "softmax", {"impl": "fused"}),
        "softmax_materialized": bench.Row("softmax_materialized", "softmax", {"impl": "materialized"}),
    }.get(label, bench.Row(label, label))
    return bench.measure_point(row, n, _cfg())["peak_mem_bytes"]


def test_cpu_peak_memory_is_quadratic_for_materialized_and_linear_for_none():
    b, h = 1, 2
    mat = {n: _peak("softmax_materialized", n) for n in (512, 1024)}
    ratio = mat[1024] / mat[512]
    assert 3.5 < ratio < 4.1, f"materialised softmax should grow ~4x per doubling, got {ratio:.2f}"
    # the n×n probabilities (saved for backward) and two n×n gradients are alive at the peak
    scores = b * h * 1024 * 1024 * 4
    assert 2.0 * scores < mat[1024] < 5.0 * scores, mat[1024] / scores

    none = {n: _peak("none", n) for n in (512, 1024)}
    assert 1.95 < none[1024] / none[512] < 2.05
    fused = {n: _peak("softmax", n) for n in (512, 1024)}
    assert 1.9 < fused[1024] / fused[512] < 2.2  # fused SDPA: O(n) memory
    assert fused[1024] < scores  # never holds an n×n matrix


def test_live_tensor_bytes_counts_storages_once_and_frees():
    x = torch.zeros(1000)  # 4000 bytes, allocated before: known, not counted
    with LiveTensorBytes([x]) as live:
        a = torch.ones(2000)  # +8000
        v = a[:10]  # view: same storage, no new bytes
        y = x.view(10, 100)  # view of a known storage
        del a, v
        b = torch.ones(1000)  # a's storage freed first: current 4000
        c = b + 1  # 8000
    assert live.peak == 8000
    assert live.current == 8000
    del b, c, y


def test_the_memory_meter_counts_known_storages_once_and_what_the_call_allocates():
    x = torch.zeros(1000)  # 4000 bytes that exist before the call
    peak = measure_peak(lambda: (torch.ones(2000) + 1).sum(), [x, x.view(10, 100)], "cpu")
    assert peak == (4000 + 2 * 8000, LIVE) and storage_bytes([x, x[:10]]) == 4000


def test_registered_cpu_sdpa_flop_formula_gives_4_n2_d_per_head():
    b, h, n, d = 2, 2, 256, 32
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    with bench.OpNames() as ops, bench.flop_counter() as fc:
        out = F.scaled_dot_product_attention(q, k, v)
    assert CPU_FUSED_SDPA in ops.sdpa
    fwd = fc.get_total_flops()
    assert fwd == pytest.approx(4 * n * n * d * b * h, rel=0.02)
    with bench.flop_counter() as fc:
        out.backward(torch.randn_like(out))
    assert fc.get_total_flops() == pytest.approx(2.5 * fwd, rel=0.02)

    # the same attention through the math path (plain bmm, priced by torch) agrees on the forward
    with (
        torch.no_grad(),
        torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH),
        bench.flop_counter() as fc_math,
    ):
        F.scaled_dot_product_attention(q, k, v)
    assert fc_math.get_total_flops() == pytest.approx(fwd, rel=0.02)


def test_unknown_backend_lists_available_names(capsys):
    with pytest.raises(ValueError, match="available: .*softmax.*"):
        bench.select_rows(["softmax", "no_such_attention"])
    with pytest.raises(SystemExit) as exc:
        bench.main(["--layer", "--backends", "no_such_attention", "--quick"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_attention" in err and "softmax_materialized" in err and "none" in err


def test_set_takes_a_runs_option_spelling_with_hydra_values(monkeypatch, capsys):
    """--set BACKEND.options.NAME=VALUE (a run's attn.options.NAME=VALUE, the backend for attn), the value
    read by Hydra's grammar."""
    handed = []
    monkeypatch.setattr(bench_cli.layer, "run_layer", lambda cfg, rows, out: handed.append(cfg.overrides))
    argv = ["--layer", "--device", "cpu", "--quick", "--backends", "nystrom", "softmax_materialized"]
    bench.main(
        [
            *argv,
            "--set",
            "nystrom.options.landmarks=64",
            "--set",
            "nystrom.options.exact_if_full=true",
            "--set",
            "softmax_materialized.options.impl=materialized",
        ]
    )
    assert handed[-1] == {
        "nystrom": {"landmarks": 64, "exact_if_full": True},
        "softmax_materialized": {"impl": "materialized"},
    }
    assert capsys.readouterr().err == ""
    row = bench.Row("nystrom", "nystrom")
    assert bench.effective_options(row, bench.Config(overrides=handed[-1]))["landmarks"] == 64


def test_a_bad_set_value_is_one_line_naming_key_value_and_what_is_allowed(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli.layer, "run_layer", lambda *a: pytest.fail("bad input ran the benchmark"))
    for item, words in (
        ("nystrom.options.landmarks=0", ("nystrom.options.landmarks=0", "out of range [1, inf)")),
        ("nystrom.options.landmarks=hot", ("nystrom.options.landmarks='hot'", "allowed: integer")),
        ("nystrom.options.landmark=16", ("landmark=16", "valid options", "landmarks")),
        ("nystrom.options.landmarks=(", ("landmarks=(", "Hydra's override grammar")),
        ("nystrom.options.landmarks=1,2", ("landmarks=1,2", "sweep", "one value")),
        ("linformer.options.k=8", ("linformer", "not being run")),
        ("nystrom=3", ("nystrom=3", "BACKEND.options.NAME=VALUE")),
        ("nystrom.landmarks=32", ("nystrom.landmarks=32", "BACKEND.options.NAME=VALUE")),  # no pre-release spelling
    ):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--layer", "--device", "cpu", "--quick", "--backends", "nystrom", "--set", item])
        assert exc.value.code == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and all(w in err[0] for w in words), (item, err)


def test_budgets_skip_the_remaining_lengths_and_say_why():
    row = bench.Row("softmax_materialized", "softmax", {"impl": "materialized"})
    res = bench.run(_cfg(lengths=(64, 128, 256), time_budget_s=1e-9), [row], log=lambda s: None)
    assert [r["status"] for r in res] == ["ok", "skipped", "skipped"]
    assert "per-point budget" in res[1]["reason"]

    first = bench.run(_cfg(lengths=(64,)), [row], log=lambda s: None)[0]["peak_mem_bytes"]
    res = bench.run(_cfg(lengths=(64, 128), mem_budget_bytes=2 * first), [row], log=lambda s: None)
    assert [r["status"] for r in res] == ["ok", "skipped"]
    assert "predicted peak" in res[1]["reason"] and "memory budget" in res[1]["reason"]


def test_crossover_and_slope():
    text, est = bench.crossover({512: 2.0, 1024: 1.2, 2048: 0.8, 4096: 0.5})
    assert "faster from 2048" in text and 1024 < est < 2048
    assert bench.crossover({512: 2.0, 1024: 0.9, 2048: 1.1})[0] == "not faster up to 2048"
    assert bench.crossover({512: 0.5, 1024: 0.4})[0].startswith("faster at all n")
    assert bench.loglog_slope({n: 3.0 * n * n for n in (512, 1024, 2048)}) == pytest.approx(2.0)
    assert math.isnan(bench.loglog_slope({512: 1.0}))


# ----------------------------------------------------------------------------- task mode
def test_task_mode_quick_run_writes_tables_with_ratios(tmp_path):
    """The quick task mode on the CPU (--device cpu: on any machine): whole step and attention rows for
    every task x backend, ratios to fused softmax in the same run, atomic CSV + Markdown."""
    rows = bench.main(
        [
            "--tasks",
            "listops",
            "pathfinder",
            "--quick",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
            "--override",
            "fit.cache=false",
        ]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_tasks.csv", "bench_tasks.md"]  # no temp files
    with open(tmp_path / "bench_tasks.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == bench_tasks.CSV_COLUMNS
        csv_rows = list(reader)
    key = lambda r: (r["task"], r["backend"], r["part"], r["mode"])  # noqa: E731
    assert sorted(map(key, csv_rows)) == sorted(
        (t, b, p, "eager")
        for t in ("listops", "pathfinder")
        for b in bench_tasks.QUICK_BACKENDS
        for p in bench_tasks.PARTS
    )
    assert all(r["status"] == "ok" and r["device"] == "cpu" and r["precision"] == "32-true" for r in csv_rows)
    by = {key(r): r for r in csv_rows}
    for t in ("listops", "pathfinder"):
        for part in bench_tasks.PARTS:
            base, sk = by[(t, "softmax", part, "eager")], by[(t, "skeinformer", part, "eager")]
            assert float(base["time_ratio"]) == 1.0 and float(base["mem_ratio"]) == 1.0
            assert float(sk["time_ratio"]) == pytest.approx(
                float(sk["per_opt_step_ms"]) / float(base["per_opt_step_ms"]), rel=1e-4
            )
            assert float(sk["mem_ratio"]) == pytest.approx(
                int(sk["peak_mem_bytes"]) / int(base["peak_mem_bytes"]), rel=1e-4
            )
            # quick: the fitted micro-batch (the whole quick batch fits a V100) capped at 4, no accumulation
            assert (sk["micro_batch"], sk["accum_steps"]) == ("4", "1") and int(sk["fit_micro_batch"]) > 4
    # pathfinder (n=1024): CPU SDPA with attention dropout runs the math path, which holds n x n matrices;
    # Skeinformer holds n x 256 ones, so its exact peak is below fused softmax's in both parts
    assert float(by[("pathfinder", "skeinformer", "attention", "eager")]["mem_ratio"]) < 0.7
    assert float(by[("pathfinder", "skeinformer", "step", "eager")]["mem_ratio"]) < 0.7
    assert [r["time_ratio"] for r in rows] == pytest.approx([float(r["time_ratio"]) for r in csv_rows], rel=1e-5)

    md = (tmp_path / "bench_tasks.md").read_text()
    for heading in (
        "## Whole training step: time ratio to fused softmax",
        "## Whole training step: peak-memory ratio to fused softmax",
        "## Attention layer alone: time ratio to fused softmax",
        "## Absolute values",
        "capped at 4",
    ):
        assert heading in md
    assert md.count("| softmax | 1 | 1 |") == 4  # the baseline against itself, in every ratio table


def test_the_step_runner_gives_each_optimizer_step_its_own_micro_batches():
    """The runner the task mode times and the doctor pairs with the harness: accumulation 2 from a pool of 5, step i
    takes micro-batches 2i and 2i + 1 (mod 5), so no step repeats one of the step before (a pool indexed by the step
    alone would hand half of each step's batches to the next, warm in the cache)."""
    spec = bench_tasks.spec_for(bench_tasks.TaskConfig(quick=True), "listops", "softmax")
    runner = meter_step.StepRunner(spec, 2, 2, "32-true", "cpu", seed=0, pool=5)
    taken = []

    class Spy:
        accum = 2

        def __call__(self, net, batches):
            taken.append([next(i for i, b in enumerate(runner.pool) if b is batch) for batch in batches])

    runner.step = Spy()
    for i in range(4):
        runner(runner.model, i)
    assert taken == [[0, 1], [2, 3], [4, 0], [1, 2]]


def test_task_mode_accumulates_as_the_plan_says(monkeypatch):
    """hardware.micro_batch=8 on a batch of 32: one optimizer step is 4 forward passes, and the
    attention row counts 4 calls per optimizer step."""
    forwards, build = [], meter_step.build_model

    def counting_build(spec):
        model = build(spec)
        model.register_forward_hook(lambda *a: forwards.append(1))
        return model

    monkeypatch.setattr(meter_step, "build_model", counting_build)  # the runner the task mode times
    cfg = bench_tasks.TaskConfig(
        tasks=("listops",),
        backends=("softmax",),
        quick=True,
        repeats=1,
        warmup=0,
        overrides=("hardware.micro_batch=8", "fit.cache=false"),
    )
    rows = {r["part"]: r for r in bench_tasks.run(cfg, log=lambda s: None)}
    step, attn = rows["step"], rows["attention"]
    assert (step["micro_batch"], step["accum_steps"], step["effective_batch"]) == (8, 4, 32)
    assert step["plan_source"] == "hardware.micro_batch"
    assert len(forwards) == 3 * 4  # first call, one timed step, the memory pass: 4 micro-batches each
    assert attn["per_opt_step_ms"] == pytest.approx(4 * attn["time_ms"])
    assert step["per_opt_step_ms"] == step["time_ms"]


def test_mode_defaults_to_the_tasks_on_cuda_and_the_layer_on_cpu():
    parse = bench.parser().parse_args
    assert bench_cli.task_mode(parse([]), "cuda") and not bench_cli.task_mode(parse([]), "cpu")
    assert bench_cli.task_mode(parse(["--tasks"]), "cpu") and bench_cli.task_mode(parse(["--tasks", "text"]), "cpu")
    assert not bench_cli.task_mode(parse(["--layer"]), "cuda")
    with pytest.raises(SystemExit):
        parse(["--tasks", "--layer"])


def test_task_mode_bad_input_is_one_line_before_work(capsys):
    for argv, words in (
        (["--tasks", "listops", "no_such_task"], ("no_such_task", "pathfinder")),
        (["--tasks", "--backends", "no_such_attention"], ("no_such_attention", "skeinformer")),
        (["--tasks", "--lengths", "512"], ("--lengths", "--layer")),
        (["--tasks", "--hardware", "no_such_gpu"], ("hardware", "no_such_gpu")),
        (["--layer", "--hardware", "a100_40gb"], ("--hardware", "--tasks")),
        # 0 used to mean "the default" (and ran the full benchmark); NaN passes every comparison
        (["--tasks", "--repeats", "0"], ("--repeats", "0 is not allowed", ">= 1")),
        (["--layer", "--time-budget-s", "nan"], ("--time-budget-s", "nan", "finite number > 0")),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.main([*argv, "--device", "cpu", "--quick"])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert all(w in err for w in words), err


@pytest.mark.slow
def test_task_mode_compiled_rows_record_compilation_apart(tmp_path):
    """--compile on the CPU (~1 min): compiled rows exist, their first call (compilation) is kept out
    of the median, dynamo is reset between models, and the CPU has no memory figure for them."""
    rows = bench.main(
        [
            "--tasks",
            "listops",
            "--quick",
            "--compile",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--backends",
            "softmax",
            "--out",
            str(tmp_path),
            "--override",
            "fit.cache=false",
        ]
    )
    by = {(r["part"], r["mode"]): r for r in rows}
    assert set(by) == {(p, m) for p in bench_tasks.PARTS for m in bench_tasks.MODES}
    for part in bench_tasks.PARTS:
        c, e = by[(part, "compiled")], by[(part, "eager")]
        assert c["status"] == "ok" and c["time_ratio"] == 1.0
        assert c["first_call_s"] > 5 * c["time_ms_max"] / 1e3  # compilation, not a step
        assert c["peak_mem_bytes"] == "" and e["peak_mem_bytes"] > 0
    assert "listops (compiled)" in (tmp_path / "bench_tasks.md").read_text()


def _figure_texts(fig) -> list[str]:
    """Every text a reader sees in a matplotlib Figure: titles, axis and tick labels, legend, notes."""
    from matplotlib.text import Text

    fig.draw_without_rendering()  # tick labels exist once the figure is laid out
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def test_figure_reads_like_the_papers_and_rerenders_byte_identical(tmp_path):
    from lra.tools.bench import render

    results = [
        dict(
            backend=b,
            n=n,
            status="ok",
            time_ms=t * n / 256,
            peak_mem_bytes=int(m * n * 2**20 / 256),
            batch=2,
            heads=2,
            head_dim=32,
            dtype="float32",
            device_name="test CPU",
        )
        for b, t, m in (("softmax", 10, 1), ("softmax_materialized", 40, 8), ("skeinformer_no_rownorm", 20, 4))
        for n in (256, 512)
    ]
    results.append(dict(results[0], backend="yoso_conv", status="skipped"))  # never measured: not drawn
    texts = _figure_texts(render.figure(results))
    joined = "\n".join(texts)
    for code in (
        "peak_mem_bytes",
        "time_ms",
        "head_dim",
        "device_name",
        "softmax_materialized",
        "skeinformer_no_rownorm",
        "yoso_conv",
        "GB =",
        "(GB)",
        "fwd+bwd",
    ):
        assert code not in joined, code
    assert "Skeinformer w/o row normalization" in texts and "Standard (fused SDPA), the reference" in texts
    assert "peak memory (MiB, log scale)" in texts and "time (ms, log scale)" in texts
    assert "sequence length n (log scale)" in texts and "256" in texts and "512" in texts
    render.plot(results, tmp_path / "a.png")
    render.plot(results, tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    # GiB once the largest peak reaches 1 GiB
    big = [dict(r, peak_mem_bytes=r["peak_mem_bytes"] * 2048) for r in results]
    assert "peak memory (GiB, log scale)" in _figure_texts(render.figure(big))
