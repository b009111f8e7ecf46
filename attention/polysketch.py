"""Polynomial attention and PolySketchFormer (Kacham, Mirrokni, Zhong, "PolySketchFormer: Fast
Transformers via Sketches for Polynomial Kernels", ICLR 2024).

``polynomial`` (exact, the paper's Sec. 1 definition with the official code's stabiliser; an extra
registered name, not a row of the papers' tables, kept as the reference polysketch approximates):
for even p,

    out_i = Σ_j (q_i·k_j)^p v_j / (β + Σ_j (q_i·k_j)^p),

β = ``normalizer_bias`` = 1 ("the constant we add in the denominator to make the computation
stable", official ``polynomial_attention.py``; β = 0 is the plain row normalisation). O(n²·d) time,
O(n²) memory. Causal: j ≤ i.

``polysketch`` (Secs. 2-4, degree p = 4): a degree-2 polynomial sketch φ₂: R^d → R^r with
E[φ₂(x)·φ₂(y)] = (x·y)², then self-tensoring φ₄(x) = φ₂(x) ⊗ φ₂(x) ∈ R^{r²} (Sec. 2.1), so that
φ₄(q)·φ₄(k) = (φ₂(q)·φ₂(k))² ≥ 0 approximates (q·k)⁴ and every attention weight is non-negative.
The output is eq. (2) with the same stabiliser:

    out = [φ₄(Q) (φ₄(K)ᵀ [V, 1])]  →  out_i = num_i / (β + den_i),

computed right to left: O(n·r²·d) time, O(n·r²) memory, r = ``sketch_size`` (default 32, the
paper's; r² = 1024 features). Causal: the same with lt(φ₄(Q)φ₄(K)ᵀ)[V, 1], evaluated by the block
lower-triangular algorithm of Sec. 3 / Fig. 4 (:func:`causal_block_lower_triangular`, block size
``block_size``, 256 in the paper): exact products inside each diagonal block plus the running sum
of the earlier blocks' φ₄(K_l)ᵀ[V_l, 1], O(n·b·r² + n·r²·d) time.

The degree-2 sketch (``sketch="srht"``, Sec. 2, Defs. 2.3-2.4, Ahle et al. 2020): two independent
SRHTs S₁, S₂ (here with sketch size d' = head_dim rounded up to a power of two, i.e. the
orthonormal randomised Hadamard rotation H D/√d', since d' ≤ r and nothing is gained by
subsampling), then a TensorSRHT (D₃, D₄, P₁, P₂): φ₂(x) = (1/√r)·(P₁ H D₃ S₁x) ⊙ (P₂ H D₄ S₂x),
with H the ±1 Walsh–Hadamard matrix and P_i sampling r coordinates uniformly with replacement.
Each branch is linear, so it is stored as a d × r matrix and φ₂ costs two matmuls.
``sketch="gaussian"`` is the official code's default form, φ₂(x) = (1/√r)(xG₁) ⊙ (xG₂) with i.i.d.
N(0, 1) G_i. Both are unbiased for (x·y)².

q and k pass through a LayerNorm over head_dim (learned, shared by q and k, eps 1e-5) before the
kernel, as the official model does for polynomial and sketched attention (``qk_norm="layernorm"``;
``"none"`` feeds them raw). After the LayerNorm (‖q‖² ≈ d) the stabiliser β = 1 is small next to
Σ_j (q·k_j)⁴.

Accuracy (float64, d = 16, n = 128, keys near their queries, mean of 4 seeds): relative output error
against ``polynomial`` 0.94 / 0.68 / 0.36 / 0.16 at r = 8 / 32 / 128 / 512 (≈ 1/√r for large r;
0.89 at r = 32 with unrelated random q, k) — the paper's remark that these sketch sizes preserve
dot products of vectors with negative entries poorly, so polysketch is its own attention
"inspired by" the polynomial one rather than a close approximation of it.

Deviations: (i) the official code scales each Gaussian branch by 1/√r, so its φ₂(q)·φ₂(k)
estimates (q·k)²/r and its φ₄ products (q·k)⁴/r²; here φ₂ carries 1/√r in total so the sketch is
unbiased and the stabiliser β means the same as in exact polynomial attention (the only effect of
the official scale is a β that is r² times larger). (ii) The sketch is used bidirectionally with
padding (LRA): φ₄ of padded keys is zeroed, so they leave both numerator and denominator. (iii) The
block algorithm pads n up to a multiple of the block size internally (the paper needs b | n). (iv)
Computed in at least float32 with autocast off ((q·k)⁴ row sums overflow float16). (v) The sketch is
degree 4 only (the paper's setting); exact ``polynomial`` takes any even p.
Randomness: the sketch is drawn once per module and head at construction (``redraw="fixed"``, the
paper: "for each attention head in each layer, we independently sample a sketching matrix") from
torch's global RNG, or redrawn every call (``redraw="per_call"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attention.registry import (
    AttentionBackend,
    Capabilities,
    InvalidOption,
    check_choice,
    check_range,
    full_mask,
    register,
)
from attention.softmax import key_mask


# ------------------------------------------------------------------------------ library functions
def hadamard(n: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """The n × n ±1 Walsh–Hadamard matrix (Sylvester), n a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _rademacher(*shape, dtype, device, generator=None) -> torch.Tensor:
    return torch.randint(0, 2, shape, device=device, generator=generator).to(dtype) * 2 - 1


def draw_degree2_sketch(
    heads: int,
    dim: int,
    r: int,
    kind: str = "srht",
    *,
    dtype=torch.float32,
    device=None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The two linear branches of a degree-2 sketch, stacked: (2, heads, dim, r).

    φ₂(x) = (x A₀) ⊙ (x A₁) / √r  with E[φ₂(x)·φ₂(y)] = (x·y)².
    """
    if kind == "gaussian":
        return torch.randn(2, heads, dim, r, dtype=dtype, device=device, generator=generator)
    d2 = 1 << max(0, (dim - 1).bit_length())  # head_dim rounded up to a power of two
    h = hadamard(d2, dtype=dtype, device=device)
    branches = []
    for _ in range(2):
        d_base = _rademacher(heads, d2, dtype=dtype, device=device, generator=generator)
        d_tensor = _rademacher(heads, d2, dtype=dtype, device=device, generator=generator)
        cols = torch.randint(0, d2, (heads, r), device=device, generator=generator)
        base = d_base[:, :, None] * h / math.sqrt(d2)  # x ↦ x·(D H/√d'): the SRHT rotation S_i
        inner = d_tensor[:, :, None] * h  # u ↦ u·(D H): coordinates of H D u
        inner = inner.gather(2, cols[:, None, :].expand(-1, d2, -1))  # P: sample r coordinates
        branches.append((base @ inner)[:, :dim, :])  # zero-padded input rows drop out
    return torch.stack(branches)


def degree2_features(x: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
    """φ₂(x): x (b, h, n, d), sketch (2, h, d, r) -> (b, h, n, r)."""
    a, b = sketch.to(x.dtype).unbind(0)
    r = a.shape[-1]
    return torch.einsum("bhnd,hdr->bhnr", x, a) * torch.einsum("bhnd,hdr->bhnr", x, b) / math.sqrt(r)


def self_tensor(phi: torch.Tensor) -> torch.Tensor:
    """φ ⊗ φ flattened: (..., r) -> (..., r²); (φ(x)⊗φ(x))·(φ(y)⊗φ(y)) = (φ(x)·φ(y))² ≥ 0."""
    return (phi[..., :, None] * phi[..., None, :]).flatten(-2)


def causal_block_lower_triangular(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, block_size: int
) -> torch.Tensor:
    """lt(φ_Q φ_Kᵀ) V without forming the n × n matrix (PolySketchFormer Sec. 3, Fig. 4).

    phi_q, phi_k (..., n, f), v (..., n, e) -> (..., n, e), row i = Σ_{j ≤ i} (φ_q,i·φ_k,j) v_j.
    Blocks of ``block_size`` rows: the diagonal blocks are multiplied exactly under a lower-triangular
    mask, the rest through the exclusive prefix sum of the blocks' φ_K,lᵀ V_l. n need not be a
    multiple of the block size (the tail is zero-padded and cut off again).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = phi_q.shape[-2]
    nb = -(-n // block_size)
    pad = nb * block_size - n
    if pad:
        phi_q, phi_k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
    lead = phi_q.shape[:-2]
    qb = phi_q.reshape(*lead, nb, block_size, phi_q.shape[-1])
    kb = phi_k.reshape(*lead, nb, block_size, phi_k.shape[-1])
    vb = v.reshape(*lead, nb, block_size, v.shape[-1])
    tri = torch.ones(block_size, block_size, dtype=torch.bool, device=v.device).tril()
    local = ((qb @ kb.transpose(-1, -2)) * tri) @ vb
    summaries = kb.transpose(-1, -2) @ vb  # (..., nb, f, e)
    prefix = summaries.cumsum(-3) - summaries  # Σ over earlier blocks only
    out = local + qb @ prefix
    return out.reshape(*lead, nb * block_size, v.shape[-1])[..., :n, :]


# ------------------------------------------------------------------------------------- modules
def _normalise(num_den: torch.Tensor, bias: float) -> torch.Tensor:
    num, den = num_den[..., :-1], num_den[..., -1:]
    return num / (bias + den).clamp_min(torch.finfo(num.dtype).tiny)


class _PolyBase(AttentionBackend):
    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        self.qk_norm = nn.LayerNorm(head_dim, eps=1e-5) if options.qk_norm == "layernorm" else None

    def forward(self, q, k, v, mask=None):
        with torch.autocast(q.device.type, enabled=False):  # (q·k)^4 sums overflow float16
            work = torch.promote_types(q.dtype, torch.float32)
            return self._forward(q.to(work), k.to(work), v.to(work), mask).to(q.dtype)

    def _inputs(self, q, k, v, mask):
        real = key_mask(full_mask(q, mask))[:, None, :, None]  # (b,1,n,1)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q), self.qk_norm(k)
        k = torch.where(real, k, 0.0)
        v1 = torch.cat([torch.where(real, v, 0.0), torch.ones_like(v[..., :1])], dim=-1)  # [V, 1]
        return q, k, v1, real


def _check_common(o) -> None:
    check_range("normalizer_bias", o.normalizer_bias, 0.0, None)
    check_choice("causal", o.causal, (False, True))
    check_choice("qk_norm", o.qk_norm, ("layernorm", "none"))


@dataclass(frozen=True)
class PolynomialOptions:
    degree: int = 4  # p: the even power of the kernel (q·k)^p
    normalizer_bias: float = 1.0  # added to each row's normaliser
    causal: bool = False  # attend to earlier positions only
    qk_norm: str = "layernorm"  # normalise q and k before the kernel (layernorm) or not

    def __post_init__(self):
        check_range("degree", self.degree, 2, 64, integer=True)
        if self.degree % 2:
            raise InvalidOption(f"option 'degree'={self.degree!r} must be even (non-negative weights)")
        _check_common(self)


@register("polynomial")
class PolynomialAttention(_PolyBase):
    """Exact degree-p polynomial attention (q·k)^p / (β + Σ (q·k)^p), the PolySketch target."""

    Options = PolynomialOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=True,
        exact=True,
        complexity="O(n^2)",
        target="polynomial",
        notes="beta=1 stabiliser in the row normaliser",
    )

    def _forward(self, q, k, v, mask):
        o = self.options
        q, k, v1, real = self._inputs(q, k, v, mask)
        w = (q @ k.transpose(-1, -2)) ** o.degree
        keep = real.transpose(-1, -2)  # (b,1,1,n)
        if o.causal:
            n = q.shape[-2]
            keep = keep & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        w = torch.where(keep, w, 0.0)
        return _normalise(w @ v1, o.normalizer_bias)


@dataclass(frozen=True)
class PolySketchOptions:
    sketch_size: int = 32  # r
    sketch: str = "srht"  # SRHT/TensorSRHT (the paper) or dense Gaussian sketches
    redraw: str = "fixed"  # fixed: sketches drawn once per module; per_call: every forward
    normalizer_bias: float = 1.0  # added to each row's normaliser
    causal: bool = False  # attend to earlier positions only (block lower-triangular)
    block_size: int = 256  # block length of the causal block lower-triangular product
    qk_norm: str = "layernorm"  # normalise q and k before sketching (layernorm) or not

    def __post_init__(self):
        check_range("sketch_size", self.sketch_size, 1, 1024, integer=True)
        check_choice("sketch", self.sketch, ("srht", "gaussian"))
        check_choice("redraw", self.redraw, ("fixed", "per_call"))
        check_range("block_size", self.block_size, 1, None, integer=True)
        _check_common(self)


@register("polysketch")
class PolySketchAttention(_PolyBase):
    """PolySketch: degree-2 sketch, self-tensored to a non-negative degree-4 kernel; linear in n."""

    Options = PolySketchOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=True,
        exact=False,
        randomized=True,
        complexity="O(n r^2 d)",
        target="polynomial",
        notes="degree 4; causal via block lower-triangular algorithm (any n)",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        fixed = options.redraw == "fixed"
        sk = self.draw_sketch(num_heads, head_dim) if fixed else torch.empty(0)
        self.register_buffer("sketch_matrices", sk, persistent=fixed)

    def draw_sketch(self, heads: int, dim: int, device=None) -> torch.Tensor:
        return draw_degree2_sketch(heads, dim, self.options.sketch_size, self.options.sketch, device=device)

    def features(self, x: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
        """φ₄(x) = φ₂(x) ⊗ φ₂(x): (b, h, n, d) -> (b, h, n, r²)."""
        return self_tensor(degree2_features(x, sketch))

    def _forward(self, q, k, v, mask):
        o = self.options
        q, k, v1, real = self._inputs(q, k, v, mask)
        sk = self.sketch_matrices if o.redraw == "fixed" else self.draw_sketch(q.shape[1], q.shape[-1], q.device)
        phi_q = self.features(q, sk)
        phi_k = self.features(k, sk) * real.to(q.dtype)  # padded keys: zero features
        if o.causal:
            num_den = causal_block_lower_triangular(phi_q, phi_k, v1, o.block_size)
        else:
            num_den = phi_q @ (phi_k.transpose(-1, -2) @ v1)
        return _normalise(num_den, o.normalizer_bias)
