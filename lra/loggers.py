"""Where a run's metrics go: ``metrics.csv`` (Lightning's CSVLogger, keeping a resumed run's history)
or Weights & Biases (``logger=wandb``, offline by default; lra/wandb_extras.py adds the record)."""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, WandbLogger

from lra.config import RunSpec


def csv_logger(run_dir: Path, resume_from: int | None) -> CSVLogger:
    """Lightning's CSVLogger, keeping the history of a resumed run.

    Its writer deletes an existing metrics.csv when it starts; a resumed run keeps the rows up to the
    step it resumes from (later rows are logged again) so curves cover the whole run.
    """
    path = run_dir / "metrics.csv"
    old, keys = [], []
    if resume_from is not None and path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            old = [r for r in reader if r.get("step", "") == "" or int(float(r["step"])) <= resume_from]
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


def make_logger(spec: RunSpec, run_dir: Path, resume_from: int | None = None):
    lg = spec.logger
    if lg["name"] == "wandb":
        os.environ.setdefault("WANDB_MODE", str(lg["mode"]))
        return WandbLogger(project=lg["project"], save_dir=str(run_dir), group=lg.get("group"),
                           tags=list(lg.get("tags") or []), name=f"{spec.task}-{spec.attn.label}-s{spec.seed}",
                           config=spec.config, mode=str(lg["mode"]))
    return csv_logger(run_dir, resume_from)
