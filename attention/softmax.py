"""Standard scaled dot-product attention (Vaswani et al., 2017): softmax(QKᵀ/√d)V.

Two implementations behind one option:
  * ``impl="fused"``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
    kernels where the device has them); O(n²) time, O(n) extra memory on CUDA.
  * ``impl="materialized"``: builds the n×n score matrix as the papers' code did (their "Standard"
    row, whose memory forced gradient accumulation in Skeinformer Table 4); O(n²) time and memory.
Padding: padded keys are excluded from every row; rows of padded queries still attend to the real
keys (their output is ignored downstream). A sample with no real token attends to all positions so
its output stays finite. Attention dropout (``dropout``, 0.1 in the papers; 0 for "w/o dropout")
is applied to the probabilities in training only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention._scores import key_bias, scores
from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register


@dataclass(frozen=True)
class SoftmaxOptions:
    dropout: float = 0.1  # dropout on the attention weights (the papers' Standard: 0.1)
    impl: str = "fused"  # fused: SDPA kernels; materialized: the n x n matrix, as the papers
    causal: bool = False  # attend to earlier positions only

    def __post_init__(self):
        check_range("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_choice("impl", self.impl, ("fused", "materialized"))
        check_choice("causal", self.causal, (False, True))


def key_mask(mask: torch.Tensor) -> torch.Tensor:
    """Key mask with all-padding samples opened up, so no row is empty: (batch, n) bool."""
    return mask | ~mask.any(dim=-1, keepdim=True)


@register("softmax")
class SoftmaxAttention(AttentionBackend):
    """Exact softmax attention (fused SDPA or materialised n×n)."""

    Options = SoftmaxOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=True,
        exact=True,
        complexity="O(n^2)",
        notes="impl=fused uses SDPA; impl=materialized reproduces the papers' memory",
    )

    def forward(self, q, k, v, mask=None):
        o = self.options
        keep = key_mask(full_mask(q, mask))[:, None, None, :]  # (b,1,1,n)
        p = o.dropout if self.training else 0.0
        if o.causal:
            n = q.shape[-2]
            keep = keep & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        if o.impl == "fused":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
        s = scores(q, k, q.shape[-1] ** -0.5, key_bias(keep, q.dtype))  # masked by a bias: attention/_scores.py
        attn = F.dropout(s.softmax(dim=-1), p=p, training=self.training)
        return attn @ v
