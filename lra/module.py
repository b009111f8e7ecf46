"""Lightning module: the classifier, AdamW with linear warmup then linear decay, exact metrics.

Validation and test metrics are sums over every example divided by the count (not a mean of batch
means), so the last partial batch counts exactly once. The learning-rate schedule rises linearly
from 0 to ``lr`` over ``warmup`` optimizer steps and falls linearly to 0 at ``max_steps``.
"""

from __future__ import annotations



import lightning as L
import torch

from lra.model import LRAClassifier, loss_and_correct


def warmup_linear_decay(warmup: int, total: int):
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


class LitLRA(L.LightningModule):
    def __init__(self, model_kwargs: dict, lr: float, warmup: int, max_steps: int, weight_decay: float = 0.0,
                 betas=(0.9, 0.999), eps: float = 1e-6, grad_clip_value: float | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.model = LRAClassifier(**model_kwargs)
        self._sums = {}

    def forward(self, tokens, mask):
        return self.model(tokens, mask)

    def training_step(self, batch, batch_idx):
        logits = self(batch["tokens"], batch["mask"])
        loss, correct = loss_and_correct(logits, batch["label"])
        n = batch["label"].numel()
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", correct.float() / n, prog_bar=True, batch_size=n)
        return loss

    # exact full-split metrics ----------------------------------------------------------------
    def _eval_step(self, batch, stage):
        logits = self(batch["tokens"], batch["mask"])
        labels = batch["label"]
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        s = self._sums.setdefault(stage, torch.zeros(3, dtype=torch.float64, device=self.device))
        s += torch.stack([loss.double(), (logits.argmax(-1) == labels).sum().double(),
                          torch.tensor(labels.numel(), dtype=torch.float64, device=self.device)])

    def _eval_end(self, stage):
        s = self._sums.pop(stage, None)
        if s is None:
            return
        s = self.all_gather(s).reshape(-1, 3).sum(0) if self.trainer.world_size > 1 else s
        loss, acc = (s[0] / s[2]).item(), (s[1] / s[2]).item()
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=False)
        self.log(f"{stage}/acc", acc, prog_bar=stage == "val", sync_dist=False)
        self.log(f"{stage}/count", s[2].item(), sync_dist=False)

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def on_test_epoch_end(self):
        self._eval_end("test")

    def configure_optimizers(self):
        h = self.hparams
        opt = torch.optim.AdamW(self.parameters(), lr=h.lr, betas=tuple(h.betas), eps=h.eps,
                                weight_decay=h.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear_decay(h.warmup, h.max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.hparams.grad_clip_value:  # Skyformer clips by value 1
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.grad_clip_value,
                                gradient_clip_algorithm="value")


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())



