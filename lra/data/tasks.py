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

import numpy as np

from lra.data import image, listops, pathfinder, retrieval, text
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
    splits = limit_examples(LOADERS[name](dict(task_cfg), Path(root)), task_cfg.get("max_examples"))
    return {k: splits[k] for k in ("train", "val", "test") if k in splits}


def limit_examples(splits: dict[str, Split], limits: dict | None, seed: int = 0) -> dict[str, Split]:
    """``task.max_examples`` (e.g. ``{val: 1000, test: 2000}``): a seeded subset of those splits, in
    their order (the quick preset evaluates on subsets; the papers' presets leave it null)."""
    if not limits:
        return splits
    out = dict(splits)
    for name, n in dict(limits).items():
        if name not in splits:
            raise ValueError(f"task.max_examples: unknown split {name!r} (train, val, test)")
        s = splits[name]
        if n is None or int(n) >= len(s):
            continue
        idx = np.sort(np.random.default_rng([seed, len(s)]).choice(len(s), size=int(n), replace=False))
        out[name] = Split(np.asarray(s.tokens[idx]), np.asarray(s.lengths[idx]), np.asarray(s.labels[idx]))
        log.info("%s: using %d of %d examples (task.max_examples)", name, int(n), len(s))
    return out


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


@register_task("text")
def load_text(cfg: dict, root: Path) -> dict[str, Split]:
    """IMDB reviews at byte level (lra/data/text.py)."""
    return text.load(cfg, root)


@register_task("retrieval")
def load_retrieval(cfg: dict, root: Path) -> dict[str, Split]:
    """AAN document pairs at byte level, two documents per example (lra/data/retrieval.py)."""
    return retrieval.load(cfg, root)


@register_task("pathfinder")
def load_pathfinder(cfg: dict, root: Path) -> dict[str, Split]:
    """Pathfinder images, official or generated on the fly (lra/data/pathfinder.py)."""
    return pathfinder.load(cfg, root, workers=_workers())


@register_task("image")
def load_image(cfg: dict, root: Path) -> dict[str, Split]:
    """CIFAR-10 in grayscale (lra/data/image.py)."""
    return image.load(cfg, root)
