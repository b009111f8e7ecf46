"""Data: readers, generators and the cache of tokenised arrays for the LRA tasks.

raw files -> ``lra.data.tasks.load_task`` (tokenised, cached ``Split`` arrays) -> ``LRADataModule``.
Where is the ListOps tokenizer? ``lra/data/listops.py``. Text / Retrieval / Image readers:
``text.py`` (also the byte tokenizer), ``retrieval.py``, ``image.py``; Pathfinder reader and generator:
``pathfinder.py``, ``pathfinder_gen.py``; searching the data root and reading the release archive:
``release.py``. The data root is ``$LRA_DATA`` or ``data/`` (layout: ``data/README.md``; formats,
keys and numbers: ``docs/data.md``).
"""

from lra.data.base import DataError, Split, data_root
from lra.data.tasks import available_tasks, load_task, register_task

__all__ = ["DataError", "Split", "available_tasks", "data_root", "load_task", "register_task"]
