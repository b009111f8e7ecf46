"""What every logger gets at a logged step beside the loss (lra/module.py, docs/logging.md): the learning
rate and Adam's beta1 that step used, training throughput and, on CUDA, peak memory. One tiny ListOps run
under OneCycleLR (the papers' schedule that also cycles beta1), read back from metrics.csv."""

import csv

import pytest
import torch

from tests.helpers import record

# quick_run's tiny run (tests/helpers.py TINY) with these
RUN = [
    "task=listops",
    "attn=softmax",
    "train.eval_every=4",
    "train.warmup=4",
    "train.batch_size=32",
    "hardware.micro_batch=16",
    "trainer.progress=false",
    "trainer.log_every_n_steps=2",
    "train.schedule=onecycle",
    "trainer.accelerator=cpu",
]


def _expected(lr: float, warmup: int, steps: int) -> list[tuple[float, float]]:
    """(lr, beta1) of each optimizer step, from torch's OneCycleLR itself, as lra.module configures it."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, total_steps=steps, pct_start=warmup / steps, anneal_strategy="linear"
    )
    out = []
    for _ in range(steps):
        g = opt.param_groups[0]
        out.append((g["lr"], g["betas"][0]))
        opt.step()
        sched.step()
    return out


def test_lr_beta1_and_throughput_reach_metrics_csv(tmp_path, quick_run):
    quick_run(*RUN)
    (path,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = [r for r in csv.DictReader(path.open()) if r.get("train/loss")]
    assert len(rows) == 6  # steps 2, 4, ..., 12 of log_every_n_steps=2
    expected = _expected(1e-3, 4, 12)
    lr_max = max(lr for lr, _ in expected)
    for r in rows:
        lr, beta1 = expected[int(r["step"]) - 1]  # the row of optimizer step s says what step s used
        assert float(r["lr"]) == pytest.approx(lr, rel=1e-6) and float(r["beta1"]) == pytest.approx(beta1, rel=1e-6)
        samples = float(r["throughput/samples_per_s"])
        assert samples > 0 and float(r["throughput/tokens_per_s"]) == pytest.approx(samples * 128, rel=1e-6)
    betas = [float(r["beta1"]) for r in rows]
    assert min(betas) < 0.9 < max(betas)  # OneCycleLR moves beta1 against the learning rate
    assert max(float(r["lr"]) for r in rows) == pytest.approx(lr_max, rel=1e-6)
    assert not any(r.get("memory/peak_gib") for r in rows)  # trainer.accelerator=cpu: no allocator to ask

    # every evaluation row says how much training time (evaluation excluded) the run had spent by then:
    # the time axis of the curves (lra/tools/collect/plots.py), from the same clock as the record's train_time_s
    evals = [r for r in csv.DictReader(path.open()) if r.get("val/acc")]
    assert [int(r["step"]) for r in evals] == [4, 8, 12]  # eval_every=4: after optimizer steps 4, 8, 12
    times = [float(r["time/train_s"]) for r in evals]
    assert 0 < times[0] < times[1] < times[2]
    assert times[-1] <= record(tmp_path / "runs")["train_time_s"] < times[-1] + 60
    assert not any(r.get("time/train_s") for r in rows)  # training rows carry throughput instead
