"""One optimizer step of a run at a task's real shape, and the inputs it takes: what the benchmark's task mode
(:mod:`lra.tools.bench.tasks`) times, the doctor's overhead check runs as its bare loop, and the doctor's fit check
measures the peak of (:func:`step_peak`).

The step is the run's: ``accum`` micro-batches of forward, loss (``lra.model.loss_and_correct``) and backward
under the run's precision (16-mixed: fp16 autocast and a GradScaler), then clipping and the AdamW step.
Inputs are random tokens, padded from a seeded per-sample length drawn uniformly in [n/8, n].
"""

from __future__ import annotations

from typing import Callable

import torch

from lra.config import RunSpec
from lra.fit import autocast
from lra.model import build_model, loss_and_correct
from lra.tools.meter.memory import measure_peak


def make_batches(spec: RunSpec, micro: int, count: int, device: str, seed: int) -> list[tuple]:
    """``count`` micro-batches (tokens, mask, labels) with seeded per-sample lengths in [n/8, n]."""
    m = spec.model
    g = torch.Generator().manual_seed(seed)
    shape = (micro, 2, m.seq_len) if m.dual else (micro, m.seq_len)
    out = []
    for _ in range(count):
        lengths = torch.randint(max(1, m.seq_len // 8), m.seq_len + 1, shape[:-1], generator=g)
        mask = torch.arange(m.seq_len) < lengths.unsqueeze(-1)
        tokens = torch.randint(1, m.vocab_size, shape, generator=g).masked_fill(~mask, 0)
        labels = torch.randint(0, m.num_classes, (micro,), generator=g)
        out.append((tokens.to(device), mask.to(device), labels.to(device)))
    return out


def attention_inputs(spec: RunSpec, micro: int, device: str, seed: int) -> tuple:
    """q, k, v, mask, upstream gradient as the first attention layer sees them (fp32; two documents
    of a dual task are one batch of 2 x micro sequences)."""
    m = spec.model
    g = torch.Generator().manual_seed(seed + 1)
    b = micro * (2 if m.dual else 1)
    shape = (b, m.num_heads, m.seq_len, m.head_dim)
    q, k, v, dout = (torch.randn(shape, generator=g).to(device) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    lengths = torch.randint(max(1, m.seq_len // 8), m.seq_len + 1, (b,), generator=g)
    mask = (torch.arange(m.seq_len) < lengths.unsqueeze(-1)).to(device)
    return q, k, v, mask, dout


class TrainStep:
    """One optimizer step of a run: ``accum`` micro-batches, loss scaled by 1/accum, then AdamW."""

    def __init__(self, model: torch.nn.Module, spec: RunSpec, accum: int, precision: str, device: str):
        self.model, self.accum, self.precision, self.device = model, accum, precision, device
        t = spec.train
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=t.lr, eps=t.eps, weight_decay=t.weight_decay)
        self.scaler = torch.amp.GradScaler(device.split(":")[0], enabled=precision in ("16-mixed", "16"))
        self.clip = t.grad_clip_value

    def __call__(self, net: Callable, batches: list[tuple]) -> None:
        for tokens, mask, labels in batches:
            with autocast(self.precision, self.device):
                loss, _ = loss_and_correct(net(tokens, mask), labels)
            self.scaler.scale(loss / self.accum).backward()
        if self.clip is not None:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_value_(self.params, self.clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)

    def state_tensors(self) -> list[torch.Tensor]:
        return self.params + [v for s in self.opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


class StepRunner:
    """The model of a run, its :class:`TrainStep` and a pool of batches: ``runner(net, i)`` is optimizer step i (each
    differs from the last). The one runner the bench's task mode times and the doctor's overhead check pairs with
    the harness; ``net`` is the model or its compiled form."""

    def __init__(self, spec: RunSpec, micro: int, accum: int, precision: str, device: str, seed: int, pool: int):
        torch.manual_seed(seed)
        self.model = build_model(spec.model).to(device).train()
        self.step = TrainStep(self.model, spec, accum, precision, device)
        self.pool = make_batches(spec, micro, pool, device, seed)

    def __call__(self, net: Callable, i: int) -> None:
        a = self.step.accum
        self.step(net, [self.pool[(i * a + j) % len(self.pool)] for j in range(a)])

    def known(self) -> list[torch.Tensor]:
        """Its parameters, AdamW states and inputs: what a peak of its step counts as its own."""
        return [*self.step.state_tensors(), *(t for b in self.pool for t in b)]


def step_peak(spec: RunSpec, micro: int, precision: str, device: str) -> int:
    """Peak bytes of one training iteration of one micro-batch (AdamW states present, as from the second
    iteration on), its parameters, states and inputs included: what ``lra.fit`` estimates."""
    with torch.random.fork_rng(devices=[]):
        r = StepRunner(spec, micro, 1, precision, device, seed=0, pool=1)
        for p in r.step.params:  # AdamW states exist from the second iteration on, as in the estimate
            p.grad = torch.zeros_like(p)
        r.step.opt.step()
        r.step.opt.zero_grad(set_to_none=True)
        return measure_peak(lambda: r(r.model, 0), r.known(), device).bytes
