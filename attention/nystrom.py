"""Nyströmformer (Xiong et al., AAAI 2021): softmax attention through the Nyström method.

With Q̃ = Q/d^¼, K̃ = K/d^¼ and m landmarks Q_L, K_L (segment means of Q̃ and K̃),

    out = softmax(Q̃ K_Lᵀ) · pinv(softmax(Q_L K_Lᵀ)) · softmax(Q_L K̃ᵀ) · V

where pinv is the paper's iterative Moore–Penrose pseudo-inverse (Razavi et al., 2014):
    Z₀ = Aᵀ / (‖A‖₁ ‖A‖_∞),   Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))   (``pinv_iterations`` times).
Optionally a depthwise convolution over the sequence of V (kernel ``conv_kernel``, one filter per
head) is added as a skip, as in the Nyströmformer LRA configs; the Skeinformer/Skyformer papers use
128 or 256 landmarks and no convolution, so it is off (0) by default.

Complexity: O(n·m·d + m²·n + m³) time, O(n·m) memory, with m = ``landmarks`` (default 256).

Deviations from the public code (docs/facts.md §6.3), all deliberate; defaults:
  * Landmarks are means over **real tokens only**: each sample's L real tokens, taken in order
    wherever they sit, are split into min(m, L) contiguous segments whose sizes differ by at most
    one. When a sample has fewer real tokens than m, the unused landmarks are masked out of every
    softmax and out of the pseudo-inverse (their rows and columns are zero, which the iteration
    preserves); with m ≥ n every real token is its own landmark and the output is exact softmax up
    to the pseudo-inverse's convergence.
  * Z₀ is scaled **per matrix** (per sample and head), so samples never mix.
  * No fallback to exact softmax when m ≥ n; the same formula runs.
  * Computed in at least float32 with autocast off (half inputs are upcast; the iteration needs the
    range), as the papers' LRA code ran every attention in float32.
A sample without any real token is treated as all real so its output stays finite.

Public-code semantics (``paper`` presets). The public code is ``NystromAttention`` in
https://github.com/mlpen/Nystromformer ``LRA/code/attention_nystrom.py`` (the "original" init),
copied unchanged (but for the config key ``max_seq_len``) to ``src/models/attention_nystrom.py`` of
https://github.com/pkuzengqi/Skyformer and https://github.com/pkuzengqi/Skeinformer; the later
``reorganized_code/encoders/backbones/efficient_attentions/attention_nystrom.py`` of the
Nyströmformer repo (also YOSO's LRA code) differs only in the pseudo-inverse start. Each quirk is
an option; every default is the corrected behaviour above.
  * ``landmark_mean="padded"``: Q and K are zeroed at padded positions (after the d^-¼ scale), the
    whole padded sequence is reshaped into m segments of n/m positions and each is averaged, the
    padded zeros included (``forward``, the ``reshape(...).mean`` of Q and K). n must be divisible
    by m (an error otherwise, as theirs). Every landmark counts, also one made of padding only (a
    zero vector), so no softmax masks landmarks; only the key softmax (kernel_3) masks padded keys,
    as theirs (their additive −1e9 and our fill give the same result unless a sample has no real
    token). Padded query rows are zero, so their outputs are the public code's too. The output at
    real tokens stays independent of padded *content* but depends on how much padding there is.
  * ``pinv_init="batch_colsum"``: Z₀ = Aᵀ / max_j Σ_i A_ij with ONE max over the whole batch and all
    heads (``iterative_inv``, ``init_option == "original"``, the only one reachable: the other
    branch reads a misspelt config key). ``pinv_init="batch_norm1_inf"``: Z₀ = Aᵀ / (max colsum|A| ·
    max rowsum|A|), both maxima over the whole batch (``reorganized_code``); the landmark kernel is
    row-stochastic (max row sum 1), so the two coincide here. Either makes a sample's output depend
    on the other samples of the batch (per matrix, ‖A‖∞ = 1 too: ``per_matrix`` is the same start
    with the max taken per sample and head).
  * ``exact_if_full=True``: when m ≥ n, exact masked softmax of the scaled (and, with
    ``landmark_mean="padded"``, query-zeroed) Q, K instead of the Nyström formula (``forward``,
    ``num_landmarks == seq_len``; theirs compares with the configured length, which equals n as
    their reshape needs it, and fails for m > n).
  * ``conv_kernel``: their depthwise ``Conv2d(heads, heads, (k, 1), padding=(k//2, 0),
    groups=heads, bias=False)`` on V·mask (unscaled V), added to the output: the same module here
    (Nyströmformer LRA: k = 35; Skyformer/Skeinformer configs: no conv).
The Nyströmformer LRA preset is ``landmark_mean="padded", pinv_init="batch_colsum",
exact_if_full=True, conv_kernel=35`` (landmarks 32-256); the Skyformer/Skeinformer one is the same
with ``conv_kernel=0`` and 128 landmarks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attention._linalg import hyperpower_iterations
from attention._scores import key_bias, scores
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


@dataclass(frozen=True)
class NystromOptions:
    landmarks: int = 256  # m: segment-mean landmarks of Q and K
    pinv_iterations: int = 6  # iterations of the landmark kernel's iterative pseudo-inverse
    conv_kernel: int = 0  # depthwise conv residual on V; 0 = off, else odd
    # real: means over real tokens | padded: reshape of the zero-padded sequence (public code; n % m == 0)
    landmark_mean: str = "real"
    # Z0 scale: per_matrix ‖A‖1‖A‖∞ | batch_colsum (public LRA code) | batch_norm1_inf (reorganized code): one max over
    # the batch
    pinv_init: str = "per_matrix"
    exact_if_full: bool = False  # m ≥ n: exact masked softmax instead of the Nyström formula (public code)

    def __post_init__(self):
        check_range("landmarks", self.landmarks, 1, None, integer=True)
        check_range("pinv_iterations", self.pinv_iterations, 0, 1000, integer=True)
        check_range("conv_kernel", self.conv_kernel, 0, None, integer=True)
        if self.conv_kernel % 2 == 0 and self.conv_kernel != 0:
            raise InvalidOption(f"option 'conv_kernel'={self.conv_kernel!r} must be 0 (off) or odd")
        check_choice("landmark_mean", self.landmark_mean, ("real", "padded"))
        check_choice("pinv_init", self.pinv_init, PINV_INITS)
        check_choice("exact_if_full", self.exact_if_full, (False, True))


PINV_INITS = ("per_matrix", "batch_colsum", "batch_norm1_inf")


def segment_landmarks(x: torch.Tensor, keep: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Means of x over contiguous segments of the real tokens.

    x (b, h, n, d), keep (b, n) bool with at least one True per row. Each sample's L real tokens are
    split into min(m, L) segments; token of rank r goes to segment ⌊r·min(m, L)/L⌋.
    Returns landmarks (b, h, m, d) (zero where unused) and their validity (b, m) bool.
    """
    b, h, n, d = x.shape
    real = keep.sum(-1, keepdim=True)  # (b,1)
    used = real.clamp(max=m)
    rank = keep.long().cumsum(-1) - 1
    seg = torch.where(keep, torch.div(rank * used, real, rounding_mode="floor"), torch.full_like(rank, m))
    counts = torch.zeros(b, m + 1, dtype=x.dtype, device=x.device).scatter_add_(1, seg, torch.ones_like(x[:, 0, :, 0]))
    idx = seg[:, None, :, None].expand(b, h, n, d)
    sums = torch.zeros(b, h, m + 1, d, dtype=x.dtype, device=x.device).scatter_add(2, idx, x)
    means = sums[:, :, :m] / counts[:, None, :m, None].clamp_min(1)
    return means, counts[:, :m] > 0


def padded_segment_landmarks(x: torch.Tensor, m: int) -> torch.Tensor:
    """Means of x (b, h, n, d) over m equal segments of the whole sequence, padding included (the
    public code's landmarks; the caller zeroes padded rows first). n must be divisible by m."""
    b, h, n, d = x.shape
    if n % m:
        raise ValueError(f"nystrom: landmark_mean='padded' needs n={n} divisible by landmarks={m}")
    return x.reshape(b, h, m, n // m, d).mean(dim=-2)


def pinv_start(a: torch.Tensor, init: str = "per_matrix") -> torch.Tensor:
    """Z₀ of the iterative pseudo-inverse of each (m, m) matrix in ``a`` (…, m, m).

    per_matrix: Aᵀ/(‖A‖₁‖A‖_∞) of each matrix. batch_colsum: Aᵀ / max column sum, ONE max over every
    matrix in ``a`` (public LRA code). batch_norm1_inf: Aᵀ / (max |column| sum · max |row| sum), both
    over every matrix (Nyströmformer reorganized code, YOSO)."""
    tiny = torch.finfo(a.dtype).tiny
    if init == "per_matrix":
        norm1 = a.abs().sum(dim=-2).amax(dim=-1)  # max column sum, per matrix
        norm_inf = a.abs().sum(dim=-1).amax(dim=-1)  # max row sum, per matrix
        return a.transpose(-1, -2) / (norm1 * norm_inf).clamp_min(tiny)[..., None, None]
    if init == "batch_colsum":
        return a.transpose(-1, -2) / a.sum(dim=-2).amax().clamp_min(tiny)
    if init == "batch_norm1_inf":
        return a.transpose(-1, -2) / (a.abs().sum(dim=-2).amax() * a.abs().sum(dim=-1).amax()).clamp_min(tiny)
    raise ValueError(f"unknown pinv init {init!r}; choose one of {list(PINV_INITS)}")


def iterative_pinv(a: torch.Tensor, iterations: int, init: str = "per_matrix") -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of each (m, m) matrix in ``a`` by the order-3 iteration from
    :func:`pinv_start`."""
    return hyperpower_iterations(a, pinv_start(a, init), iterations)


@register("nystrom")
class NystromAttention(AttentionBackend):
    """Nyströmformer: segment-mean landmarks over real tokens, iterative pseudo-inverse."""

    Options = NystromOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        complexity="O(n)",
        target="softmax",
        notes="O(n·m·d + m³); landmarks are masked segment means, any padding, any n",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        k = options.conv_kernel
        self.conv = (
            nn.Conv2d(num_heads, num_heads, (k, 1), padding=(k // 2, 0), groups=num_heads, bias=False) if k else None
        )

    def forward(self, q, k, v, mask=None):
        with torch.autocast(q.device.type, enabled=False):  # the iteration needs at least float32
            return self._forward(q, k, v, mask)

    def _forward(self, q, k, v, mask):
        o = self.options
        keep = key_mask(full_mask(q, mask))
        dtype = torch.promote_types(q.dtype, torch.float32)
        qs, ks, vs = q.to(dtype), k.to(dtype), v.to(dtype)
        # every row keeps at least one key and one landmark (key_mask), so -inf biases leave no row empty
        key_cols = key_bias(keep[:, None, None, :], dtype)
        if o.landmark_mean == "padded":  # public code: (Q·mask)/d^¼, padded rows zero vectors (one product)
            rows = keep[:, None, :, None].to(dtype) / math.sqrt(math.sqrt(q.shape[-1]))
            qs, ks = qs * rows, ks * rows
        else:
            scale = q.shape[-1] ** -0.25
            qs, ks = qs * scale, ks * scale
        if o.exact_if_full and o.landmarks >= q.shape[-2]:
            out = scores(qs, ks, 1.0, key_cols).softmax(-1) @ vs
        elif o.landmark_mean == "padded":  # every landmark counts: kernel_1, kernel_2 unmasked
            ql, kl = padded_segment_landmarks(qs, o.landmarks), padded_segment_landmarks(ks, o.landmarks)
            kernel_1 = (qs @ kl.transpose(-1, -2)).softmax(-1)  # (b,h,n,m)
            kernel_2 = (ql @ kl.transpose(-1, -2)).softmax(-1)  # (b,h,m,m)
            kernel_3 = scores(ql, ks, 1.0, key_cols).softmax(-1)  # (b,h,m,n)
            # right to left (the public code goes left to right): n·m·d multiply-adds where n·m² were
            out = kernel_1 @ (iterative_pinv(kernel_2, o.pinv_iterations, o.pinv_init) @ (kernel_3 @ vs))
        else:
            ql, lm_valid = segment_landmarks(qs, keep, o.landmarks)
            kl, _ = segment_landmarks(ks, keep, o.landmarks)
            lm_cols = key_bias(lm_valid[:, None, None, :], dtype)
            kernel_1 = scores(qs, kl, 1.0, lm_cols).softmax(-1)  # (b,h,n,m)
            kernel_2 = scores(ql, kl, 1.0, lm_cols).softmax(-1)  # (b,h,m,m)
            kernel_2 = kernel_2 * lm_valid[:, None, :, None]  # unused landmarks: zero rows and columns
            kernel_3 = scores(ql, ks, 1.0, key_cols).softmax(-1)  # (b,h,m,n)
            out = kernel_1 @ (iterative_pinv(kernel_2, o.pinv_iterations, o.pinv_init) @ (kernel_3 @ vs))
        if self.conv is not None:
            out = out + self.conv((vs * keep[:, None, :, None]).to(self.conv.weight.dtype)).to(dtype)
        return out.to(q.dtype)
