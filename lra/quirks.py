"""The public codes' quirks (conf/quirks/): which code a preset reproduces, that code's quirks table, and which of
its quirks a run has on. Read from the config files without composing; :mod:`lra.config` puts them in the spec
(``attn``, ``model``, ``train`` below are its AttnSpec, ModelSpec and TrainSpec: not imported, it imports this)."""

from __future__ import annotations

import functools

from omegaconf import DictConfig, OmegaConf

from lra import CONF_DIR
from lra.checks import container


def preset_code(preset: str) -> str:
    """The public code whose quirks the preset ``preset`` chooses (its file's ``override /quirks``), or
    ``none``: read from conf/preset/<preset>.yaml without composing."""
    path = CONF_DIR / "preset" / f"{preset}.yaml"
    shipped = path.is_file() and path.parent == CONF_DIR / "preset" and not preset.startswith(".")  # not ../x
    defaults = OmegaConf.load(path).get("defaults") or [] if shipped else []
    return next((str(d["override /quirks"]) for d in defaults if "override /quirks" in d), "none")


@functools.lru_cache(maxsize=None)
def code_quirks(code: str) -> dict:
    """The quirks table of the public code ``code`` (conf/quirks/<code>.yaml over the files its defaults
    list names, as Hydra merges them), read without composing."""
    node = OmegaConf.load(CONF_DIR / "quirks" / f"{code}.yaml") or OmegaConf.create({})
    defaults = list(node.pop("defaults", None) or ["_self_"])
    merged = OmegaConf.merge(*[node if d == "_self_" else code_quirks(str(d)) for d in defaults])
    return OmegaConf.to_container(merged) or {}


def paper_chunks(cfg: DictConfig, attn, table: dict | None = None) -> int:
    """The public code's accumulation chunks for this task and attention: ``quirks.train.chunks.<task>``
    (of ``table`` where given, a quirks table), one count for every attention or one per attention name or
    label (the label wins); 1 where none."""
    quirks = container(cfg.get("quirks") or {}) if table is None else table
    node = ((quirks.get("train") or {}).get("chunks") or {}).get(str(cfg.task.name))
    if isinstance(node, dict):
        return [1, *(node[k] for k in (attn.name, attn.label) if k in node)][-1]
    return 1 if node is None else node


def quirks_on(cfg: DictConfig, model, task: dict, train=None) -> dict:
    """The public-code quirks this run has on, whatever turned them on (``quirks=<code>`` or a single
    option): ``{"model.pooling": "padded_mean", "task.tokenizer": "alnum",
    "attn.options.pilot_sampling": "with_replacement", ...}``; a quirk is on where the value that
    runs is the public code's: the chosen code's, or under ``quirks=none`` the code the preset
    reproduces (:func:`preset_code`). Each entry of a table differs from the clean default
    (tests/test_fidelity.py), so a clean run lists none unless a single option sets one."""
    table = container(cfg.get("quirks") or {}) or code_quirks(preset_code(str(cfg.preset)))
    attn, on = model.attn, {}
    for k, v in (table.get("model") or {}).items():
        if getattr(model, k) == v:
            on[f"model.{k}"] = v
    for k, v in ((table.get("task") or {}).get(task["name"]) or {}).items():
        if task.get(k) == v:
            on[f"task.{k}"] = v
    for key in dict.fromkeys([attn.name, attn.label]):
        for k, v in ((table.get("attn_options") or {}).get(key) or {}).items():
            if attn.options.get(k) == v:
                on[f"attn.options.{k}"] = v
    chunks = paper_chunks(cfg, attn, table)
    if train is not None and chunks > 1 and train.chunks == chunks:
        on["train.chunks"] = chunks
    return on
