"""A callback a user would write (tests/test_callbacks_config.py gives it to a run through ``callbacks=``)."""

import json
from pathlib import Path

from lightning.pytorch.callbacks import Callback


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
