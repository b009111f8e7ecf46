"""Task registry: task name -> loader returning ``{"train", "val", "test"} -> Split``.

A loader takes the task config (``conf/task/<name>.yaml``, a dict) and the data root, finds the
data in any supported format, tokenises it through the cache, and raises :class:`DataError`
naming the paths it looked at and the command that prepares them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

from lra.data import listops
from lra.data.base import DataError, Split
from lra.data.cache import cached_splits, source_fingerprint

log = logging.getLogger(__name__)

LOADERS: dict[str, Callable[[dict, Path], dict[str, Split]]] = {}


def register_task(name: str):
    def deco(fn):
        LOADERS[name] = fn
        return fn
    return deco


def available_tasks() -> list[str]:
    return sorted(LOADERS)


def load_task(task_cfg: dict, root: Path) -> dict[str, Split]:
    name = task_cfg["name"]
    if name not in LOADERS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(available_tasks())}")
    return LOADERS[name](dict(task_cfg), Path(root))


def _workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def prepare_listops(cfg: dict, root: Path, progress: bool = True) -> Path:
    """The ListOps folder, generated (seeded, official distribution) if absent and allowed."""
    params = listops.GeneratorParams(**cfg.get("generator", {}))
    folder = listops.find_dir(root, cfg["dirname"])
    if folder is not None:
        stamp = folder / "GENERATED.json"
        if not stamp.exists():
            return folder  # official release files: use as they are
        if json.loads(stamp.read_text()).get("params") == listops.asdict(params):
            return folder
        log.warning("%s was generated with other parameters; regenerating", folder)
    target = root / cfg["dirname"]
    if not cfg.get("generate", True):
        raise DataError(
            f"ListOps data not found: looked for basic_{{train,val,test}}.tsv in {target} (and under "
            f"{root}/lra_release/). Generate it with `make data task=listops`, or point LRA_DATA at a folder "
            f"holding listops-1000/ from the LRA release (lra_release.gz).")
    log.warning("ListOps data not found under %s: generating the official distribution (seed %d, %d/%d/%d) "
                "into %s", root, params.seed, params.n_train, params.n_val, params.n_test, target)
    return listops.write_dataset(target, params, workers=_workers(), progress=progress)


@register_task("listops")
def load_listops(cfg: dict, root: Path) -> dict[str, Split]:
    folder = prepare_listops(cfg, root)
    paths = {s: folder / f"basic_{s}.tsv" for s in listops.SPLITS}
    key = {"task": "listops", "max_length": cfg["max_length"], "seq_len": cfg["seq_len"],
           "vocab": listops.VOCAB, "sources": source_fingerprint(paths.values())}

    def build():
        return {s: listops.tokenize_split(listops.read_tsv(p), p, cfg["max_length"], cfg["seq_len"], _workers())
                for s, p in paths.items()}

    return cached_splits(root, "listops", key, build)
