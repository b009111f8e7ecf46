"""Linformer (Wang et al., "Linformer: Self-Attention with Linear Complexity", 2020) and the unreduced
Johnson-Lindenstrauss form it departs from (Skeinformer paper, §3.3 and Table 1 "w/ unreduced JLT").

``linformer``: learned projections E, F ∈ R^{n×k} (k = sketch size, option ``k``, 256 in the
Skeinformer paper) compress keys and values along the sequence:
    head = softmax(Q (Eᵀ K)ᵀ / √p) (Fᵀ V),        O(n·k·p) time, O(n·k) memory.
Parameter sharing (Linformer §4, option ``sharing``):
  * ``none``: one E_i and one F_i per head (shape (heads, max_len, k) each);
  * ``headwise``: E_i = E, F_i = F across heads;
  * ``kv``: E_i = F_i = E across heads (one (max_len, k) matrix);
  * ``layerwise``: one matrix for all layers, heads, K and V. A module here is one layer's
    attention, so inside it this is the same single matrix as ``kv``; sharing it across layers means
    tying the ``E`` parameters of the layers' modules (the model's job, as for any weight tying). We do
    not share through class attributes (the LRA seed code did, tying every model in the process).
E and F are registered ``nn.Parameter``s created in ``__init__`` with N(0, 1/k) entries (so that
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

Deviations: the LRA seed code's Linformer E was never registered (``Parameter(...).to(device)``), so
it was a frozen random projection; here E/F train and are saved. Its init was N(0, 0.02); ours is the
JL scaling above. No attention dropout (no efficient backend in the papers used one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register
from attention.softmax import key_mask

NEG_INF = float("-inf")


@dataclass(frozen=True)
class LinformerOptions:
    k: int = 256  # projected length (sketch size)
    sharing: str = "none"  # none | headwise | kv | layerwise

    def __post_init__(self):
        check_range("k", self.k, 1, None, integer=True)
        check_choice("sharing", self.sharing, ("none", "headwise", "kv", "layerwise"))


@register("linformer")
class LinformerAttention(AttentionBackend):
    """Linformer: softmax(Q (EᵀK)ᵀ/√p) FᵀV with learned n→k projections E, F."""

    Options = LinformerOptions
    capabilities = Capabilities(padding_mask=True, exact=False, complexity="O(n k)",
                                notes="learned E,F of shape (max_len, k); shorter inputs slice them")

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        kk, std = options.k, 1.0 / math.sqrt(options.k)
        shape = (num_heads, max_len, kk) if options.sharing == "none" else (max_len, kk)
        self.E = nn.Parameter(torch.randn(shape) * std)
        if options.sharing in ("none", "headwise"):
            self.F = nn.Parameter(torch.randn(shape) * std)
        else:  # kv / layerwise: F is E
            self.register_parameter("F", None)

    def projections(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """E and F restricted to the first n positions: (heads or 1, n, k) each."""
        if n > self.max_len:
            raise ValueError(f"linformer: sequence length {n} exceeds max_len={self.max_len}")
        e = self.E[..., :n, :]
        f = e if self.F is None else self.F[..., :n, :]
        return e, f

    def forward(self, q, k, v, mask=None):
        n, p = q.shape[-2:]
        real = key_mask(full_mask(q, mask))[:, None, :, None]
        e, f = self.projections(n)
        k_proj = e.transpose(-1, -2) @ k.masked_fill(~real, 0.0)  # (b, h, k, p)
        v_proj = f.transpose(-1, -2) @ v.masked_fill(~real, 0.0)
        return ((q @ k_proj.transpose(-1, -2)) / math.sqrt(p)).softmax(-1) @ v_proj


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
    capabilities = Capabilities(padding_mask=True, exact=False, randomized=True, complexity="O(n^2)",
                                notes="unbiased for softmax attention (E[S S^T] = I)")

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
