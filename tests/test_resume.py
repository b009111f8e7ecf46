"""Resume: a real ``python -m lra.train`` subprocess killed mid-training and restarted with the same
command ends with the record of an uninterrupted run of the same seed (same steps, same metrics); a run
stopped and resumed several times in this process ends with the uninterrupted run's metrics.csv."""

import csv
import importlib.util
import json
import signal
import time

import pytest

from tests.helpers import SHORT, TINY, kill_at, record, run_train, start_train, train_here

# Long enough to be killed mid-training; micro-batch 16 x accumulation 2 exercises accumulation
# boundaries; patience exercises the early-stopping state; a checkpoint every 3 optimizer steps
# besides every evaluation. 256 training examples / 16 = 16 batches per epoch: epochs roll over.
RESUME = [
    *[o for o in TINY if not o.startswith(("train.max_steps", "train.eval_every"))],
    "train.max_steps=40",
    "train.eval_every=8",
    "train.patience=3",
    "hardware.micro_batch=16",
    "train.ckpt_every_steps=3",
    "trainer.progress=false",
]
SAME = (
    "status",
    "steps",
    "steps_at_stop",
    "steps_to_best",
    "stop_reason",
    "micro_batch",
    "accum_steps",
    "effective_batch",
    "tested_ckpt",
    "split_sizes",
)
CLOSE = ("test_acc", "test_loss", "best_val_acc")


def _val_history(tmp_path, runs):
    """(step, val/acc) rows of the run's metrics.csv: the curve the collector plots."""
    with open(next((tmp_path / runs).rglob("metrics.csv")), newline="") as f:
        return [(int(float(r["step"])), round(float(r["val/acc"]), 6)) for r in csv.DictReader(f) if r.get("val/acc")]


def _start_reference(tmp_path):
    """The uninterrupted run, in the background while the test kills the other one."""
    return start_train(tmp_path, *RESUME, runs="ref")


def _reference(tmp_path, proc):
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    rec = record(tmp_path / "ref")
    assert rec["status"] in ("completed", "stopped_early") and rec["resumed_from_step"] is None
    assert rec["accum_steps"] == 2 and rec["steps"] > 10
    return rec


def _start_and_kill(tmp_path, runs, sig, min_step, *extra, env=None):
    """Start the run (RESUME, then ``extra`` overrides; ``env`` replaces :func:`run_env`'s), wait for a resume
    checkpoint at optimizer step >= min_step, send ``sig``."""
    import torch

    proc = start_train(tmp_path, *RESUME, *extra, runs=runs, **({"env": env} if env else {}))
    deadline = time.time() + 300
    step = None
    try:
        while time.time() < deadline and proc.poll() is None:
            last = next((tmp_path / runs).rglob("last.ckpt"), None) if (tmp_path / runs).exists() else None
            if last is not None:
                try:
                    step = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
                except Exception:  # being replaced right now
                    step = None
                if step is not None and step >= min_step:
                    proc.send_signal(sig)
                    break
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert step is not None and step >= min_step, f"no checkpoint at step >= {min_step}:\n{out[-3000:]}"
    return step, proc.returncode, out


def _compare(resumed, reference):
    for k in SAME:
        assert resumed[k] == reference[k], (k, resumed[k], reference[k])
    for k in CLOSE:
        assert resumed[k] == pytest.approx(reference[k], abs=1e-6), (k, resumed[k], reference[k])
    assert resumed["train_time_s"] > 0 and resumed["time_per_1k_steps_s"] > 0


@pytest.mark.slow  # 40 s; SIGTERM to a run and its rerun matching the uninterrupted one stays in the main suite
def test_sigkill_mid_training_then_restart_matches_uninterrupted(tmp_path):
    ref = _start_reference(tmp_path)
    step, rc, out = _start_and_kill(tmp_path, "runs", signal.SIGKILL, min_step=9)  # after the first evaluation
    reference = _reference(tmp_path, ref)
    assert rc == -signal.SIGKILL, out[-2000:]
    killed = record(tmp_path / "runs")
    assert killed["status"] == "running" and killed["test_acc"] is None  # the kill left no finished record
    assert 0 < step < reference["steps"]

    proc = run_train(tmp_path, *RESUME)
    assert "resuming from" in proc.stdout + proc.stderr
    resumed = record(tmp_path / "runs")
    assert resumed["resumed_from_step"] is not None and resumed["resumed_from_step"] >= step
    _compare(resumed, reference)
    assert not list((tmp_path / "runs").rglob("last.ckpt"))  # removed once the run finished
    # the validation history survives the restart: same evaluations as the uninterrupted run, none twice
    assert _val_history(tmp_path, "runs") == _val_history(tmp_path, "ref")


@pytest.mark.slow
def test_sigterm_then_sigkill_then_restart_matches_uninterrupted(tmp_path):
    """Two interruptions of one run: SIGTERM (Lightning's graceful stop, record says interrupted)
    after the first evaluation, then SIGKILL later; the third start finishes it."""
    ref = _start_reference(tmp_path)
    step1, rc, out = _start_and_kill(tmp_path, "runs", signal.SIGTERM, min_step=8)
    assert rc != 0, out[-2000:]
    assert record(tmp_path / "runs")["status"] in ("interrupted", "running")
    reference = _reference(tmp_path, ref)
    step2, rc, out = _start_and_kill(tmp_path, "runs", signal.SIGKILL, min_step=step1 + 3)
    assert rc == -signal.SIGKILL and "resuming from" in out
    assert step2 < reference["steps"], "the run finished before it could be killed the second time"
    run_train(tmp_path, *RESUME)
    _compare(record(tmp_path / "runs"), reference)


# ---------------------------------------------------------------------------------------------
# Interrupted and resumed in this process: a callback stops the run at an optimizer step, as a kill
# would (the record says failed, last.ckpt stays), and the same spec run again resumes it.

# 64 training examples in micro-batches of 8 x accumulation 2: 8 batches, 4 optimizer steps per epoch,
# so 14 steps cross 3 epoch boundaries. Evaluation every 3 steps; a resume checkpoint at each evaluation
# and at every 2nd step.
EPOCHS = [
    *SHORT,
    "num_threads=1",
    "train.batch_size=16",
    "hardware.micro_batch=8",
    "train.max_steps=14",
    "train.eval_every=3",
    "train.ckpt_every_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.progress=false",
    *(["logger=tensorboard"] if importlib.util.find_spec("tensorboard") else []),
]  # a dev extra


def _metrics_rows(run_dir):
    """(step, epoch, names of the metrics logged) of every metrics.csv row, in order."""
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    logged = [tuple(sorted(k for k, v in r.items() if v and k not in ("step", "epoch"))) for r in rows]
    return [(int(r["step"]), int(r["epoch"]), names) for r, names in zip(rows, logged)]


def _tensorboard_epochs(run_dir):
    """(step, epoch) of the TensorBoard ``epoch`` scalar as TensorBoard shows it (purged steps hidden)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, int(e.value)) for e in acc.Scalars("epoch")]


def test_metrics_csv_epoch_after_resumes_matches_an_uninterrupted_run(tmp_path):
    """Stopped three times, each time resumed: from a checkpoint at an epoch's last batch (step 4), one
    written at a mid-epoch evaluation (step 6) and a mid-epoch step checkpoint (step 10). metrics.csv
    holds the uninterrupted run's rows, each once, with the same step and ``epoch`` (Lightning's own
    epoch count drifted by an epoch or more on such restarts; rows of re-trained steps were doubled)."""
    ref = train_here(tmp_path, *EPOCHS, run_dir=tmp_path / "runs" / "ref")
    assert ref["status"] == "completed" and ref["steps"] == 14 and ref["accum_steps"] == 2
    run_dir = tmp_path / "runs" / "resumed"
    for step, starts_from in ((5, None), (7, 4), (11, 6)):
        assert train_here(tmp_path, *EPOCHS, callbacks=[kill_at(step)], run_dir=run_dir) is None
        rec = json.loads((run_dir / "result.json").read_text())
        assert rec["status"] == "failed" and rec["resumed_from_step"] == starts_from
    resumed = train_here(tmp_path, *EPOCHS, run_dir=run_dir)
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == 10

    expected = _metrics_rows(tmp_path / "runs" / "ref")
    # the epoch of the data: 4 optimizer steps per epoch; a row at step k comes from optimizer step k
    assert [(s, e) for s, e, m in expected if "train/loss" in m] == [(k, (k - 1) // 4) for k in range(1, 15)]
    assert expected[-1][1:] == (4, ("test/acc", "test/count", "test/loss"))  # after training: epochs begun
    assert _metrics_rows(tmp_path / "runs" / "resumed") == expected
    # the curves' time axis goes on from where each stretch stopped: training time only ever grows
    with open(tmp_path / "runs" / "resumed" / "metrics.csv", newline="") as f:
        times = [float(r["time/train_s"]) for r in csv.DictReader(f) if r.get("time/train_s")]
    assert len(times) == sum("val/acc" in m for _, _, m in expected) and times == sorted(times) and times[0] > 0
    if "logger=tensorboard" in EPOCHS:  # TensorBoard gets the same rows
        tb = _tensorboard_epochs(tmp_path / "runs" / "ref")
        assert tb == [(k, e) for k, e, _ in expected]
        assert _tensorboard_epochs(tmp_path / "runs" / "resumed") == tb


def test_interrupted_record_says_how_far_the_run_got(tmp_path):
    """SIGTERM after 8 optimizer steps (evaluated at 3 and 6): the interrupted record says 8 steps and the best
    validation so far with its step, as metrics.csv shows them and a finished record would say them (it said
    ``steps: 0``, ``best_val_acc: null``); the same spec run again resumes and finishes."""
    from lra.interrupts import Interrupted

    run_dir = tmp_path / "runs" / "term"
    with pytest.raises(Interrupted) as e:
        train_here(tmp_path, *EPOCHS, callbacks=[kill_at(8, signal.SIGTERM)], run_dir=run_dir)
    assert e.value.code == 128 + signal.SIGTERM
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "interrupted" and rec["reason"].startswith("SIGTERM: run the same command again")
    assert rec["steps"] == rec["steps_at_stop"] == 8 and rec["train_time_s"] > 0
    with open(run_dir / "metrics.csv", newline="") as f:
        vals = [(int(float(r["step"])), float(r["val/acc"])) for r in csv.DictReader(f) if r.get("val/acc")]
    assert len(vals) == 2
    assert rec["best_val_acc"] == pytest.approx(max(acc for _, acc in vals), abs=1e-7)
    assert rec["steps_to_best"] in (3, 6) and rec["best_ckpt"].endswith("best.ckpt")

    done = train_here(tmp_path, *EPOCHS, run_dir=run_dir)
    assert done["status"] == "completed" and done["resumed_from_step"] == 8 and done["steps"] == 14
