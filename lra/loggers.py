"""Where a run's metrics go, and what its log says.

* :func:`make_logger`: ``metrics.csv`` always (Lightning's CSVLogger, keeping a resumed run's history:
  ``make tables`` plots its curves), the harness's own record, plus a logger for every ``logger.<name>``
  node that has a ``_target_`` (conf/logger/), built as the user's callbacks are (:mod:`lra.targets`): any
  Lightning logger with its arguments (``+logger.mine._target_=my_pkg.MyLogger``), or one of the harness's
  own, which also take the run (:func:`run_logger`): ``wandb`` (Weights & Biases, offline by default; a
  resumed run continues the same W&B run) and ``tensorboard`` (event files). Several at once compose as a
  Hydra list: ``logger=[wandb,tensorboard]``; ``logger=csv`` (an empty node) adds nothing to metrics.csv.
  Returns the Lightning loggers (CSV first: ``trainer.log_dir`` is the run folder) and the callbacks they
  need (W&B's tables wherever a WandbLogger is among them).
* :class:`StepsTaken`: the harness's own loggers (metrics.csv, ``tensorboard``, ``wandb``) count a row's step
  as the run's log and record do, the optimizer steps taken when it was logged (the validation after step 50
  is step 50), where Lightning hands a logger its 0-based logging step while training (49).
* :class:`EvalLog`: one line per validation in the run's log (``train.log``), what a batch-job user tails.
* :func:`quiet_lightning`: silences Lightning's advertising tips, its checkpoint-load lines that repeat
  the harness's own, and a torch deprecation warning Lightning triggers on every run, and nothing else.
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import os
import secrets
import string
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import lightning as L
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from lra import compat
from lra.config import ConfigError, RunSpec
from lra.data.base import hms
from lra.files import write_text
from lra.targets import instantiate, locate
from lra.wandb_extras import WandbTables

log = logging.getLogger("lra.eval")

LOGGER_BASE = "lightning.pytorch.loggers.Logger"
WANDB_ID_FILE = Path("wandb") / "run-id"  # in the run folder: a resumed run continues this W&B run


class Logging(NamedTuple):
    loggers: list[Logger]  # Trainer(logger=...); CSVLogger first
    callbacks: list[L.Callback]  # Trainer(callbacks=...) besides the protocol's: StepsTakenStage, EvalLog, W&B tables


class StepsTaken:
    """A Lightning logger whose rows say the optimizer steps taken when they were logged, as the run's log
    (``eval step 50/600``), its record (``steps``, ``steps_to_best``) and the tables count them.

    While fitting, Lightning passes a logger the number of optimizer steps done *before* the one just
    taken (its ``_batches_that_stepped``: the validation after step 50 comes as step 49, a training row
    of step 50 as 49, LearningRateMonitor's row of the rate step 50 uses as 49, with or without gradient
    accumulation, and on after a resume); such rows are written at ``step + 1``. Outside fitting (the test
    after training) Lightning passes the steps done already: written as given (the test row of a
    600-step run is at 600, the record's ``steps``). :class:`StepsTakenStage` tells it which (a mixin:
    first among the bases, before the Lightning logger class)."""

    fitting = False  # set by StepsTakenStage at every trainer.fit / validate / test

    @rank_zero_only
    def log_metrics(self, metrics, step: int | None = None) -> None:
        super().log_metrics(metrics, step + 1 if self.fitting and step is not None else step)


class StepsTakenStage(L.Callback):
    """Tells the trainer's :class:`StepsTaken` loggers whether it is fitting (``setup`` of each stage)."""

    def setup(self, trainer, pl_module, stage) -> None:
        for lg in trainer.loggers:
            if isinstance(lg, StepsTaken):
                lg.fitting = stage == "fit"  # TrainerFn.FITTING, a str enum


class StepCSVLogger(StepsTaken, CSVLogger):
    """Lightning's CSVLogger counting optimizer steps taken (:class:`StepsTaken`): ``metrics.csv``."""


class StepTensorBoardLogger(StepsTaken, TensorBoardLogger):
    """Lightning's TensorBoardLogger counting optimizer steps taken (:class:`StepsTaken`)."""


class StepWandbLogger(StepsTaken, WandbLogger):
    """Lightning's WandbLogger counting optimizer steps taken (:class:`StepsTaken`): its ``trainer/global_step``
    is then the trainer's ``global_step``, the step of the ``val_history`` table (lra/wandb_extras.py)."""


class Run(NamedTuple):
    """What the harness's own loggers take besides their node's arguments: the run they log."""

    spec: RunSpec
    run_dir: Path
    resume_from: int | None  # the step a resumed run continues from; None: a fresh run


def run_logger(extra: str, available: Callable[[], bool]):
    """Marks a factory of the harness's own loggers ``fn(run: Run, **node arguments) -> Logger``: a
    ``logger.<name>._target_`` may name it; ``extra`` is the pip extra named when ``available()`` is False."""

    def mark(fn):
        fn.takes_run, fn.extra, fn.available = True, extra, available
        return fn

    return mark


def make_logger(spec: RunSpec, run_dir: Path, resume_from: int | None = None) -> Logging:
    """The run's loggers (CSV first) and their callbacks; ``resume_from``: the step a resumed run continues."""
    quiet_lightning()
    check_loggers(spec.logger)
    loggers: list[Logger] = [csv_logger(run_dir, resume_from)]
    run = Run(spec, run_dir, resume_from)
    for name, node in spec.logger.items():
        if node:  # logger=csv: an empty node, metrics.csv alone
            late = {"run": run} if getattr(_target(name, node), "takes_run", False) else {}
            loggers.append(instantiate(f"logger.{name}", node, **late))
    callbacks: list[L.Callback] = [StepsTakenStage(), EvalLog(spec.train.max_steps)]
    if any(isinstance(lg, WandbLogger) for lg in loggers):
        callbacks.append(WandbTables())
    return Logging(loggers, callbacks)


def _target(name: str, node: dict):
    """The Logger class, or the harness's logger factory, ``logger.<name>._target_`` names (one line otherwise)."""
    obj = locate(f"logger.{name}", node["_target_"], "a Lightning logger")
    if not (getattr(obj, "takes_run", False) or (isinstance(obj, type) and issubclass(obj, Logger))):
        raise ConfigError(
            f"logger.{name}._target_={node['_target_']!r} is not a Lightning logger: give a subclass of {LOGGER_BASE}"
        )
    return obj


def check_loggers(nodes: dict) -> None:
    """One line, before any work, if a logger's ``_target_`` cannot be imported or is no logger, or the
    package one of the harness's own loggers needs is not installed."""
    targets = [_target(name, node) for name, node in nodes.items() if node]
    missing = [t.extra for t in targets if getattr(t, "takes_run", False) and not t.available()]
    if missing:
        raise ConfigError(
            f"logger={','.join(missing)} needs the package{'s' * (len(missing) > 1)} "
            f"{' and '.join(missing)}: pip install 'lra-harness[{','.join(missing)}]'"
        )


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def csv_logger(run_dir: Path, resume_from: int | None) -> StepCSVLogger:
    """Lightning's CSVLogger counting optimizer steps taken (:class:`StepsTaken`), keeping the history of a
    resumed run.

    Its writer deletes an existing metrics.csv when it starts; a resumed run keeps the rows logged up to
    the optimizer step it resumes from, so curves cover the whole run and each row is there once: rows
    after ``resume_from`` come from the steps that are trained (and logged) again.
    """
    path = run_dir / "metrics.csv"
    old, keys = [], []
    if resume_from is not None and path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            old = [r for r in reader if r.get("step", "") == "" or int(float(r["step"])) <= resume_from]
    # flush at every logging call: a killed run keeps its history up to its last checkpoint
    logger = StepCSVLogger(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=1)
    with warnings.catch_warnings():  # the run folder already holds result.json: nothing of ours is deleted
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        writer = logger.experiment
    if old:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(old)
        writer.metrics_keys = keys
    return logger


@run_logger("wandb", lambda: _importable("wandb"))
def wandb_logger(
    run: Run, project: str | None = None, mode: str | None = "offline", group=None, tags=(), **kwargs
) -> WandbLogger:
    """W&B under <run folder>/wandb/, steps counted as taken (:class:`StepsTaken`); a resumed run continues the
    W&B run whose id the folder keeps. ``kwargs``: any other argument of WandbLogger (``logger.wandb.entity=...``)."""
    spec = run.spec
    mode = str(mode or "offline")
    os.environ.setdefault("WANDB_MODE", mode)
    args = dict(
        project=project,
        save_dir=str(run.run_dir),
        group=group,
        tags=list(tags or []),
        name=f"{spec.task}-{spec.attn.label}-s{spec.seed}",
        config=spec.config,
        mode=mode,
        id=wandb_run_id(run.run_dir, run.resume_from),
        resume="allow",
    )
    wl = StepWandbLogger(**{**args, **kwargs})
    if "anonymous" not in kwargs:
        # Lightning hands wandb.init anonymous=None when nobody set it, and W&B warns on every run that the
        # setting will be removed: pass it only when the user sets it (+logger.wandb.anonymous=...)
        getattr(wl, "_wandb_init", {}).pop("anonymous", None)
    return wl


def wandb_run_id(run_dir: Path, resume_from: int | None) -> str:
    """The W&B run id of this run folder: the stored one when resuming, else a new one (stored)."""
    path = run_dir / WANDB_ID_FILE
    if resume_from is not None and path.exists():
        old = path.read_text().strip()
        if old:
            return old
    # W&B's own id alphabet; written before W&B starts so a run killed at any point resumes into it
    new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if getattr(rank_zero_only, "rank", 0) == 0:
        write_text(path, new + "\n")
    return new


@run_logger("tensorboard", lambda: compat.tensorboard_available())
def tensorboard_logger(run: Run, **kwargs) -> TensorBoardLogger:
    """Event files in <run folder>/tensorboard/, steps counted as taken (:class:`StepsTaken`). A resumed run
    logs again the steps after its checkpoint (``resume_from + 1`` and later, see csv_logger): ``purge_step``
    hides the earlier copies of those steps, as csv_logger drops their rows. ``kwargs``: any other argument
    of TensorBoardLogger."""
    purge = {} if run.resume_from is None else {"purge_step": run.resume_from + 1}
    args = dict(save_dir=str(run.run_dir), name="tensorboard", version="", default_hp_metric=False, **purge)
    return StepTensorBoardLogger(**{**args, **kwargs})


# ---------------------------------------------------------------------------------------------
# The run's log


class EvalLog(L.Callback):
    """After every validation, one line: step/max_steps, val loss and accuracy, the best accuracy so far,
    elapsed time and the ETA to max_steps. Best and elapsed survive a restart (checkpointed state)."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.best_acc: float | None = None
        self.best_step: int | None = None
        self.elapsed_before = 0.0  # wall time of earlier stretches of a resumed run
        self._t0 = self._step0 = None

    def on_train_start(self, trainer, pl_module):
        self._t0, self._step0 = time.monotonic(), trainer.global_step

    def elapsed(self) -> float:
        return self.elapsed_before + (time.monotonic() - self._t0 if self._t0 is not None else 0.0)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero or self._t0 is None:
            return
        m, step = trainer.callback_metrics, int(trainer.global_step)
        loss, acc = _float(m.get("val/loss")), _float(m.get("val/acc"))
        if acc is not None and (self.best_acc is None or acc > self.best_acc):
            self.best_acc, self.best_step = acc, step
        done, spent = step - self._step0, time.monotonic() - self._t0
        eta = spent / done * (self.max_steps - step) if done > 0 else None
        best = "n/a" if self.best_acc is None else f"{self.best_acc:.4f} at step {self.best_step}"
        log.info(
            "eval step %d/%d (%.0f%%): val loss %s, val acc %s (best %s), elapsed %s, ETA %s",
            step,
            self.max_steps,
            100.0 * step / max(self.max_steps, 1),
            _fmt(loss),
            _fmt(acc),
            best,
            hms(self.elapsed()),
            hms(eta),
        )

    def state_dict(self):
        return {"best_acc": self.best_acc, "best_step": self.best_step, "elapsed_s": self.elapsed()}

    def load_state_dict(self, state):
        self.best_acc, self.best_step = state.get("best_acc"), state.get("best_step")
        self.elapsed_before = float(state.get("elapsed_s") or 0.0)


def _float(x) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


# ---------------------------------------------------------------------------------------------
# Noise


# Lightning's lines that say nothing a reader needs: its advertisements ("💡 Tip: ... try installing [litlogger]"),
# and the announcement before each checkpoint load plus its "Restored all states" after a resume, which repeat
# the harness's own "resuming from <last.ckpt>" line; the test checkpoint's "Loaded model weights" line stays.
_DROPPED = ("💡 Tip:", "Restoring states from the checkpoint path at", "Restored all states from the checkpoint at")


class _DropTips(logging.Filter):
    """Lightning's advertisements and repeated checkpoint-load lines (``_DROPPED``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_DROPPED)


_TIP_FILTER = _DropTips()
# where Lightning's rank_zero_info logs (lightning_utilities' module logger, re-pointed by fabric, then pytorch)
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning_utilities.core.rank_zero",
)


def quiet_lightning() -> None:
    """Silence exactly the lines every run printed and no reader needs: Lightning's tips and repeated
    checkpoint-load lines (``_DROPPED``), and torch's
    ``isinstance(treespec, LeafSpec)`` FutureWarning raised from Lightning's own code. Idempotent."""
    for name in _RANK_ZERO_LOGGERS:
        lg = logging.getLogger(name)
        if _TIP_FILTER not in lg.filters:
            lg.addFilter(_TIP_FILTER)
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
