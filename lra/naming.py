"""The run folder: ``<runs_root>/<preset>/<semantics>/<task>/<attn>/seed<s>[/<tag>]``, named by the resolved
configuration, not by how the command line spelled it (``train.lr=1e-3`` and ``train.lr=0.001`` are one
folder). ``lra.train`` and ``lra.tools.sweep`` name runs through :func:`run_tag`; ``hydra.run.dir`` in
conf/config.yaml is the same template."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from lra.compose import folder_name, tag_level
from lra.config import ConfigError, RunSpec, compose_checked, container, load, resolve

# Overrides that name a level of the run folder (runs/<preset>/<semantics>/<task>/<attn>/seed<s>; a debug=<name>
# run: runs/debug/<name>/<preset>/<task>/<attn>/seed<s>, conf/debug/), or pick where things live: the
# configuration they give is the base the tag is measured against.
FOLDER_KEYS = ("preset", "quirks", "task", "attn", "attn.target", "seed", "runs_root", "data_root", "debug")

# Resolved keys that never enter the tag: folder levels, tables whose effect shows in the keys they feed
# (attn_options -> attn.options), and settings that change how a run
# is executed or logged but not what it computes (the resume key and record still hold them), and labels
# (name: the record's display name).
UNTAGGED = (
    "preset",
    "semantics",
    "seed",
    "name",
    "task.name",
    "attn.name",
    "attn.label",
    "attn.target",
    "attn.base_options",
    "attn_options",
    "quirks",
    "runs_root",
    "data_root",
    "run_tag",
    "force",
    "num_threads",
    "fit",
    "hardware",
    "logger",
    "trainer.progress",
    "trainer.num_workers",
    "trainer.log_every_n_steps",
    "train.compile",
    "train.ckpt_every_steps",
)


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and node:
        out: dict = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _untagged(key: str) -> bool:
    return any(key == u or key.startswith(u + ".") for u in UNTAGGED)


def _canonical(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=64)  # a sweep names many runs of a few bases
def _base_config(named: tuple[str, ...]) -> dict:
    """The flat resolved config of the folder-naming overrides alone."""
    cfg = compose_checked(list(named))
    try:
        return _flat(resolve(cfg).config)
    except ConfigError:  # the base alone need not be a valid run (the overrides may repair it)
        return _flat(container(cfg))


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
    new, old = _flat(spec.config), _base_config(tuple(o for o in overrides if _override_key(o) in FOLDER_KEYS))
    keys = sorted(k for k in set(new) | set(old) if not _untagged(k) and new.get(k, ...) != old.get(k, ...))
    return folder_name(",".join(f"{k}={_canonical(new.get(k))}" for k in keys))


def run_folder(spec: "RunSpec", tag: str) -> Path:
    """Where ``python -m lra.train`` writes: ``<runs_root>/<preset>/<semantics>/<task>/<attn>/seed<s>[/<tag>]``
    (the same template as ``hydra.run.dir`` in conf/config.yaml, with ``run_tag=<tag>``); a ``debug=<name>`` run:
    ``<runs_root>/debug/<name>/<preset>/<task>/<attn>/seed<s>[/<tag>]`` (conf/debug/), never the preset's tree."""
    root = Path(spec.config["runs_root"])
    where = root / "debug" / spec.debug.name / spec.preset if spec.debug else root / spec.preset / spec.semantics
    return where / spec.where / f"seed{spec.seed}{tag_level(tag)}"
