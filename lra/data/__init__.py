"""Data: readers, generators and the cache of tokenised arrays for the LRA tasks.

raw files -> ``lra.data.load_task`` (tokenised, cached ``Split`` arrays) -> ``LRADataModule``.
Each task module registers its loader (``@register_task``, ``lra/data/registry.py``); importing
them here fills the registry. Where is the ListOps tokenizer? ``lra/data/listops.py``. Text /
Retrieval / Image readers: ``text.py`` (also the byte tokenizer), ``retrieval.py``, ``image.py``;
Pathfinder reader and generator: ``pathfinder.py``, ``pathfinder_gen.py``; searching the data root
and reading the release archive: ``release.py``. The data root is ``$LRA_DATA`` or ``data/``
(layout: ``data/README.md``; formats, keys and numbers: ``docs/data.md``).
"""

from lra.data import image, listops, pathfinder, retrieval, text  # each registers its task
from lra.data.base import DataError, Split
from lra.data.cache import fingerprint
from lra.data.provenance import data_record
from lra.data.registry import available_tasks, load_task, register_task
from lra.files import data_root  # the data root lives with the other paths (lra/files.py); re-exported

__all__ = [
    "DataError",
    "Split",
    "available_tasks",
    "data_record",
    "data_root",
    "fingerprint",
    "load_task",
    "register_task",
]
