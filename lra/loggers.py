"""Where a run's metrics go, and what its log says.

* :func:`make_logger`: ``metrics.csv`` always (Lightning's CSVLogger, keeping a resumed run's history:
  ``make tables`` plots its curves), plus the loggers ``logger=`` names: ``wandb`` (Weights & Biases,
  offline by default; a resumed run continues the same W&B run) and ``tensorboard`` (event files).
  Several at once compose as a Hydra list: ``logger=[wandb,tensorboard]``. Returns the Lightning
  loggers (CSV first: ``trainer.log_dir`` is the run folder) and the callbacks they need.
* :class:`EvalLog`: one line per validation in the run's log (``train.log``), what a batch-job user tails.
* :func:`quiet_lightning`: silences Lightning's advertising tips and a torch deprecation warning
  Lightning triggers on every run, and nothing else.
"""

from __future__ import annotations

import csv
import datetime
import importlib.util
import logging
import os
import secrets
import string
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import lightning as L
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from lra import compat
from lra.config import ConfigError, RunSpec
from lra.files import write_text
from lra.wandb_extras import WandbTables

log = logging.getLogger("lra.eval")

LOGGERS = ("csv", "wandb", "tensorboard")
WANDB_ID_FILE = Path("wandb") / "run-id"  # in the run folder: a resumed run continues this W&B run


class Logging(NamedTuple):
    loggers: list[Logger]  # Trainer(logger=...); CSVLogger first
    callbacks: list[L.Callback]  # Trainer(callbacks=...) besides the protocol's: EvalLog, W&B tables


def make_logger(spec: RunSpec, run_dir: Path, resume_from: int | None = None) -> Logging:
    """The run's loggers (CSV first) and their callbacks; ``resume_from``: the step a resumed run continues."""
    quiet_lightning()
    check_loggers(spec.logger)
    loggers: list[Logger] = [csv_logger(run_dir, resume_from)]
    callbacks: list[L.Callback] = [EvalLog(spec.train.max_steps)]
    if "wandb" in spec.logger:
        loggers.append(wandb_logger(spec, run_dir, resume_from))
        callbacks.append(WandbTables())
    if "tensorboard" in spec.logger:
        loggers.append(tensorboard_logger(run_dir, resume_from))
    return Logging(loggers, callbacks)


def check_loggers(names) -> None:
    """One line, before any work, if a named logger is unknown or its package is not installed."""
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ConfigError(
            f"logger={','.join(unknown)} is not allowed: one of {', '.join(LOGGERS)}, or a list of "
            f"them such as logger=[wandb,tensorboard]"
        )
    installed = {"wandb": _importable("wandb"), "tensorboard": compat.tensorboard_available()}
    missing = [n for n in names if not installed.get(n, True)]
    if missing:
        raise ConfigError(
            f"logger={','.join(missing)} needs the package{'s' * (len(missing) > 1)} "
            f"{' and '.join(missing)}: pip install 'lra-harness[{','.join(missing)}]'"
        )


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def csv_logger(run_dir: Path, resume_from: int | None) -> CSVLogger:
    """Lightning's CSVLogger, keeping the history of a resumed run.

    Its writer deletes an existing metrics.csv when it starts; a resumed run keeps the rows logged
    before the optimizer step it resumes from, so curves cover the whole run and each row is there once.
    A row's ``step`` is Lightning's logging step, one less than the optimizer steps done when it was
    logged: rows at ``resume_from`` and later come from the steps that are trained (and logged) again.
    """
    path = run_dir / "metrics.csv"
    old, keys = [], []
    if resume_from is not None and path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            old = [r for r in reader if r.get("step", "") == "" or int(float(r["step"])) < resume_from]
    # flush at every logging call: a killed run keeps its history up to its last checkpoint
    logger = CSVLogger(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=1)
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


def wandb_logger(spec: RunSpec, run_dir: Path, resume_from: int | None) -> WandbLogger:
    """W&B under <run folder>/wandb/; a resumed run continues the W&B run whose id the folder keeps."""
    lg = spec.logger["wandb"]
    mode = str(lg.get("mode") or "offline")
    os.environ.setdefault("WANDB_MODE", mode)
    run_id = wandb_run_id(run_dir, resume_from)
    return WandbLogger(
        project=lg.get("project"),
        save_dir=str(run_dir),
        group=lg.get("group"),
        tags=list(lg.get("tags") or []),
        name=f"{spec.task}-{spec.attn.label}-s{spec.seed}",
        config=spec.config,
        mode=mode,
        id=run_id,
        resume="allow",
    )


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


def tensorboard_logger(run_dir: Path, resume_from: int | None) -> TensorBoardLogger:
    """Event files in <run folder>/tensorboard/. A resumed run logs again the steps after its checkpoint
    (logging steps ``resume_from`` and later, see csv_logger): ``purge_step`` hides the earlier copies
    of those steps, as csv_logger drops their rows."""
    purge = {} if resume_from is None else {"purge_step": resume_from}
    return TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False, **purge)


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
            _hms(self.elapsed()),
            _hms(eta),
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


def _hms(seconds: float | None) -> str:
    return "n/a" if seconds is None else str(datetime.timedelta(seconds=round(seconds)))


# ---------------------------------------------------------------------------------------------
# Noise


class _DropTips(logging.Filter):
    """Lightning's "💡 Tip: ... try installing [litlogger] / [litmodels]" advertisements."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


_TIP_FILTER = _DropTips()
# where Lightning's rank_zero_info logs (lightning_utilities' module logger, re-pointed by fabric, then pytorch)
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning_utilities.core.rank_zero",
)


def quiet_lightning() -> None:
    """Silence exactly the lines every run printed and no reader needs: Lightning's tips, and torch's
    ``isinstance(treespec, LeafSpec)`` FutureWarning raised from Lightning's own code. Idempotent."""
    for name in _RANK_ZERO_LOGGERS:
        lg = logging.getLogger(name)
        if _TIP_FILTER not in lg.filters:
            lg.addFilter(_TIP_FILTER)
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
