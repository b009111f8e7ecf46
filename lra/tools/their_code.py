"""A public code's checkout, imported at run time beside the harness (nothing of it is copied here): which
repositories (:data:`REPOS`), the sandbox their modules are imported in (:func:`public_code`: their top-level
names hide ours only inside it, packages they import but we lack get stand-ins) and their model config as their
entry points read it. :mod:`lra.tools.fidelity` compares their classifiers with ours, the benchmark their layers."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch


@dataclass(frozen=True)
class Repo:
    url: str
    code: str  # the folder their entry points run from
    wrapper: str  # the file in it that holds ModelForSC
    tolerance: float  # on the paper column

    @property
    def module(self) -> str:
        return self.wrapper.removesuffix(".py").replace("/", ".")


REPOS = {
    "skeinformer": Repo("https://github.com/pkuzengqi/Skeinformer", "src", "models/model_LRA.py", 1e-5),
    "skyformer": Repo("https://github.com/pkuzengqi/Skyformer", "src", "models/model_LRA.py", 1e-4),
    "nystromformer": Repo("https://github.com/mlpen/Nystromformer", "LRA/code", "model_wrapper.py", 1e-4),
}


def _unavailable(name: str) -> Callable:
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in of lra.tools.their_code: the compared code should not call it")

    return fail


def _repeat(t: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
    """einops.repeat for the one pattern FastAttention applies to its projection matrix."""
    if pattern != "j d -> b h j d":
        raise RuntimeError(f"lra.tools.their_code's einops stand-in has no pattern {pattern!r}")
    return t.expand(sizes["b"], sizes["h"], *t.shape).contiguous()


def _stand_ins() -> dict[str, types.ModuleType]:
    """Modules for the packages their files import at top level, for those not installed (a real one wins)."""
    attrs = {
        "einops": {"repeat": _repeat, "rearrange": _unavailable("einops.rearrange")},
        "local_attention": {"LocalAttention": _unavailable("LocalAttention")},
        "axial_positional_embedding": {"AxialPositionalEmbedding": _unavailable("AxialPositionalEmbedding")},
        "performer_pytorch.reversible": {
            "ReversibleSequence": _unavailable("ReversibleSequence"),
            "SequentialSequence": _unavailable("SequentialSequence"),
        },
        "performer_pytorch": {"FastAttention": _unavailable("performer_pytorch.FastAttention")},
    }
    mods = {name: types.ModuleType(name) for name in attrs}
    for name, values in attrs.items():
        vars(mods[name]).update(values)
    mods["performer_pytorch"].reversible = mods["performer_pytorch.reversible"]
    return {n: m for n, m in mods.items() if importlib.util.find_spec(n.split(".")[0]) is None}


@contextlib.contextmanager
def public_code(folder: Path, performer_copy: Path | None = None) -> Iterator[None]:
    """Import from ``folder`` as their entry points do (first on sys.path), with stand-ins for missing
    packages; on exit sys.modules and sys.path are exactly as before (their modules live on only in
    the objects built inside)."""
    saved_modules, saved_path = dict(sys.modules), list(sys.path)
    # their top-level names (attention, models, config, ...) hide ours: the harness has an `attention` too
    theirs = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
    try:
        for name in [n for n in sys.modules if n.split(".")[0] in theirs]:
            del sys.modules[name]
        stand_ins = _stand_ins()
        sys.modules.update(stand_ins)
        sys.path.insert(0, str(folder))
        if performer_copy is not None and "performer_pytorch" in stand_ins:
            spec = importlib.util.spec_from_file_location("performer_pytorch.fast_attention", performer_copy)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            stand_ins["performer_pytorch"].FastAttention = module.FastAttention
        with warnings.catch_warnings():  # their code's deprecation warnings are not ours to fix
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - set(saved_modules):
            del sys.modules[name]
        sys.modules.update(saved_modules)


def performer_copy(repo: str, roots: dict[str, Path]) -> Path | None:
    """Only the Nyström code imports pip performer_pytorch's FastAttention; the Skeinformer checkout ships a copy."""
    if repo != "nystromformer" or "skeinformer" not in roots:
        return None
    return roots["skeinformer"] / "src/models/performer.py"


def their_config(repo: str, task: str, attn_type: str) -> dict:
    """Their model config for ``task`` with ``attn_type``'s extra settings, as their entry points read it (a
    copy; call inside :func:`public_code`)."""
    if repo == "nystromformer":
        cfg = copy.deepcopy(importlib.import_module("lra_config").config[task])
    else:
        cfg = copy.deepcopy(importlib.import_module("config").Config["lra-" + task])
    model = cfg["model"]
    model.update(cfg["extra_attn_config"].get(attn_type, {}))
    return model
