"""Lightning callbacks: a progress bar over optimizer steps with ETA, and a training-only timer."""

from __future__ import annotations

import time

import lightning as L
from tqdm.auto import tqdm


class StepProgress(L.Callback):
    """One bar over optimizer steps (not epochs), with ETA, train loss and the last validation accuracy."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.bar = None
        self.last = 0

    def on_train_start(self, trainer, pl_module):
        self.last = trainer.global_step
        self.bar = tqdm(total=self.max_steps, initial=self.last, desc="train", unit="step", dynamic_ncols=True,
                        disable=not trainer.is_global_zero)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.bar is None or trainer.global_step == self.last:
            return
        self.bar.update(trainer.global_step - self.last)
        self.last = trainer.global_step
        m = trainer.callback_metrics
        post = {k.split("/")[-1] if k.startswith("train") else k.replace("/", "_"): f"{float(v):.3f}"
                for k, v in m.items() if k in ("train/loss", "val/acc")}
        self.bar.set_postfix(post, refresh=False)

    def on_train_end(self, trainer, pl_module):
        if self.bar is not None:
            self.bar.close()


class TrainTimer(L.Callback):
    """Wall time of training alone: the fit loop minus validation (evaluation excluded)."""

    def __init__(self):
        self.train_time_s = 0.0
        self.eval_time_s = 0.0
        self._t0 = self._v0 = None

    def on_train_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def on_validation_start(self, trainer, pl_module):
        if trainer.training or self._t0 is not None:
            self._v0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self._v0 is not None:
            self.eval_time_s += time.perf_counter() - self._v0
            self._v0 = None

    def on_train_end(self, trainer, pl_module):
        if self._t0 is not None:
            self.train_time_s = time.perf_counter() - self._t0 - self.eval_time_s
            self._t0 = None
