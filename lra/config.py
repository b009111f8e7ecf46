"""Config helpers shared by the entry points: our OmegaConf resolvers and composing ``conf/`` without a run.

``compose(["task=listops", "attn=skeinformer"])`` returns the same config ``python -m lra.train``
would see, for tools that do not train (``lra.data``, ``lra.fit``) and for tests.
"""

from __future__ import annotations

import hashlib
import re

from omegaconf import DictConfig, OmegaConf

from lra import CONF_DIR, REPO_ROOT


def _tag(override_dirname: str = "") -> str:
    """Extra folder level for overrides that are not part of the standard run name."""
    if not override_dirname:
        return ""
    name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", override_dirname)
    if len(name) > 150:  # keep folder names short, but never let two configurations share one
        name = name[:140] + "-" + hashlib.sha1(override_dirname.encode()).hexdigest()[:9]
    return "/" + name


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("lra.repo", lambda: str(REPO_ROOT), replace=True)
    OmegaConf.register_new_resolver("lra.tag", _tag, replace=True)


register_resolvers()


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))
