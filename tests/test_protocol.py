"""The papers' protocols: presets (docs/facts.md §4), stopping and selection rules, run records,
diverged and stuck runs, schedules, the resumable data order and the training timer."""

import time
from types import SimpleNamespace

import pytest
import torch

from lra.config import AttnSpec, ConfigError, ModelSpec, TrainSpec, compose, load
from tests.helpers import TINY

# docs/facts.md §4, §9.3, §9.4, §9.5: (batch, lr, warmup, steps, eval every)
PAPER = {
    "skeinformer_paper": {
        "listops": (256, 1e-4, 1000, 20000, 500),
        "text": (128, 1e-4, 80, 50000, 500),
        "retrieval": (64, 1e-4, 800, 60000, 300),
        "image": (256, 1e-4, 175, 50000, 50),
        "pathfinder": (512, 2e-4, 312, 31200, 312),
    },
    "skyformer_paper": {
        "listops": (32, 1e-4, 1000, 50000, 500),
        "text": (32, 1e-4, 80, 50000, 500),
        "retrieval": (16, 2e-4, 800, 50000, 1000),
        "image": (256, 1e-4, 175, 50000, 50),
        "pathfinder": (128, 2e-4, 312, 50000, 500),
    },
    "nystromformer_paper": {
        "listops": (32, 1e-4, 1000, 5000, 50),
        "text": (32, 1e-4, 8000, 20000, 500),
        "retrieval": (32, 1e-4, 800, 30000, 300),
        "image": (256, 1e-4, 175, 35000, 175),
        "pathfinder": (256, 1e-4, 312, 62400, 312),
    },
}


def cfg(*overrides):
    return load(list(overrides))


@pytest.mark.parametrize("preset", sorted(PAPER))
def test_presets_reproduce_the_papers_numbers(preset):
    for task, (batch, lr, warmup, steps, every) in PAPER[preset].items():
        t = compose([f"preset={preset}", f"task={task}"]).train  # as conf/protocol/<preset>/<task>.yaml sets it
        assert (t.batch_size, t.lr, t.warmup, t.max_steps, t.eval_every) == (
            batch,
            lr,
            warmup,
            steps,
            every,
        ), (preset, task)
    c = cfg(f"preset={preset}", "task=listops")
    assert c.preset == preset and c.train.batch_size == PAPER[preset]["listops"][0]
    assert c.train.schedule == "onecycle" and c.model.seq_len == 2048


def test_stopping_and_selection_rules():
    skein = cfg("preset=skeinformer_paper", "task=listops").train
    assert skein.patience == 10 and skein.test_ckpt == "last" and skein.select_after == 0.0
    assert skein.grad_clip_value is None
    sky = cfg("preset=skyformer_paper", "task=listops").train
    assert sky.patience is None and sky.select_after == 0.2 and sky.test_ckpt == "best" and sky.grad_clip_value == 1.0
    nys = cfg("preset=nystromformer_paper", "task=listops").train
    assert nys.patience is None and nys.select_after == 0.0 and nys.test_ckpt == "best"


def test_feature_budgets_and_softmax_impl():
    def opts(preset, attn, *extra):
        return dict(cfg(f"preset={preset}", f"attn={attn}", *extra).attn.options)

    def has(options: dict, expected: dict) -> bool:  # the options that run include the registry's defaults
        return options.items() >= expected.items()

    for preset in PAPER:
        assert opts(preset, "softmax")["impl"] == "materialized"
        assert has(opts(preset, "softmax_nodrop"), {"dropout": 0.0, "impl": "materialized"})
        assert cfg(f"preset={preset}", "attn=softmax").attn.checkpointing
    # Skeinformer: the paper's text gives every method 256 features (clean); its code gave the
    # baselines 128 (quirks=skeinformer, conf/quirks/skeinformer.yaml)
    for code, budget in (("none", 256), ("skeinformer", 128)):
        assert opts("skeinformer_paper", "linformer", f"quirks={code}")["k"] == budget
        assert has(opts("skeinformer_paper", "nystrom", f"quirks={code}"), {"landmarks": budget, "conv_kernel": 0})
        assert opts("skeinformer_paper", "performer", f"quirks={code}")["features"] == budget
        assert opts("skeinformer_paper", "informer", f"quirks={code}")["num_features"] == budget
        assert opts("skeinformer_paper", "skeinformer_uniform", f"quirks={code}")["num_features"] == 256
    for attn, key in [
        ("skyformer", "num_landmarks"),
        ("linformer", "k"),
        ("nystrom", "landmarks"),
        ("performer", "features"),
        ("informer", "num_features"),
    ]:
        assert opts("skyformer_paper", attn)[key] == 128, attn
    assert has(opts("skyformer_paper", "bigbird"), {"block_size": 64, "random_blocks": 3})
    assert has(opts("nystromformer_paper", "nystrom"), {"landmarks": 64, "conv_kernel": 35})
    assert has(opts("nystromformer_paper", "yoso", "task=listops"), {"num_hashes": 32, "hash_bits": 11})
    assert opts("nystromformer_paper", "yoso", "task=image")["hash_bits"] == 10
    # the command line wins over the preset, and the preset's share is kept for the record
    c = cfg("preset=skeinformer_paper", "attn=softmax", "attn.options.impl=fused")
    assert c.attn.options["impl"] == "fused" and "impl" not in c.attn.preset_options
    for plus in ("", "+"):  # without + (typed option nodes), and with it as before
        c = cfg("preset=skyformer_paper", "attn=nystrom", f"{plus}attn.options.landmarks=32")
        assert has(c.attn.options, {"landmarks": 32, "conv_kernel": 0}) and "landmarks" not in c.attn.preset_options
    # quick keeps today's fused softmax
    assert opts("quick", "softmax")["impl"] == "fused"


def test_text_length_and_dev_split():
    for preset, length, seq in [
        ("skeinformer_paper", 4000, 4096),
        ("skyformer_paper", 4000, 4096),
        ("nystromformer_paper", 1000, 1024),
    ]:
        text = compose([f"preset={preset}", "task=text"]).task
        assert text.max_length == length and text.dev_split == "test"
        pathfinder = compose([f"preset={preset}", "task=pathfinder"]).task
        assert (pathfinder.resolution, pathfinder.difficulty) == (32, "hard")
        try:
            t = cfg(f"preset={preset}", "task=text").data.options
        except ConfigError:  # no IMDB under the data root does not matter here
            continue
        assert (t["max_length"], t["seq_len"], t["dev_split"]) == (length, seq, "test")


# ---------------------------------------------------------------------------------------------
# Runs in this process (tiny ListOps): stopping rules, selection, failure records


def train(tmp_path, *overrides):
    from lra.train import run

    return run(
        load(
            [
                *TINY,
                "trainer.progress=false",
                f"data_root={tmp_path / 'data'}",
                f"runs_root={tmp_path / 'runs'}",
                f"fit.cache_dir={tmp_path / 'cache'}",
                *overrides,
            ],
            run_dir=tmp_path / "runs" / "_".join(o.replace("/", "_") for o in overrides),
        )
    )


def test_early_stopping_after_patience_evaluations(tmp_path):
    # lr 0: validation loss never improves, so patience 2 stops at the third evaluation
    rec = train(tmp_path, "train.lr=0.0", "train.patience=2", "train.eval_every=2", "train.max_steps=40")
    assert rec["status"] == "stopped_early" and rec["stop_reason"] == "early_stopping"
    assert rec["steps"] == rec["steps_at_stop"] == 6 and rec["steps_to_best"] == 2
    assert rec["test_acc"] is not None and rec["tested_ckpt"] == "best"
    assert rec["stop_rule"].startswith("early stopping")


def test_skyformer_selection_only_after_warm_fraction(tmp_path):
    free = train(tmp_path, "train.eval_every=3", "train.select_after=0.0")
    warm = train(tmp_path, "train.eval_every=3", "train.select_after=0.5")
    never = train(tmp_path, "train.eval_every=3", "train.select_after=1.1")
    assert free["steps"] == warm["steps"] == never["steps"] == 12
    assert warm["steps_to_best"] > 6 and warm["tested_ckpt"] == "best"  # strictly after half: 9 or 12
    assert free["best_val_acc"] >= warm["best_val_acc"]
    assert never["steps_to_best"] is None and never["tested_ckpt"].startswith("last (no best")
    assert never["test_acc"] is not None


def test_selection_is_strictly_after_the_fraction_as_skyformer():
    """Bug caught: the evaluation at exactly 20% (step 10,000 of 50,000) became the best checkpoint, which
    Skyformer's main.py never saves ((train_step_idx + 1) > 0.2 * total, strict)."""
    from lra.protocol import selectable

    assert not selectable(10, 0.2, 50) and selectable(11, 0.2, 50)
    assert not selectable(10_000, 0.2, 50_000) and selectable(10_500, 0.2, 50_000)  # they evaluate every 500
    assert not selectable(10, 0.2, 51) and selectable(11, 0.2, 51)  # 10.2: the first step past it
    assert selectable(1, 0.0, 50) and not selectable(50, 1.0, 50) and not selectable(50, 1.1, 50)


def test_skyformer_rule_sees_the_step_as_their_train_step_idx_plus_one(tmp_path):
    """Bug caught: an off-by-one between their ``train_step_idx + 1`` and Lightning's global_step at the
    evaluation. With lr 0 every evaluation scores the same, so the best is the first eligible one: with
    select_after 0.25 of 12 steps, evaluated every step, step 3 is not eligible and step 4 is."""
    rec = train(tmp_path, "train.lr=0.0", "train.eval_every=1", "train.select_after=0.25")
    assert rec["steps"] == 12 and rec["steps_to_best"] == 4 and rec["tested_ckpt"] == "best"


def test_test_at_stop(tmp_path):
    rec = train(tmp_path, "train.test_ckpt=last", "train.eval_every=4")
    assert rec["tested_ckpt"] == "last" and rec["status"] == "completed" and rec["steps_to_best"] in (4, 8, 12)


def test_record_fields(tmp_path):
    rec = train(tmp_path, "hardware=v100_16gb", "hardware.micro_batch=null", "train.eval_every=6")
    for key in (
        "steps_to_best",
        "steps_at_stop",
        "train_time_s",
        "eval_time_s",
        "time_per_1k_steps_s",
        "peak_mem_bytes",
        "peak_mem_estimate_bytes",
        "micro_batch",
        "accum_steps",
        "effective_batch",
        "tokens_per_s",
        "attn_impl",
        "attn_options",
        "precision",
        "stop_reason",
        "tested_ckpt",
    ):
        assert key in rec, key
    assert rec["peak_mem_estimate_bytes"] > 0 and rec["accum_source"] == "memory fit"
    assert (rec["peak_mem_bytes"] is None) is (not torch.cuda.is_available())  # measured on a GPU only
    assert rec["tokens_per_s"] == pytest.approx(12 * 32 * 128 / rec["train_time_s"])
    assert rec["attn_impl"] == "fused" and rec["micro_batch"] * rec["accum_steps"] == 32


def test_nan_loss_stops_with_status_and_reason(tmp_path, monkeypatch):
    import lra.module

    calls = {"n": 0}
    real = lra.module.loss_and_correct

    def poisoned(logits, labels):
        loss, correct = real(logits, labels)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] >= 5 else loss), correct

    monkeypatch.setattr(lra.module, "loss_and_correct", poisoned)
    rec = train(tmp_path, "train.eval_every=6")
    assert rec["status"] == "failed" and rec["stop_reason"] == "diverged"
    assert rec["reason"].startswith("diverged: non-finite training loss") and "step 5" in rec["reason"]
    assert rec["steps"] == 5 and rec["test_acc"] is None


def test_stuck_run_stops_with_status_and_reason(tmp_path):
    rec = train(tmp_path, "train.lr=0.0", "train.eval_every=3", "train.stuck_after_steps=3")
    assert rec["status"] == "stuck" and rec["stop_reason"] == "stuck" and rec["steps"] == 3
    assert rec["reason"].startswith("stuck: after 3 steps") and rec["test_acc"] is not None
    # not stopped when the check is off, but the record says it ended at chance
    off = train(tmp_path, "train.lr=0.0", "train.eval_every=3")
    assert off["status"] == "completed" and off["steps"] == 12 and off["stuck_at_end"] is True


# ---------------------------------------------------------------------------------------------
# Pieces


def test_onecycle_schedule_as_the_papers_code():
    from lra.module import LitLRA

    mk = ModelSpec(vocab_size=16, seq_len=32, num_classes=10, attn=AttnSpec("none"))
    lit = LitLRA(mk, TrainSpec(lr=1e-3, warmup=10, max_steps=100, schedule="onecycle"))
    conf = lit.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    lrs, betas = [], []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        betas.append(opt.param_groups[0]["betas"][0])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-3 / 25) and max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) == 9
    assert lrs[-1] < 1e-4 and betas[0] == pytest.approx(0.95) and betas[9] == pytest.approx(0.85)
    linear = LitLRA(mk, TrainSpec(lr=1e-3, warmup=10, max_steps=100)).configure_optimizers()
    assert linear["optimizer"].param_groups[0]["lr"] == pytest.approx(1e-4)  # (0 + 1) / 10 of lr at step 0
    with pytest.raises(ConfigError, match="train.schedule='cosine'"):
        TrainSpec(lr=1e-3, warmup=10, max_steps=100, schedule="cosine")


def test_resumable_loader_continues_the_same_order():
    from lra.data.module import EpochBatches, ResumableLoader

    class Idx(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, idx):
            return list(idx)

    full = ResumableLoader(Idx(), EpochBatches(10, 3, seed=7))
    epochs = [list(full), list(full)]
    assert [len(e) for e in epochs] == [4, 4] and epochs[0] != epochs[1]
    assert sorted(i for b in epochs[0] for i in b) == list(range(10))
    part = ResumableLoader(Idx(), EpochBatches(10, 3, seed=7))
    it = iter(part)
    seen = [next(it), next(it)]
    state = part.state_dict()
    assert state == {"epoch": 0, "position": 2}
    again = ResumableLoader(Idx(), EpochBatches(10, 3, seed=7))
    again.load_state_dict(state)
    assert seen + list(again) == epochs[0] and list(again) == epochs[1]
    assert len(again) == 4
    last = ResumableLoader(Idx(), EpochBatches(10, 3, seed=7))
    it = iter(last)
    for _ in range(4):
        next(it)
    assert last.state_dict() == {"epoch": 1, "position": 0}  # after the last batch: the next epoch


def test_train_clock_excludes_evaluation_and_survives_a_restart():
    from lra.module import TrainClock

    c = TrainClock()
    c.pause()  # the sanity check's evaluation, before training starts: not counted
    c.resume()
    assert not c.running and c.train_s == 0 and c.eval_s == 0
    c.start()
    time.sleep(0.05)
    c.pause()
    assert c.evaluating and not c.running
    frozen = c.train_s
    time.sleep(0.2)
    assert c.train_s == frozen  # the clock stands still while evaluating
    c.resume()
    time.sleep(0.05)
    saved = c.state_dict()
    c.stop()
    assert 0.09 < c.train_s < 0.2 and c.eval_s >= 0.2 and saved["train_time_s"] >= 0.09
    resumed = TrainClock.from_state(saved)
    resumed.start()
    time.sleep(0.01)
    resumed.stop()
    assert resumed.train_s >= saved["train_time_s"] + 0.01 and resumed.eval_s == saved["eval_time_s"]


def test_train_clock_is_restored_from_new_and_older_checkpoints():
    """The clock goes on from a checkpoint's ``train_clock``, or from the TrainTimer callback state an older
    harness wrote (a run started before the upgrade resumes with its training time, not from zero)."""
    from lra.module import LitLRA

    for ckpt in (
        {"train_clock": {"train_time_s": 12.5, "eval_time_s": 3.0}},
        {"callbacks": {"TrainTimer": {"train_time_s": 12.5, "eval_time_s": 3.0}}},
    ):
        lit = SimpleNamespace(clock=None)
        LitLRA.on_load_checkpoint(lit, ckpt)
        assert (lit.clock.train_s, lit.clock.eval_s) == (12.5, 3.0) and not lit.clock.running


@pytest.mark.parametrize("warmup,steps", [(0, 10), (1, 10), (10, 10), (50, 10)])
def test_onecycle_rejects_warmup_outside_its_range(warmup, steps):
    with pytest.raises(ConfigError, match=r"train.warmup=.*train.max_steps"):
        TrainSpec(lr=1e-3, warmup=warmup, max_steps=steps, schedule="onecycle")
    TrainSpec(lr=1e-3, warmup=warmup, max_steps=steps, schedule="linear")  # the linear schedule takes any warmup


def test_the_at_chance_warning_quotes_the_last_validation_not_the_first(caplog):
    """Bug caught: debug=fast's 'at chance' line quoted step 5's validation while step 10's was the last."""
    from lra.protocol import RunGuard
    from lra.train import _warn_about

    guard = RunGuard(baseline_loss=2.30, majority_acc=0.19)
    for loss, acc in ((2.3010, 0.125), (2.3123, 0.1250)):
        trainer = SimpleNamespace(sanity_checking=False, global_step=5, should_stop=False)
        trainer.callback_metrics = {"val/loss": torch.tensor(loss), "val/acc": torch.tensor(acc)}
        guard.on_validation_end(trainer, None)
    with caplog.at_level("WARNING", logger="lra.train"):
        _warn_about(SimpleNamespace(status="completed", reason=None), SimpleNamespace(guard=guard))
    assert "at chance level (loss 2.3123, accuracy 0.1250, majority 0.1900)" in caplog.text
