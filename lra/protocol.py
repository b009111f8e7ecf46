"""The papers' protocol as the loop runs it: when to evaluate, checkpoint, stop and select, and
what the outcome of a run is (docs/protocol.md).

* :func:`callbacks` builds a run's callbacks from its spec: progress bar,
  best-validation selection (after ``select_after``), resume checkpoints, early stopping on val loss,
  the guard that stops diverged (NaN/inf) and stuck runs, and the epoch count every logger records
  (:class:`DataEpoch`). All keep their state in the checkpoint, so a restarted run ends with the same
  record and the same metrics.csv.
* :func:`outcome` classifies a finished ``fit`` (completed, stopped early, stuck, diverged) and
  chooses the checkpoint to test; :func:`measured` collects its steps, times and throughput.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, ModelCheckpoint
from tqdm.auto import tqdm

from lra.compat import should_accumulate
from lra.config import RunSpec
from lra.data.base import Split, hms
from lra.data.module import ResumableLoader

progress_log = logging.getLogger("lra.progress")


class StepProgress(L.Callback):
    """Progress over optimizer steps (not epochs) with ETA and train loss, as ``trainer.progress`` says.

    ``mode``: ``True`` a tqdm bar (with the last validation accuracy), ``"auto"`` the bar when stderr is a
    terminal and otherwise (a batch job's log file) a plain log line (``lra.progress``) every tenth of
    ``max_steps`` or every ``line_every_s`` seconds, whichever comes first. While the bar is drawn, the
    console's log lines (an evaluation, Lightning's) are written above it, never glued to it.
    """

    def __init__(self, max_steps: int, every_s: float = 1.0, mode: bool | str = "auto", line_every_s: float = 60.0):
        self.max_steps = max_steps
        self.mode = mode
        self.bar = None
        self.last = 0
        self.every_s, self._posted = every_s, 0.0  # reading a metric syncs the GPU: at most once a second
        self.line_every_s = line_every_s
        self.line_steps = max(1, math.ceil(max_steps / 10))
        self._lines = False
        self._t0 = self._step0 = None
        self._line_t = 0.0
        self._streams = []  # (handler, its own stream) of the console handlers routed above the bar

    def uses_bar(self) -> bool:
        return self.mode is True or (self.mode == "auto" and sys.stderr.isatty())

    def on_train_start(self, trainer, pl_module):
        self.last = trainer.global_step
        if not trainer.is_global_zero:
            return
        if not self.uses_bar():
            self._lines = True
            self._t0, self._step0, self._line_t = time.monotonic(), self.last, time.monotonic()
            return
        self.bar = tqdm(
            total=self.max_steps,
            initial=self.last,
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        self._above_bar(type(self.bar))

    def _above_bar(self, bar_cls) -> None:
        """Route the console's log handlers through the bar's class: each record clears the bar, is written
        on its own line, and the bar is drawn again below it (tqdm's external write mode)."""
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                self._streams.append((h, h.setStream(_AboveBar(h.stream, bar_cls))))

    def _restore(self) -> None:
        for h, stream in self._streams:
            h.setStream(stream)
        self._streams = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.last:
            return
        step, self.last = trainer.global_step, trainer.global_step
        if self._lines:
            self._line(trainer, step, outputs)
            return
        if self.bar is None:
            return
        self.bar.update(step - self.bar.n)
        if time.monotonic() - self._posted < self.every_s:
            return
        self._posted = time.monotonic()
        m = trainer.callback_metrics
        post = {
            k.split("/")[-1] if k.startswith("train") else k.replace("/", "_"): f"{float(v):.3f}"
            for k, v in m.items()
            if k in ("train/loss", "val/acc")
        }
        self.bar.set_postfix(post, refresh=False)

    def _line(self, trainer, step: int, outputs) -> None:
        """One plain line at every tenth of the run, or when ``line_every_s`` passed since the last one."""
        now = time.monotonic()
        if step % self.line_steps != 0 and step < self.max_steps and now - self._line_t < self.line_every_s:
            return
        self._line_t = now
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:  # Lightning divides the loss it hands on by the accumulation: the micro-batch's loss
            loss = float(loss) * trainer.accumulate_grad_batches
        spent, done = now - self._t0, step - self._step0
        eta = spent / done * (self.max_steps - step) if done > 0 else None
        progress_log.info(
            "step %d/%d (%.0f%%): train loss %s, elapsed %s, ETA %s",
            step,
            self.max_steps,
            100.0 * step / max(self.max_steps, 1),
            "n/a" if loss is None else f"{loss:.4f}",
            hms(spent),
            hms(eta),
        )

    def on_train_end(self, trainer, pl_module):
        self._close()

    def on_exception(self, trainer, pl_module, exception):
        self._close()

    def _close(self) -> None:
        self._restore()
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._lines = False


class _AboveBar:
    """A console log handler's stream while a bar is drawn: every write clears the bar first and draws it again
    after, so a log line starts at the beginning of its own line."""

    def __init__(self, stream, bar_cls):
        self.stream, self.bar_cls = stream, bar_cls

    def write(self, text: str) -> int:
        with self.bar_cls.external_write_mode(file=self.stream):
            n = self.stream.write(text)
            self.stream.flush()
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def selectable(step: int, select_after: float, max_steps: int) -> bool:
    """Whether the evaluation after ``step`` optimizer steps may become the best checkpoint: strictly
    after the fraction ``select_after`` of ``max_steps``, as Skyformer's main.py saves only when
    ``(train_step_idx + 1) > total_step * 0.2``; its ``train_step_idx + 1`` at an evaluation is the
    optimizer steps done, Lightning's ``global_step`` there (step 10,000 of 50,000 is not eligible)."""
    return step > max_steps * select_after


class BestCheckpoint(ModelCheckpoint):
    """The best-validation checkpoint (``best.ckpt``), considered only after ``select_after`` of the
    ``max_steps`` optimizer steps (:func:`selectable`; Skyformer keeps the best dev checkpoint after 20%
    of training); remembers the step."""

    def __init__(self, *args, select_after: float = 0.0, max_steps: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.select_after, self.max_steps = float(select_after), int(max_steps)
        self.best_step = None

    def on_validation_end(self, trainer, pl_module):
        if not selectable(trainer.global_step, self.select_after, self.max_steps):
            return
        before = self.best_model_score
        super().on_validation_end(trainer, pl_module)
        # compared as numbers: a score restored from a checkpoint lives on the CPU, a new one on the GPU
        if self.best_model_score is not None and (before is None or float(before) != float(self.best_model_score)):
            self.best_step = trainer.global_step

    def state_dict(self):
        return {**super().state_dict(), "best_step": self.best_step}

    def load_state_dict(self, state):
        old = state.get("dirpath")
        if old is not None and self.dirpath is not None and str(old) != str(self.dirpath):
            state = moved(state, str(old), str(self.dirpath))
        super().load_state_dict(state)
        self.best_step = state.get("best_step")


def moved(state: dict, old: str, new: str) -> dict:
    """A checkpoint callback's state whose folder has moved (a runs root copied, carried to another machine):
    the same files in the new folder. Lightning keeps the best score only when the folder is unchanged; without
    it the next evaluation would become "best" and overwrite best.ckpt, and the run end with another record."""

    def at(path):
        if not path or not str(path).startswith(old.rstrip(os.sep) + os.sep):
            return path
        return os.path.join(new, os.path.relpath(str(path), old))

    out = {**state, "dirpath": new}
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in out:
            out[key] = at(out[key])
    if isinstance(out.get("best_k_models"), dict):
        out["best_k_models"] = {at(k): v for k, v in out["best_k_models"].items()}
    return out


class ResumeCheckpoint(Checkpoint):
    """``last.ckpt``: the whole training state (weights, optimizer, scheduler, RNG, data position,
    callbacks), written atomically after every evaluation and, with ``every_n_steps``, after every
    N-th optimizer step that has no evaluation due (a checkpoint taken just before a due evaluation
    would make Lightning skip that evaluation on restart)."""

    def __init__(self, path: Path, eval_every: int, every_n_steps: int | None = None):
        self.path = Path(path)
        self.eval_every = int(eval_every)
        self.every_n_steps = int(every_n_steps or 0)
        self._last_step = -1

    def _save(self, trainer):
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            trainer.save_checkpoint(tmp, weights_only=False)
            if trainer.is_global_zero:
                os.replace(tmp, self.path)
        except BaseException:  # disk full, a signal: the previous last.ckpt stays, no temporary file
            tmp.unlink(missing_ok=True)
            raise
        trainer.strategy.barrier("lra-resume-checkpoint")
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        s = trainer.global_step
        if (
            self.every_n_steps
            and s > 0
            and s != self._last_step
            and s % self.every_n_steps == 0
            and s % self.eval_every != 0
            and s < trainer.max_steps
            and not should_accumulate(trainer, batch_idx)
            and not trainer.should_stop  # the guard stopped the run at this step (diverged): as at an evaluation
        ):
            self._save(trainer)

    def on_validation_end(self, trainer, pl_module):
        # not when the run stops here: a restart would then train on past the stopping evaluation
        if not trainer.sanity_checking and trainer.state.fn == "fit" and not trainer.should_stop:
            self._save(trainer)


class DataEpoch(L.Callback):
    """Keeps ``trainer.current_epoch`` (the ``epoch`` Lightning adds to every logged row: metrics.csv,
    TensorBoard, W&B) at the epoch of the training data consumed, as the loader counts it.

    Lightning counts epochs itself, and its count drifts (an epoch up or down) once a run restarts
    from checkpoints written mid-epoch or at an epoch's last batch: its fit loop's restart rules leave
    the epoch counters out of step, and each later restart builds on them. The loader's position is
    checkpointed and exact, so the count is taken from it: during a batch, the epoch of that batch;
    after training, one more (Lightning closes the epoch training stopped in), as an uninterrupted run
    logs its test row."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._set(trainer, 0)

    def on_train_end(self, trainer, pl_module):
        self._set(trainer, 1)

    @staticmethod
    def _set(trainer, after: int) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableLoader):
            trainer.fit_loop.epoch_progress.current.completed = last_batch_epoch(loader) + after


def last_batch_epoch(loader: ResumableLoader) -> int:
    """Epoch of the last batch the loader delivered: its state names the next batch, and position 0
    means the last one closed the epoch before (-1: none delivered yet)."""
    return loader.epoch - 1 if loader.position == 0 else loader.epoch


class RunGuard(L.Callback):
    """Stops a run that diverged (non-finite training or validation loss) or is stuck at chance
    (after ``stuck_after`` optimizer steps, validation loss within ``loss_tol`` of the entropy of
    the training labels and accuracy within ``acc_tol`` of the majority rate) and says why in
    ``status`` / ``reason``, which the record takes over."""

    def __init__(
        self,
        baseline_loss: float,
        majority_acc: float,
        stuck_after: int | None = None,
        loss_tol: float = 0.02,
        acc_tol: float = 0.01,
    ):
        self.baseline_loss, self.majority_acc = float(baseline_loss), float(majority_acc)
        self.stuck_after = int(stuck_after) if stuck_after else None
        self.loss_tol, self.acc_tol = float(loss_tol), float(acc_tol)
        self.check_every, self._losses = 25, []
        self.status = None
        self.reason = None
        self.at_chance = False  # the last evaluation looked like chance (reported even when not stopping)
        self.last_val = None  # (loss, acc) of the last evaluation

    def _stop(self, trainer, status, reason):
        self.status, self.reason = status, reason
        trainer.should_stop = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """Non-finite losses are checked every step on a CPU, every ``check_every`` on a GPU (one host
        sync for all of them), and the first bad one is reported."""
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None or self.status is not None:
            return
        self._losses.append((trainer.global_step, batch_idx, loss.detach().float().reshape(())))
        if loss.device.type == "cpu" or len(self._losses) >= self.check_every:
            self._check_losses(trainer)

    def _check_losses(self, trainer):
        losses, self._losses = self._losses, []
        if not losses or self.status is not None:
            return
        bad = (~torch.isfinite(torch.stack([x for _, _, x in losses]))).nonzero()
        if len(bad):
            step, batch, value = losses[int(bad[0])]
            self._stop(
                trainer,
                "failed",
                f"diverged: non-finite training loss ({float(value):g}) at optimizer " f"step {step}, batch {batch}",
            )

    def on_validation_end(self, trainer, pl_module):
        self._check_losses(trainer)
        if trainer.sanity_checking or self.status is not None:
            return
        m = trainer.callback_metrics
        if "val/loss" not in m:
            return
        loss, acc = float(m["val/loss"]), float(m["val/acc"])
        self.last_val = (loss, acc)
        if not math.isfinite(loss):
            self._stop(trainer, "failed", f"diverged: non-finite validation loss at step {trainer.global_step}")
            return
        self.at_chance = loss >= self.baseline_loss - self.loss_tol and acc <= self.majority_acc + self.acc_tol
        if self.at_chance and self.stuck_after is not None and trainer.global_step >= self.stuck_after:
            self._stop(
                trainer,
                "stuck",
                f"stuck: after {trainer.global_step} steps validation loss {loss:.4f} "
                f"(chance {self.baseline_loss:.4f}) and accuracy {acc:.4f} (majority "
                f"{self.majority_acc:.4f})",
            )

    def state_dict(self):
        return {"status": self.status, "reason": self.reason, "at_chance": self.at_chance, "last_val": self.last_val}

    def load_state_dict(self, state):
        self.status, self.reason, self.at_chance = state["status"], state["reason"], state["at_chance"]
        self.last_val = state.get("last_val")


# ---------------------------------------------------------------------------------------------
# Checkpoints, read as data (lra.train resumes from them; lra.tools.carry and the sweep read their step)


class RunError(RuntimeError):
    """The run cannot go on until the user acts (a damaged record or checkpoint, another config)."""


_TORCH_ADVICE = ("Weights only load failed", "Check the documentation of torch.load")  # around its reason


def read_checkpoint(path: Path) -> dict:
    """A checkpoint of this harness, read as data (``torch.load(weights_only=True)``: tensors, numbers, strings,
    containers): a runs folder from elsewhere is never run as code. Raises a one-line RunError naming the file:
    damaged, or holding objects that would run code when loaded (not loaded, so nothing in it ran)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # one line naming the file, not the zip's or the unpickler's error
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        code = next((ln for ln in lines if "GLOBAL" in ln), None)  # what weights_only refuses: a callable to call
        if isinstance(e, pickle.UnpicklingError) and code is not None:
            raise RunError(
                f"{path} holds objects that would run code when loaded ({code.rstrip('.')[:160]}), so it was not "
                f"loaded (this harness's checkpoints, callbacks= included, hold only tensors, numbers and strings); "
                f"pass force=true to discard the run's checkpoints and start again"
            ) from None
        said = next((ln for ln in lines if not ln.startswith(_TORCH_ADVICE)), "").split(". This is an internal")[0]
        raise RunError(
            f"{path} cannot be read ({type(e).__name__}: {said[:160]}); it is damaged: pass force=true to discard "
            f"the run's checkpoints and start again"
        ) from None
    if not isinstance(saved, dict):
        raise RunError(f"{path} is not a checkpoint; pass force=true to discard the run's checkpoints and start again")
    return saved


def resumes_at(last: Path) -> str:
    """What ``last.ckpt`` holds for a resume, in words: its optimizer step, read as data (a record written before
    records counted an interrupted run's steps says 0, so the checkpoint is the one to ask)."""
    if not last.is_file():
        return "no last.ckpt: the run starts over"
    try:
        step = read_checkpoint(last).get("global_step", 0)
    except RunError:
        return "an unreadable last.ckpt"
    return f"last.ckpt at step {step}" if type(step) is int and 0 <= step < 10**12 else "a last.ckpt that holds no step"


# ---------------------------------------------------------------------------------------------
# A run's callbacks and its outcome


FINISHED = ("completed", "stopped_early", "stuck")  # statuses a rerun of the same command skips
STATUSES = (*FINISHED, "running", "failed", "interrupted")  # what this version writes; another is not trained over


def label_entropy(labels) -> float:
    p = np.bincount(np.asarray(labels)).astype(np.float64)
    p = p[p > 0] / p.sum()
    return float(-(p * np.log(p)).sum())


@dataclass
class Callbacks:
    """The callbacks of one run, by role (``all`` in the order the Trainer runs them)."""

    guard: RunGuard
    best: BestCheckpoint
    resume: ResumeCheckpoint
    stopper: EarlyStopping | None
    all: list


def callbacks(spec: RunSpec, val: Split, ckpt_dir: Path, extra: list | None = None) -> Callbacks:
    tr = spec.train
    best = BestCheckpoint(
        dirpath=ckpt_dir,
        filename="best",
        monitor=tr.monitor,
        mode="max" if tr.monitor.endswith("acc") else "min",
        save_top_k=1,
        save_last=False,
        auto_insert_metric_name=False,
        enable_version_counter=False,
        select_after=tr.select_after,
        max_steps=tr.max_steps,
    )
    resume = ResumeCheckpoint(ckpt_dir / "last.ckpt", eval_every=tr.eval_every, every_n_steps=tr.ckpt_every_steps)
    guard = RunGuard(
        baseline_loss=label_entropy(val.labels),
        majority_acc=val.majority_rate(),
        stuck_after=tr.stuck_after_steps,
        loss_tol=tr.stuck_loss_tol,
        acc_tol=tr.stuck_acc_tol,
    )
    stopper = None
    if tr.patience:
        stopper = EarlyStopping(
            monitor="val/loss", mode="min", patience=tr.patience, check_on_train_epoch_end=False, check_finite=False
        )
    cbs = [DataEpoch(), guard, best, resume, *(extra or [])]
    if spec.progress:
        cbs.append(StepProgress(tr.max_steps, mode=spec.progress))
    if stopper is not None:
        cbs.append(stopper)
    return Callbacks(guard, best, resume, stopper, cbs)


def measured(spec: RunSpec, trainer, cb: Callbacks, effective_batch: int) -> dict:
    """Steps, training time (evaluation excluded), throughput and selection of a finished fit."""
    clock = trainer.lightning_module.clock  # lra.module.TrainClock: training time, evaluation excluded
    steps, t = int(trainer.global_step), clock.train_s
    tokens = steps * effective_batch * spec.model.seq_len * (2 if spec.model.dual else 1)
    return {
        "steps": steps,
        "steps_at_stop": steps,
        "train_time_s": t,
        "eval_time_s": clock.eval_s,
        "time_per_1k_steps_s": t / steps * 1000 if steps else None,
        "tokens_per_s": tokens / t if t else None,
        "best_val_acc": None if cb.best.best_model_score is None else float(cb.best.best_model_score),
        "best_ckpt": cb.best.best_model_path or None,
        "steps_to_best": cb.best.best_step,
        "stuck_at_end": cb.guard.at_chance,
    }


@dataclass
class Outcome:
    """How a fit ended, before testing: the record's status fields and the checkpoint to test."""

    status: str  # completed | stopped_early | stuck | failed
    reason: str | None
    stop_reason: str  # max_steps | early_stopping | stopped | stuck | diverged
    stop_rule: str
    test_ckpt: str | None  # path of the checkpoint to test; None: the model at stop
    tested: str | None  # what the record calls it: best | last | last (no best checkpoint after select_after)

    @property
    def fields(self) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "stop_reason": self.stop_reason,
            "stop_rule": self.stop_rule,
            "tested_ckpt": self.tested,
        }


def outcome(spec: RunSpec, trainer, cb: Callbacks) -> Outcome:
    tr = spec.train
    steps = int(trainer.global_step)
    rule = f"early stopping on val/loss, patience {tr.patience}" if tr.patience else "fixed steps"
    early = (cb.stopper is not None and cb.stopper.stopped_epoch > 0) or (steps < tr.max_steps and trainer.should_stop)
    stop = "max_steps" if steps >= tr.max_steps else ("early_stopping" if early else "stopped")
    if cb.guard.status == "failed":  # diverged: nothing worth testing
        return Outcome("failed", cb.guard.reason, "diverged", rule, None, None)
    best = cb.best.best_model_path if tr.test_ckpt == "best" else None
    tested = "best" if best else ("last" if tr.test_ckpt == "last" else "last (no best checkpoint after select_after)")
    if cb.guard.status == "stuck":
        return Outcome("stuck", cb.guard.reason, "stuck", rule, best or None, tested)
    return Outcome("stopped_early" if early else "completed", None, stop, rule, best or None, tested)
