"""Lightning module: the classifier, AdamW with a warmup schedule, exact metrics, resumable state.

Validation and test metrics are sums over every example divided by the count (not a mean of batch
means), so the last partial batch counts exactly once.

Schedules (``schedule``): ``linear`` rises linearly from 0 to ``lr`` over ``warmup`` optimizer steps
and falls linearly to 0 at ``max_steps``; ``onecycle`` is ``torch.optim.lr_scheduler.OneCycleLR``
as the papers' code configures it (``pct_start = warmup / max_steps``, linear annealing, start at
lr/25, end at lr/25/1e4, and Adam's beta1 cycled between 0.95 and 0.85 by its default
``cycle_momentum``).

Resume: checkpoints carry the CPU/CUDA/numpy/python RNG states (restored when training restarts,
so dropout and randomised attention draw what an uninterrupted run draws) and the run's resume key;
the training data position is the loader's (lra/data/module.py).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time

import lightning as L
import numpy as np
import torch

from lra.config import ModelSpec, TrainSpec
from lra.devices import GIB
from lra.model import build_model, loss_and_correct

log = logging.getLogger("lra.module")

COMPILE_BACKEND = "inductor"  # torch.compile's backend, looked up at compile time (tests plant a failing one)


class CompileError(RuntimeError):
    """``train.compile=true`` and torch.compile failed: the run stops (``auto`` would run eager)."""


def warmup_linear_decay(warmup: int, total: int):
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def rng_states() -> dict:
    """The global RNG states in types ``torch.load(weights_only=True)`` accepts."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    s = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_states(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state((n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, state, gauss_next = s["python"]
    random.setstate((version, tuple(state), gauss_next))
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


class TrainClock:
    """Training wall time with evaluation taken out, summed over the restarts of a resumed run: the one
    clock behind the record's ``train_time_s``, the ``time/train_s`` of every validation row and the
    ``throughput/*`` of the training rows. :class:`LitLRA` drives it from its hooks and keeps it in the
    checkpoint."""

    def __init__(self, train_s: float = 0.0, eval_s: float = 0.0):
        self._train_before, self._eval_before = float(train_s), float(eval_s)
        self._t0: float | None = None  # start of the current training stretch (None while evaluating or stopped)
        self._v0: float | None = None  # start of the current evaluation, when it paused training

    @property
    def running(self) -> bool:
        return self._t0 is not None

    @property
    def train_s(self) -> float:
        return self._train_before + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    @property
    def eval_s(self) -> float:
        return self._eval_before

    @property
    def evaluating(self) -> bool:
        """In an evaluation that paused training."""
        return self._v0 is not None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self._train_before, self._t0 = self.train_s, None

    def pause(self) -> None:
        """Evaluation begins: an evaluation outside a training stretch (the sanity check) is not counted."""
        if self._t0 is not None:
            self.stop()
            self._v0 = time.perf_counter()

    def resume(self) -> None:
        if self._v0 is not None:
            self._eval_before += time.perf_counter() - self._v0
            self._v0 = None
            self.start()

    def state_dict(self) -> dict:
        return {"train_time_s": self.train_s, "eval_time_s": self.eval_s}

    @classmethod
    def from_state(cls, state: dict) -> "TrainClock":
        return cls(state["train_time_s"], state["eval_time_s"])


class LitLRA(L.LightningModule):
    """The classifier of ``model`` trained under ``train`` (the protocol: lr, schedule, clipping)."""

    def __init__(
        self,
        model: ModelSpec,
        train: TrainSpec,
        resume_key: str | None = None,
        compile: bool = False,
        compile_fallback: bool = False,
    ):
        super().__init__()
        self.spec, self.train_spec, self.resume_key = model, train, resume_key
        self.save_hyperparameters({"model": dataclasses.asdict(model), "train": dataclasses.asdict(train)})
        self.model = build_model(model)
        self.compiled: bool = compile  # what runs: False again when a compilation under auto fell back to eager
        self.compile_time_s: float | None = None
        self.compile_note: str | None = None  # why a requested compilation runs eager
        self.compile_fallback = compile_fallback  # train.compile=auto: a failed compilation runs eager
        self._sums = {}
        self._samples = 0  # training examples this process has seen
        self._rng_to_restore = None
        self._last_batch = None  # (loss, correct, count, optimizer step before it) of the last micro-batch
        self.clock = TrainClock()
        self._since_log = (0, 0.0)  # (samples, clock.train_s) at the last logged training row
        self._step_hparams: dict = {}  # lr and beta1 the last optimizer step used

    # compilation -------------------------------------------------------------------------------
    def on_fit_start(self):
        if self.compiled and self.compile_time_s is None:
            try:
                self.compile_time_s = self._compile()
            except Exception as e:  # a missing Triton, a backend's inductor bug: any of them
                self._uncompile(e)

    def _uncompile(self, e: Exception) -> None:
        """Back to the eager classifier after a failed compilation (``auto``), or one CompileError (``true``)."""
        self.model._compiled_call_impl = None  # what nn.Module.compile() set: forward runs eager again
        torch.compiler.reset()  # drop the half-built caches and guards
        self.model.train()  # the failure may have come in the evaluation call
        for p in self.parameters():
            p.grad = None  # a partial backward's (fork_rng in _compile has already restored the RNG states)
        why = error_line(e)
        if not self.compile_fallback:
            raise CompileError(
                f"train.compile=true: torch.compile failed on attention {self.spec.attn.label!r} "
                f"({why}); set train.compile=auto to fall back to eager or false to run eager"
            ) from e
        log.warning("torch.compile failed on attention %r (%s): running eager", self.spec.attn.label, why)
        self.compiled, self.compile_note = False, f"torch.compile failed ({why}): ran eager"

    def _compile(self) -> float:
        """``torch.compile`` the classifier's forward in place (state_dict keys stay those of the eager
        model, so checkpoints are interchangeable) and compile its training and evaluation graphs now,
        on a synthetic batch of the training shape with the batch dimension dynamic (the last, partial
        batch and evaluation batches reuse them): compilation is timed apart from training. Every
        backend traces as one graph whatever the padding (tests/test_compile.py). RNG states and
        gradients are left as they were, also when compilation fails (:meth:`_uncompile`)."""
        torch.compiler.reset()  # one process may build several models (tests, benchmarks)
        self.model.compile(backend=COMPILE_BACKEND)
        s, dev, b = self.spec, self.device, self.trainer.datamodule.batch_size
        shape = (b, 2, s.seq_len) if s.dual else (b, s.seq_len)
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else [], device_type=dev.type):
            tokens = torch.randint(1, s.vocab_size, shape, device=dev)
            mask = (
                torch.arange(s.seq_len, device=dev) < torch.randint(1, s.seq_len + 1, shape[:-1], device=dev)[..., None]
            )
            labels = torch.randint(0, s.num_classes, (b,), device=dev)
            torch._dynamo.mark_dynamic(tokens, 0)
            torch._dynamo.mark_dynamic(mask, 0)
            with self.trainer.precision_plugin.forward_context():
                loss, _ = loss_and_correct(self.model(tokens, mask), labels)
            loss.backward()
            self.model.eval()
            with torch.no_grad(), self.trainer.precision_plugin.forward_context():
                self.model(tokens, mask)
            self.model.train()
        for p in self.parameters():
            p.grad = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    def forward(self, tokens, mask):
        return self.model(tokens, mask)

    def training_step(self, batch, batch_idx):
        logits = self(batch["tokens"], batch["mask"])
        loss, correct = loss_and_correct(logits, batch["label"])
        self._last_batch = (loss.detach(), correct, batch["label"].numel(), self.trainer.global_step)
        self._samples += batch["label"].numel()
        return loss

    def on_before_optimizer_step(self, optimizer):
        """The learning rate and Adam's beta1 this step uses (OneCycleLR cycles beta1 against the lr)."""
        group = optimizer.param_groups[0]
        self._step_hparams = {"lr": float(group["lr"]), "beta1": float(group["betas"][0])}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        """The training loss and accuracy of the micro-batch that ends a logged optimizer step.

        Lightning writes a training row only at an optimizer step that is a multiple of
        ``log_every_n_steps``, or where a callback stopped the run (its ``should_update_logs``; this hook
        runs after the callbacks' and before that decision). ``self.log`` costs about 0.5 ms of host work a
        call (it moves its stored result each time), more than a whole quick CPU step's budget for the
        harness, so it is called for the rows that are written and no others: the same rows, the same values.
        """
        loss, correct, n, before = self._last_batch
        t = self.trainer
        if t.global_step != before and (t.global_step % t.log_every_n_steps == 0 or t.should_stop):
            self.log("train/loss", loss, prog_bar=True, batch_size=n, on_step=True, on_epoch=False)
            self.log("train/acc", correct.float() / n, prog_bar=True, batch_size=n, on_step=True, on_epoch=False)
            self.log_dict(self._step_metrics(), batch_size=n, on_step=True, on_epoch=False)

    def _step_metrics(self) -> dict[str, float]:
        """What every logger gets beside the loss at a logged step (docs/logging.md): the step's learning rate
        and beta1, training throughput since the last logged step (every rank's samples, evaluation excluded)
        and, on CUDA, the peak memory the caching allocator has handed out so far."""
        out = dict(self._step_hparams)
        samples, train_s = self._samples, self.clock.train_s
        n, seconds = samples - self._since_log[0], train_s - self._since_log[1]
        self._since_log = (samples, train_s)
        if seconds > 0:
            rate = n / seconds * self.trainer.world_size
            out["throughput/samples_per_s"] = rate
            out["throughput/tokens_per_s"] = rate * self.spec.seq_len * (2 if self.spec.dual else 1)
        if self.device.type == "cuda":
            out["memory/peak_gib"] = torch.cuda.max_memory_allocated(self.device) / GIB
        return out

    # exact full-split metrics ----------------------------------------------------------------
    def _eval_step(self, batch, stage):
        logits = self(batch["tokens"], batch["mask"])
        labels = batch["label"]
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        s = self._sums.setdefault(stage, torch.zeros(3, dtype=torch.float64, device=self.device))
        s += torch.stack(
            [
                loss.double(),
                (logits.argmax(-1) == labels).sum().double(),
                torch.tensor(labels.numel(), dtype=torch.float64, device=self.device),
            ]
        )

    def _eval_end(self, stage):
        s = self._sums.pop(stage, None)
        if s is None:
            return
        s = self.all_gather(s).reshape(-1, 3).sum(0) if self.trainer.world_size > 1 else s
        loss, acc = (s[0] / s[2]).item(), (s[1] / s[2]).item()
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=False)
        self.log(f"{stage}/acc", acc, prog_bar=stage == "val", sync_dist=False)
        self.log(f"{stage}/count", s[2].item(), sync_dist=False)
        if stage == "val" and self.clock.evaluating:  # an evaluation that paused training (not the sanity check)
            self.log("time/train_s", self.clock.train_s, sync_dist=False)

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def on_test_epoch_end(self):
        self._eval_end("test")

    def configure_optimizers(self):
        h = self.train_spec
        opt = torch.optim.AdamW(self.parameters(), lr=h.lr, betas=(0.9, 0.999), eps=h.eps, weight_decay=h.weight_decay)
        if h.schedule == "onecycle":
            sched = torch.optim.lr_scheduler.OneCycleLR(
                opt,
                max_lr=h.lr,
                total_steps=int(h.max_steps),
                pct_start=int(h.warmup) / int(h.max_steps),
                anneal_strategy="linear",
            )
        else:
            sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear_decay(h.warmup, h.max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.train_spec.grad_clip_value:  # Skyformer clips by value 1
            self.clip_gradients(
                optimizer, gradient_clip_val=self.train_spec.grad_clip_value, gradient_clip_algorithm="value"
            )

    # resume ------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint):
        checkpoint["rng_states"] = rng_states()
        checkpoint["resume_key"] = self.resume_key
        checkpoint["train_clock"] = self.clock.state_dict()

    def on_load_checkpoint(self, checkpoint):
        # applied when training (re)starts: restoring data loaders between here and there draws seeds
        self._rng_to_restore = checkpoint.get("rng_states")
        # a checkpoint of an older harness kept the clock in its TrainTimer callback's state
        state = checkpoint.get("train_clock") or checkpoint.get("callbacks", {}).get("TrainTimer")
        if state:
            self.clock = TrainClock.from_state(state)

    def on_validation_start(self):
        self.clock.pause()  # evaluation time is not training time

    def on_validation_end(self):
        self.clock.resume()

    def on_train_end(self):
        self.clock.stop()

    def on_train_start(self):
        self.clock.start()
        self._since_log = (self._samples, self.clock.train_s)
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None


def error_line(e: BaseException) -> str:
    """``Type: first line`` of an error; a first line ending in ':' (dynamo's "backend='inductor' raised:")
    keeps the next one, which says what was raised."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
    return f"{type(e).__name__}: {' '.join(lines[:2]) if lines[0].endswith(':') else lines[0]}"


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
