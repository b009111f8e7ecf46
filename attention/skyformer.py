"""Kernelized attention and Skyformer (Chen, Zeng et al., "Skyformer: Remodel Self-Attention with
Gaussian Kernel and Nyström Method", NeurIPS 2021).

``kernelized`` (paper eq. 3): with p = head_dim, Q̃ = Q/p^¼, K̃ = K/p^¼ and the Gaussian kernel
κ(x, y) = exp(−‖x − y‖²/2),

    out = C V,   C_ij = κ(q̃_i, k̃_j) = exp(q̃_i·k̃_j − ‖q̃_i‖²/2 − ‖k̃_j‖²/2).

There is no row normalisation (the paper argues the kernel normalises itself: C = D_Q^{-½} A D_K^{-½}).
Attention dropout (``dropout``, 0.1 as in the Skyformer code) is applied to C in training only.
O(n²·p) time, O(n²) memory. Exact.

``skyformer`` (paper Sec. 4.2-4.4): Nyström on the PSD completion. With X = [Q̃; K̃] (2n × p) the
matrix B̄ = κ(X, X) is PSD and holds C as its off-diagonal block (eq. 4). Choose d landmark rows S of
X uniformly at random (Definition 1), then (eqs. 5-6)

    C ≈ κ(Q̃, X_S) · (M + γI)⁻¹ · κ(X_S, K̃),   M = κ(X_S, X_S),

and the inverse is computed as in Sec. 4.4: A = D^{-½}(M + γI)D^{-½} with D = diag((M + γI)·1)
has spectrum in (0, 1] (Lemma 3; ‖I − A‖ < 1, the eigenvalue 1 belongs to D^{½}1). That is the
condition of Razavi et al.'s Theorem 2 for their Newton–Schulz-type hyper-power iteration (the one
Nyströmformer uses) started at Z₀ = I:

    Z₀ = I,   Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))    (``ns_iters`` times, default 6)

converges to A⁻¹ (residual ε → ¾ε³ + ¼ε⁴), and (M + γI)⁻¹ = D^{-½} A⁻¹ D^{-½}. The output
κ(Q̃, X_S)·[(M + γI)⁻¹·(κ(X_S, K̃)V)] is evaluated right to left: O(n·d·p + n·d·p_v + d³) time,
O(n·d) memory, d = ``num_landmarks`` (default 256, the Skeinformer paper's feature budget; the
Skyformer configs use 128).
When every real row of [Q̃; K̃] is a landmark (d ≥ 2·n_real, sampled without replacement),
κ(Q̃, X_S)(M + γI)⁻¹κ(X_S, K̃) = [B̄(B̄ + γI)⁻¹B̄]_QK, which differs from C by at most γ in spectral
norm; with the exact inverse and small γ the approximation is exact up to rounding.
Accuracy (float64, unit-scale random q, k, v, d_head = 16, n = 128 with 37 and 7 padded tokens, mean
of 3 seeds, defaults γ = 0.1 and 6 iterations): relative error against ``kernelized`` 0.79 / 0.51 /
0.35 / 0.16 / 0.005 at 8 / 32 / 64 / 128 / 256 landmarks (random inputs are the hard case: B̄ is
close to I, so error falls roughly with the share of rows taken; 256 ≥ 2·n_real takes them all).

Deviations from the paper and the public code (docs/facts.md §6.1, §6.3, §6.4), all deliberate:
  * Landmarks are drawn **among real tokens only**, per sample and head, wherever the padding
    sits (the public code draws positions below the real-token count, i.e. assumes right padding).
    By default without replacement (``replacement=False``): duplicates add nothing to a Nyström
    approximation, and d ≥ 2·n_real then uses every real row (exact up to γ). A sample with fewer
    than d real rows leaves the spare landmark slots empty: their kernel columns are zero and they
    form an identity block of A, so they change nothing. ``replacement=True`` is the paper's
    Definition 1 (i.i.d. uniform columns). The public code takes half the landmarks from Q rows
    and half from K rows; here they are uniform over all real rows of [Q̃; K̃], as in eq. (5).
  * Z₀ never mixes samples. The public code starts from Z₀ = Aᵀ / max colsum with one max over the
    whole batch, so a sample's output depends on the others. Default Z₀ = I (what Lemma 3 licenses;
    per matrix by construction). ``ns_init="colsum"`` is the public start made per matrix
    (Z₀ = Aᵀ/‖A‖₁ of each sample and head); it converges slowly when A is ill-conditioned (kernel
    entries near 1): at q, k of scale 0.3 (d = 32, n = 128, full landmarks, 6 iterations) it leaves
    5% relative error against 0.2% for Z₀ = I. ``inverse="exact"`` (torch.linalg.inv) separates
    sampling error from iteration error in approximation studies.
  * The kernel scale uses the actual head_dim p (the public code hard-codes p = 32, LRA's value).
  * The 1/√d scale of Definition 1 is dropped (as in the public code); it cancels in the exact
    Nyström formula and only rescales the effective γ.
  * Computed in at least float32 with autocast off (half inputs are upcast; the iteration needs
    the range), as the papers' LRA code ran attention in float32.

Public-code semantics (``paper`` presets). Each quirk of the public code
(https://github.com/pkuzengqi/Skyformer, ``src/models/attention_skyformer.py``, class ``Skyformer``,
and ``src/models/attention.py``, class ``SoftmaxAttention_RBF``) is an option; every default is the
corrected behaviour above. ``skyformer`` reproduces the public ``Skyformer`` with
``num_landmarks=128, ns_init="colsum_batch", replacement=True, landmark_split="halves",
landmark_draw="shared", scale_dim=32, zero_padded_queries=True`` (γ = 0.1, 6 iterations: the defaults):
  * ``ns_init="colsum_batch"``: ``iterative_inv`` (init "original") starts from Z₀ = Aᵀ / c with one
    c = the largest column sum over the whole batch and all heads, so a sample's output depends on
    the others in its batch (chunk).
  * ``landmark_draw="shared"``: ``uniform_sketching`` draws ONE vector of d uniforms
    (``torch.rand(d)``, the same RNG use, so the same seed gives the same landmarks) for the whole
    batch and all heads; sample i takes positions ⌊u·m_i⌋, m_i its real-token count, i.e. the first
    m_i positions whatever the padding (right padding assumed: with padding elsewhere, landmarks can
    be padded rows). Without replacement, one key per position shared by the batch and heads.
  * ``replacement=True``: those draws are with replacement (duplicates kept).
  * ``landmark_split="halves"``: the first d//2 landmarks are Q rows, the other d − d//2 K rows
    (the public code adds n to the second half of its draws).
  * ``scale_dim=32``: the kernel scale is 32^{-1/4} whatever the head size (no effect at head_dim 32).
  * ``zero_padded_queries=True``: q is multiplied by the mask, so a padded query row outputs
    κ(0, ·)-weighted values instead of its own; real rows are unchanged (right padding). The same
    option on ``kernelized`` reproduces ``SoftmaxAttention_RBF`` (which otherwise matches).
  No effect beyond float rounding (fp32, measured ≤ 1e-6 relative on outputs): their kernel has no
  clamp at 0, they compute (K_f D Z D)ᵀV where we compute D Z D (K_fᵀV) (Z is symmetric), and
  D^{-½} as sqrt(1/s). Not reproduced: a sample with no real token (theirs: landmarks at position 0
  and output 0; here treated as all real), and a float32 product u·m_i that rounds up to m_i
  (probability ~2⁻²⁴ per draw; theirs then takes position m_i, here m_i − 1).

Randomness: landmarks come from torch's global RNG every call (``redraw="per_call"``, as the public
code, in eval too) or from uniforms drawn once at construction from a seed saved with the module
(``redraw="fixed"``): one key per position of Q and of K and head, shared by the batch, so a sample
gets the same landmarks on every call, wherever it sits in the batch and on any device (with
``replacement=True``, d uniforms per head pick the ⌊u·m⌋-th real row). The uniforms are a buffer
(redrawn when a state dict is loaded), so torch.compile traces forward as one graph.
A sample without real tokens is treated as all real.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention._linalg import hyperpower_iterations
from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register
from attention.softmax import key_mask


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """κ(x_i, y_j) = exp(−‖x_i − y_j‖²/2) for x (..., n, p), y (..., m, p): (..., n, m).

    The exponent x·y − ‖x‖²/2 − ‖y‖²/2 is one GEMM of [x, ‖x‖²/2, 1] and [y, −1, −‖y‖²/2]: no (n, m) sum of the
    two norms built, subtracted and differentiated beside the product."""
    hx, hy = 0.5 * x.square().sum(-1, keepdim=True), 0.5 * y.square().sum(-1, keepdim=True)
    xa = torch.cat([x, hx, torch.ones_like(hx)], dim=-1)
    ya = torch.cat([y, -torch.ones_like(hy), -hy], dim=-1)
    return torch.exp((xa @ ya.transpose(-1, -2)).clamp(max=0.0))


# ----------------------------------------------------------------------------------- kernelized
@dataclass(frozen=True)
class KernelizedOptions:
    dropout: float = 0.1  # dropout on the Gaussian kernel matrix C (training only)
    # zero q at padded positions first (public code): padded rows output exp(-|k|^2/2)-weighted V
    zero_padded_queries: bool = False

    def __post_init__(self):
        check_range("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_choice("zero_padded_queries", self.zero_padded_queries, (False, True))


@register("kernelized")
class KernelizedAttention(AttentionBackend):
    """Exact Gaussian-kernel attention C V (Skyformer eq. 3), no row normalisation."""

    Options = KernelizedOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=False,
        exact=True,
        complexity="O(n^2)",
        target="gaussian",
        notes="C_ij = exp(-|q_i-k_j|^2/(2 sqrt(p))); dropout on C",
    )

    def forward(self, q, k, v, mask=None):
        scale = q.shape[-1] ** -0.25
        keep = key_mask(full_mask(q, mask))[:, None, :, None]  # (b,1,n,1)
        if self.options.zero_padded_queries:
            q = torch.where(keep, q, 0.0)
        c = gaussian_kernel(q * scale, torch.where(keep, k, 0.0) * scale)
        c = F.dropout(c, p=self.options.dropout, training=self.training)
        return c @ torch.where(keep, v, 0.0)  # padded keys weigh nothing: their rows of v are zero


# ----------------------------------------------------------------------------------- skyformer
@dataclass(frozen=True)
class SkyformerOptions:
    num_landmarks: int = 256  # d: landmark rows of [Q; K] for the Nystrom approximation
    gamma: float = 0.1  # gamma: the ridge gamma*I added to the landmark kernel
    ns_iters: int = 6  # Newton-Schulz iterations for the landmark kernel's inverse
    # Newton-Schulz start: I; colsum: A^T/max colsum per matrix; colsum_batch: one max over batch and heads (public
    # code)
    ns_init: str = "identity"
    inverse: str = "newton_schulz"  # newton_schulz (the paper) or an exact solve
    replacement: bool = False  # draw landmarks with replacement (the paper) instead of without
    redraw: str = "per_call"  # per_call: new landmarks every forward; fixed: drawn once
    # pooled: uniform over the rows of [Q; K]; halves: d//2 from Q rows, the rest from K rows (public code)
    landmark_split: str = "pooled"
    # per_sample: per sample and head among real rows; shared: one draw for batch and heads, prefix positions (public
    # code)
    landmark_draw: str = "per_sample"
    scale_dim: int | None = None  # p in the kernel scale p^(-1/4); None: head_dim (public code: 32)
    # zero q at padded positions first (public code): changes padded rows' outputs only
    zero_padded_queries: bool = False

    def __post_init__(self):
        check_range("num_landmarks", self.num_landmarks, 1, None, integer=True)
        check_range("gamma", self.gamma, 0.0, None, lo_open=True)
        check_range("ns_iters", self.ns_iters, 0, 1000, integer=True)
        check_choice("ns_init", self.ns_init, ("identity", "colsum", "colsum_batch"))
        check_choice("inverse", self.inverse, ("newton_schulz", "exact"))
        check_choice("replacement", self.replacement, (False, True))
        check_choice("redraw", self.redraw, ("per_call", "fixed"))
        check_choice("landmark_split", self.landmark_split, ("pooled", "halves"))
        check_choice("landmark_draw", self.landmark_draw, ("per_sample", "shared"))
        if self.scale_dim is not None:
            check_range("scale_dim", self.scale_dim, 1, None, integer=True)
        check_choice("zero_padded_queries", self.zero_padded_queries, (False, True))


def sample_landmarks(
    real: torch.Tensor,
    heads: int,
    d: int,
    *,
    replacement: bool = False,
    uniforms: torch.Tensor | None = None,
    split: str = "pooled",
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform landmark rows among the rows of each sample that ``real`` allows.

    real: bool (batch, N), True where a row may be chosen. Returns ``idx`` int64 (batch, heads, d')
    and ``valid`` bool (batch, heads, d'), d' = d (with replacement) or min(d, N) (without); slots
    beyond a sample's real-row count are marked invalid (they point at padded rows).
    ``uniforms``: given U(0, 1) draws instead of torch's RNG (``redraw="fixed"``): one key per row,
    (heads, N), without replacement (the d real rows with the largest keys); (heads, d) with
    replacement (draw j is the ⌊u_j·m⌋-th of the sample's m real rows).
    ``split="halves"``: the first d//2 landmarks come from rows [0, N/2) (the Q rows of [Q; K]), the
    other d − d//2 from rows [N/2, N) (the K rows), each half drawn as above from its own real rows
    (and its own part of ``uniforms``: the first d//2 draws or the first N/2 keys).
    ``shared=True``: one draw for the whole batch and every head, as the Skyformer code does: the
    uniforms (d,) or keys (N,) are drawn once (``torch.rand(d)`` with replacement, like its
    ``uniform_sketching``), or given 1-D, and each sample maps them onto its own rows; with
    ``real`` a prefix mask this is ⌊u·m_i⌋ per sample (plus N/2 in the K half).
    """
    b, big_n = real.shape
    if shared:
        if uniforms is None:
            uniforms = torch.rand(d if replacement else big_n, device=real.device)
        uniforms = uniforms.expand(heads, uniforms.shape[-1])
    if split == "halves":
        half, d_q = big_n // 2, d // 2
        cut = d_q if replacement else half
        idx, valid = [], []
        for off, rows, dd, u in (
            (0, real[:, :half], d_q, None if uniforms is None else uniforms[..., :cut]),
            (half, real[:, half:], d - d_q, None if uniforms is None else uniforms[..., cut:]),
        ):
            if dd:
                i, ok = _sample_rows(rows, heads, dd, replacement, u)
                idx.append(i + off)
                valid.append(ok)
        return torch.cat(idx, -1), torch.cat(valid, -1)
    return _sample_rows(real, heads, d, replacement, uniforms)


def _sample_rows(real, heads, d, replacement, uniforms):
    b, big_n = real.shape
    if replacement:
        if uniforms is None:
            probs = real.to(torch.float32)[:, None, :].expand(b, heads, big_n).reshape(b * heads, big_n)
            idx = torch.multinomial(probs, d, replacement=True).view(b, heads, d)
        else:
            m = real.sum(-1)[:, None, None]  # (b,1,1), at least 1
            rank = torch.minimum((uniforms * m).long(), m - 1)  # (b, heads, d); float32 product, as the public code
            real_first = torch.argsort((~real).to(torch.uint8), dim=-1, stable=True)  # real rows in order
            idx = real_first.gather(1, rank.flatten(1)).view(b, heads, d)
        return idx, torch.ones_like(idx, dtype=torch.bool)
    u = torch.rand(b, heads, big_n, device=real.device) if uniforms is None else uniforms.expand(b, heads, big_n)
    u = torch.where(real[:, None, :], u, -1.0)  # padded rows lose to every real one
    idx = u.topk(min(d, big_n), dim=-1).indices
    return idx, real[:, None, :].expand(b, heads, big_n).gather(-1, idx)


def newton_schulz_inverse(a: torch.Tensor, iters: int, init: str = "identity") -> torch.Tensor:
    """Razavi et al. hyper-power iteration for A⁻¹ (..., m, m).

    init: ``identity`` Z₀ = I; ``colsum`` Z₀ = Aᵀ/‖A‖₁ per matrix; ``colsum_batch`` Z₀ = Aᵀ/c with ONE
    c = the largest column sum over every matrix of ``a`` (batch and heads), the Skyformer code's
    start (``iterative_inv``, init "original"): it couples the samples of a batch."""
    if init == "colsum":
        z = a.transpose(-1, -2) / a.abs().sum(-2).amax(-1)[..., None, None]
    elif init == "colsum_batch":
        z = (1 / a.abs().sum(-2).amax()) * a.transpose(-1, -2)
    else:
        z = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    return hyperpower_iterations(a, z, iters)


def _redraw_after_load(module: "Skyformer", incompatible_keys) -> None:
    module._draw_uniforms()  # the loaded seed defines the landmarks


@register("skyformer")
class Skyformer(AttentionBackend):
    """Nyström approximation of kernelized attention on the PSD completion of [Q; K]."""

    Options = SkyformerOptions
    capabilities = Capabilities(
        padding_mask=True,
        causal=False,
        exact=False,
        randomized=True,
        complexity="O(n d)",
        target="gaussian",
        notes="landmarks among real rows of [Q;K]; per-matrix Newton-Schulz init "
        "(public-code options couple the batch)",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        fixed = options.redraw == "fixed"
        # redraw="fixed": the landmark generator's seed, drawn once and saved with the module
        seed = torch.randint(0, 2**62, (1,)) if fixed else torch.empty(0, dtype=torch.int64)
        self.register_buffer("landmark_seed", seed, persistent=fixed)
        if fixed:  # the uniforms it gives, in a buffer that follows the device; redrawn, not saved
            self.register_buffer("landmark_uniforms", None, persistent=False)
            self._draw_uniforms()
            self.register_load_state_dict_post_hook(_redraw_after_load)

    def _draw_uniforms(self) -> None:
        o = self.options
        shape = (o.num_landmarks,) if o.replacement else (2, self.max_len)
        if o.landmark_draw == "per_sample":  # one set per head; shared: one for all heads
            shape = (self.num_heads, *shape)
        gen = torch.Generator().manual_seed(int(self.landmark_seed.item()))
        self.landmark_uniforms = torch.rand(shape, generator=gen).to(self.landmark_seed.device)

    def fixed_uniforms(self, n: int) -> torch.Tensor | None:
        """The uniforms ``sample_landmarks`` uses for length n (``redraw="fixed"``), else None.

        Without replacement, one key per row of [Q; K]: position i of Q and of K keeps its key for
        every n ≤ max_len (keys of Q rows at [0, n), of K rows at [max_len, max_len + n)).
        Per head (heads, ·), or one for all heads (·) with ``landmark_draw="shared"``."""
        if self.options.redraw != "fixed":
            return None
        if self.options.replacement:
            return self.landmark_uniforms
        if n > self.max_len:
            raise ValueError(f"skyformer: sequence length {n} exceeds max_len={self.max_len}")
        return self.landmark_uniforms[..., :n].flatten(-2)

    def forward(self, q, k, v, mask=None):
        with torch.autocast(q.device.type, enabled=False):  # the inverse needs at least float32
            work = torch.promote_types(q.dtype, torch.float32)
            return self._forward(q.to(work), k.to(work), v.to(work), mask).to(q.dtype)

    def _forward(self, q, k, v, mask):
        o = self.options
        b, h, n, p = q.shape
        work = q.dtype
        real = key_mask(full_mask(q, mask))  # (b, n)
        keep = real[:, None, :, None]
        scale = (o.scale_dim or p) ** -0.25
        if o.zero_padded_queries:
            q = torch.where(keep, q, 0.0)
        q = q * scale
        k = torch.where(keep, k, 0.0) * scale
        v = torch.where(keep, v, 0.0)

        x = torch.cat([q, k], dim=2)  # (b, h, 2n, p)
        rows = real
        if o.landmark_draw == "shared":  # the public code's rows: the first (real count) positions
            rows = torch.arange(n, device=q.device) < real.sum(-1, keepdim=True)
        idx, valid = sample_landmarks(
            torch.cat([rows, rows], dim=1),
            h,
            o.num_landmarks,
            replacement=o.replacement,
            uniforms=self.fixed_uniforms(n),
            split=o.landmark_split,
            shared=o.landmark_draw == "shared",
        )
        land = x.gather(2, idx[..., None].expand(-1, -1, -1, p))  # (b, h, d, p)
        vf = valid.to(work)
        q_f = gaussian_kernel(q, land) * vf[:, :, None, :]  # (b, h, n, d)
        k_f = gaussian_kernel(k, land) * vf[:, :, None, :] * keep.to(work)  # padded keys: 0
        m = gaussian_kernel(land, land) * (vf[..., :, None] * vf[..., None, :])
        m = m + o.gamma * torch.eye(m.shape[-1], dtype=work, device=m.device)
        dinv = m.sum(-1).rsqrt()  # D^{-1/2}; row sums ≥ γ > 0
        a = dinv[..., :, None] * m * dinv[..., None, :]
        if o.inverse == "exact":
            z = torch.linalg.inv(a)
        else:
            z = newton_schulz_inverse(a, o.ns_iters, o.ns_init)
        kv = k_f.transpose(-1, -2) @ v  # (b, h, d, p_v)
        core = dinv[..., None] * (z @ (dinv[..., None] * kv))  # (M + γI)^{-1} κ(X_S, K̃) V
        return q_f @ core
