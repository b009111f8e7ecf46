"""The run folder: ``<runs_root>/<preset>/<semantics>/<task>/<attn>/seed<s>[/<tag>]``, named by the resolved
configuration, not by how the command line spelled it (``train.lr=1e-3`` and ``train.lr=0.001`` are one
folder). ``lra.train`` and ``lra.tools.sweep`` name runs through :func:`run_tag`; ``hydra.run.dir`` in
conf/config.yaml is the same template."""

from __future__ import annotations

import functools
from pathlib import Path

from lra.compose import folder_name, tag_level
from lra.config import ConfigError, RunSpec, compose_checked, container, load, resolve
from lra.tags import UNTAGGED, flat, spelled

# Overrides that name a level of the run folder (runs/<preset>/<semantics>/<task>/<attn>/seed<s>; a debug=<name>
# run: runs/debug/<name>/<preset>/<task>/<attn>/seed<s>, conf/debug/), or pick where things live: the
# configuration they give is the base the tag is measured against.
FOLDER_KEYS = ("preset", "quirks", "task", "attn", "attn.target", "seed", "runs_root", "data_root", "debug")


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _untagged(key: str) -> bool:
    return any(key == u or key.startswith(u + ".") for u in UNTAGGED)


@functools.lru_cache(maxsize=64)  # a sweep names many runs of a few bases
def _base_config(named: tuple[str, ...]) -> dict:
    """The flat resolved config of the folder-naming overrides alone."""
    cfg = compose_checked(list(named))
    try:
        return flat(resolve(cfg).config)
    except ConfigError:  # the base alone need not be a valid run (the overrides may repair it)
        return flat(container(cfg))


def run_tag(overrides: list[str] | tuple[str, ...], spec: "RunSpec | None" = None) -> str:
    """The run folder's last level for ``overrides``: every resolved value that differs from the
    configuration of the folder-naming overrides alone (:data:`FOLDER_KEYS`), as sorted ``key=value``
    with canonical values (``train.lr=1e-3`` and ``train.lr=0.001`` are one folder, and no folder
    when the preset's lr is 1e-3). Empty for the preset's own configuration.

    Example::

        run_tag(["preset=quick", "train.lr=0.002", "train.max_steps=120"])
        # 'train.lr=0.002,train.max_steps=120'
    """
    spec = spec or load(overrides)
    new, old = flat(spec.config), _base_config(tuple(o for o in overrides if _override_key(o) in FOLDER_KEYS))
    keys = sorted(k for k in set(new) | set(old) if not _untagged(k) and new.get(k, ...) != old.get(k, ...))
    return folder_name(",".join(f"{k}={spelled(new.get(k))}" for k in keys))


def run_folder(spec: "RunSpec", tag: str) -> Path:
    """Where ``python -m lra.train`` writes: ``<runs_root>/<preset>/<semantics>/<task>/<attn>/seed<s>[/<tag>]``
    (the same template as ``hydra.run.dir`` in conf/config.yaml, with ``run_tag=<tag>``); a ``debug=<name>`` run:
    ``<runs_root>/debug/<name>/<preset>/<task>/<attn>/seed<s>[/<tag>]`` (conf/debug/), never the preset's tree."""
    root = Path(spec.config["runs_root"])
    where = root / "debug" / spec.debug.name / spec.preset if spec.debug else root / spec.preset / spec.semantics
    return where / spec.where / f"seed{spec.seed}{tag_level(tag)}"
