"""What training actually did, not only what the record says: micro-batches per optimizer step, the
steps at which validation ran, which weights were tested, per-example metrics over batches of unequal
size, early stopping's metric, the sampling weights of the default Skeinformer, the collector's
statistics and ListOps' median.

Tiny ListOps runs in this process, observed by a callback (:class:`Probe`) given to the run where the
user's callbacks go (``lra.loop.user_callbacks``, patched); the data is generated once for the module.
"""

import logging
import math
import re

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from lra.config import load
from lra.data import listops as lo
from lra.data.module import SplitDataset
from lra.model import build_model
from lra.tools.collect import collect
from lra.tools.collect.records import load_runs
from lra.tools.collect.tables import TABLES, build, paper_results, summary
from tests.helpers import TINY, train_here
from tests.test_collect import cell, make_record

SPEC = {s.key: s for s in TABLES}


# ---------------------------------------------------------------------------------------------
# Tiny runs in this process, observed from inside the Trainer


def exact_metrics(module, split) -> tuple[float, float]:
    """(mean loss, accuracy) of ``module`` over every example of ``split`` in one batch, in float64."""
    batch = SplitDataset(split)[list(range(len(split)))]
    was_training = module.training
    module.eval()
    with torch.no_grad():
        logits = module(batch["tokens"], batch["mask"]).double()
    module.train(was_training)
    labels = batch["label"].long()
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    return loss, (logits.argmax(-1) == labels).double().mean().item()


def weights(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def max_grad(optimizer) -> float:
    return max(p.grad.abs().max().item() for g in optimizer.param_groups for p in g["params"] if p.grad is not None)


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Probe(L.Callback):
    """Records what the Trainer did: every micro-batch, the micro-batch sizes, learning rate and largest
    gradient (before and after clipping) of each optimizer step, the optimizer step of each validation
    with its logged and exactly recomputed metrics and its weights, the weights at the end of training,
    and the weights tested with the logged and recomputed test metrics."""

    def __init__(self):
        self.pending, self.steps = [], []  # micro-batch sizes since the last optimizer step / per step
        self.lrs = []  # learning rate of each optimizer step
        self.vals = []  # (global step, logged (loss, acc), exact (loss, acc))
        self.val_counts, self.val_weights = [], []  # logged val/count, weights at each validation
        self.train_split, self.batches = None, []  # (tokens, labels) of every micro-batch, in training order
        self.grads, self.clipped = [], []  # largest |gradient| of each step before / after clipping
        self.trained = self.tested = None
        self.test_logged = self.test_exact = None
        self.losses = []  # (optimizer steps done after it, training loss / accumulation) of every micro-batch
        self.eval_lines = []  # the run's log lines of its evaluations (lra.eval: train.log's "eval step ...")

    def on_train_start(self, trainer, pl_module):
        self.train_split = trainer.datamodule.splits["train"]
        # the gradients the step used: optimizer.step runs the last micro-batch and the clipping inside
        trainer.optimizers[0].register_step_post_hook(lambda opt, args, kwargs: self.clipped.append(max_grad(opt)))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.pending.append(int(batch["label"].numel()))
        self.batches.append((batch["tokens"].clone(), batch["label"].clone()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append((trainer.global_step, float(outputs["loss"])))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append(self.pending)
        self.pending = []
        self.lrs.append(optimizer.param_groups[0]["lr"])
        self.grads.append(max_grad(optimizer))  # before clipping

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        logged = (float(m["val/loss"]), float(m["val/acc"]))
        self.vals.append((trainer.global_step, logged, exact_metrics(pl_module, trainer.datamodule.splits["val"])))
        self.val_counts.append(float(m["val/count"]) if "val/count" in m else None)
        self.val_weights.append(weights(pl_module))

    def on_train_end(self, trainer, pl_module):
        self.trained = weights(pl_module)

    def on_test_start(self, trainer, pl_module):
        self.tested = weights(pl_module)

    def on_test_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        self.test_logged = (float(m["test/loss"]), float(m["test/acc"]))
        self.test_exact = exact_metrics(pl_module, trainer.datamodule.splits["test"])


class _Said:
    """lra.loggers' log, keeping the messages of its info lines (train.log's "eval step ...") in a list: taken
    where they are made, so no logging configuration an earlier test left (Hydra's) can hide them."""

    def __init__(self, into: list, real: logging.Logger):
        self.into, self.real = into, real

    def info(self, msg, *args):
        self.into.append(msg % args)
        self.real.info(msg, *args)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture(scope="module")
def trainer_env(tmp_path_factory):
    """One data root (ListOps generated once) and a runner: ``run(name, *overrides) -> (record, probe,
    run dir)``; ``patch`` (a callable taking a MonkeyPatch) instruments the run."""
    root = tmp_path_factory.mktemp("wiring")

    def run(name, *overrides, patch=None):
        probe = Probe()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("lra.loggers.log", _Said(probe.eval_lines, logging.getLogger("lra.eval")))
            if patch is not None:
                patch(mp)
            rec = train_here(
                root, *TINY, "trainer.progress=false", *overrides, callbacks=[probe], run_dir=root / "runs" / name
            )
        return rec, probe, root / "runs" / name

    return run


# micro-batch 8 of the effective 32: accumulation 4; evaluation batch 24 over 64 examples: 24 + 24 + 16;
# max_steps 12 is no multiple of eval_every 5, so the model at stop (step 12) is none of the evaluated ones
# warmup 4: the learning rate rises over 4 optimizer steps, then falls to 0 at step 12; gradients clipped
# by value 0.01 (Skyformer's clipping, with a bound that these gradients exceed)
ACCUM = [
    "hardware.micro_batch=8",
    "train.eval_batch_size=24",
    "train.eval_every=5",
    "train.max_steps=12",
    "train.warmup=4",
    "train.grad_clip_value=0.01",
]


@pytest.fixture(scope="module")
def accum_runs(trainer_env):
    """The same accumulated run twice: testing the model at stop (last) and the best checkpoint (best)."""
    return {ckpt: trainer_env(f"accum_{ckpt}", *ACCUM, f"train.test_ckpt={ckpt}") for ckpt in ("last", "best")}


def test_gradient_accumulation_runs_accum_micro_batches_per_optimizer_step(accum_runs):
    rec, probe, _ = accum_runs["last"]
    assert (rec["micro_batch"], rec["accum_steps"], rec["effective_batch"]) == (8, 4, 32)
    # every optimizer step saw accum_steps micro-batches of micro_batch examples: the effective batch
    assert probe.steps == [[8, 8, 8, 8]] * 12 and probe.pending == []
    assert rec["steps"] == len(probe.steps) == 12


def test_each_epoch_trains_on_every_example_once_in_a_new_order(accum_runs):
    """48 micro-batches of 8 over 256 training rows: one epoch, then half of a differently shuffled one;
    every micro-batch carries the labels of its rows."""
    _, probe, _ = accum_runs["last"]
    train = probe.train_split
    rows = {np.asarray(train.tokens[i], dtype=np.int64).tobytes(): i for i in range(len(train))}
    assert len(rows) == len(train) == 256
    seen = []
    for tokens, labels in probe.batches:
        idx = [rows[t.numpy().astype(np.int64).tobytes()] for t in tokens]
        assert labels.tolist() == [int(train.labels[i]) for i in idx]
        seen += idx
    assert len(seen) == 384 and sorted(seen[:256]) == list(range(256))
    assert len(set(seen[256:])) == 128 and seen[256:] != seen[:128]


def test_training_rows_are_written_every_log_every_n_steps_with_the_loss_that_ended_the_step(trainer_env):
    """metrics.csv gets a training row at every ``log_every_n_steps``-th optimizer step (its step column counts
    the optimizer steps taken, as the log and the record do), holding the loss of the micro-batch that ended that
    step, under gradient accumulation too. LitLRA
    calls self.log only for those rows (0.5 ms of host work a call on every micro-batch before): a wrong
    step, a missing row under accumulation or another micro-batch's loss fails here."""
    _, probe, run_dir = trainer_env("log_rows", *ACCUM, "trainer.log_every_n_steps=3")
    train = pd.read_csv(run_dir / "metrics.csv").dropna(subset=["train/loss"])
    assert list(train["step"]) == [3, 6, 9, 12]  # after optimizer steps 3, 6, 9, 12 (4 micro-batches each)
    ended = {}  # optimizer step -> loss of its last micro-batch: the first micro-batch seen once it is done
    for done, loss in probe.losses:
        ended.setdefault(done, loss * 4)  # outputs["loss"] is divided by the accumulation (4)
    assert list(train["train/loss"]) == pytest.approx([ended[k] for k in (3, 6, 9, 12)], rel=1e-6)


def test_metrics_csv_counts_the_optimizer_steps_the_log_and_the_record_count(accum_runs):
    """metrics.csv's step column says the optimizer step a row comes after, as train.log's "eval step 5/12" and
    the record's ``steps`` do, under gradient accumulation (4 micro-batches a step): validation rows at 5 and 10
    (eval_every 5), a training row at every step 1..12, the test row at the record's 12. Lightning hands its
    loggers one less while training (its validation rows said 4 and 9, the training rows 0..11); its columns
    stay, ``epoch`` included."""
    rec, probe, run_dir = accum_runs["last"]
    rows = pd.read_csv(run_dir / "metrics.csv")
    said = [int(m) for line in probe.eval_lines for m in re.findall(r"^eval step (\d+)/12 ", line)]
    assert said == [step for step, *_ in probe.vals] == [5, 10]
    assert list(rows.dropna(subset=["val/acc"])["step"]) == said
    assert rec["steps_to_best"] in said
    assert list(rows.dropna(subset=["train/loss"])["step"]) == list(range(1, 13))
    last = rows.iloc[-1]
    assert last["step"] == rec["steps"] == 12 and not math.isnan(last["test/acc"])
    assert {"step", "epoch", "train/loss", "val/acc", "test/acc", "lr", "time/train_s"} <= set(rows.columns)
    assert rows["epoch"].notna().all() and list(rows["step"]) == sorted(rows["step"])


def test_gradients_are_clipped_by_value_before_each_step(accum_runs):
    _, probe, _ = accum_runs["last"]
    assert len(probe.clipped) == len(probe.grads) == 12
    assert max(probe.grads) > 0.01  # the bound was reached
    assert max(probe.clipped) <= 0.01


def test_schedule_counts_optimizer_steps_not_micro_batches(accum_runs):
    """Linear schedule, lr 1e-3 (quick): (s + 1) / 4 of it over warmup 4, then (12 - s) / 8 at step s."""
    _, probe, _ = accum_runs["last"]
    want = [1e-3 * ((s + 1) / 4 if s < 4 else (12 - s) / 8) for s in range(12)]
    assert probe.lrs == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_evaluation_interval_counts_optimizer_steps_under_accumulation(accum_runs):
    rec, probe, _ = accum_runs["last"]
    assert [step for step, _, _ in probe.vals] == [5, 10]  # eval_every 5 optimizer steps, not 5 micro-batches
    assert rec["steps_to_best"] in (5, 10)


def test_validation_metrics_are_per_example_over_batches_of_unequal_size(accum_runs):
    rec, probe, _ = accum_runs["last"]
    assert rec["split_sizes"]["val"] % 24 and rec["split_sizes"]["test"] % 24  # a last, smaller batch
    assert probe.val_counts == [rec["split_sizes"]["val"]] * 2  # every example, once
    for step, (loss, acc), (want_loss, want_acc) in probe.vals:
        assert acc == pytest.approx(want_acc, abs=1e-7), step  # k / 64: exact
        assert loss == pytest.approx(want_loss, rel=1e-6), step
    assert probe.test_logged[1] == pytest.approx(probe.test_exact[1], abs=1e-7)
    assert probe.test_logged[0] == pytest.approx(probe.test_exact[0], rel=1e-6)
    # the record holds the metrics of the weights that were tested
    assert rec["test_acc"] == pytest.approx(probe.test_exact[1], abs=1e-7)
    assert rec["test_loss"] == pytest.approx(probe.test_exact[0], rel=1e-6)
    assert rec["best_val_acc"] == pytest.approx(max(acc for _, (_, acc), _ in probe.vals), abs=1e-7)


def _best_weights(run_dir) -> dict:
    saved = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    return saved["state_dict"]


def test_best_checkpoint_holds_the_weights_of_the_best_validation(accum_runs):
    rec, probe, run_dir = accum_runs["best"]
    accs = [acc for _, (_, acc), _ in probe.vals]
    first_best = accs.index(max(accs))  # a tie does not replace the earlier checkpoint
    assert rec["steps_to_best"] == probe.vals[first_best][0]
    assert same_weights(_best_weights(run_dir), probe.val_weights[first_best])


def test_test_ckpt_last_tests_the_model_at_stop(accum_runs):
    rec, probe, run_dir = accum_runs["last"]
    assert rec["tested_ckpt"] == "last" and rec["steps"] == 12
    assert same_weights(probe.tested, probe.trained)
    assert not same_weights(probe.tested, _best_weights(run_dir))  # best is at step 5 or 10, not 12


def test_test_ckpt_best_tests_the_best_checkpoint(accum_runs):
    rec, probe, run_dir = accum_runs["best"]
    assert rec["tested_ckpt"] == "best" and rec["steps"] == 12
    assert same_weights(probe.tested, _best_weights(run_dir))
    assert not same_weights(probe.tested, probe.trained)
    assert rec["test_acc"] == pytest.approx(probe.test_exact[1], abs=1e-7)


def _scripted_validation(mp, script):
    """Validation logs ``script(i)`` = (loss, acc) at its i-th evaluation (the real sums are dropped)."""
    from lra.module import LitLRA

    def on_validation_epoch_end(self):
        self._sums.pop("val", None)
        loss, acc = script(self._scripted)
        self._scripted += 1
        self.log("val/loss", loss)
        self.log("val/acc", acc)

    mp.setattr(LitLRA, "_scripted", 0, raising=False)
    mp.setattr(LitLRA, "on_validation_epoch_end", on_validation_epoch_end)


STOPPING = ["hardware=cpu", "train.eval_every=2", "train.max_steps=12", "train.patience=2"]


def test_early_stopping_watches_validation_loss_not_accuracy(trainer_env):
    """docs/protocol.md: early stopping on val/loss. Loss improving while accuracy is flat runs to the
    end; accuracy improving while loss is flat stops after patience (2) evaluations (at step 6)."""
    rec, probe, _ = trainer_env(
        "loss_improves", *STOPPING, patch=lambda mp: _scripted_validation(mp, lambda i: (2.0 - 0.1 * i, 0.3))
    )
    assert rec["status"] == "completed" and rec["steps"] == 12
    assert [s for s, _, _ in probe.vals] == [2, 4, 6, 8, 10, 12]
    rec, probe, _ = trainer_env(
        "acc_improves", *STOPPING, patch=lambda mp: _scripted_validation(mp, lambda i: (2.0, 0.2 + 0.05 * i))
    )
    assert rec["status"] == "stopped_early" and rec["stop_reason"] == "early_stopping"
    assert rec["steps"] == 6 and [s for s, _, _ in probe.vals] == [2, 4, 6]
    assert rec["steps_to_best"] == 6  # the best checkpoint follows val/acc (trainer.monitor)


# ---------------------------------------------------------------------------------------------
# The default Skeinformer samples columns by importance (eq. 5), as its docstring says


def _capture_skeinformer(mp):
    """Record, per Skeinformer call: q, k, v, mask, its pilot rows and the log-weights of its column draw."""
    from attention import skeinformer as sk

    calls, draws = [], []
    real_topk, real_pilots, real_forward = (
        sk.gumbel_topk,
        sk.SkeinformerAttention._pilot_rows,
        sk.SkeinformerAttention.forward,
    )

    def gumbel_topk(log_w, d, kth=None):
        draws.append(log_w.detach().clone())
        return real_topk(log_w, d, kth)

    def pilot_rows(self, *args):
        out = real_pilots(self, *args)
        calls[-1]["pilots"] = out.clone()
        return out

    def forward(self, q, k, v, mask=None):
        calls.append({"q": q.detach().clone(), "k": k.detach().clone(), "v": v.detach().clone(), "mask": mask})
        draws.clear()
        out = real_forward(self, q, k, v, mask)
        calls[-1]["log_w"] = draws[-1]  # the column draw comes after the pilot draw
        return out

    mp.setattr(sk, "gumbel_topk", gumbel_topk)
    mp.setattr(sk.SkeinformerAttention, "_pilot_rows", pilot_rows)
    mp.setattr(sk.SkeinformerAttention, "forward", forward)
    return calls


def eq5_probabilities(q, k, v, real, pilots) -> torch.Tensor:
    """p̂_i ∝ ‖(B_J)^(i)‖₂ ‖V_(i)‖₂ over real keys i (0 on padding), B_J = softmax(Q_J Kᵀ/√p) over the
    real keys, every pilot copy counted; float64. q, k, v (b, h, n, p); real (b, n); pilots (b, h, d)."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, n, p = q.shape
    probs = torch.zeros(b, h, n, dtype=torch.float64)
    for i in range(b):
        keys = real[i].nonzero().flatten()
        for j in range(h):
            rows = pilots[i, j]
            assert real[i, rows].all(), "right padding: every pilot row is a real token"
            b_j = (q[i, j, rows] @ k[i, j, keys].T / math.sqrt(p)).softmax(-1)  # (d, m)
            w = b_j.square().sum(0).sqrt() * v[i, j, keys].norm(dim=-1)
            probs[i, j, keys] = w / w.sum()
    return probs


@pytest.mark.parametrize("preset", ["quick", "skeinformer_paper"])
def test_default_skeinformer_samples_columns_by_importance(preset, monkeypatch):
    """The run's own model (its preset's options: clean, and the public code's quirks) draws columns
    with probabilities ∝ eq. (5), recomputed here from the layer's q, k, v and pilot rows."""
    spec = load([f"preset={preset}", "task=listops", "attn=skeinformer", "attn.options.num_features=8"])
    assert spec.model.attn.options["column_sampling"] == "importance"
    torch.manual_seed(0)
    model = build_model(spec.model).eval()
    n = spec.model.seq_len
    lengths = torch.tensor([n // 2 + 5, 40])  # right padding; more than num_features + 1 real tokens each
    mask = torch.arange(n)[None, :] < lengths[:, None]
    tokens = torch.randint(1, spec.model.vocab_size, (2, n)) * mask
    calls = _capture_skeinformer(monkeypatch)
    with torch.no_grad():
        model(tokens, mask)
    assert len(calls) == spec.model.num_layers
    for c in calls:
        assert torch.equal(c["mask"], mask) and c["pilots"].shape[-1] == 8
        want = eq5_probabilities(c["q"], c["k"], c["v"], mask, c["pilots"])
        got = c["log_w"].double().softmax(-1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
        assert got.std(-1).min() > 0  # not uniform over the real keys


def test_skeinformer_uniform_ablation_samples_columns_uniformly(monkeypatch):
    spec = load(["preset=quick", "task=listops", "attn=skeinformer_uniform", "attn.options.num_features=8"])
    model = build_model(spec.model).eval()
    n = spec.model.seq_len
    mask = torch.arange(n)[None, :] < torch.tensor([n, 30])[:, None]
    calls = _capture_skeinformer(monkeypatch)
    with torch.no_grad():
        model(torch.randint(1, spec.model.vocab_size, (2, n)) * mask, mask)
    for c in calls:
        got = c["log_w"].double().softmax(-1)
        torch.testing.assert_close(got, (mask / mask.sum(-1, keepdim=True)).double()[:, None].expand_as(got))


# ---------------------------------------------------------------------------------------------
# The collector's statistics on hand-made records

ACCS = (0.30, 0.40, 0.50, 0.80)  # mean 0.5; squared deviations 0.04 + 0.01 + 0 + 0.09 = 0.14


def _sample_std(xs) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_collector_std_over_seeds_is_the_sample_std(tmp_path):
    """mean ± sample std (ddof 1) in the tables, summary.csv, index.md and the curves' band."""
    for seed, acc in enumerate(ACCS):
        make_record(tmp_path / "runs", "softmax", seed, test_acc=acc, train_time_s=100.0 * (seed + 1))
    want_std = math.sqrt(0.14 / 3)
    assert _sample_std(ACCS) == pytest.approx(want_std)
    runs, _ = load_runs(tmp_path / "runs")
    c = cell(build(SPEC["skeinformer_table1"], runs, "quick"), "softmax")
    assert (c.mean, c.std, c.n) == (pytest.approx(50.0), pytest.approx(100 * want_std), 4)
    s = summary(runs).set_index("attn").loc["softmax"]
    assert s["test_acc_mean"] == pytest.approx(0.5) and s["test_acc_std"] == pytest.approx(want_std)
    assert s["train_time_s_std"] == pytest.approx(_sample_std([100.0, 200.0, 300.0, 400.0]))
    collect(tmp_path / "runs", tmp_path / "out", plots=False)
    csv = pd.read_csv(tmp_path / "out" / "quick" / "summary.csv").set_index("attn")
    assert csv.loc["softmax", "test_acc_std"] == pytest.approx(want_std, abs=1e-6)  # written to 6 decimals
    out = tmp_path / "out"
    assert f"50.00 ± {100 * want_std:.2f} (4)" in (out / "quick" / "skeinformer_table1.md").read_text()
    half95 = 3.182446 * 100 * want_std / 2  # t(0.975, 3 degrees of freedom) * std / sqrt(4), from a t table
    row = f"| listops | Standard | 0,1,2,3 | 50.00 | {100 * want_std:.2f} | {half95:.2f} | 4 |"  # as the tables round
    assert row in (out / "index.md").read_text()
    # the curves: validation accuracy 0.2 + 0.05 i + 0.01 seed at each step (make_record): band ± std
    from lra.tools.collect.plots import curves_figure

    fig, _ = curves_figure(runs, tmp_path / "runs", "quick", "listops")
    band = next(c for c in fig.axes[0].collections if "PolyCollection" in type(c).__name__)  # fill_between
    ys = band.get_paths()[0].vertices[:, 1]
    half = 100 * _sample_std([0.01 * s for s in range(4)])
    means = [100 * (0.2 + 0.05 * i + 0.015) for i in range(4)]
    assert max(ys) == pytest.approx(means[-1] + half) and min(ys) == pytest.approx(means[0] - half)


def test_collector_average_column_and_delta_on_hand_records(tmp_path):
    """Average = mean of the per-task means (n = the fewest seeds of a task); delta = ours - paper."""
    per_task = {
        "text": (0.60, 0.64),
        "listops": (0.30, 0.40, 0.41),
        "retrieval": (0.70, 0.80),
        "pathfinder": (0.55, 0.65),
        "image": (0.35,),
    }
    for task, accs in per_task.items():
        for seed, acc in enumerate(accs):
            make_record(tmp_path, "softmax", seed, task=task, test_acc=acc, preset="skeinformer_paper")
    res = collect(tmp_path, tmp_path / "out", compare=("skeinformer",), plots=False)
    t1 = res.tables[("skeinformer_paper", "skeinformer_table1")]  # the paper's own preset: compared
    paper = paper_results()
    paper = paper[(paper["paper"] == "skeinformer") & (paper["table"] == "table1") & (paper["attn"] == "softmax")]
    means = {}
    for task, accs in per_task.items():
        c = cell(t1, "softmax", task)
        means[task] = 100 * sum(accs) / len(accs)
        assert c.mean == pytest.approx(means[task]) and c.n == len(accs)
        want_std = 100 * _sample_std(accs) if len(accs) > 1 else math.nan
        assert c.std == pytest.approx(want_std, nan_ok=True)
        value = float(paper[paper["task"] == task]["value"].iloc[0])
        assert c.paper == value and c.delta == pytest.approx(means[task] - value)
    avg = cell(t1, "softmax", "average")
    assert avg.mean == pytest.approx(sum(means.values()) / 5) and avg.n == 1
    value = float(paper[paper["task"] == "average"]["value"].iloc[0])
    assert avg.delta == pytest.approx(avg.mean - value)


# ---------------------------------------------------------------------------------------------
# ListOps MED: the median, an even count's mean of the middle two truncated (the official generator's
# int(np.median(...)): floor for digits), never rounded


@pytest.mark.parametrize(
    "src,value",
    [
        ("[MED 0 1 ]", 0),  # 0.5: rounding half up gives 1
        ("[MED 1 2 ]", 1),  # 1.5: rounding half to even (Python's round) gives 2
        ("[MED 5 6 ]", 5),  # 5.5
        ("[MED 9 2 8 3 ]", 5),  # sorted 2 3 8 9 -> 5.5; the upper middle value would be 8
        ("[MED 7 8 ]", 7),  # 7.5
        ("[MED 6 7 ]", 6),  # 6.5
        ("[MED 3 3 ]", 3),
        ("[MED 9 0 4 ]", 4),  # odd count: the middle value
    ],
)
def test_listops_median_of_an_even_count_is_the_truncated_mean(src, value):
    assert lo.evaluate(lo.parse(src)) == value


def _oracle(tree) -> int:
    """The LRA ListOps value, written out here: MED of an even count = floor of the middle two's mean."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    vals = sorted(_oracle(c) for c in children)
    n = len(vals)
    return {
        "[MIN": vals[0],
        "[MAX": vals[-1],
        "[SM": sum(vals) % 10,
        "[MED": vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) // 2,
    }[op]


def _half_medians(tree) -> int:
    """MED nodes of ``tree`` with an even count whose middle two sum to an odd number (a median x.5)."""
    if isinstance(tree, int):
        return 0
    op, children = tree
    vals = sorted(_oracle(c) for c in children)
    n = len(vals)
    here = op == "[MED" and n % 2 == 0 and (vals[n // 2 - 1] + vals[n // 2]) % 2 == 1
    return here + sum(_half_medians(c) for c in children)


def test_generated_listops_labels_follow_the_median_rule():
    params = lo.GeneratorParams(seed=3, n_train=300, n_val=1, n_test=1, min_length=5, max_length=60, max_depth=4)
    rows = [r for split in lo.generate(params, workers=1, progress=False).values() for r in split]
    assert [label for _, label in rows] == [_oracle(lo.parse(src)) for src, _ in rows]
    assert sum(_half_medians(lo.parse(src)) for src, _ in rows) >= 10  # the rule was put to the test


# ---------------------------------------------------------------------------------------------
# The data a run trains on, as lra.loop.wire hands it to the Trainer (no training)


def wired_batch(tmp_path, splits, *overrides):
    """The first training batch of the run ``overrides`` on ``splits``, from the data module ``lra.loop.wire``
    builds for it, and the run's spec."""
    from lra.fit import Plan
    from lra.loop import wire

    spec = load([*overrides, f"runs_root={tmp_path / 'runs'}", "num_threads=1"], run_dir=tmp_path / "run")
    w = wire(spec, Plan(4, 1, 4, "test"), splits, key=None, start=None)
    return next(iter(w.dm.train_dataloader())), spec


def tiny_splits(n=32, length=16, seed=0):
    from lra.data import Split

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 3, (n, length)).astype(np.uint8)  # zeros inside, as black pixels
    split = lambda: Split(tokens, np.full(n, length, np.int32), rng.integers(0, 2, n))  # noqa: E731
    return {"train": split(), "val": split(), "test": split()}


def test_each_seed_trains_on_its_own_batch_order(tmp_path):
    """Bug caught: the data module not given the run's seed, so every seed trains on seed 0's batch order (and
    spreads over seeds come out too narrow)."""
    splits = tiny_splits()
    first = {s: wired_batch(tmp_path / str(s), splits, *TINY, f"seed={s}")[0]["label"] for s in (0, 1, 2)}
    orders = {s: tuple(v.tolist()) for s, v in first.items()}
    assert len(set(orders.values())) == 3, orders  # labels of 4 random rows: 16 orders of 32 rows, 3 differ


def test_pathfinder_under_paper_semantics_masks_pixel_0_and_the_record_says_so(tmp_path, monkeypatch):
    """Bug caught: Pathfinder losing its pixel-0-is-padding mask under the public code's semantics (the
    skeinformer_paper preset's quirks) while the record still says ``task.mask: nonzero``; and the converse."""
    from lra.data import load_task
    from lra.data.registry import LOADERS
    from lra.record import new_record

    monkeypatch.setitem(LOADERS, "pathfinder", lambda spec, root: tiny_splits())
    for preset, zero_is_padding in (("skeinformer_paper", True), ("quick", False)):
        spec = load(["task=pathfinder", f"preset={preset}"], run_dir=tmp_path / preset)
        splits = load_task(spec.data.spec, tmp_path)  # the reader is replaced; what load_task does to it is not
        batch, spec = wired_batch(tmp_path / preset, splits, "task=pathfinder", f"preset={preset}")
        tokens, mask = batch["tokens"], batch["mask"]
        assert (tokens == 0).any()
        assert torch.equal(mask, tokens != 0) if zero_is_padding else bool(mask.all()), preset
        said = new_record(spec).quirks.get("task.mask")
        assert said == ("nonzero" if zero_is_padding else None), (preset, said)
        assert spec.config["task"]["mask"] == ("nonzero" if zero_is_padding else "all")
