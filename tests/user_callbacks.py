"""A callback and a logger a user would write (tests/test_callbacks_config.py gives the callback to a run through
``callbacks=``, tests/test_loggers.py the logger through ``logger=``)."""

import json
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger


class StepCounter(Callback):
    """Counts the optimizer steps and validations it sees; writes them, with its argument, when training ends."""

    def __init__(self, out: str, label: str = "none"):
        self.out, self.label = Path(out), label
        self.steps, self.validations, self._last = 0, 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > self._last:  # an optimizer step ended (accumulation: several batches per step)
            self._last = trainer.global_step
            self.steps += 1

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validations += 1

    def on_train_end(self, trainer, pl_module):
        self.out.write_text(
            json.dumps(
                {
                    "label": self.label,
                    "steps": self.steps,
                    "validations": self.validations,
                    "global_step": trainer.global_step,
                }
            )
        )

    def record_fields(self) -> dict:
        return {"user_callback_steps": self.steps}


class MetricsRecorder(Logger):
    """A logger a user would write (tests/test_loggers.py gives it to a run through ``+logger.<name>._target_``):
    keeps every metrics row it receives and writes them, with its argument, whenever Lightning finalizes it."""

    def __init__(self, out: str, label: str = "none"):
        super().__init__()
        self.out, self.label, self.rows = Path(out), label, []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.rows.append({"step": step, **{k: float(v) for k, v in metrics.items()}})

    def finalize(self, status: str) -> None:
        self.out.write_text(json.dumps({"label": self.label, "status": status, "rows": self.rows}))
