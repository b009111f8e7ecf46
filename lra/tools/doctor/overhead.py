"""What the harness costs over a bare PyTorch loop of the same model, shapes and precision (check 3).

The harness is timed as a run trains (``lra.loop.wire``: the module, the protocol's callbacks, the
CSV logger, the resumable loader, the Trainer). A callback inside that Trainer interleaves the two:
after every ``block`` harness optimizer steps it runs ``block`` steps of the bare loop (its own copy
of the model, AdamW, the same schedule, clipping and precision, batches already on the device), so
both see the same machine, load and clock. Evaluation is out of the window (``eval_every`` past the
last step) as it is out of ``time_per_1k_steps_s``; so are compilation and the first ``warmup`` steps.

The first bare block runs before any timed harness block (it warms the bare loop) and is not counted:
harness block i is paired with bare block i + 1, the one that follows it (:func:`warm_pairs`). The
figures are those of the median pair, the pair whose ratio is the median (the lower middle one of an
even count; :func:`median_pair`), so a slow minute of a shared machine weighs on both sides of a pair
and the printed times give the printed ratio: ratio = harness / bare, host work = harness - bare. On a
loaded machine (the runs' rule), or where the harness came out faster than the bare loop beyond the noise,
the figures are no measurement and the check says so instead (:meth:`Overhead.unmeasured`).

Given ``budget_s``, the timing loop looks at the clock at every optimizer step and stops the run when
it is spent: the figures are then those of the pairs timed until then, ``cut`` says so.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import lightning as L
import numpy as np
import torch

from lra.config import RunSpec, load
from lra.data import Split
from lra.devices import LoadMeter, sync
from lra.fit import Plan, plan
from lra.interrupts import Interrupted
from lra.loop import wire
from lra.module import warmup_linear_decay
from lra.tools.meter import timed
from lra.tools.meter.step import StepRunner


def synthetic_splits(spec: RunSpec, n_train: int, n_eval: int, seed: int = 0) -> dict[str, Split]:
    """Random splits of the task's shapes (tokens, padded lengths in [n/8, n], labels): what a check
    needs to time a run without the task's data on this machine."""
    m, rng = spec.model, np.random.default_rng(seed)

    def split(n: int) -> Split:
        shape = (n, 2, m.seq_len) if m.dual else (n, m.seq_len)
        lengths = rng.integers(max(1, m.seq_len // 8), m.seq_len + 1, shape[:-1])
        tokens = rng.integers(1, m.vocab_size, shape, dtype=np.int32)
        tokens[np.arange(m.seq_len) >= lengths[..., None]] = 0
        return Split(tokens, lengths, rng.integers(0, m.num_classes, n).astype(np.int64))

    return {"train": split(n_train), "val": split(n_eval), "test": split(n_eval)}


class BareLoop:
    """The loop a researcher would write, as the bench times it (:class:`lra.tools.meter.step.StepRunner`: forward,
    loss, backward, clipping, AdamW), with the run's schedule."""

    def __init__(self, spec: RunSpec, p: Plan, device: torch.device, precision: str, compiled: bool, seed: int):
        self.runner = StepRunner(spec, p.micro_batch, p.accum_steps, precision, str(device), seed, p.accum_steps + 3)
        self.net = torch.compile(self.runner.model) if compiled else self.runner.model
        t, opt = spec.train, self.runner.step.opt
        self.sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear_decay(t.warmup, t.max_steps))
        self.i = 0

    def __call__(self) -> None:
        self.runner(self.net, self.i)
        self.sched.step()
        self.i += 1


class Interleave(L.Callback):
    """Times the Trainer's optimizer steps in blocks and runs a block of the bare loop between them."""

    def __init__(self, block: int, warmup: int, deadline: float | None = None):
        self.block, self.warmup = block, warmup
        self.deadline = deadline  # time.perf_counter() past which the run is stopped (None: never)
        self.cut = False  # stopped at the deadline before its last block
        self.bare: Callable[[], None] | None = None  # one bare optimizer step, set before training starts
        self.device = torch.device("cpu")  # where both loops run (synchronised around each block on CUDA)
        self.harness_s: list[float] = []
        self.bare_s: list[float] = []
        self._t0 = None
        self._step = 0  # optimizer steps done at the last micro-batch seen

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._step:
            return  # inside an optimizer step (accumulating)
        self._step = step
        if step >= self.warmup and not (step - self.warmup) % self.block:
            sync(self.device)
            if self._t0 is not None:
                self.harness_s.append((time.perf_counter() - self._t0) / self.block)
            self.bare_s.append(timed(self._bare_block, self.device) / self.block)
            self._t0 = time.perf_counter()
        if self.deadline is not None and time.perf_counter() >= self.deadline and step < trainer.max_steps:
            self.cut = True  # the block in flight is dropped; the pairs timed so far stand
            trainer.should_stop = True

    def _bare_block(self) -> None:
        for _ in range(self.block):
            self.bare()


TARGET = 1.05  # the harness may cost at most 5% over the bare loop (issue 22)
NOISE = 0.05  # the harness timed faster than the same work without it by more than this: the timing went wrong


@contextlib.contextmanager
def quiet():
    """The timed run's progress bar and Lightning's notes go nowhere (they are still drawn and timed):
    the doctor's console keeps one line per result."""
    levels = {n: logging.getLogger(n).level for n in ("lightning.pytorch", "lightning.fabric")}
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        for n in levels:
            logging.getLogger(n).setLevel(logging.WARNING)
        try:
            yield
        finally:
            for n, level in levels.items():
                logging.getLogger(n).setLevel(level)


def fit_interruptible(w) -> None:
    """``trainer.fit`` where Ctrl-C stays a KeyboardInterrupt: Lightning answers it with its own shutdown,
    ``sys.exit(1)``, and SIGINT ignored from then on. A SIGTERM (:class:`Interrupted`) stays itself."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        w.trainer.fit(w.lit, datamodule=w.dm)
    except Interrupted:
        raise
    except SystemExit:
        if w.trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, handler)


def warm_pairs(harness_s: list[float], bare_s: list[float]) -> list[tuple[float, float]]:
    """(harness block i, bare block i + 1): each harness block with the bare block that runs right after
    it. ``bare_s[0]`` ran before any timed harness block, on a cold bare loop: it is in no pair."""
    return list(zip(harness_s, bare_s[1:]))


def median_pair(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The pair whose harness / bare ratio is the median (the lower middle one of an even count)."""
    ranked = sorted(pairs, key=lambda p: p[0] / p[1])
    return ranked[(len(ranked) - 1) // 2]


def summarize(harness_s: list[float], bare_s: list[float]) -> dict:
    """The figures of :class:`Overhead` from the blocks' times per step (seconds, in the order timed):
    those of the median warm pair, so that ratio = harness_ms / bare_ms and host_ms = their difference."""
    pairs = warm_pairs(harness_s, bare_s)
    h, b = median_pair(pairs) if pairs else (math.nan, math.nan)
    return dict(ratio=h / b, host_ms=(h - b) * 1e3, harness_ms=h * 1e3, bare_ms=b * 1e3, blocks=len(pairs))


@dataclass
class Overhead:
    ratio: float  # harness_ms / bare_ms: the median pair's ratio (NaN: no pair timed)
    host_ms: float  # harness_ms - bare_ms, per optimizer step
    harness_ms: float  # the median pair's harness time per optimizer step
    bare_ms: float  # the median pair's bare-loop time per optimizer step
    blocks: int  # the pairs timed
    block: int
    micro_batch: int
    accum_steps: int
    precision: str
    compiled: bool
    cut: bool = False  # stopped at its time budget before the blocks asked for
    loaded: bool | None = None  # the machine was loaded while it ran (lra.devices.machine_loaded, a run's rule)
    cpu_others: float | None = None  # other processes' share of the machine's CPU time meanwhile

    def as_dict(self) -> dict:
        return asdict(self)

    def unmeasured(self) -> str | None:
        """Why these figures are no measurement (None: they are one): a loaded machine, or a harness faster than
        the same work without it beyond :data:`NOISE`, which cannot be. Such a figure is not printed."""
        if self.loaded:
            share = "" if self.cpu_others is None else f", other processes used {self.cpu_others:.0%} of its CPU time"
            return f"the machine was loaded while it ran (as a run's record judges it{share}): run it on a calm machine"
        if self.ratio < 1 - NOISE:
            return (
                f"the harness timed faster than a bare loop doing the same work, beyond the {NOISE:.0%} noise, "
                "which cannot be: the timings are not to be trusted (another process's bursts?); run it again"
            )
        return None


def measure(
    overrides: list[str],
    *,
    blocks: int = 8,
    block: int = 20,
    warmup: int = 10,
    seed: int = 0,
    workdir: Path | None = None,
    budget_s: float | None = None,
) -> Overhead:
    """The harness against the bare loop for the run ``overrides`` describe (e.g. ``task=listops
    attn=softmax preset=quick``), on random data of the task's shapes.

    Args:
        overrides: Hydra overrides as ``lra.train`` takes them.
        blocks: timed blocks of each loop; block: optimizer steps per block; warmup: untimed first steps.
        workdir: where the timed run writes (checkpoints, metrics.csv); a temporary folder if None.
        budget_s: seconds from the call after which the timing loop stops, the pairs timed so far kept
            (``cut`` True); None: no limit.

    Returns:
        :class:`Overhead` with the medians per optimizer step, their ratio and difference.

    Example:
        >>> o = measure(["task=listops", "attn=softmax", "preset=quick"])  # doctest: +SKIP
        >>> print(f"{o.ratio:.3f} ({o.host_ms:.2f} ms of host work per step)")  # doctest: +SKIP
    """
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    steps = warmup + blocks * block
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        args = [
            *overrides,
            f"train.max_steps={steps}",
            f"train.eval_every={steps + 1}",
            "train.patience=null",
            "fit.cache=false",
            f"seed={seed}",
        ]
        spec = load(args, run_dir=Path(tmp) / "run")
        spec.run_dir.mkdir(parents=True)
        p = plan(spec, use_cache=False)
        # one epoch, as most of a run's steps are, within 256 MiB of int32 tokens (a paper-sized batch rolls over)
        n = min(spec.train.batch_size * (steps + 1), 2**26 // (spec.model.seq_len * (2 if spec.model.dual else 1)))
        n = max(n, spec.train.batch_size)
        splits = synthetic_splits(spec, n, p.micro_batch, seed)
        L.seed_everything(seed, workers=True, verbose=False)
        timer = Interleave(block, warmup, deadline)
        with quiet():
            w = wire(spec, p, splits, key=None, start=None, extra=(timer,))
            timer.device = w.trainer.strategy.root_device  # the harness's device: the bare loop runs there too
            timer.bare = BareLoop(spec, p, timer.device, spec.hardware.precision, spec.hardware.compile, seed)
            meter = LoadMeter(timer.device)
            fit_interruptible(w)
            machine = meter.end()
    return Overhead(
        **summarize(timer.harness_s, timer.bare_s),
        block=block,
        micro_batch=p.micro_batch,
        accum_steps=p.accum_steps,
        precision=spec.hardware.precision,
        compiled=spec.hardware.compile,
        cut=timer.cut,
        loaded=machine["loaded"],
        cpu_others=machine["cpu_others"],
    )
