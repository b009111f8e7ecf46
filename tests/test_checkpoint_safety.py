"""Checkpoints are read as data: a runs folder from elsewhere never runs code when a run resumes from it, and the
checkpoints a resume depends on are checked when it starts (one line naming the file, what to do), not after the
whole training. In-process tiny runs (tests/test_resume.py's EPOCHS run, without its TensorBoard logger)."""

import dataclasses
import os
import shutil

import lightning as L
import pytest
import torch

from lra import train as lra_train
from tests.helpers import Killed, kill_at, spec_here, train_here
from tests.test_resume import EPOCHS

RUN = [o for o in EPOCHS if not o.startswith("logger=")]


class _RunsCode:
    """Unpickled, it would create ``marker``: what a hostile ``last.ckpt`` does with ``os.system``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _plant(spec, marker):
    ckpt = spec.run_dir / "checkpoints"
    ckpt.mkdir(parents=True)
    payload = {"resume_key": "whatever", "global_step": 3, "state_dict": {}, "callbacks": {}, "x": _RunsCode(marker)}
    torch.save(payload, ckpt / "last.ckpt")
    return ckpt / "last.ckpt"


def _one_line(e, path):
    line = str(e)
    assert "\n" not in line and str(path) in line and "force=true" in line, line
    end = lra_train.ending(e, "python -m lra.train ...")
    assert end.code == 2 and end.line == line  # the console's one line, the user's to fix
    return line


@pytest.fixture(scope="module")
def _killed_once(tmp_path_factory):
    """A run stopped after optimizer step 5 (evaluated at 3, last.ckpt at 4, best.ckpt at 3), made once; its data
    and fit cache serve every test here."""
    spec = spec_here(tmp_path_factory.mktemp("killed"), *RUN)
    assert train_here(spec, callbacks=[kill_at(5)]) is None
    assert (spec.run_dir / "checkpoints" / "best.ckpt").exists()
    return spec


@pytest.fixture
def spec(_killed_once, tmp_path):
    """The same run in a fresh folder under ``tmp_path/runs``."""
    return dataclasses.replace(_killed_once, run_dir=tmp_path / "runs" / "run")


@pytest.fixture
def killed(_killed_once, spec):
    """:func:`_killed_once`'s run folder, copied for one test."""
    shutil.copytree(_killed_once.run_dir, spec.run_dir)
    return spec


def test_a_last_ckpt_that_would_run_code_is_refused_and_nothing_in_it_runs(spec, tmp_path, monkeypatch):
    """A runs folder received from someone else, re-run to resume: its last.ckpt is read as data, so the pickle's
    ``os.system`` never runs (it ran before the resume key was even compared), and the user gets one line."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # a user's setting for old checkpoints changes nothing
    marker = tmp_path / "ran"
    last = _plant(spec, marker)
    with pytest.raises(lra_train.RunError) as e:
        train_here(spec)
    assert not marker.exists()
    assert "would run code" in _one_line(e.value, last)


def test_lightnings_restore_reads_the_checkpoint_as_data_too(spec, tmp_path, monkeypatch):
    """The second read of last.ckpt, Lightning's restore in ``trainer.fit``: as data, even if the file changed after
    the harness checked it (here the check is skipped) and whatever TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD says."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    _plant(spec, marker)
    monkeypatch.setattr(lra_train, "resume_step", lambda last, key: 3)
    with pytest.raises(Exception, match="GLOBAL posix.system"):
        train_here(spec)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_best_ckpt_is_found_when_the_run_resumes_not_after_it_trains(killed, monkeypatch, damage):
    """best.ckpt is what the run tests at its end: damaged, it was found only then, as an OSError after the whole
    training (and every rerun trained again to fail the same way). Now: one line before any training."""
    best = killed.run_dir / "checkpoints" / "best.ckpt"
    if damage == "truncated":
        best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    else:
        best.unlink()
    last = (killed.run_dir / "checkpoints" / "last.ckpt").read_bytes()
    metrics = (killed.run_dir / "metrics.csv").read_text()
    monkeypatch.setattr("lra.loop.make_trainer", lambda *a, **k: pytest.fail("trained with a damaged best.ckpt"))
    with pytest.raises(lra_train.RunError) as e:
        train_here(killed)
    line = _one_line(e.value, best)
    assert ("damaged" if damage == "truncated" else "missing") in line
    assert (killed.run_dir / "checkpoints" / "last.ckpt").read_bytes() == last  # the run is as it was
    assert (killed.run_dir / "metrics.csv").read_text() == metrics


def test_a_copied_runs_root_checks_its_own_best_ckpt_when_it_resumes(_killed_once, killed):
    """``killed`` is a copy of the run folder (the original still in place, where its checkpoints say they are):
    the resume checks the copy's best.ckpt, never the original's (damaged here after the copy), and a damaged one in
    the copy is named in the copy. (tests/test_carry.py resumes a copy to the uninterrupted run's record.)"""
    last, best = killed.run_dir / "checkpoints" / "last.ckpt", killed.run_dir / "checkpoints" / "best.ckpt"
    key = torch.load(last, weights_only=True)["resume_key"]
    original = _killed_once.run_dir / "checkpoints" / "best.ckpt"
    kept = original.read_bytes()
    try:
        original.write_bytes(b"damaged after the copy")
        assert lra_train.resume_step(last, key) == 4
    finally:
        original.write_bytes(kept)
    best.write_bytes(b"garbage")
    with pytest.raises(lra_train.RunError, match=f"^{best} cannot be read"):
        lra_train.resume_step(last, key)


# ---------------------------------------------------------------------------------------------
# What last.ckpt holds is a state an uninterrupted run passed through, and never the state where it stopped.

BATCHES_PER_EPOCH, ACCUM = 8, 2  # RUN: 64 training examples in micro-batches of 8, accumulation 2


def _saved(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def _variant(_killed_once, tmp_path, *overrides):
    """The run with ``overrides``, in ``tmp_path/runs/run``, on :func:`_killed_once`'s data and fit cache."""
    runs = tmp_path / "runs"
    return spec_here(_killed_once.run_dir.parents[1], *RUN, f"runs_root={runs}", *overrides, run_dir=runs / "run")


def test_a_step_checkpoint_soon_after_a_resume_is_never_taken_inside_an_accumulation_window(killed):
    """Resumed from step 4 (an epoch's last batch), the first micro-batch is inside an accumulation window at step 4,
    which every 2nd step is due a checkpoint: without the "not mid-accumulation" guard the step checkpoint was
    written there (the resumed callback had not saved step 4 itself), with one micro-batch consumed and its gradient
    in no checkpoint. A second kill soon after (here at step 5) resumed from it, one micro-batch short: another
    record. The data a checkpoint has consumed must be its optimizer steps' micro-batches, no more."""
    assert _saved(killed.run_dir)["global_step"] == 4
    assert train_here(killed, callbacks=[kill_at(5)]) is None
    saved = _saved(killed.run_dir)
    (loader,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    consumed = loader["epoch"] * BATCHES_PER_EPOCH + loader["position"]
    assert consumed == saved["global_step"] * ACCUM, (saved["global_step"], loader)


def test_last_ckpt_is_not_written_at_the_evaluation_where_early_stopping_fires(_killed_once, tmp_path):
    """lr 0: validation loss never improves, so patience 1 stops the run at its second evaluation (step 6). Killed
    while it tests (before its record is final), the same command again must stop where it stopped: a last.ckpt
    written at the stopping evaluation restarted past it (Lightning does not keep ``should_stop``) and trained on to
    the next evaluation (step 9)."""
    spec = _variant(_killed_once, tmp_path, "train.lr=0.0", "train.patience=1")

    class KilledWhileTesting(L.Callback):
        def on_test_start(self, trainer, pl_module):
            raise Killed("testing")

    assert train_here(spec, callbacks=[KilledWhileTesting()]) is None  # ended by Killed
    assert _saved(spec.run_dir)["global_step"] < 6  # the state before the stop, which a restart trains on from
    rec = train_here(spec)
    assert rec["status"] == "stopped_early" and rec["stop_reason"] == "early_stopping" and rec["steps"] == 6


def test_last_ckpt_is_not_written_at_the_step_where_the_guard_stops_a_diverged_run(_killed_once, tmp_path, monkeypatch):
    """Kin of the early-stopping case, found looking for it: the step checkpoint (every 2nd step) at the step whose
    training loss is NaN. The guard stops the run there, but a restart from that checkpoint had the guard's
    "failed" state and NaN weights, and no ``should_stop``: it trained on to max_steps."""
    import lra.module

    spec = _variant(_killed_once, tmp_path)
    real, calls = lra.module.loss_and_correct, {"train": 0}

    def nan_at_step_4(logits, labels):  # training micro-batches 7 and 8 make optimizer step 4
        loss, correct = real(logits, labels)
        if torch.is_grad_enabled():
            calls["train"] += 1
            if calls["train"] == 8:
                loss = loss * float("nan")
        return loss, correct

    monkeypatch.setattr(lra.module, "loss_and_correct", nan_at_step_4)
    rec = train_here(spec)
    assert rec["status"] == "failed" and rec["stop_reason"] == "diverged" and rec["steps"] == 4
    assert _saved(spec.run_dir)["global_step"] == 3  # the evaluation's checkpoint, not the diverged step's
