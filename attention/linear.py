"""Linear Transformer (Katharopoulos et al., ICML 2020, "Transformers are RNNs"):

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + ε),     φ(x) = elu(x) + 1,

i.e. attention with the kernel sim(q, k) = φ(q)·φ(k) computed right-to-left, so the n×n matrix is
never formed. O(n·d²) time, O(n·d + d²) memory.

Padding: φ(k) of padded keys is set to 0, so they leave both the sum and the normaliser (the
official fast-transformers code does the same). ε (``eps``, 1e-6 as in fast-transformers) only
guards the division; φ > 0 makes the normaliser positive whenever a real key exists, and a sample
without real keys returns 0.

As in the paper there is no 1/√d temperature (φ is not scale-invariant, so adding one would
change the model). Computed in at least float32 with autocast off.

Public-code semantics (``paper`` presets). The LRA code of Nyströmformer and YOSO
(https://github.com/mlpen/Nystromformer ``LRA/code/attention_linear.py``, the same file in
``reorganized_code/encoders/backbones/efficient_attentions/`` and in https://github.com/mlpen/YOSO
``encoders/backbones/efficient_attentions/attention_linear.py``) computes

    out = Q' (K'ᵀ V'),   Q' = φ(Q)/n^¼,  K' = φ(K)·mask/n^¼,  V' = V·mask,

with n the padded sequence length (``Q.size(2)``) and **no** normaliser, i.e. φ(Q)(φ(K)ᵀV)/√n:
not the Katharopoulos model (each output is a sum over the real keys, so it grows with their
number). Two options reproduce it, each usable alone; the defaults are the paper's model:

* ``normaliser`` (default True): divide by φ(q_i)·Σ_j φ(k_j) + ε; False: the raw sum (their code).
* ``feature_scale`` (default ``"none"``): ``"seq_len_quarter"`` divides φ(q) and φ(k) by n^¼ with n
  the padded length (their code); with the normaliser on it cancels up to ε.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention.registry import (
    AttentionBackend,
    Capabilities,
    InvalidOption,
    check_choice,
    check_range,
    full_mask,
    register,
)


@dataclass(frozen=True)
class LinearOptions:
    eps: float = 1e-6  # added to the normaliser phi(q)·sum phi(k)
    # divide by phi(q)·sum phi(k) + eps (Katharopoulos); False: raw sum (Nystromformer/YOSO LRA code)
    normaliser: bool = True
    # none, or seq_len_quarter: phi(q), phi(k) divided by n^(1/4), n the padded length (LRA code)
    feature_scale: str = "none"

    def __post_init__(self):
        check_range("eps", self.eps, 0.0, 1.0)
        if not isinstance(self.normaliser, bool):
            raise InvalidOption(f"option 'normaliser' must be a bool, got {self.normaliser!r}")
        check_choice("feature_scale", self.feature_scale, ("none", "seq_len_quarter"))


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


@register("linear")
class LinearAttention(AttentionBackend):
    """Linear Transformer: elu+1 feature map with its normaliser."""

    Options = LinearOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=True,
        complexity="O(n)",
        target="elu+1 kernel",
        notes="O(n·d²); exact for its own kernel φ(q)·φ(k), φ = elu+1",
    )

    def forward(self, q, k, v, mask=None):
        with torch.autocast(q.device.type, enabled=False):  # Σφ(k) overflows fp16 ranges on long inputs
            return self._forward(q, k, v, mask)

    def _forward(self, q, k, v, mask):
        real = full_mask(q, mask)[:, None, :, None]
        dtype = torch.promote_types(q.dtype, torch.float32)
        phi_q = elu_feature_map(q.to(dtype))
        phi_k = elu_feature_map(k.to(dtype)).masked_fill(~real, 0.0)
        if self.options.feature_scale == "seq_len_quarter":  # the LRA code: both divided by n^(1/4)
            scale = math.sqrt(math.sqrt(q.shape[2]))
            phi_q, phi_k = phi_q / scale, phi_k / scale
        kv = phi_k.transpose(-1, -2) @ v.to(dtype).masked_fill(~real, 0.0)  # (b,h,d,d)
        if not self.options.normaliser:
            return (phi_q @ kv).to(q.dtype)
        normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (b,h,n,1)
        normaliser = (normaliser + self.options.eps).clamp_min(torch.finfo(dtype).tiny)
        return ((phi_q @ kv) / normaliser).to(q.dtype)
