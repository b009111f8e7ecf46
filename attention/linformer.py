"""Linformer (Wang et al., "Linformer: Self-Attention with Linear Complexity", 2020) and the unreduced
Johnson-Lindenstrauss form it departs from (Skeinformer paper, §3.3 and Table 1 "w/ unreduced JLT").

``linformer``: learned projections E, F ∈ R^{n×k} (k = sketch size, option ``k``, 256 in the
Skeinformer paper) compress keys and values along the sequence:
    head = softmax(Q (Eᵀ K)ᵀ / √p) (Fᵀ V),        O(n·k·p) time, O(n·k) memory.
Parameter sharing (Linformer §4, option ``sharing``; ``kv_per_head`` is the public code's, below):
  * ``none``: one E_i and one F_i per head (shape (heads, max_len, k) each);
  * ``headwise``: E_i = E, F_i = F across heads;
  * ``kv``: E_i = F_i = E across heads (one (max_len, k) matrix);
  * ``kv_per_head``: E_i = F_i per head (shape (heads, max_len, k)), not in the paper: the public
    LRA code's layout;
  * ``layerwise``: one matrix for all layers, heads, K and V. A module here is one layer's
    attention, so inside it this is the same single matrix as ``kv``; sharing it across layers means
    tying the ``E`` parameters of the layers' modules (the model's job, as for any weight tying). We do
    not share through class attributes (the LRA seed code did, tying every model in the process).
E and F are registered ``nn.Parameter``s (``trainable=False``: buffers) created in ``__init__`` by
:func:`sample_projection` with N(0, 1/k) entries (so that
E[E Eᵀ] = I, the JL scaling of Linformer's proof). Inputs shorter than ``max_len`` use the first n
rows (slicing, as fairseq/lucidrains do); longer inputs are an error. Padding: keys and values of
padded positions are zeroed before the projection, so the output at real positions does not depend
on padded content, wherever the padding sits.

``linformer_jlt``: D⁻¹ A S Sᵀ V, the sketch Linformer's Theorem motivates (Skeinformer §3.3) with a
Gaussian S ∈ R^{n×k}, i.i.d. N(0, 1/k) so E[S Sᵀ] = I and the output is softmax attention in
expectation; D is the exact row sum of A. It needs the whole n×n A: O(n²·p + n·k·p) time, O(n²)
memory, like the paper's row. Rows of S at padded keys are zeroed (A's padded columns are masked),
so it is padding-aware; an all-padding sample uses every position. Option ``redraw``: ``call``
draws a fresh S (per head, shared over the batch) from torch's RNG on every forward; ``fixed`` draws
it once in ``__init__`` as a buffer of shape (heads, max_len, k) and slices it.

Deviations from the public code (defaults): E and F train and are saved; N(0, 1/k) init; no
attention dropout (no efficient backend in the papers used one).

Public-code semantics (``paper`` presets). Public code: ``LinformerAttention`` in
https://github.com/pkuzengqi/Skyformer and https://github.com/pkuzengqi/Skeinformer
``src/models/attention_linformer.py`` (byte-identical), and https://github.com/mlpen/Nystromformer
``LRA/code/attention_linformer.py``. Both use ONE matrix E of shape (heads, k, max_seq_len) for
keys and values (K̃ = E·(K⊙mask), Ṽ = E·(V⊙mask), queries unmasked, no softmax mask), drawn
N(0, 0.02²); the input length must equal max_seq_len (here shorter inputs slice E).
  * ``sharing="kv_per_head"``: one E_i per head, used for K and V (F_i = E_i): their layout.
  * ``init="normal_0.02"``: entries N(0, 0.02²), drawn in their (heads, k, max_len) order (a
    draw of the same generator state gives their matrix, transposed).
  * ``trainable=False``: E (and F) are fixed buffers drawn once at construction, no gradient. In
    Skyformer/Skeinformer, ``self.E = nn.Parameter(...).to(device)`` with device ``cuda`` returns
    a plain tensor, so E is never registered: a fixed random projection per layer, not trained,
    not in the state_dict (it is drawn by the CUDA generator there; on a CPU device ``.to`` would
    return the Parameter itself and it would train). Here the buffer is saved with the module, so
    a reloaded model keeps its E (theirs re-draws it on load; with their fixed seed, the same one).
  * Cross-layer sharing (Nyströmformer ``LRA/code``: E is a class attribute ``nn.Parameter``,
    created by the first layer and reused by every later layer and every model of the process;
    trainable) is a tie between modules: ``sharing="kv_per_head"`` (or ``layerwise``) here, plus
    the model tying every layer's ``E`` to the first one's. A backend module alone cannot do it.
Skyformer/Skeinformer preset: ``sharing="kv_per_head", init="normal_0.02", trainable=False``, k 128;
Nyströmformer LRA: ``sharing="kv_per_head", init="normal_0.02"`` with E tied across layers, k 256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attention._scores import scores
from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register
from attention.softmax import key_mask

NEG_INF = float("-inf")


@dataclass(frozen=True)
class LinformerOptions:
    k: int = 256  # projected length (sketch size)
    sharing: str = "none"  # none | headwise | kv | kv_per_head (one E per head for K and V, public code) | layerwise
    init: str = "jl"  # entries of E, F: jl N(0, 1/k) | normal_0.02 N(0, 0.02²) (public code)
    trainable: bool = True  # False: E, F are fixed random buffers, no gradient (Skyformer/Skeinformer code)

    def __post_init__(self):
        check_range("k", self.k, 1, None, integer=True)
        check_choice("sharing", self.sharing, ("none", "headwise", "kv", "kv_per_head", "layerwise"))
        check_choice("init", self.init, ("jl", "normal_0.02"))
        check_choice("trainable", self.trainable, (True, False))


def sample_projection(shape: tuple[int, ...], init: str = "jl") -> torch.Tensor:
    """A random projection of ``shape`` (…, max_len, k) from torch's global RNG.

    jl: i.i.d. N(0, 1/k). normal_0.02: i.i.d. N(0, 0.02²), drawn as a (…, k, max_len) tensor (the
    public code's layout and order) and returned transposed."""
    *lead, n, kk = shape
    if init == "jl":
        return torch.randn(shape) * (1.0 / math.sqrt(kk))
    if init == "normal_0.02":
        return torch.empty(*lead, kk, n).normal_(0.0, 0.02).transpose(-1, -2).contiguous()
    raise ValueError(f"unknown linformer init {init!r}")


@register("linformer")
class LinformerAttention(AttentionBackend):
    """Linformer: softmax(Q (EᵀK)ᵀ/√p) FᵀV with learned n→k projections E, F."""

    Options = LinformerOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        complexity="O(n k)",
        notes="learned E,F of shape (max_len, k); shorter inputs slice them",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        per_head = options.sharing in ("none", "kv_per_head")
        shape = (num_heads, max_len, options.k) if per_head else (max_len, options.k)
        tensors = {"E": sample_projection(shape, options.init)}
        if options.sharing in ("none", "headwise"):
            tensors["F"] = sample_projection(shape, options.init)
        for name in ("E", "F"):
            t = tensors.get(name)
            if options.trainable:
                self.register_parameter(name, None if t is None else nn.Parameter(t))
            else:  # a fixed random projection, saved with the module
                self.register_buffer(name, t)

    def projections(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """E and F restricted to the first n positions: (heads or 1, n, k) each."""
        if n > self.max_len:
            raise ValueError(f"linformer: sequence length {n} exceeds max_len={self.max_len}")
        e = self.E[..., :n, :]
        f = e if self.F is None else self.F[..., :n, :]
        return e, f

    def forward(self, q, k, v, mask=None):
        n, p = q.shape[-2:]
        real = key_mask(full_mask(q, mask))[:, None, :, None].to(k.dtype)
        e, f = self.projections(n)
        # einsum, not e.transpose @ x: a (heads, n, k) projection broadcast over the batch is copied per sample
        # by matmul; einsum batches over the heads and moves the small x instead. One E: K and V in one product
        if f is e:
            kv = torch.einsum("hnk,bhnp->bhkp", e.expand(q.shape[1], -1, -1), torch.cat([k, v], -1) * real)
            k_proj, v_proj = kv.split(p, dim=-1)  # (b, h, k, p) each
        else:
            k_proj = torch.einsum("hnk,bhnp->bhkp", e.expand(q.shape[1], -1, -1), k * real)
            v_proj = torch.einsum("hnk,bhnp->bhkp", f.expand(q.shape[1], -1, -1), v * real)
        return scores(q, k_proj, p**-0.5).softmax(-1) @ v_proj


@dataclass(frozen=True)
class LinformerJLTOptions:
    k: int = 256  # sketch size (columns of S)
    redraw: str = "call"  # "call": fresh S every forward | "fixed": drawn once at construction

    def __post_init__(self):
        check_range("k", self.k, 1, None, integer=True)
        check_choice("redraw", self.redraw, ("call", "fixed"))


@register("linformer_jlt")
class LinformerJLTAttention(AttentionBackend):
    """Linformer w/ unreduced JLT: D⁻¹ A S Sᵀ V with a Gaussian sketch S (O(n²))."""

    Options = LinformerJLTOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        complexity="O(n^2)",
        notes="unbiased for softmax attention (E[S S^T] = I)",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        if options.redraw == "fixed":
            self.register_buffer("S", torch.randn(num_heads, max_len, options.k) / math.sqrt(options.k))
        else:
            self.register_buffer("S", None)

    def sketch(self, n: int, like: torch.Tensor) -> torch.Tensor:
        """S for length n: (heads, n, k)."""
        if self.S is None:
            s = torch.randn(self.num_heads, n, self.options.k, dtype=like.dtype, device=like.device)
            return s / math.sqrt(self.options.k)
        if n > self.max_len:
            raise ValueError(f"linformer_jlt: sequence length {n} exceeds max_len={self.max_len}")
        return self.S[:, :n].to(like.dtype)

    def forward(self, q, k, v, mask=None):
        n, p = q.shape[-2:]
        real = key_mask(full_mask(q, mask))
        s = self.sketch(n, q) * real[:, None, :, None]  # (b, h, n, k), padded rows zeroed
        scores = ((q @ k.transpose(-1, -2)) / math.sqrt(p)).masked_fill(~real[:, None, None, :], NEG_INF)
        v = v.masked_fill(~real[:, None, :, None], 0.0)
        return scores.softmax(-1) @ (s @ (s.transpose(-1, -2) @ v))
