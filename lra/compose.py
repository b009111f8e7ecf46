"""Composing a run's config with Hydra: :func:`compose` (the old spellings refused first, in one line), its
errors as one line (:func:`compose_checked`), and what Hydra composes from besides conf/'s files: the ``lra.*``
resolvers the yaml uses (``lra.repo``, ``lra.quirk``, ``lra.semantics``, ``lra.tag``, ``lra.attr``) and a typed
structured config ``attn/<name>`` for every registered attention backend, registered when this is imported.
:mod:`lra.config` resolves what this composes into the typed run spec."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

import attention
from lra import CONF_DIR, REPO_ROOT
from lra.checks import ConfigError
from lra.quirks import preset_code
from lra.tasks import ListOpsGenerator, ListOpsSpec


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


# ---------------------------------------------------------------------------------------------
# Composing

SEMANTICS = ("clean", "paper")
DEFAULT_PRESET = "skeinformer_paper"  # conf/config.yaml's defaults list


# ListOps' task.generator.* keys that are not also the task's own (max_length is both: the task's is what it keeps)
GENERATOR_KEYS = {f.name for f in dataclasses.fields(ListOpsGenerator)} - {
    f.name for f in dataclasses.fields(ListOpsSpec)
}


def protocol_key(key: str) -> str:
    """The one key a ``protocol.*`` spelling names today: ``protocol.lr`` is ``train.lr``, ``protocol.data.<k>``
    the task's ``task.<k>`` (``task.generator.<k>`` for ListOps' generator), ``protocol.attn_options.*``
    is ``attn_options.*`` (a protocol file writes the run's own keys, docs/protocol.md)."""
    rest = key.removeprefix("protocol.")
    if rest.startswith("data."):
        k = rest[5:]
        return f"task.generator.{k}" if k.split(".")[0] in GENERATOR_KEYS else f"task.{k}"
    return rest if rest.startswith("attn_options.") else f"train.{rest}"


def renamed_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    """Refuse a command line's old spellings, before any work, with one line naming the new one:
    ``experiment=<p>`` is ``preset=<p>``; ``semantics=clean|paper`` is ``quirks=none|<the preset's code>``;
    ``protocol.<k>=<v>`` is :func:`protocol_key`'s key."""
    keys = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] if "=" in o else "" for o in overrides}
    for key, value in keys.items():
        if key.startswith("protocol."):
            new = protocol_key(key)
            both = " (ListOps' generated length: task.generator.max_length=)" if new == "task.max_length" else ""
            raise ConfigError(f"{key}= is now {new}= (one key per value): use {new}={value}{both}")
    if "experiment" in keys:
        raise ConfigError(f"experiment= is now preset=: use preset={keys['experiment'] or '<name>'}")
    if "semantics" in keys:
        preset = keys.get("preset") or DEFAULT_PRESET
        code = preset_code(preset)
        if keys["semantics"] == "clean":
            new = "use quirks=none (the harness's corrections)"
        elif keys["semantics"] == "paper" and code != "none":
            new = f"use quirks={code} (the code preset {preset} reproduces)"
        else:
            new = "use quirks=none (clean) or quirks=skeinformer|skyformer|nystromformer (that public code's)"
        raise ConfigError(f"semantics= is now quirks=: {new}")


def compose(overrides: list[str] | tuple[str, ...] = (), job: str | None = None) -> DictConfig:
    """The config ``python -m lra.train <overrides>`` sees. ``job``: also its ``hydra`` node, as ``@hydra.main``
    composes it for ``python -m lra.<job>`` (``lra.train`` runs this one config; :mod:`lra.hydra_glue`).
    An old spelling (``experiment=``, ``semantics=``, ``protocol.*=``) raises :class:`ConfigError`
    (:func:`renamed_overrides`)."""
    renamed_overrides(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=job or "app"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=job is not None)


def without_hydra(cfg: DictConfig) -> DictConfig:
    """The run's own config: ``cfg`` without the ``hydra`` node :func:`compose` adds for a ``job``."""
    if "hydra" not in cfg:
        return cfg
    out = cfg.copy()
    with open_dict(out):
        del out["hydra"]
    return out


def compose_checked(overrides: list[str] | tuple[str, ...] = (), job: str | None = None) -> DictConfig:
    """:func:`compose`, with Hydra's and OmegaConf's composition errors turned into one-line
    :class:`ConfigError` s (an unknown attention option lists the backend's valid ones)."""
    try:
        return compose(overrides, job)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_composition_error(e, list(overrides))) from None


def _composition_error(e: Exception, overrides: list[str]) -> str:
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    what = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if key and key.startswith("attn.options."):
        name = compose([o for o in overrides if key not in o]).attn.name  # the backend, without the bad override
        valid = ", ".join(f.name for f in dataclasses.fields(attention.options_class(name))) or "(none)"
        return f"{key}: {what}; attention {name!r} has the options {valid} (attention.describe({name!r}))"
    if key and "." in key and "not in struct" in what:  # a typo'd key: say which keys the node has
        parent = key.rsplit(".", 1)[0]
        try:
            node = OmegaConf.select(compose([o for o in overrides if key not in o]), parent)
        except (HydraException, OmegaConfBaseException):
            node = None
        if isinstance(node, DictConfig):
            return f"{key}: {what}; {parent} has the keys {', '.join(sorted(str(k) for k in node))}"
    if key:
        return f"{key}: {what}"
    text = str(e).split("Config search path")[0]  # Hydra's message (e.g. a group's available choices)
    return " ".join(text.split())
