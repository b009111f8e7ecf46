"""YOSO attention (Zeng et al., "You Only Sample (Almost) Once: Linear Cost Self-Attention Via
Bernoulli Sampling", ICML 2021): attention weights are LSH collision probabilities.

With q̂ = q/‖q‖, k̂ = k/‖k‖ and τ-bit random-hyperplane (SimHash) hashing, a query and a key collide
with probability (paper eq. 6)

    w(q̂·k̂) = (1 − arccos(q̂·k̂)/π)^τ,

and the output is  out_i = normalise(Σ_j w_ij v_j)  (eq. 8: the L2 normalisation of each output
row replaces softmax's row sums; ``output_norm="none"`` keeps the raw sum). Padded keys contribute
nothing; there is no 1/√d temperature (τ sets the sharpness).

``yoso_e``: the expectation, w computed exactly; O(n²·d) time and O(n²) memory.
``yoso``: YOSO-m. For each of m = ``num_hashes`` hashes (τ = ``hash_bits`` hyperplanes each) the
  Bernoulli matrix B_ij = 1[h(q_i) = h(k_j)] is never formed: the values of the real keys are
  added into a table of 2^τ buckets by key code and each query reads its own bucket back (the
  bucket-sum trick of Sec. 3.2), and the m results are averaged: E[out] = YOSO-E. Pure torch
  (index_add_/index_select), no custom CUDA. O(m·n·(τd + d)) time, O(n·d + 2^τ·d) memory per
  hash (hashes run one after another) plus the m·n int64 codes kept for backward. The backward
  costs O(m·(n + 2^τ)·d·d_v) time, the price of the paper's scheme (its d runs of the cumulation):
  on one CPU thread, b·h = 4, n = 4096, d = 32, m = 32, τ = 12 take ≈ 0.3 s forward, ≈ 8 s backward.
  Accuracy (float64, d = 16, n = 128, τ = 8, keys near queries, mean of 3 seeds, raw sums):
  relative error against yoso_e 1.49 / 0.75 / 0.38 / 0.19 at m = 4 / 16 / 64 / 256, i.e. ∝ 1/√m.
``yoso_conv``: YOSO-C, ``yoso`` plus a depthwise convolution over the sequence of the (masked) V,
  one learned filter of ``conv_kernel`` taps per head, added to the output (bias-free).

Backward (``yoso``): the paper's lower-bound surrogate (eq. 13). The true derivative
τ(1 − θ/π)^{τ−1}/(π√(1 − x²)) of the collision probability is unbounded as x → ±1, so the paper
replaces it by (τ/2)·w(x) ≤ it, which is again a collision probability and hence estimated with the
same hashes: ∂L/∂q̂_i = (τ/2)·mean_hash Σ_j B_ij (g_i·v_j) k̂_j, computed by scattering the outer
products v_j k̂_jᵀ into the buckets (chunked over value dimensions so memory stays linear in n);
∂L/∂k̂_j likewise with g_i q̂_iᵀ; ∂L/∂V is exact for the sampled B. The gradient flows on through
the normalisations of q and k by autograd. ``yoso_e`` uses the same surrogate by default
(``backward="lower_bound"``, so it is the m → ∞ limit of ``yoso`` in both passes) or the true
derivative (``backward="exact"``, evaluated at x clamped to |x| ≤ 1 − 1e-6).

Defaults from the YOSO LRA configs (``LRA/models/yoso-v1-32``, ``yoso-v2-16``): ``hash_bits`` = τ
= ⌈log2(max_len)⌉ when left at None, which gives their per-task values (ListOps 2000 → 11, Text and
Retrieval 4000 → 12, Image and Pathfinder 1024 → 10); m = 32 for ``yoso`` (YOSO-32), m = 16 for
``yoso_conv`` (YOSO-C-16), conv kernel 35 (the Nyströmformer LRA convolution the paper says it
borrowed; the configs do not state YOSO-C's size).

Deviations (clean defaults): hyperplanes are dense Gaussian (exact SimHash probabilities) instead
of the public code's fast Hadamard hash; everything runs in float32 or wider with autocast off;
index_add_ on CUDA sums in a nondeterministic order (bitwise reproducibility only on CPU); q and k
are normalised in eval too (the public code skips it there since hashing is scale-invariant; the
same codes up to a sign flip of a projection within rounding of 0). Randomness: the m·τ hyperplanes
(independent per head, shared across the batch) are redrawn from torch's global RNG every call
(``redraw="per_call"``, as the public code) or drawn once at construction (``redraw="fixed"``).
A sample without real tokens is treated as all real.

Public-code semantics (``paper`` presets). The YOSO LRA code (https://github.com/mlpen/YOSO,
``encoders/backbones/efficient_attentions/yoso/yoso_v1/yoso.py`` ``YOSOAttention``/``YOSOEAttention``,
``kernel.py``, CUDA kernels in ``yoso_v1/cuda/fast_lsh_cumulation_cuda.cu``; configs
``LRA/models/yoso-v1-32/config.json``: ``use_fast_hash`` true, ``n2_backward`` false) differs from the
defaults as follows; each option can be set alone and the default is the corrected form:

* ``hash_family`` (``yoso``; default ``"gaussian"``): ``"hadamard"`` is the code's ``fast_hash``: the
  head dim zero-padded to W = max(32, next power of two), y = H·D₃·H·D₂·H·D₁·x with H the
  unnormalised Sylvester Hadamard matrix and D_i random ±1 diagonals, code j of a transform taken from
  the signs of y_{jτ}, …, y_{jτ+τ−1} (⌊W/τ⌋ codes per transform, as many transforms as m needs). The τ
  hyperplanes of a code are then orthogonal, so collisions are rarer than (1 − θ/π)^τ for dissimilar
  pairs (d = 32, τ = 10: ≈ 0.58× at cos 0, 0.82× at cos 0.6, 0.96× at cos 0.9): YOSO-m is then not an
  unbiased estimate of YOSO-E. Hyperplanes are built as explicit columns H·D·H·D·H·D (O(W²) per
  transform), not the fast O(W log W) butterfly; codes agree except at projections within rounding of 0.
* ``draw_per_sample`` (``yoso``; default False): the code draws its projections (``hashing``'s ``rmat``,
  ``fast_hash``'s ``Dmat``) for every (sample, head) row of the flattened batch; True does so
  (needs ``redraw="per_call"``). The default draws per head, shared by the batch.
* ``zero_padded_queries`` (all; default False): the CUDA kernels skip masked queries (and YOSO-E
  multiplies by the query mask), so padded rows output 0, plus the conv term; the default computes
  them like real rows. Real rows are the same either way.
* ``norm_eps`` (all; default 1e-6): the code's ``F.normalize`` uses eps 1e-12 for q, k and the output.
* ``cos_scale`` (``yoso_e``; default 1): ``yoso_v2/kernel.py`` ``yoso_e`` multiplies q̂·k̂ by 0.98 before
  arccos and differentiates by autograd (``backward="exact"``); ``yoso_v1`` ``YOSOEAttention`` uses
  1 with the lower-bound backward (the default here). The ``yoso`` backward (lower-bound surrogate
  estimated with the same hashes, ``n2_backward`` false) is the code's.

Not reproduced: ``YOSOEAttention`` has no clamp before ``acos`` (NaN where rounding puts |q̂·k̂| above
1; here clamped); the CUDA grids use n/8 (forward) and n/(256/m) (backward sort) blocks, so tokens
past the last multiple are dropped when n is not a multiple of 8 (resp. 256/m); the fast hash needs a
power-of-two head dim (the kernel is wrong otherwise; here it is zero-padded); the v2 kernels
(``yoso-v2-16``: a backward weighting each collision by an interpolated τ·p^{τ−1}/(π√(1−x²))) are not
implemented. No LRA config sets YOSO-C's ``conv_window`` (the efficiency scripts use 33; 35 here is
the Nyströmformer LRA value); the conv itself (depthwise, bias-free, on V·mask, added after the output
normalisation) is the code's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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

_CHUNK_ELEMENTS = 1 << 24  # transient scatter source in the backward: at most this many elements
_MAX_HASH_BITS = 20


def collision_probability(x: torch.Tensor, tau: float) -> torch.Tensor:
    """(1 − arccos(x)/π)^τ, the probability that τ random hyperplanes put two unit vectors with
    cosine x on the same side each time."""
    return (1 - torch.arccos(x.clamp(-1.0, 1.0)) / math.pi) ** tau


def auto_hash_bits(max_len: int) -> int:
    """τ = ⌈log2(max_len)⌉ (the YOSO LRA configs' per-task values), within [1, 20]."""
    return min(max(math.ceil(math.log2(max(max_len, 2))), 1), _MAX_HASH_BITS)


def draw_hyperplanes(
    heads: int,
    num_hashes: int,
    dim: int,
    bits: int,
    *,
    batch: int | None = None,
    device=None,
    dtype=torch.float32,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Gaussian hyperplanes (heads, num_hashes, dim, bits), or (batch, heads, …) when ``batch`` is given."""
    lead = (heads,) if batch is None else (batch, heads)
    return torch.randn(*lead, num_hashes, dim, bits, device=device, dtype=dtype, generator=generator)


def hadamard_dim(head_dim: int) -> int:
    """Width of the fast-hash transform: the head dim zero-padded to a power of two, at least 32 (the
    YOSO code pads head dims below 32 to 32; its kernel needs a power of two)."""
    return max(32, 1 << (head_dim - 1).bit_length())


def hadamard_parts(num_hashes: int, bits: int, width: int) -> int:
    """Number of H·D·H·D·H·D transforms the fast hash needs: each yields ⌊width/τ⌋ codes."""
    return max(1, math.ceil(num_hashes / (width // bits)))


def draw_hadamard_signs(
    heads: int,
    num_parts: int,
    width: int,
    *,
    batch: int | None = None,
    device=None,
    dtype=torch.float32,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random ±1 diagonals (heads, 3, num_parts, width), or (batch, heads, …) with ``batch``."""
    lead = (heads,) if batch is None else (batch, heads)
    bits = torch.randint(0, 2, (*lead, 3, num_parts, width), device=device, generator=generator)
    return (2 * bits - 1).to(dtype)


def sylvester_hadamard(width: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """The unnormalised Sylvester Hadamard matrix H (width a power of two): H_1 = [1],
    H_2k = [[H_k, H_k], [H_k, −H_k]]; symmetric, H² = width·I."""
    h = torch.ones(1, 1, device=device, dtype=dtype)
    while h.shape[0] < width:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_planes(signs: torch.Tensor, head_dim: int, bits: int, num_hashes: int) -> torch.Tensor:
    """The hyperplanes of the YOSO fast hash, as columns: signs (…, 3, P, W) -> planes (…, m, head_dim, τ).

    Part p maps the zero-padded x ∈ R^W to y = H S₃ H S₂ H S₁ x (S_i = diag(signs[…, i−1, p, :])),
    and code j of that part takes the signs of y_{jτ}, …, y_{jτ+τ−1}; codes are numbered part by part
    (p·⌊W/τ⌋ + j) and the first m kept. So y = x·R with R = S₁ H S₂ H S₃ H, whose columns are the
    hyperplanes: τ mutually orthogonal ones per code, instead of independent Gaussian ones.
    """
    width = signs.shape[-1]
    per_part = width // bits
    h = sylvester_hadamard(width, device=signs.device, dtype=signs.dtype)
    s1, s2, s3 = signs.unbind(-3)  # each (…, P, W)
    r = h @ (s3[..., :, None] * h)
    r = s1[..., :, None] * (h @ (s2[..., :, None] * r))  # (…, P, W, W)
    r = r[..., :head_dim, : per_part * bits].unflatten(-1, (per_part, bits))  # (…, P, d, per_part, τ)
    return r.movedim(-2, -3).flatten(-4, -3)[..., :num_hashes, :, :]


def simhash_codes(x: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """Bucket codes Σ_t 1[x·r_t > 0]·2^t: x (b, h, n, d), planes (h, m, d, τ) or per sample
    (b, h, m, d, τ) -> int64 (b, h, m, n)."""
    bits = planes.shape[-1]
    weights = (2 ** torch.arange(bits, device=x.device)).to(torch.int64)
    spec = "bhnd,hdt->bhnt" if planes.dim() == 4 else "bhnd,bhdt->bhnt"
    codes = [
        ((torch.einsum(spec, x, planes[..., t, :, :].to(x.dtype)) > 0).to(torch.int64) * weights).sum(-1)
        for t in range(planes.shape[-3])
    ]
    return torch.stack(codes, dim=2)


def bucket_sum(codes_src: torch.Tensor, src: torch.Tensor, codes_dst: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Σ_{j: codes_src[j] = codes_dst[i]} src_j for every i: the bucket-sum trick for one hash.

    codes_src (b, h, n_src), src (b, h, n_src, f), codes_dst (b, h, n_dst) -> (b, h, n_dst, f).
    One flat table of b·h·2^τ rows (index_add_/index_select: faster than scatter_add/gather).
    """
    b, h, _, f = src.shape
    offset = (torch.arange(b * h, device=src.device) * num_buckets).view(b, h, 1)
    table = src.new_zeros(b * h * num_buckets, f)
    table.index_add_(0, (codes_src + offset).flatten(), src.reshape(-1, f))
    return table.index_select(0, (codes_dst + offset).flatten()).view(b, h, -1, f)


class _LSHCumulation(torch.autograd.Function):
    """out_i = mean_hash Σ_j 1[h(q_i) = h(k_j)] v_j, with the lower-bound surrogate backward."""

    @staticmethod
    def forward(ctx, qn, kn, v, codes_q, codes_k, tau):
        m = codes_q.shape[2]
        nb = 2 ** int(tau)
        out = v.new_zeros(qn.shape[:3] + (v.shape[-1],))
        for t in range(m):
            out += bucket_sum(codes_k[:, :, t], v, codes_q[:, :, t], nb)
        ctx.save_for_backward(qn, kn, v, codes_q, codes_k)
        ctx.tau = tau
        return out / m

    @staticmethod
    def backward(ctx, g):
        qn, kn, v, codes_q, codes_k = ctx.saved_tensors
        tau = ctx.tau
        m, nb = codes_q.shape[2], 2 ** int(tau)
        b, h, n, d = qn.shape
        dv = v.shape[-1]
        g = g.contiguous()
        grad_q = grad_k = grad_v = None
        chunk = max(1, min(dv, _CHUNK_ELEMENTS // max(1, b * h * max(n, kn.shape[2]) * d)))
        if ctx.needs_input_grad[2]:
            grad_v = sum(bucket_sum(codes_q[:, :, t], g, codes_k[:, :, t], nb) for t in range(m)) / m
        if ctx.needs_input_grad[0]:
            grad_q = torch.zeros_like(qn)
        if ctx.needs_input_grad[1]:
            grad_k = torch.zeros_like(kn)
        for t in range(m):
            cq, ck = codes_q[:, :, t], codes_k[:, :, t]
            for s in range(0, dv, chunk):
                sl = slice(s, min(s + chunk, dv))
                c = sl.stop - sl.start
                if grad_q is not None:  # Σ_j B_ij (g_i·v_j) k̂_j via buckets of v_j k̂_jᵀ
                    outer = (v[..., sl, None] * kn[..., None, :]).flatten(-2)
                    got = bucket_sum(ck, outer, cq, nb).view(b, h, -1, c, d)
                    grad_q += torch.einsum("bhnc,bhncd->bhnd", g[..., sl], got)
                if grad_k is not None:  # Σ_i B_ij (g_i·v_j) q̂_i via buckets of g_i q̂_iᵀ
                    outer = (g[..., sl, None] * qn[..., None, :]).flatten(-2)
                    got = bucket_sum(cq, outer, ck, nb).view(b, h, -1, c, d)
                    grad_k += torch.einsum("bhnc,bhncd->bhnd", v[..., sl], got)
        scale = (tau / 2) / m
        if grad_q is not None:
            grad_q = grad_q * scale
        if grad_k is not None:
            grad_k = grad_k * scale
        return grad_q, grad_k, grad_v, None, None, None


def lsh_attention(
    qn: torch.Tensor, kn: torch.Tensor, v: torch.Tensor, codes_q: torch.Tensor, codes_k: torch.Tensor, tau: int
) -> torch.Tensor:
    """YOSO-m numerator mean_hash Σ_j B_ij v_j for given codes (b, h, m, n); v must be zero at
    padded keys. Differentiable with the lower-bound surrogate (τ/2)·B for ∂/∂(q̂·k̂)."""
    return _LSHCumulation.apply(qn, kn, v, codes_q, codes_k, tau)


# ------------------------------------------------------------------------------------ modules
def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise InvalidOption(f"option {name!r} must be a bool, got {value!r}")


def _check_common(o) -> None:
    if o.hash_bits is not None:
        check_range("hash_bits", o.hash_bits, 1, _MAX_HASH_BITS, integer=True)
    check_choice("output_norm", o.output_norm, ("l2", "none"))
    check_range("conv_kernel", o.conv_kernel, 0, None, integer=True)
    if o.conv_kernel % 2 == 0 and o.conv_kernel != 0:
        raise InvalidOption(f"option 'conv_kernel'={o.conv_kernel!r} must be 0 (off) or odd")
    _check_bool("zero_padded_queries", o.zero_padded_queries)
    check_range("norm_eps", o.norm_eps, 0.0, 1e-2, lo_open=True)


@dataclass(frozen=True)
class YosoEOptions:
    hash_bits: int | None = None  # τ; None: ⌈log2(max_len)⌉
    backward: str = "lower_bound"  # lower_bound: the paper's surrogate gradient; exact: the true derivative of E[B]
    output_norm: str = "l2"  # l2: normalise output rows (the YOSO code) or none
    conv_kernel: int = 0  # depthwise conv residual on V; 0 = off
    cos_scale: float = 1.0  # q̂·k̂ is multiplied by this before arccos (YOSO code v2 yoso_e: 0.98; v1: 1)
    # True: padded query rows output 0 (+ conv), as the YOSO code; False: computed like real rows
    zero_padded_queries: bool = False
    # eps of the L2 normalisations of q, k and the output (YOSO code: 1e-12, F.normalize's default)
    norm_eps: float = 1e-6

    def __post_init__(self):
        _check_common(self)
        check_choice("backward", self.backward, ("lower_bound", "exact"))
        check_range("cos_scale", self.cos_scale, 0.0, 1.0, lo_open=True)


@dataclass(frozen=True)
class YosoOptions:
    num_hashes: int = 32  # m
    hash_bits: int | None = None  # τ; None: ⌈log2(max_len)⌉
    redraw: str = "per_call"  # per_call: new hyperplanes every forward; fixed: drawn once
    output_norm: str = "l2"  # l2: normalise output rows (the YOSO code) or none
    conv_kernel: int = 0  # depthwise conv residual on V; 0 = off
    # gaussian: iid N(0,1) hyperplanes (exact SimHash); hadamard: the YOSO code's fast_hash (H·D·H·D·H·D)
    hash_family: str = "gaussian"
    # True: hyperplanes drawn for every sample and head (YOSO code; needs per_call); False: per head, shared by the
    # batch
    draw_per_sample: bool = False
    # True: padded query rows output 0 (+ conv), as the YOSO code; False: computed like real rows
    zero_padded_queries: bool = False
    # eps of the L2 normalisations of q, k and the output (YOSO code: 1e-12, F.normalize's default)
    norm_eps: float = 1e-6

    def __post_init__(self):
        _check_common(self)
        check_range("num_hashes", self.num_hashes, 1, None, integer=True)
        check_choice("redraw", self.redraw, ("per_call", "fixed"))
        check_choice("hash_family", self.hash_family, ("gaussian", "hadamard"))
        _check_bool("draw_per_sample", self.draw_per_sample)
        if self.draw_per_sample and self.redraw == "fixed":
            raise InvalidOption(
                "option 'draw_per_sample'=True needs redraw='per_call' (the batch size is known " "only at call time)"
            )


class _YosoBase(AttentionBackend):
    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        self.tau = options.hash_bits if options.hash_bits is not None else auto_hash_bits(max_len)
        k = options.conv_kernel
        self.conv = (
            nn.Conv2d(num_heads, num_heads, (k, 1), padding=(k // 2, 0), groups=num_heads, bias=False) if k else None
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.tau}"

    def forward(self, q, k, v, mask=None):
        in_dtype = q.dtype
        with torch.autocast(q.device.type, enabled=False):  # hashing and bucket sums in float32+
            work = torch.promote_types(q.dtype, torch.float32)
            q, k, v = q.to(work), k.to(work), v.to(work)
            o = self.options
            given = full_mask(q, mask)
            real = key_mask(given)[:, None, :, None]  # (b,1,n,1)
            qn = F.normalize(q, dim=-1, eps=o.norm_eps)
            kn = F.normalize(torch.where(real, k, 0.0), dim=-1, eps=o.norm_eps)
            vm = torch.where(real, v, 0.0)
            num = self._numerator(qn, kn, vm, real)
            if o.zero_padded_queries:  # the YOSO kernels skip masked queries: their rows stay 0
                num = torch.where(given[:, None, :, None], num, 0.0)
            out = F.normalize(num, dim=-1, eps=o.norm_eps) if o.output_norm == "l2" else num
            if self.conv is not None:
                out = out + self.conv(vm.to(self.conv.weight.dtype)).to(out.dtype)
            return out.to(in_dtype)


@register("yoso_e")
class YosoE(_YosoBase):
    """YOSO-E: exact expected LSH collision weights (1 − arccos(q̂·k̂)/π)^τ, O(n²)."""

    Options = YosoEOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=False,
        exact=True,
        complexity="O(n^2)",
        target="yoso",
        notes="backward: lower-bound surrogate (tau/2)w by default",
    )

    def _numerator(self, qn, kn, vm, real):
        tau, s = self.tau, self.options.cos_scale
        x = qn @ kn.transpose(-1, -2)
        with torch.no_grad():
            xs = x * s if s != 1.0 else x  # the argument of arccos
            w = collision_probability(xs, tau)
            if self.options.backward == "lower_bound":
                slope = (s * tau / 2) * w if s != 1.0 else (tau / 2) * w
            else:  # true derivative, at |xs| ≤ 1 − 1e-6 where it is finite
                xc = xs.clamp(-1 + 1e-6, 1 - 1e-6)
                base = 1 - torch.arccos(xc) / math.pi
                slope = tau * base ** (tau - 1) / (math.pi * torch.sqrt(1 - xc * xc))
                slope = slope * s if s != 1.0 else slope
        w = w + slope * (x - x.detach())  # value w, gradient slope·dx
        w = w * real.transpose(-1, -2).to(w.dtype)
        return w @ vm


@register("yoso", doc="YOSO-m: LSH Bernoulli-sampling attention with m hashes of tau bits (bucket sums).")
@register(
    "yoso_conv",
    defaults={"num_hashes": 16, "conv_kernel": 35},
    doc="YOSO-C: YOSO-m plus a depthwise convolution on V (m = 16, kernel 35).",
)
class Yoso(_YosoBase):
    """YOSO-m: LSH Bernoulli sampling with the bucket-sum trick; linear in n."""

    Options = YosoOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=False,
        exact=False,
        randomized=True,
        complexity="O(n m tau d)",
        target="yoso",
        notes="pure-torch scatter/gather; lower-bound surrogate backward",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        planes = self._draw_planes(num_heads, head_dim) if options.redraw == "fixed" else torch.empty(0)
        self.register_buffer("planes", planes, persistent=options.redraw == "fixed")

    def _draw_planes(self, heads, dim, batch=None, device=None):
        """(heads, m, dim, τ) hyperplanes, or (batch, heads, …): Gaussian, or the fast hash's."""
        o = self.options
        if o.hash_family == "gaussian":
            return draw_hyperplanes(heads, o.num_hashes, dim, self.tau, batch=batch, device=device)
        width = hadamard_dim(dim)
        signs = draw_hadamard_signs(
            heads, hadamard_parts(o.num_hashes, self.tau, width), width, batch=batch, device=device
        )
        return hadamard_planes(signs, dim, self.tau, o.num_hashes)

    def _numerator(self, qn, kn, vm, real):
        o = self.options
        if o.redraw == "fixed":
            planes = self.planes
        else:
            batch = qn.shape[0] if o.draw_per_sample else None
            planes = self._draw_planes(qn.shape[1], qn.shape[-1], batch=batch, device=qn.device)
        with torch.no_grad():
            codes_q = simhash_codes(qn, planes)
            codes_k = simhash_codes(kn, planes)
        return lsh_attention(qn, kn, vm, codes_q, codes_k, self.tau)
