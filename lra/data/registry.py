"""Task registry: task name -> loader returning ``{"train", "val", "test"} -> Split``.

Each task module registers its own loader with ``@register_task("<name>")`` (as attention backends
do); ``lra/data/__init__.py`` imports the task modules, so importing ``lra.data`` fills the registry.
This module knows no task. A loader takes the task config (``conf/task/<name>.yaml``, a dict) and
the data root, finds the data in any supported format, tokenises it through the cache, and raises
:class:`DataError` naming the paths it looked at and the command that prepares them.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

import numpy as np

from lra.data.base import Split

log = logging.getLogger(__name__)

Loader = Callable[[dict, Path], dict[str, Split]]
LOADERS: dict[str, Loader] = {}


def register_task(name: str):
    """Decorator: ``fn(task_cfg: dict, root: Path) -> {split: Split}`` becomes the loader of ``name``."""
    def deco(fn: Loader) -> Loader:
        if name in LOADERS and LOADERS[name] is not fn:
            raise ValueError(f"task {name!r} is registered twice ({LOADERS[name].__module__} and {fn.__module__})")
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
    zero_is_padding = task_cfg.get("mask", "all") == "nonzero"  # the public code's ids != 0 (docs/fidelity.md)
    return {k: dataclasses.replace(splits[k], zero_is_padding=zero_is_padding)
            for k in ("train", "val", "test") if k in splits}


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
