"""Data: readers, generators and the cache of tokenised arrays for the LRA tasks.

raw files -> ``lra.data.tasks.load_task`` (tokenised, cached ``Split`` arrays) -> ``LRADataModule``.
Where is the ListOps tokenizer? ``lra/data/listops.py``. The data root is ``$LRA_DATA`` or ``data/``.
"""

from lra.data.base import DataError, Split, data_root
from lra.data.tasks import available_tasks, load_task, register_task

__all__ = ["DataError", "Split", "available_tasks", "data_root", "load_task", "register_task"]
