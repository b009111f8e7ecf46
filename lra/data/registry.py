"""Task registry: task name -> reader returning ``{"train", "val", "test"} -> Split``.

Each task module registers its own reader with ``@register_task("<name>", spec=<Spec>)`` (as attention
backends do); ``lra/data/__init__.py`` imports the task modules, so importing ``lra.data`` fills the
registry. This module knows no task. A reader takes its task's typed spec (``lra/tasks.py``: the task
node, checked when the config is resolved) and the data root, finds the data in any supported format,
tokenises it through the cache, and raises :class:`DataError` naming the paths it looked at and the
command that prepares them. The spec a reader declares must be the one ``lra.tasks.TASK_SPECS``
registers for its task, so the spec the config checks is the spec the reader reads.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from lra.data.base import DataError, Split
from lra.data.provenance import subset_origin
from lra.tasks import TASK_SPECS, TaskSpec, task_spec

log = logging.getLogger(__name__)

Loader = Callable[[TaskSpec, Path], dict[str, Split]]
LOADERS: dict[str, Loader] = {}


def register_task(name: str, *, spec: type[TaskSpec]):
    """Decorator: ``fn(spec: <spec>, root: Path) -> {split: Split}`` becomes the reader of ``name``;
    ``spec`` is the typed spec it takes, which must be ``lra.tasks.TASK_SPECS[name]``."""
    registered = TASK_SPECS.get(name)
    if spec is not registered:
        where = f"registers {registered.__name__}" if registered else "registers no spec for it"
        raise ValueError(
            f"task {name!r}: the reader takes {getattr(spec, '__name__', spec)}, but lra.tasks.TASK_SPECS "
            f"{where}; a task's spec is registered in lra/tasks.py"
        )

    def deco(fn: Loader) -> Loader:
        if name in LOADERS and LOADERS[name] is not fn:
            raise ValueError(f"task {name!r} is registered twice ({LOADERS[name].__module__} and {fn.__module__})")
        fn.spec = spec
        LOADERS[name] = fn
        return fn

    return deco


def available_tasks() -> list[str]:
    return sorted(LOADERS)


def load_task(task: TaskSpec | Mapping, root: Path) -> dict[str, Split]:
    """The splits of a task: ``task`` is its typed spec (``RunSpec.data.spec``) or its node as composed (a
    dict: typed here by :func:`lra.tasks.task_spec`, as the config does, so a bad value is a ConfigError)."""
    name = task.name if isinstance(task, TaskSpec) else task.get("name")
    if name not in LOADERS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(available_tasks())}")
    spec = task if isinstance(task, TaskSpec) else task_spec(task)
    cap = getattr(spec, "max_length", None)
    if cap is not None and cap > spec.seq_len:  # before any work: tokenising would fail on the first long example
        raise DataError(
            f"task.max_length={cap} is more than task.seq_len={spec.seq_len}: each example keeps up to max_length "
            f"tokens, padded to seq_len; set task.max_length to at most {spec.seq_len} "
            f"or task.seq_len to at least {cap}"
        )
    try:
        splits = LOADERS[name](spec, Path(root))
    except OSError as e:  # the file system's refusal (read-only, full, permissions), not the harness's fault
        raise DataError(
            f"cannot prepare the data under {root}: {e.strerror or e}{f': {e.filename}' if e.filename else ''}; "
            f"make the data root a writable folder with free space, or set LRA_DATA (or data_root=) to one"
        ) from None
    splits = limit_examples(splits, spec.max_examples.limits() if spec.max_examples else None)
    return {
        k: dataclasses.replace(splits[k], zero_is_padding=spec.zero_is_padding)
        for k in ("train", "val", "test")
        if k in splits
    }


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
        out[name] = Split(
            np.asarray(s.tokens[idx]),
            np.asarray(s.lengths[idx]),
            np.asarray(s.labels[idx]),
            origin=subset_origin(s.origin, int(n), len(s), seed),
        )
        log.info("%s: using %d of %d examples (task.max_examples)", name, int(n), len(s))
    return out
