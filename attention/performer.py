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
Every draw goes through the module-level :func:`gaussian_orthogonal_features`.

Defaults (the corrected behaviour; docs/facts.md §6.2):
  * Temperature 1/√d once.
  * Padded keys are removed *after* the feature map (φ(k)=0), so they leave both the sum and the
    normaliser.
  * Stabilisers cancel exactly and never cross samples: a per-row max for each query and, for keys,
    one max per (sample, head) over real keys only; no eps inside the features.
  * The ORF blocks are Haar (QR with the signs of diag(R) fixed).
  * Features are computed in at least float32 with autocast off (fp16 underflows in the normaliser).
  * One ω is shared by all heads of a module (as performer-pytorch).
A sample without any real token is treated as all real so its output stays finite.

Public-code semantics (``paper`` presets)
-----------------------------------------
The LRA baselines of Skyformer and Skeinformer (https://github.com/pkuzengqi/Skyformer and
https://github.com/pkuzengqi/Skeinformer, ``src/models/attention_performer.py``: a wrapper followed by
a copy of lucidrains' performer-pytorch ``FastAttention``, identical to their ``src/models/performer.py``)
and of Nyströmformer (https://github.com/mlpen/Nystromformer ``LRA/code/attention_performer.py``, the
same wrapper over the pip package ``performer_pytorch``) differ from the defaults as follows; each
difference is an option, and all of them together reproduce the Skyformer/Skeinformer code:

  * ``temperature="d"``: the wrapper divides Q and K by d^¼ and ``softmax_kernel`` multiplies by
    ``data_normalizer = d^-¼`` again, so the features estimate exp(q·k/d), not exp(q·k/√d).
  * ``pad_keys_in_normaliser=True``: the wrapper zeroes padded keys (K·mask) *before* the feature map
    and zeroes V there; φ(0) > 0, so padded keys still add to the normaliser (not to the numerator).
  * ``stabiliser_of="projection"``: ``softmax_kernel`` subtracts the max of ω·x' (not of
    ω·x' − ‖x'‖²/2).
  * ``key_stabiliser="batch"``: for keys that max is ``torch.max(data_dash)``, one number over the
    whole (batch, heads, keys, features) tensor, padded (zero) keys included: samples are coupled.
    (performer-pytorch ≥ 1.1.1, Oct 2021, takes it per (sample, head), padded keys included:
    ``key_stabiliser="sample"`` with ``pad_keys_in_normaliser=True``.)
  * ``feature_eps=1e-4``: ``exp(...) + eps`` inside every feature, so the stabilisers no longer cancel
    exactly (the output depends on them, and with ``key_stabiliser="batch"`` on the other samples).
  * ``detach_stabilisers=False``: gradients flow through the maxima (``torch.max``; performer-pytorch
    detaches them since Feb 2022). It changes gradients only when ``feature_eps > 0``.
  * ``qr_sign_fix=False``: the ORF blocks are LAPACK's Q (``torch.qr``, ``qr_uniform_q=False``), not
    Haar: e.g. the first row of every block always has a negative first coordinate. Draws consume
    torch's RNG in the same order as ``gaussian_orthogonal_random_matrix`` (one d×d Gaussian per
    block, the last block cut, then an m×d Gaussian for the chi row lengths, ``scaling=0``), so from
    the same RNG state the two draw the same ω.
Shared with the defaults: one ω per module shared by all heads, drawn once at construction and
never redrawn (``redraw="fixed"``: the wrapper never calls ``redraw_projection_matrix``); the
``kernel_type`` ("relu"/"exp") of the wrappers is inert because ``generalized_attention`` is False.
The public configs use m = ``rp_dim`` = 128 (Skyformer/Skeinformer) and 256 (Nyströmformer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention._scores import key_bias
from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register
from attention.softmax import key_mask


@dataclass(frozen=True)
class PerformerOptions:
    features: int = 256  # m: positive random features (FAVOR+)
    redraw: str = "fixed"  # "fixed": drawn once at construction; "per_call": new ω every forward
    orthogonal: bool = True  # False: iid Gaussian ω (the plain positive random features)
    temperature: str = "sqrt_d"  # estimates exp(q·k/T): "sqrt_d" T=√d (softmax); "d" T=d (public double d^-¼)
    pad_keys_in_normaliser: bool = False  # True: padded keys zeroed before the map, φ(0)>0 in the normaliser (public)
    stabiliser_of: str = "log_feature"  # subtracted max of "log_feature" ω·x'−‖x'‖²/2 or "projection" ω·x' (public)
    key_stabiliser: str = "sample"  # key max per "sample" (and head), or one over the whole "batch" tensor (public)
    feature_eps: float = 0.0  # added to exp(...) inside each feature (public 1e-4); >0: stabilisers no longer cancel
    detach_stabilisers: bool = True  # False: gradients flow through the maxima (public); matters only if feature_eps>0
    qr_sign_fix: bool = True  # ORF blocks Haar (Q·sign diag R); False: raw LAPACK Q as performer-pytorch (not Haar)

    def __post_init__(self):
        check_range("features", self.features, 1, None, integer=True)
        check_choice("redraw", self.redraw, ("fixed", "per_call"))
        check_choice("orthogonal", self.orthogonal, (True, False))
        check_choice("temperature", self.temperature, ("sqrt_d", "d"))
        check_choice("pad_keys_in_normaliser", self.pad_keys_in_normaliser, (True, False))
        check_choice("stabiliser_of", self.stabiliser_of, ("log_feature", "projection"))
        check_choice("key_stabiliser", self.key_stabiliser, ("sample", "batch"))
        check_range("feature_eps", self.feature_eps, 0.0, None)
        check_choice("detach_stabilisers", self.detach_stabilisers, (True, False))
        check_choice("qr_sign_fix", self.qr_sign_fix, (True, False))


def gaussian_orthogonal_features(
    m: int, d: int, *, orthogonal: bool = True, qr_sign_fix: bool = True, device=None, dtype=torch.float32
) -> torch.Tensor:
    """(m, d) random matrix; orthogonal within blocks of d rows, row lengths chi(d).

    ``qr_sign_fix``: Q·sign(diag R), a Haar block, so each row is marginally N(0, I_d); without it the
    raw LAPACK Q of performer-pytorch. RNG order: ceil(m/d) Gaussian d×d blocks, then one m×d Gaussian.
    """
    if not orthogonal:
        return torch.randn(m, d, device=device, dtype=dtype)
    blocks = []
    for _ in range(math.ceil(m / d)):
        qmat, rmat = torch.linalg.qr(torch.randn(d, d, device=device, dtype=dtype))
        if qr_sign_fix:
            qmat = qmat * torch.sign(torch.diagonal(rmat))  # unique QR: Haar-distributed (LAPACK signs are not)
        blocks.append(qmat.T)  # rows orthonormal
    rows = torch.cat(blocks)[:m]
    lengths = torch.randn(m, d, device=device, dtype=dtype).norm(dim=1)  # chi(d): length of a Gaussian vector
    return rows * lengths[:, None]


def favor_attention(q, k, v, keep, omega, options: PerformerOptions | None = None):
    """FAVOR+ with a given ω (m, d); q, k, v (b, h, n, d), keep (b, n) bool with a True per row."""
    o = options or PerformerOptions()
    dtype = torch.promote_types(q.dtype, torch.float32)
    d = q.shape[-1]
    qs, ks, vs = q.to(dtype), k.to(dtype), v.to(dtype)
    real = keep[:, None, :, None]
    if o.pad_keys_in_normaliser:  # zero vectors go through the map: φ(0) > 0
        ks, vs = ks * real, vs * real
    if o.temperature == "d":  # x/d^¼ twice, in the order of the public wrapper + kernel
        qs, ks = qs / d**0.25 * d**-0.25, ks / d**0.25 * d**-0.25
    else:
        qs, ks = qs * d**-0.25, ks * d**-0.25
    omega = omega.to(dtype)
    p_q, p_k = qs @ omega.T, ks @ omega.T  # (b,h,n,m) projections ω·x'
    h_q = 0.5 * qs.square().sum(-1, keepdim=True)  # ‖x'‖²/2, (b,h,n,1)
    h_k = 0.5 * ks.square().sum(-1, keepdim=True)
    if not o.pad_keys_in_normaliser:  # padded keys: φ(k) = 0, by an infinite shift of their row (no (n, m) copy)
        h_k = h_k - key_bias(real, dtype)
    if o.stabiliser_of == "projection":
        c_q = p_q.amax(dim=-1, keepdim=True)  # per query row
        s_k = p_k if o.pad_keys_in_normaliser else p_k + key_bias(real, dtype)
        c_k = s_k.amax(dim=(-1, -2), keepdim=True)  # per (sample, head)
    else:
        a_q, a_k = p_q - h_q, p_k - h_k  # log φ(x)·√m
        c_q, c_k = a_q.amax(dim=-1, keepdim=True), a_k.amax(dim=(-1, -2), keepdim=True)
    if o.key_stabiliser == "batch":
        c_k = c_k.amax(dim=(0, 1), keepdim=True)  # one number for the whole batch
    if o.detach_stabilisers:  # they cancel in the ratio exactly when feature_eps == 0
        c_q, c_k = c_q.detach(), c_k.detach()
    # exp(ω·x' − (‖x'‖²/2 + c)): the shifts are (n, 1) columns, so one pass over (n, m) and an addition, whose
    # gradient is the incoming one (a subtraction's would negate the whole (n, m) gradient)
    phi_q, phi_k = torch.exp(p_q + (-(h_q + c_q))), torch.exp(p_k + (-(h_k + c_k)))
    if o.feature_eps:
        phi_q, phi_k = phi_q + o.feature_eps, phi_k + o.feature_eps
        if not o.pad_keys_in_normaliser:
            phi_k = phi_k * real  # eps must not revive padded keys
    # φ's 1/√m is left out: it scales numerator and normaliser alike. The normaliser rides along as a column of
    # ones beside v, so one GEMM pair gives both (no separate Σφ(k) pass and φ(q)·Σφ(k) product)
    kv = phi_k.transpose(-1, -2) @ torch.cat([vs, torch.ones_like(vs[..., :1])], dim=-1)  # (b,h,m,d+1)
    both = phi_q @ kv  # (b,h,n,d+1)
    out = both[..., :-1] / both[..., -1:].clamp_min(torch.finfo(dtype).tiny)
    return out.to(q.dtype)


@register("performer")
class PerformerAttention(AttentionBackend):
    """Performer FAVOR+: positive orthogonal random features for softmax attention."""

    Options = PerformerOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        complexity="O(n)",
        target="softmax",
        notes="O(n·m·d); redraw='fixed' or 'per_call'",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        if options.redraw == "fixed":
            self.register_buffer("omega", self.draw_features())
        else:
            self.omega = None

    def draw_features(self, device=None) -> torch.Tensor:
        """A new (features, head_dim) ω from torch's RNG."""
        o = self.options
        return gaussian_orthogonal_features(
            o.features, self.head_dim, orthogonal=o.orthogonal, qr_sign_fix=o.qr_sign_fix, device=device
        )

    def forward(self, q, k, v, mask=None):
        keep = key_mask(full_mask(q, mask))
        omega = self.omega if self.omega is not None else self.draw_features(q.device)
        with torch.autocast(q.device.type, enabled=False):  # fp16 underflows in the normaliser
            return favor_attention(q, k, v, keep, omega, self.options)
