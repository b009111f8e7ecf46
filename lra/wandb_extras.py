"""Weights & Biases extras for ``logger=wandb``: the run record and tables next to Lightning's metrics.

Lightning's ``WandbLogger`` (built in lra/loggers.py from conf/logger/wandb.yaml) already logs the
resolved config and every metric. This module adds what a reader of the papers' tables wants:

* :class:`WandbTables`: a Lightning callback; at the end of training it logs ``val_history``, a table
  of (step, validation accuracy, validation loss) of every evaluation;
* :func:`log_record`: after ``result.json`` is written, puts its numbers in the run summary, logs it
  as a ``run_record`` table and attaches the file itself as an artifact (type ``run-record``).

A sweep's own ``jobs`` table is the sweep's (lra/tools/sweep/wandb_table.py).

Offline unless ``WANDB_MODE=online``: runs are written under the run folder (``wandb/``) and
``wandb sync`` uploads them later. Nothing here raises into training: a W&B problem is logged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from lra.record import Record

log = logging.getLogger("lra.wandb")


def _run(target):
    """The wandb Run behind ``target``: a run, a Lightning WandbLogger, or a list of Lightning loggers
    (``trainer.loggers``: the W&B one among them; None if there is none)."""
    if isinstance(target, (list, tuple)):
        target = next((lg for lg in target if isinstance(lg, WandbLogger)), None)
    return getattr(target, "experiment", target)


class WandbTables(L.Callback):
    """Collect every validation's accuracy and loss; log them as the ``val_history`` table at the end.
    The rows are checkpointed state: a resumed run's table holds the evaluations before the restart."""

    def __init__(self):
        self.rows: list[list] = []

    def state_dict(self):
        return {"rows": self.rows}

    def load_state_dict(self, state):
        self.rows = [list(r) for r in state.get("rows", [])]

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        m = trainer.callback_metrics
        self.rows.append([int(trainer.global_step), _float(m.get("val/acc")), _float(m.get("val/loss"))])

    def on_train_end(self, trainer, pl_module):
        run = _run(trainer.loggers)
        if not trainer.is_global_zero or run is None or not self.rows:
            return
        try:
            import wandb

            run.log({"val_history": wandb.Table(columns=["step", "val/acc", "val/loss"], data=self.rows)})
        except Exception as e:  # never break training for a dashboard
            log.warning("could not log val_history to W&B: %s", e)


def _float(x):
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def log_record(target, record: dict, run_dir: Path | str | None = None) -> None:
    """Summary fields, a ``run_record`` table (key, value) and result.json as an artifact.
    ``target``: a W&B run, a WandbLogger, or ``trainer.loggers`` (nothing happens without W&B among them)."""
    try:
        import wandb

        run = _run(target)
        if run is None:
            return
        run.summary.update({f"record/{k}": record.get(k) for k in Record.fields_in("summary") if k in record})
        rows = [
            [k, v if isinstance(v, str) else json.dumps(v, default=str)]
            for k, v in sorted(record.items())
            if k != "config"
        ]  # the config is W&B's run config
        run.log({"run_record": wandb.Table(columns=["key", "value"], data=rows)})
        path = Path(run_dir) / "result.json" if run_dir is not None else None
        if path is not None and path.exists():
            art = wandb.Artifact(
                name=_artifact_name(record),
                type="run-record",
                metadata={k: record.get(k) for k in Record.fields_in("artifact")},
            )
            art.add_file(str(path))
            run.log_artifact(art)
    except Exception as e:
        log.warning("could not log the run record to W&B: %s", e)


def _artifact_name(record: dict) -> str:
    parts = [str(record.get(k, "")) for k in ("preset", "task", "attn")] + [f"seed{record.get('seed')}"]
    return "record-" + "-".join(p for p in parts if p).replace("/", "_")
