"""Memory-fitted accumulation (lra/fit.py): the CPU estimate, the decision, its cache and errors."""

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from lra.config import AttnSpec, ConfigError, ModelSpec, load
from lra.devices import GIB
from lra.fit import FitError, autocast, plan, train_step_peak
from lra.model import CheckpointedAttention, LRAClassifier, checkpoint_attention


def small(attn: str, options: dict | None = None, checkpointing: bool = False, **kw) -> ModelSpec:
    """The papers' classifier at n=128 (dim 64, 2 layers, 2 heads x 32)."""
    kw = {"vocab_size": 16, "seq_len": 128, "num_classes": 10, **kw}
    return ModelSpec(attn=AttnSpec(attn, options=options or {}, checkpointing=checkpointing), **kw)


def cfg_for(tmp_path, *overrides):
    return load([f"runs_root={tmp_path}", *overrides])


@pytest.mark.parametrize(
    "attn,options,ckpt",
    [
        ("softmax", {"impl": "materialized"}, False),
        ("softmax", {"impl": "materialized"}, True),
        ("nystrom", {"landmarks": 32}, False),
        ("skeinformer", {"num_features": 32}, False),
    ],
)
def test_fake_estimate_equals_real_tensor_peak(attn, options, ckpt):
    """FakeTensorMode allocates nothing, yet MemTracker's peak equals the one of real CPU tensors."""
    mk = small(attn, options, ckpt)
    fake = train_step_peak(mk, 4, fake=True, cuda_kernels=False)
    real = train_step_peak(mk, 4, fake=False)
    assert fake == pytest.approx(real, rel=0.01)
    assert fake > 4 * 2 * 2 * 128 * 128 * 4  # at least one fp32 score matrix per layer is counted


def test_estimate_grows_with_batch_and_length():
    mk = small("softmax", {"impl": "materialized"})
    by_batch = [train_step_peak(mk, b) for b in (1, 2, 4, 8)]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == 4
    by_len = [train_step_peak(replace(mk, seq_len=n), 2) for n in (64, 128, 256)]
    assert by_len == sorted(by_len) and len(set(by_len)) == 3
    # quadratic in n for the materialised matrix, (almost) linear for the CUDA fused kernel
    fused = small("softmax", {"impl": "fused"})
    f = [train_step_peak(replace(fused, seq_len=n), 2) for n in (256, 512)]
    m = [train_step_peak(replace(mk, seq_len=n), 2) for n in (256, 512)]
    assert m[1] / m[0] > 3.0 and f[1] / f[0] < 2.5


def test_fused_sdpa_is_estimated_as_the_cuda_kernel():
    """CPU SDPA with dropout materialises n x n; the estimate uses CUDA's memory-efficient kernel."""
    mk = small("softmax", {"impl": "fused"}, seq_len=512)
    cuda = train_step_peak(mk, 2)
    cpu = train_step_peak(mk, 2, cuda_kernels=False)
    materialized = train_step_peak(small("softmax", {"impl": "materialized"}, seq_len=512), 2)
    assert cuda < 0.5 * cpu and cpu == pytest.approx(materialized, rel=0.05)


def test_the_cuda_softmax_backwards_temporary_is_counted():
    """Bug caught: CUDA's softmax backward allocates ``grad * output`` beside its output (the CPU kernel and fake
    tensors do not), one n x n matrix the estimate missed at the peak of a materialised softmax: Skeinformer
    Table 4's Standard w/o dropout was fitted at 2-4x the micro-batch of Standard (32 x 4096 tokens for Text)
    and ran out of memory under a 15 GiB cap on a GPU, where both rows peak at the same bytes."""
    mk = small("softmax", {"impl": "materialized", "dropout": 0.0}, checkpointing=True, seq_len=256, num_layers=1)
    cuda, cpu = train_step_peak(mk, 2), train_step_peak(mk, 2, cuda_kernels=False)
    assert cuda - cpu == 2 * 2 * 256 * 256 * 4  # one fp32 score matrix of micro-batch 2 (2 heads); was 0


def test_estimate_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    train_step_peak(small("skeinformer", {"num_features": 16}), 2)
    assert torch.equal(before, torch.get_rng_state())


def test_checkpointed_attention_same_result_less_memory():
    import attention

    torch.manual_seed(0)
    inner = attention.build("softmax", num_heads=2, head_dim=8, max_len=64, dropout=0.1, impl="materialized").train()
    q, k, v = (torch.randn(2, 2, 64, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 64, dtype=torch.bool)
    torch.manual_seed(1)
    a = inner(q, k, v, mask)
    ga = torch.autograd.grad(a.square().sum(), (q, k, v))
    torch.manual_seed(1)
    b = CheckpointedAttention(inner)(q, k, v, mask)
    gb = torch.autograd.grad(b.square().sum(), (q, k, v))
    assert torch.equal(a, b) and all(torch.allclose(x, y) for x, y in zip(ga, gb))
    mk = small("softmax", {"impl": "materialized"}, seq_len=512)
    assert train_step_peak(replace(mk, attn=replace(mk.attn, checkpointing=True)), 2) < 0.8 * train_step_peak(mk, 2)
    m = checkpoint_attention(LRAClassifier(**small("softmax").kwargs()))
    assert sum(isinstance(x, CheckpointedAttention) for x in m.modules()) == 2


def test_listops_table4_shape_on_v100(tmp_path):
    """Skeinformer protocol, ListOps batch 256 on a V100 16 GB: the materialised softmax needs
    accumulation, the fused kernel does not, and Skeinformer fits a larger micro-batch."""
    base = [f"fit.cache_dir={tmp_path}/cache", "task=listops", "hardware=v100_16gb", "preset=skeinformer_paper"]
    mat = plan(cfg_for(tmp_path, *base, "attn=softmax"))
    fused = plan(cfg_for(tmp_path, *base, "attn=softmax", "attn.options.impl=fused"))
    skein = plan(cfg_for(tmp_path, *base, "attn=skeinformer", "train.chunks=1"))  # memory alone: no chunk cap
    for p in (mat, fused, skein):
        assert p.effective_batch == 256 == p.micro_batch * p.accum_steps
        assert p.estimate_bytes <= p.budget_bytes and p.source == "memory fit"
    assert mat.accum_steps > 1 and fused.accum_steps == 1
    assert skein.micro_batch > mat.micro_batch
    # every estimate above the chosen micro-batch's next divisor would not have fit
    bigger = [m for m in mat.estimates if m > mat.micro_batch]
    assert bigger and all(mat.estimates[m] > mat.budget_bytes for m in bigger)
    assert mat.seconds < 60  # a few seconds on an idle machine (the 2-core CI box is shared)


def test_paper_runs_the_public_codes_chunks_where_the_whole_batch_fits(tmp_path):
    """Bug caught: under quirks=skeinformer skeinformer_paper ListOps trained one micro-batch of 256 on a V100
    where 256 fits, so Skeinformer's batch budget and shared pilot draws spanned twice the chunk of its
    code (config.py bz_rate 2); it must run micro-batch 128 x 2, and quirks=none keeps 256 x 1."""
    base = [f"fit.cache_dir={tmp_path}/cache", "task=listops", "attn=skeinformer", "hardware=v100_16gb"]
    clean = plan(cfg_for(tmp_path, *base, "quirks=none"))
    paper = plan(cfg_for(tmp_path, *base))
    assert (clean.micro_batch, clean.accum_steps) == (256, 1) and clean.source == "memory fit"
    assert (paper.micro_batch, paper.accum_steps, paper.effective_batch) == (128, 2, 256)
    assert paper.source == "memory fit within train.chunks=2 (micro-batch <= 128)"
    assert 256 not in paper.estimates  # nothing above the chunk is even tried
    # the same model's decision for the whole batch (train.chunks=1, cached first) is not reused under the cap
    whole = plan(cfg_for(tmp_path, f"fit.cache_dir={tmp_path}/c2", *base[1:], "train.chunks=1"))
    capped = plan(cfg_for(tmp_path, f"fit.cache_dir={tmp_path}/c2", *base[1:]))
    assert (whole.micro_batch, capped.micro_batch, capped.cached) == (256, 128, False)
    assert plan(cfg_for(tmp_path, f"fit.cache_dir={tmp_path}/c2", *base[1:])).cached


def test_the_public_codes_chunk_still_shrinks_when_it_does_not_fit(tmp_path):
    """Bug caught: the chunk of the public code taken as the micro-batch whatever the memory (an OOM on a
    small card); where 128 does not fit, the memory fit still walks down to a divisor that does."""
    p = plan(
        cfg_for(
            tmp_path,
            "fit.cache=false",
            "task=listops",
            "attn=skeinformer",
            "hardware=v100_16gb",
            "hardware.total_gib=4",
        )
    )
    assert (p.micro_batch, p.accum_steps) == (64, 4) and p.estimates[128] > p.budget_bytes >= p.estimates[64]
    assert 256 not in p.estimates and "train.chunks=2" in p.source


def test_chunks_without_a_budget_over_devices_and_bad_counts(tmp_path):
    """No memory budget (hardware=cpu): the chunk is the micro-batch (was: the whole batch); over 2 devices
    each device's 128 is one chunk; a count that does not divide the batch is one line."""
    cpu = ["task=listops", "attn=skeinformer", "hardware=cpu"]
    p = plan(cfg_for(tmp_path, *cpu))
    assert (p.micro_batch, p.accum_steps) == (128, 2) and "train.chunks=2" in p.source
    assert (plan(cfg_for(tmp_path, *cpu, "quirks=none")).micro_batch, p.effective_batch) == (256, 256)
    two = plan(cfg_for(tmp_path, *cpu, "trainer.devices=2"))
    assert (two.micro_batch, two.accum_steps, two.devices) == (128, 1, 2)
    assert plan(cfg_for(tmp_path, *cpu, "hardware.micro_batch=32")).micro_batch == 32  # forced wins
    with pytest.raises(ConfigError, match=r"train.chunks=3 .*a divisor of train.batch_size=256") as e:
        cfg_for(tmp_path, *cpu, "train.chunks=3")
    assert "\n" not in str(e.value)


def test_decision_is_cached(tmp_path):
    ov = [
        f"fit.cache_dir={tmp_path}/cache",
        "attn=skeinformer",
        "attn.options.num_features=32",
        "preset=quick",
        "hardware=v100_16gb",
    ]
    first = plan(cfg_for(tmp_path, *ov))
    t0 = time.perf_counter()
    second = plan(cfg_for(tmp_path, *ov))
    assert not first.cached and second.cached and time.perf_counter() - t0 < 1.0
    assert (second.micro_batch, second.accum_steps, second.estimate_bytes) == (
        first.micro_batch,
        first.accum_steps,
        first.estimate_bytes,
    )
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    other = plan(cfg_for(tmp_path, *ov[:-1], "hardware=a100_40gb"))  # another budget: another key
    assert not other.cached and len(list((tmp_path / "cache").glob("*.json"))) == 2


def test_micro_batch_one_not_fitting_is_an_error_with_the_estimate(tmp_path):
    cfg = cfg_for(
        tmp_path, "fit.cache=false", "task=listops", "attn=softmax", "hardware=v100_16gb", "hardware.total_gib=0.9"
    )
    with pytest.raises(FitError, match=r"micro-batch 1 does not fit.*Estimated peak training memory \d+\.\d+ GiB"):
        plan(cfg)


@pytest.mark.slow  # ~19 s of a subprocess run: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_train_refuses_before_training_when_nothing_fits(tmp_path):
    env = {**os.environ, "LRA_DATA": str(tmp_path / "data"), "LRA_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}
    from tests.helpers import TINY

    proc = subprocess.run(
        [sys.executable, "-m", "lra.train", *TINY, "hardware=v100_16gb", "hardware.total_gib=0.75"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "does not fit, not training" in out and "micro-batch 1 does not fit" in out
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "failed" and "FitError" in rec["reason"] and rec["steps"] == 0
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.csv").exists()


def test_effective_batch_constant_across_devices(tmp_path):
    for devices in (1, 2, 4):
        p = plan(cfg_for(tmp_path, "preset=quick", "hardware=cpu", f"trainer.devices={devices}"))
        assert p.micro_batch * p.accum_steps * p.devices == p.effective_batch == 32 and p.devices == devices
        f = plan(
            cfg_for(tmp_path, "preset=quick", "hardware=cpu", "hardware.micro_batch=4", f"trainer.devices={devices}")
        )
        assert (f.micro_batch, f.accum_steps * devices) == (4, 8)
    m = plan(
        cfg_for(tmp_path, f"fit.cache_dir={tmp_path}/c", "preset=quick", "hardware=v100_16gb", "trainer.devices=2")
    )
    assert m.micro_batch * m.accum_steps * 2 == 32 and m.devices == 2
    with pytest.raises(ConfigError, match=r"train.batch_size=32 .*a multiple of the 3 devices"):
        cfg_for(tmp_path, "preset=quick", "trainer.devices=3")
    with pytest.raises(ConfigError, match=r"hardware.micro_batch=5 .*a divisor of the per-device batch 32"):
        cfg_for(tmp_path, "preset=quick", "hardware=cpu", "hardware.micro_batch=5")


def test_profiles(tmp_path):
    v100 = cfg_for(tmp_path, "hardware=v100_16gb").hardware
    a100 = cfg_for(tmp_path, "hardware=a100_40gb").hardware
    h100 = cfg_for(tmp_path, "hardware=h100_80gb").hardware
    assert 13 * GIB < v100.budget_bytes < 15 * GIB < a100.budget_bytes < h100.budget_bytes < 80 * GIB
    assert cfg_for(tmp_path, "hardware=cpu").hardware.budget_bytes is None
    assert cfg_for(tmp_path).hardware.name == "v100_16gb"  # the papers' GPU is the default
    auto = cfg_for(tmp_path, "hardware=auto", "preset=quick")
    if not torch.cuda.is_available():  # auto without CUDA: no budget, no fitting
        assert auto.hardware.budget_bytes is None
        assert plan(auto).accum_steps == 1 and "no memory budget" in plan(auto).source
    else:
        assert auto.hardware.budget_bytes is not None


def test_make_fit_prints_the_decision(tmp_path):
    env = {**os.environ, "LRA_RUNS": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "lra.fit", "task=listops", "attn=softmax", "hardware=v100_16gb"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "micro-batch 64 x accumulation 4" in proc.stdout and "materialized" in proc.stdout
    assert "estimates (micro-batch: GiB)" in proc.stdout


def test_table_lists_every_cell(tmp_path):
    from lra.tools.bench.fit_table import decision_table, format_table

    ov = [f"runs_root={tmp_path}", "hardware=v100_16gb", "preset=quick"]
    rows = decision_table(ov, tasks=("listops",), attns=["softmax", "none"], progress=False)
    assert [(r["attn"], r["task"]) for r in rows] == [
        ("softmax", "listops"),
        ("none", "listops"),
        ("softmax_fused", "listops"),
    ]
    text = format_table(rows, ("listops",))
    assert text.splitlines()[0] == "| attention | listops |" and "32 (x1)" in text


def test_model_kwargs_follow_the_preset(tmp_path):
    mk = cfg_for(tmp_path, "attn=softmax", "preset=skeinformer_paper").model.kwargs()
    assert mk["attn_options"]["impl"] == "materialized" and mk["seq_len"] == 2048


def test_an_estimate_that_cannot_be_traced_does_not_block_training(tmp_path, monkeypatch):
    import lra.fit

    def untraceable(*a, **k):
        raise RuntimeError("data-dependent op")

    monkeypatch.setattr(lra.fit, "train_step_peak", untraceable)
    p = plan(cfg_for(tmp_path, "fit.cache=false", "preset=quick", "hardware=v100_16gb"))
    assert (p.micro_batch, p.accum_steps) == (32, 1) and p.source.startswith("no estimate (RuntimeError)")


def test_fit_table_takes_flags_between_overrides_and_refuses_bad_ones_in_one_line(tmp_path, capsys):
    """The table is the bench's (``lra-bench fit``); ``python -m lra.fit`` is one decision and has no --table."""
    import lra.fit
    from lra.tools.bench import fit_table

    level = lra.fit.log.level
    try:
        argv = ["task=listops", "--out", str(tmp_path / "t"), "attn=none", "hardware=cpu", "preset=quick"]
        code = fit_table.main([*argv, f"runs_root={tmp_path}"])
    finally:
        lra.fit.log.setLevel(level)
    assert code == 0 and (tmp_path / "t.md").is_file() and (tmp_path / "t.json").is_file()
    assert "| none | 32 (x1) |" in capsys.readouterr().out
    for main, argv, word, prog in (
        (fit_table.main, ["task=listops", "--out"], "--out", "python -m lra.tools.bench fit"),
        (fit_table.main, ["--no-such-flag", "task=listops"], "'--no-such-flag'", "python -m lra.tools.bench fit"),
        (
            lra.fit.main,
            ["task=listops", "--table"],
            "--table is now python -m lra.tools.bench fit",
            "python -m lra.fit",
        ),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and word in err[0] and f"{prog} --help" in err[0], err
    for main in (fit_table.main, lra.fit.main):
        assert main(["task=listops", "hardware=no_such_gpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and "no_such_gpu" in err[0], err


def test_one_autocast_for_the_estimate_and_the_measured_step():
    """16-mixed is fp16 on CUDA (what the run and the bench's step use) and bf16 in the CPU estimate (the same
    size); fp32 has none; a precision without one is refused, not silently run in fp32."""
    with autocast("16-mixed"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with autocast("bf16-mixed", "cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    with autocast("32-true", "cuda"):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="transformer-engine"):
        autocast("transformer-engine")
    if torch.cuda.is_available():
        with autocast("16-mixed", "cuda:0"):
            assert torch.get_autocast_dtype("cuda") == torch.float16


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '"x"',
        '{"estimates": [1]}',
        '{"micro_batch": -4, "accum_steps": -2, "source": "x"}',
        "dir",
    ],
)
def test_damaged_fit_cache_is_one_warning_and_estimated_again(tmp_path, caplog, content):
    """A fit cache entry damaged in any way (a list, a string, negative sizes, a folder at its name) is ignored
    with one warning, never a traceback or a plan of negative micro-batches."""
    from lra.fit import _cached

    path = tmp_path / "entry.json"
    if content == "dir":
        path.mkdir()
    else:
        path.write_text(content)
    with caplog.at_level("WARNING", logger="lra.fit"):
        assert _cached(path, 8, 8, 1, 8) is None
    assert [r.getMessage().startswith(f"fit cache {path} is damaged") for r in caplog.records] == [True]
