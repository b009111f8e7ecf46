"""Multi-device data parallel: one sweep job with trainer.devices=2, strategy=ddp on the CPU (two
processes, gloo). The effective batch stays the preset's: micro-batch x accumulation x devices."""

import json

import pytest
from test_sweep import TINY, manifest, run_sweep

from lra.config import compose


@pytest.mark.slow  # 30-50 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_ddp_two_cpu_processes_keep_the_effective_batch(tmp_path):
    out = run_sweep(
        tmp_path,
        "grid=quick",
        "task=listops",
        "attn=softmax",
        "seed=0",
        "hydra/launcher=basic",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        *TINY,
    )
    text = out.stdout + out.stderr
    assert "distributed_backend=gloo" in text and "Starting with 2 processes" in text
    (job,) = manifest(tmp_path)["jobs"]
    run_dir = tmp_path / "runs" / job["run_dir"]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "completed" and rec["steps"] == 12
    assert rec["config"]["trainer"]["devices"] == 2 and rec["config"]["trainer"]["strategy"] == "ddp"
    single = int(compose(["preset=quick", "task=listops"]).train.batch_size)
    devices = int(rec.get("devices", 2))
    assert devices == 2, "the record should say how many devices shared the batch"
    assert rec["effective_batch"] == single == 32
    assert rec["micro_batch"] * rec["accum_steps"] * devices == single, (
        f"micro {rec['micro_batch']} x accum {rec['accum_steps']} x devices {devices} != {single}: "
        "lra/fit.py plan() must divide the effective batch over the devices"
    )
    # what each process did up to the best checkpoint: optimizer steps x accumulation micro-batches
    torch = pytest.importorskip("torch")
    ckpt = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    progress = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {}).get("total", {})
    if progress:  # Lightning's loop counters (absent in other Lightning versions)
        assert progress["completed"] == ckpt["global_step"] * rec["accum_steps"]
