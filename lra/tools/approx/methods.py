"""The methods of the approximation study and their feature budgets.

Every registered backend with a feature budget (sketch size, landmarks, features, window, ...; see
``BUDGET_OPTIONS``) is swept over the study's budgets; budget-free baselines (V-mean, the exact
attention of other targets) are flat lines; other backends are skipped with the reason logged. Besides
the registry, ``amm_oracle`` (``AmmOracle``) is the O(n^2) sketching baseline of Skeinformer Sec. 3.3.
``with_quirks`` adds a twin of a method built with a public code's quirks (docs/fidelity.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

import attention
from lra.config import ConfigError, compose
from lra.tools.approx.inputs import HEAD_DIM

# Paper order for tables and legends (names not listed follow alphabetically).
ORDER = (
    "vmean",
    "informer",
    "informer_mask",
    "linformer",
    "linformer_jlt",
    "skeinformer",
    "skeinformer_uniform",
    "skeinformer_no_rownorm",
    "skeinformer_simple_rownorm",
    "skeinformer_no_pilot",
    "nystrom",
    "performer",
    "skyformer",
    "kernelized",
    "bigbird",
    "longformer",
    "reformer",
    "yoso_e",
    "yoso",
    "yoso_conv",
    "polynomial",
    "polysketch",
    "amm_oracle",
)


# ----------------------------------------------------------------------------- budgets
def _count(budget: int, n: int, defaults: dict) -> int:
    return int(budget)


def _informer_factor(budget: int, n: int, defaults: dict):
    """Informer keeps u = factor * ceil(ln n) rows; choose the factor giving u close to the budget."""
    f = budget / math.ceil(math.log(n))
    return max(1, round(f)) if isinstance(defaults.get("factor"), int) else f


def _bigbird_block(budget: int, n: int, defaults: dict) -> int:
    """BigBird visits (window + 2 global + random) blocks of ``block_size`` keys per query row:
    choose the block size that makes that about ``budget`` keys (8 -> 1, 256 -> 32 for 3+2+3 blocks)."""
    blocks = defaults.get("window_blocks", 3) + 2 + defaults.get("random_blocks", 3)
    return max(1, budget // blocks)


def _sqrt_count(budget: int, n: int, defaults: dict) -> int:
    """PolySketch: sketch size r gives r² features (φ₄ = φ₂ ⊗ φ₂), so r = round(sqrt(d))."""
    return max(1, round(math.sqrt(budget)))


# The option holding a method's feature budget d ("the number of columns/rows selected or the
# projection dimension", Skeinformer Sec. 5) and how d becomes its value. A per-backend entry wins;
# otherwise the first name of GENERIC_BUDGET_OPTIONS that the backend has is set to d. Converters
# get (d, n, the backend's option defaults).
GENERIC_BUDGET_OPTIONS = (
    "num_features",
    "num_landmarks",
    "landmarks",
    "features",
    "sketch_size",
    "num_samples",
    "num_sampled",
    "sample_size",
    "proj_dim",
    "projection_dim",
    "k",
    "rank",
    "nb_features",
    "num_random_features",
    "num_rows",
    "num_columns",
    "d",
)
BUDGET_OPTIONS: dict[str, tuple[tuple[str, Callable], ...]] = {
    # Informer: num_features is already "about d exact rows"; a bare factor is converted.
    "informer": (("num_features", _count), ("factor", _informer_factor)),
    "informer_mask": (("num_features", _count), ("factor", _informer_factor)),
    # sparse patterns: the budget is the number of keys each query visits
    "longformer": (("window", _count), ("window_size", _count)),  # w keys around i (+ globals)
    "bigbird": (("block_size", _bigbird_block),),
    "reformer": (("bucket_size", _count),),  # keys per bucket, per hash round
    # LSH sampling: the number of hash rounds (YOSO-m)
    "yoso": (("num_hashes", _count), ("num_hash", _count), ("hashes", _count)),
    "polysketch": (("sketch_size", _sqrt_count),),  # r² features
}
# Budget-free baselines drawn as flat lines: the papers' "V-Mean", and the exact attentions of the
# other targets (kernelized, polynomial, YOSO-E) against softmax, which cost nothing extra since they
# are computed anyway as the references of Skyformer, PolySketch and YOSO.
BUDGET_FREE = ("vmean", "kernelized", "polynomial", "yoso_e")
# Never approximations of anything to measure here.
NOT_STUDIED = {
    "softmax": "exact softmax (the reference itself)",
    "none": "identity mixing, no target",
    "yoso_conv": "adds a learned depthwise convolution of V (random at init), so its output "
    "approximates no attention; its attention part is `yoso`",
}


def _count_value(budget, n):
    return budget


@dataclass
class Method:
    """One line of the study: how to build it at a budget and what to compare it with."""

    name: str
    build: Callable[[int | None, int, int], nn.Module]  # (budget or None, n, heads) -> module
    budget_option: str | None  # None: budget-free (flat line)
    budget_value: Callable[[int, int], object] = _count_value  # (budget, n) -> the option's value
    target: str = "softmax"
    shared_qk: bool = False
    block_multiple: int | None = None
    note: str = ""


def budget_option(name: str) -> tuple[str, Callable] | None:
    """The (option, converter) carrying the feature budget of backend ``name``, or None."""
    defaults = attention.option_defaults(name)
    for opt, conv in BUDGET_OPTIONS.get(name, ()):
        if opt in defaults:
            return opt, conv
    for opt in GENERIC_BUDGET_OPTIONS:
        if opt in defaults:
            return opt, _count
    return None


def _registry_method(name: str, extra: dict | None = None) -> tuple[Method | None, str]:
    """A Method for registered backend ``name`` (built with the ``extra`` options too), or (None,
    reason to skip)."""
    if name in NOT_STUDIED:
        return None, NOT_STUDIED[name]
    desc = attention.describe(name)
    defaults = desc["options"]
    fixed = {**({"dropout": 0.0} if "dropout" in defaults else {}), **(extra or {})}
    found = budget_option(name)
    if found is None and name not in BUDGET_FREE:
        return None, f"no feature-budget option (options: {sorted(defaults) or 'none'})"
    if found is None and desc["exact"] and desc["target"] == "softmax":
        return None, "exact softmax"
    opt, conv = found if found else (None, None)

    def build(budget, n, heads, _name=name, _opt=opt, _conv=conv, _fixed=fixed, _d=defaults):
        options = dict(_fixed)
        if _opt is not None:
            options[_opt] = _conv(budget, n, _d)
        return attention.build(_name, num_heads=heads, head_dim=HEAD_DIM, max_len=n, **options)

    value = (lambda budget, n, _conv=conv, _d=defaults: _conv(budget, n, _d)) if conv else _count_value
    return Method(
        name=name,
        build=build,
        budget_option=opt,
        budget_value=value,
        target=desc["target"],
        shared_qk=bool(desc.get("shared_qk")),
        block_multiple=desc.get("block_multiple"),
        note=desc.get("notes", ""),
    ), ""


class AmmOracle(nn.Module):
    """Approximate matrix multiplication B S S^T V (Skeinformer Sec. 3.3, Proposition 1): d columns of
    the exact B drawn i.i.d. with p_j ∝ ||B e_j|| ||V_j||, rescaled by 1/sqrt(d p_j). O(n^2): it needs
    all of B, so it is not an attention backend, only the sketching baseline the theory describes."""

    def __init__(self, d: int):
        super().__init__()
        self.d = d

    def forward(self, q, k, v, mask=None):
        out = torch.empty_like(v)
        for idx in np.ndindex(*q.shape[:-2]):
            b = (q[idx] @ k[idx].T / math.sqrt(q.shape[-1])).softmax(dim=-1)
            p = b.norm(dim=0) * v[idx].norm(dim=-1)
            p = p / p.sum()
            j = torch.multinomial(p, self.d, replacement=True)
            w = 1.0 / (self.d * p[j])
            out[idx] = (b[:, j] * w) @ v[idx][j]
        return out


BUILTIN = {
    "amm_oracle": Method(
        "amm_oracle",
        lambda budget, n, heads: AmmOracle(budget),
        "d",
        note="O(n^2) sketching oracle B S S^T V (not a backend)",
    ),
}


def resolve_methods(names: list[str] | None) -> tuple[list[Method], dict[str, str]]:
    """Methods to study (``names`` or every registered backend) and {skipped name: reason}.

    Unknown names raise ``ConfigError`` (a ``ValueError``) listing what is available.
    """
    registered = attention.available()
    known = sorted(set(registered) | set(BUILTIN))
    if names:
        unknown = [m for m in names if m not in known]
        if unknown:
            raise ConfigError(f"--methods: unknown method(s) {unknown}; available: {', '.join(known)}")
        wanted = list(dict.fromkeys(names))
    else:
        wanted = registered
    methods, skipped = [], {}
    for name in wanted:
        if name in BUILTIN:
            methods.append(BUILTIN[name])
            continue
        try:
            m, reason = _registry_method(name)
        except Exception as err:  # a backend under construction must not stop the study
            m, reason = None, f"could not be described: {type(err).__name__}: {err}"
        if m is None:
            skipped[name] = reason
        else:
            methods.append(m)
    methods.sort(key=order_key)
    return methods, skipped


def with_quirks(methods: list[Method], code: str) -> list[Method]:
    """A twin ``<name>[<code>]`` of every method the public code ``code`` (``conf/quirks/<code>.yaml``:
    skeinformer, skyformer, nystromformer) has quirks for, built with those options (the budget stays
    the study's): the approximation error under that code's ``quirks=`` next to the clean one. The study
    calls one sequence at a time without padding, so quirks of padding and of batch coupling change
    nothing here (docs/fidelity.md measures those on padded batches)."""
    try:
        table = compose([f"quirks={code}"]).quirks.attn_options
    except ConfigError as e:
        raise ConfigError(f"--quirks {code}: {e}") from None
    twins = []
    for m in methods:
        opts = {k: v for k, v in dict(table.get(m.name) or {}).items() if k != m.budget_option}
        if not opts:
            continue
        twin, _ = _registry_method(m.name, extra=opts)
        twins.append(
            dataclasses.replace(
                twin, name=f"{m.name}[{code}]", note=f"{code} code: " + ", ".join(f"{k}={v}" for k, v in opts.items())
            )
        )
    return twins


def order_key(m) -> tuple:
    name = m if isinstance(m, str) else m.name
    base = name.split("[")[0]  # a twin with a public code's quirks sorts after its method
    return (ORDER.index(base) if base in ORDER else len(ORDER), name)
