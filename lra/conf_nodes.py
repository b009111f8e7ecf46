"""What Hydra composes from besides conf/'s files: the ``lra.*`` resolvers the yaml uses (``lra.repo``,
``lra.quirk``, ``lra.semantics``, ``lra.tag``, ``lra.attr``) and a typed structured config ``attn/<name>`` for every
registered attention backend. Registered when imported (:mod:`lra.config` imports it), so any composition sees them."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import attention
from lra import CONF_DIR, REPO_ROOT


def folder_name(text: str) -> str:
    """``text`` as one folder name: unsafe characters replaced, and then (or when long) a hash of the
    exact text added, so two different texts never give one name."""
    name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)
    if name != text or len(name) > 200:  # a file name holds 255 bytes
        name = name[:190] + "-" + hashlib.sha1(text.encode()).hexdigest()[:9]
    return name


def tag_level(run_tag: str | None = None, override_dirname: str = "") -> str:
    """The run folder's last level: ``run_tag`` (the canonical one, set by ``lra.train`` and the sweep:
    :func:`lra.naming.run_tag`); without it (a bare Hydra ``-m``) the override text, as Hydra spells it."""
    text = run_tag if run_tag is not None else override_dirname
    return "/" + folder_name(str(text)) if text else ""


def _quirk(path: str, clean, *, _root_):
    """``${lra.quirk:<path>,<clean value>}``: the chosen public code's ``quirks.<path>`` (its behaviour)
    where it has one; else (``quirks=none``, or a key that code does not change) the clean value. A
    command-line value for the key itself replaces the interpolation, so it wins over both."""
    return OmegaConf.select(_root_, f"quirks.{path}", default=clean)


def semantics(quirks) -> str:
    """The word for whose semantics a run has (the run folder's level, the record): ``clean`` under
    ``quirks=none`` (the harness's corrections), ``paper`` under a public code's quirks (docs/fidelity.md)."""
    return "paper" if quirks else "clean"


def _semantics(*, _root_) -> str:
    """``${lra.semantics:}``: :func:`semantics` of the composed ``quirks`` node (conf/config.yaml)."""
    return semantics(_root_.get("quirks"))


def _external_label(target) -> str:
    """attn=external's folder and label: the class name as the registry spells it (TempSoftmax ->
    temp_softmax, the record's attn unless the class is registered under another name:
    attention.load_external); the class name itself where that spelling is a built-in backend's."""
    cls = str(target).partition(":")[2] or str(target)
    snake = attention.registry.snake_case(cls)
    builtin = snake in attention.available() and attention.describe(snake)["module"].startswith("attention.")
    return cls if builtin else snake


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("lra.repo", lambda: str(REPO_ROOT), replace=True)
    OmegaConf.register_new_resolver("lra.quirk", _quirk, replace=True)
    OmegaConf.register_new_resolver("lra.semantics", _semantics, replace=True)
    OmegaConf.register_new_resolver("lra.tag", tag_level, replace=True)
    OmegaConf.register_new_resolver("lra.attr", _external_label, replace=True)


def _config_type(tp):
    """The OmegaConf-typable form of an ``Options`` field type (``int | None`` -> ``Optional[int]``)."""
    args = typing.get_args(tp)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return Optional[rest[0]] if len(rest) == 1 and rest[0] in (int, float, str, bool) else Any
    return tp if tp in (int, float, str, bool) else Any


def attention_node(name: str) -> type:
    """The structured config ``attn/<name>``: name, label, a variant's base options, and one typed,
    initially unset field per option of the backend (unknown options are rejected at composition)."""
    opts_cls = attention.options_class(name)
    hints = typing.get_type_hints(opts_cls)
    options = dataclasses.make_dataclass(
        f"{name}_options",
        [(f.name, _config_type(hints[f.name]), field(default=MISSING)) for f in dataclasses.fields(opts_cls)],
    )
    return dataclasses.make_dataclass(
        f"attn_{name}",
        [
            ("name", str, field(default=name)),
            ("label", str, field(default=name)),  # the run folder and table name (a variant sets its own)
            ("base_options", Dict[str, Any], field(default_factory=dict)),
            ("options", options, field(default_factory=options)),
        ],
    )


@dataclass
class ExternalAttention:
    """``attn=external attn.target=package.module:ClassName``: a backend from the user's own package,
    imported when the config is resolved; its options (``+attn.options.k=64``: the ``+`` because the
    node cannot know them before the import) are checked against its Options dataclass there. Registered
    through an entry point instead, a backend gets its own typed node: ``attn=<name>``."""

    name: str = "external"
    target: str = MISSING
    label: str = "${lra.attr:${.target}}"  # the run folder and table name: the class name in snake_case
    base_options: Dict[str, Any] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)


def register_attention_configs() -> None:
    store = ConfigStore.instance()
    for name in attention.available():
        store.store(group="attn", name=name, node=attention_node(name))
    store.store(group="attn", name="external", node=ExternalAttention)


def attn_configs() -> list[str]:
    """Every name ``attn=`` accepts: the registered backends and the variants in conf/attn/."""
    return sorted(set(attention.available()) | {p.stem for p in (CONF_DIR / "attn").glob("*.yaml")})


register_resolvers()
register_attention_configs()


def container(node) -> Any:
    """A config node as plain Python (resolved); anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
