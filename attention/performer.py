"""Performer / FAVOR+ (Choromanski et al., ICLR 2021): softmax attention through positive random features.

With x' = x/d^¼ (so that x'_q·x'_k = q·k/√d: the temperature 1/√d is applied once) and m random
vectors ω₁…ω_m, the positive random feature map of the paper ("SM⁺")

    φ(x) = exp(ω x' − ‖x'‖²/2) / √m,     E_ω[φ(q)·φ(k)] = exp(q·k/√d)   for ω ~ N(0, I_d),

gives out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), a linear-time estimate of softmax
attention. The ω are orthogonal random features (the paper's ORF): blocks of d orthonormal rows (QR of a
Gaussian matrix) with row lengths drawn as norms of Gaussian vectors, so each ω is marginally N(0, I)
and the estimator stays unbiased with lower variance.

Complexity: O(n·m·d) time, O(n·m + m·d) memory, m = ``features`` (default 256).

Randomness (``redraw``): ``"fixed"`` (default) draws ω once at construction from torch's RNG into a
buffer (saved with the model), as the LRA papers' code did; ``"per_call"`` draws new ω on every
forward from torch's RNG, as the paper's redrawing (performer-pytorch redraws every 1000 calls).

Deviations from the public wrappers (LRA_FACTS §6, peers §5.1, §5.9, §5.11, §5.13):
  * Temperature 1/√d once (the LRA wrappers pre-scale by d^-¼ and the kernel scales again: 1/d).
  * Padded keys are removed *after* the feature map (φ(k)=0), so they leave both the sum and the
    normaliser; zeroing k before the map does not, because φ(0) > 0.
  * Stabilisers cancel exactly and never cross samples: a per-row max for each query and, for keys,
    one max per (sample, head) over real keys only (not the whole batch, not padded keys). No eps is
    added inside the features, so the stabilisers cancel in the ratio exactly.
  * Features are computed in at least float32 with autocast off (fp16 underflows in the normaliser).
  * One ω is shared by all heads of a module (as performer-pytorch).
A sample without any real token is treated as all real so its output stays finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register
from attention.softmax import key_mask


@dataclass(frozen=True)
class PerformerOptions:
    features: int = 256  # m: positive random features (FAVOR+)
    redraw: str = "fixed"  # "fixed": drawn once at construction; "per_call": new ω every forward
    orthogonal: bool = True  # False: iid Gaussian ω (the plain positive random features)

    def __post_init__(self):
        check_range("features", self.features, 1, None, integer=True)
        check_choice("redraw", self.redraw, ("fixed", "per_call"))
        check_choice("orthogonal", self.orthogonal, (True, False))


def gaussian_orthogonal_features(m: int, d: int, *, orthogonal: bool = True, device=None,
                                 dtype=torch.float32) -> torch.Tensor:
    """(m, d) random matrix whose rows are marginally N(0, I_d); orthogonal within blocks of d rows."""
    if not orthogonal:
        return torch.randn(m, d, device=device, dtype=dtype)
    blocks = []
    for _ in range(math.ceil(m / d)):
        qmat, rmat = torch.linalg.qr(torch.randn(d, d, device=device, dtype=dtype))
        qmat = qmat * torch.sign(torch.diagonal(rmat))  # unique QR: Haar-distributed (LAPACK signs are not)
        blocks.append(qmat.T)  # rows orthonormal
    rows = torch.cat(blocks)[:m]
    lengths = torch.randn(m, d, device=device, dtype=dtype).norm(dim=1)  # chi(d): length of a Gaussian vector
    return rows * lengths[:, None]


def favor_attention(q, k, v, keep, omega):
    """FAVOR+ with a given ω (m, d); q, k, v (b, h, n, d), keep (b, n) bool with a True per row."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    d = q.shape[-1]
    m = omega.shape[0]
    scale = d ** -0.25
    qs, ks, vs = q.to(dtype) * scale, k.to(dtype) * scale, v.to(dtype)
    omega = omega.to(dtype)
    a_q = qs @ omega.T - 0.5 * qs.square().sum(-1, keepdim=True)  # (b,h,n,m) log φ(q)·√m
    a_k = ks @ omega.T - 0.5 * ks.square().sum(-1, keepdim=True)
    a_k = a_k.masked_fill(~keep[:, None, :, None], float("-inf"))  # padded keys: φ(k) = 0
    # Stabilisers cancel in the ratio: per query row; per (sample, head) over real keys for keys.
    c_q = a_q.amax(dim=-1, keepdim=True).detach()
    c_k = a_k.amax(dim=(-1, -2), keepdim=True).detach()
    phi_q = torch.exp(a_q - c_q) / math.sqrt(m)
    phi_k = torch.exp(a_k - c_k) / math.sqrt(m)
    kv = phi_k.transpose(-1, -2) @ vs  # (b,h,m,d)
    normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (b,h,n,1)
    out = (phi_q @ kv) / normaliser.clamp_min(torch.finfo(dtype).tiny)
    return out.to(q.dtype)


@register("performer")
class PerformerAttention(AttentionBackend):
    """Performer FAVOR+: positive orthogonal random features for softmax attention."""

    Options = PerformerOptions
    capabilities = Capabilities(padding_mask=True, exact=False, randomized=True, complexity="O(n)",
                                target="softmax", notes="O(n·m·d); redraw='fixed' or 'per_call'")

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        if options.redraw == "fixed":
            self.register_buffer("omega", self.draw_features())
        else:
            self.omega = None

    def draw_features(self, device=None) -> torch.Tensor:
        """A new (features, head_dim) ω from torch's RNG."""
        o = self.options
        return gaussian_orthogonal_features(o.features, self.head_dim, orthogonal=o.orthogonal, device=device)

    def forward(self, q, k, v, mask=None):
        keep = key_mask(full_mask(q, mask))
        omega = self.omega if self.omega is not None else self.draw_features(q.device)
        with torch.autocast(q.device.type, enabled=False):  # fp16 underflows in the normaliser
            return favor_attention(q, k, v, keep, omega)
