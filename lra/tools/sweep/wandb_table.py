"""A sweep's end in Weights & Biases: one run of job type ``sweep`` in the sweep's group with a ``jobs`` table of
its manifest (task, attention, seed, status, accuracies, steps, time). Each run's own record is the run's
(lra/wandb_extras.py); offline unless ``WANDB_MODE=online``, as there."""

from __future__ import annotations

import json
import os
from pathlib import Path

JOB_COLUMNS = (
    "task",
    "attn",
    "seed",
    "status",
    "test_acc",
    "best_val_acc",
    "steps",
    "train_time_s",
    "attempts",
    "run_dir",
    "reason",
)


def _cell(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def log_sweep_table(manifest: dict | None, folder: Path | str) -> None:
    """One ``sweep`` run in the sweep's W&B group with the manifest's jobs as a table."""
    if not manifest:
        return
    import wandb

    group = os.environ.get("WANDB_RUN_GROUP") or manifest.get("grid")
    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "lra-harness"),
        group=group,
        job_type="sweep",
        name=f"sweep-{manifest.get('grid')}",
        dir=str(folder),
        mode=os.environ.get("WANDB_MODE", "offline"),
        config={"grid": manifest.get("grid"), "command": manifest.get("command")},
    )
    try:
        rows = [[_cell(j.get(c)) for c in JOB_COLUMNS] for j in manifest.get("jobs", [])]
        run.log({"jobs": wandb.Table(columns=list(JOB_COLUMNS), data=rows)})
        run.summary.update({f"jobs/{k}": v for k, v in (manifest.get("counts") or {}).items()})
    finally:
        run.finish()
