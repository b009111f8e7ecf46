"""V-mean: the rank-one baseline of the Skeinformer paper (Chen, Zeng et al., NAACL 2022, §5-6).

Every position outputs the mean of the value rows of the real tokens, R = (1/m) 1 1ᵀ V, where m is
the number of real (unpadded) tokens of the sample. It is what adaptive row normalisation gives with
no sampled column (Skeinformer eq. 6 with d = 0), and the paper's Fig. 1 uses it as the reference
level that sampling methods must beat. O(n·p) time and memory.

Deviation from the paper: none in the formula; padding may sit anywhere (the mean is over the real
positions given by the mask, not over the first m). A sample with no real token averages all
positions so the output stays finite. Q and K are not used, so they receive no gradient.
"""

from __future__ import annotations

from attention.registry import AttentionBackend, Capabilities, full_mask, register
from attention.softmax import key_mask


@register("vmean")
class VMeanAttention(AttentionBackend):
    """V-mean baseline: every row outputs the mean of the real value rows (1/m 11ᵀV)."""

    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        complexity="O(n)",
        target="softmax",
        uses_qk=False,
        notes="rank-one 1/m 11^T V; ignores q and k (no gradient to them)",
    )

    def forward(self, q, k, v, mask=None):
        real = key_mask(full_mask(q, mask)).to(v.dtype)  # (b, n)
        weights = (real / real.sum(-1, keepdim=True))[:, None, :, None]  # (b, 1, n, 1): 1/m on real keys
        return (v * weights).sum(-2, keepdim=True).expand_as(v).clone()  # a weighted sum, not a masked copy of v
