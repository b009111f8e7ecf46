"""The training loop of a run, wired: the module, the protocol's callbacks, the user's callbacks
(``callbacks=``), the loggers, the Trainer and the data, exactly as ``lra.train`` trains them
(``lra.tools.doctor`` times this same loop against a bare one)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, NamedTuple

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler

from lra.config import RunSpec
from lra.data import Split
from lra.data.module import LRADataModule
from lra.fit import Plan
from lra.loggers import make_logger
from lra.module import LitLRA
from lra.protocol import Callbacks, callbacks, measured
from lra.targets import instantiate, target_class

CALLBACK_BASE = "lightning.pytorch.callbacks.Callback"
log = logging.getLogger("lra.train")  # the run's own messages, under one name
PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}  # debug.profiler


class Wired(NamedTuple):
    """What one run trains with."""

    lit: LitLRA
    cb: Callbacks
    trainer: L.Trainer
    dm: LRADataModule


def wire(
    spec: RunSpec,
    p: Plan,
    splits: dict[str, Split],
    key: str | None,
    start: int | None,
    extra: tuple = (),
    progress: Callable[[dict], None] | None = None,
) -> Wired:
    """The module, callbacks, loggers, Trainer and data of a run, as ``lra.train.run`` trains them.

    Args:
        spec: the resolved run (its ``run_dir`` receives checkpoints and metrics.csv).
        p: the micro-batch and accumulation (:func:`lra.fit.plan`).
        splits: the task's ``train``/``val``/``test`` splits.
        key: the resume key written into checkpoints; ``start``: the step a resume continues from.
        extra: more callbacks, run after the protocol's own and the user's (``lra.tools.doctor`` times the loop
            with one).
        progress: given the record's progress fields at every checkpoint (:class:`RecordProgress`; ``lra.train``
            writes the record with them).

    Example:
        >>> w = wire(spec, plan(spec), splits, key=None, start=None)  # doctest: +SKIP
        >>> w.trainer.fit(w.lit, datamodule=w.dm)  # doctest: +SKIP
    """
    lit = LitLRA(
        spec.model,
        spec.train,
        resume_key=key,
        compile=spec.hardware.compile,
        compile_fallback=not spec.hardware.compile_forced,
    )
    logs = make_logger(spec, spec.run_dir, start)  # metrics.csv, logger=[...], their callbacks (EvalLog, W&B)
    cb = callbacks(
        spec, splits["val"], spec.run_dir / "checkpoints", extra=logs.callbacks + user_callbacks(spec) + list(extra)
    )
    if progress is not None:
        cb.all.append(RecordProgress(spec, cb, p.effective_batch, progress))
    trainer = make_trainer(spec, p, cb, logs.loggers)
    if spec.debug and spec.debug.overfit_batches:  # debug=overfit: the same batch every step
        splits = overfit_splits(splits, spec.debug.overfit_batches * p.micro_batch * p.accum_steps)
    dm = LRADataModule(
        splits,
        batch_size=p.micro_batch,
        eval_batch_size=spec.train.eval_batch_size or p.micro_batch,
        seed=spec.seed,
        num_workers=spec.hardware.num_workers,
        pin_memory=spec.hardware.pin_memory,
    )
    return Wired(lit, cb, trainer, dm)


class RecordProgress(Callback):
    """Hands the run's progress (steps, training time, best validation so far: :func:`lra.protocol.measured`) to
    ``write`` at every checkpoint (``last.ckpt`` after each evaluation and every ``train.ckpt_every_steps``,
    ``best.ckpt``), so the record on disk keeps up with the checkpoints: a run killed where nothing can write
    (SIGKILL, a lost node) leaves a record of how far it got, not the one written before it trained. At a
    checkpoint, not at ``on_validation_end``: Lightning runs checkpoint callbacks last, so only then is the
    evaluation's best selected."""

    def __init__(self, spec: RunSpec, cb: Callbacks, effective_batch: int, write: Callable[[dict], None]):
        self.spec, self.cb, self.effective_batch, self.write = spec, cb, effective_batch, write

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        fields = measured(self.spec, trainer, self.cb, self.effective_batch)
        for when_it_ends in ("steps_at_stop", "stuck_at_end"):  # said when the fit ends
            del fields[when_it_ends]
        self.write(fields)


def make_trainer(spec: RunSpec, p: Plan, cb: Callbacks, logger) -> L.Trainer:
    """The Trainer of a run: optimizer steps, evaluation every ``eval_every`` of them, accumulation."""
    hw, tr = spec.hardware, spec.train
    trainer = L.Trainer(
        default_root_dir=spec.run_dir,
        max_steps=tr.max_steps,
        max_epochs=-1,
        val_check_interval=tr.eval_every * p.accum_steps,
        check_val_every_n_epoch=None,
        accumulate_grad_batches=p.accum_steps,
        accelerator=hw.accelerator,
        devices=hw.devices_arg,
        strategy=hw.strategy,
        precision=hw.precision,
        logger=logger,
        callbacks=cb.all,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=spec.log_every,  # trainer.log_every_n_steps, or scaled to the run
        deterministic=hw.deterministic,
        use_distributed_sampler=False,
        **debug_trainer_args(spec),
    )  # LRADataModule shards by rank itself
    if trainer.world_size != p.devices:
        log.warning("planned for %d devices, the trainer has %d", p.devices, trainer.world_size)
    return trainer


def debug_trainer_args(spec: RunSpec) -> dict:
    """The Trainer's arguments for ``debug=<name>`` (lra.config.DebugSpec): evaluation and test on a few batches,
    a profiler writing its report into the run folder (named in the log); {} for a run that is no debug run."""
    d = spec.debug
    if d is None:
        return {}
    out: dict = {}
    if d.limit_batches is not None:
        out.update(limit_val_batches=d.limit_batches, limit_test_batches=d.limit_batches)
    if d.profiler is not None:
        out["profiler"] = PROFILERS[d.profiler](dirpath=spec.run_dir, filename="profile")
        files = ", ".join(str(spec.run_dir / f) for f in d.profile_files)
        log.info("debug=%s: the %s profiler writes its report to %s", d.name, d.profiler, files)
    log.info("debug=%s: a check, not a result: %d steps, never in a table", d.name, spec.train.max_steps)
    return out


def overfit_splits(splits: dict[str, Split], n: int) -> dict[str, Split]:
    """``splits`` with the training split cut to its first ``n`` examples (debug=overfit: one batch, every step)."""
    train = splits["train"]
    n = min(n, len(train))
    cut = dataclasses.replace(train, tokens=train.tokens[:n], lengths=train.lengths[:n], labels=train.labels[:n])
    return {**splits, "train": cut}


def _callback_class(name: str, target: str) -> type:
    return target_class(f"callbacks.{name}", target, Callback, "a Lightning callback", CALLBACK_BASE)


def check_callbacks(spec: RunSpec) -> None:
    """Every ``callbacks.<name>._target_`` is an importable Lightning callback (one line otherwise): checked
    before the run's folder exists; the arguments are checked when they are given to the class."""
    for name, node in spec.callbacks.items():
        _callback_class(name, node["_target_"])


def user_callbacks(spec: RunSpec) -> list[Callback]:
    """The user's callbacks (``callbacks=lr_monitor``, ``+callbacks.<name>._target_=...``), instantiated with
    their arguments, after the protocol's own, which are always on.

    Example:
        ``python -m lra.train ... +callbacks.mine._target_=my_pkg.MyCallback +callbacks.mine.every=10``
        runs ``my_pkg.MyCallback(every=10)`` with the protocol's callbacks.
    """
    out = []
    for name, node in spec.callbacks.items():
        _callback_class(name, node["_target_"])
        out.append(instantiate(f"callbacks.{name}", node))
    return out
