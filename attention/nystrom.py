"""Nyströmformer (Xiong et al., AAAI 2021): softmax attention through the Nyström method.

With Q̃ = Q/d^¼, K̃ = K/d^¼ and m landmarks Q_L, K_L (segment means of Q̃ and K̃),

    out = softmax(Q̃ K_Lᵀ) · pinv(softmax(Q_L K_Lᵀ)) · softmax(Q_L K̃ᵀ) · V

where pinv is the paper's iterative Moore–Penrose pseudo-inverse (Razavi et al., 2014):
    Z₀ = Aᵀ / (‖A‖₁ ‖A‖_∞),   Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))   (``pinv_iterations`` times).
Optionally a depthwise convolution over the sequence of V (kernel ``conv_kernel``, one filter per
head) is added as a skip, as in the Nyströmformer LRA configs; the Skeinformer/Skyformer papers use
128 or 256 landmarks and no convolution, so it is off (0) by default.

Complexity: O(n·m·d + m²·n + m³) time, O(n·m) memory, with m = ``landmarks`` (default 256).

Deviations from the public code (LRA_FACTS §6, peers §5.4 and §5.10), all deliberate:
  * Landmarks are means over **real tokens only**: each sample's L real tokens, taken in order
    wherever they sit, are split into min(m, L) contiguous segments whose sizes differ by at most
    one. The public code reshapes the padded sequence (n must divide by m) and averages padded zeros
    into the landmarks, so padding changes the output. When a sample has fewer real tokens than m,
    the unused landmarks are masked out of every softmax and out of the pseudo-inverse (their rows
    and columns are zero, which the iteration preserves); with m ≥ n every real token is its own
    landmark and the output is exact softmax up to the pseudo-inverse's convergence.
  * Z₀ is scaled **per matrix** (per sample and head). The public code takes one max over the whole
    batch, which makes a sample's output depend on the others.
  * No fallback to exact softmax when m ≥ n (the public code switches); the same formula runs.
  * Computed in at least float32 with autocast off (half inputs are upcast; the iteration needs the
    range), as the papers' LRA code ran every attention in float32.
A sample without any real token is treated as all real so its output stays finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attention._linalg import hyperpower_iterations
from attention.registry import AttentionBackend, Capabilities, InvalidOption, check_range, full_mask, register
from attention.softmax import key_mask


@dataclass(frozen=True)
class NystromOptions:
    landmarks: int = 256  # m: segment-mean landmarks of Q and K (over real tokens)
    pinv_iterations: int = 6  # iterations of the landmark kernel's iterative pseudo-inverse
    conv_kernel: int = 0  # depthwise conv residual on V; 0 = off, else odd

    def __post_init__(self):
        check_range("landmarks", self.landmarks, 1, None, integer=True)
        check_range("pinv_iterations", self.pinv_iterations, 0, 1000, integer=True)
        check_range("conv_kernel", self.conv_kernel, 0, None, integer=True)
        if self.conv_kernel % 2 == 0 and self.conv_kernel != 0:
            raise InvalidOption(f"option 'conv_kernel'={self.conv_kernel!r} must be 0 (off) or odd")


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


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of each (m, m) matrix in ``a`` by the order-3 iteration, Z₀ per matrix."""
    norm1 = a.abs().sum(dim=-2).amax(dim=-1)  # max column sum, per matrix
    norm_inf = a.abs().sum(dim=-1).amax(dim=-1)  # max row sum, per matrix
    z = a.transpose(-1, -2) / (norm1 * norm_inf).clamp_min(torch.finfo(a.dtype).tiny)[..., None, None]
    return hyperpower_iterations(a, z, iterations)


@register("nystrom")
class NystromAttention(AttentionBackend):
    """Nyströmformer: segment-mean landmarks over real tokens, iterative pseudo-inverse."""

    Options = NystromOptions
    capabilities = Capabilities(padding_mask=True, exact=False, complexity="O(n)", target="softmax",
                                notes="O(n·m·d + m³); landmarks are masked segment means, any padding, any n")

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        k = options.conv_kernel
        self.conv = (nn.Conv2d(num_heads, num_heads, (k, 1), padding=(k // 2, 0), groups=num_heads, bias=False)
                     if k else None)

    def forward(self, q, k, v, mask=None):
        with torch.autocast(q.device.type, enabled=False):  # the iteration needs at least float32
            return self._forward(q, k, v, mask)

    def _forward(self, q, k, v, mask):
        o = self.options
        keep = key_mask(full_mask(q, mask))
        dtype = torch.promote_types(q.dtype, torch.float32)
        scale = q.shape[-1] ** -0.25
        qs, ks, vs = q.to(dtype) * scale, k.to(dtype) * scale, v.to(dtype)
        ql, lm_valid = segment_landmarks(qs, keep, o.landmarks)
        kl, _ = segment_landmarks(ks, keep, o.landmarks)
        neg = torch.finfo(dtype).min
        lm_cols = lm_valid[:, None, None, :]
        kernel_1 = (qs @ kl.transpose(-1, -2)).masked_fill(~lm_cols, neg).softmax(-1)  # (b,h,n,m)
        kernel_2 = (ql @ kl.transpose(-1, -2)).masked_fill(~lm_cols, neg).softmax(-1)  # (b,h,m,m)
        kernel_2 = kernel_2 * lm_valid[:, None, :, None]  # unused landmarks: zero rows and columns
        kernel_3 = (ql @ ks.transpose(-1, -2)).masked_fill(~keep[:, None, None, :], neg).softmax(-1)  # (b,h,m,n)
        out = (kernel_1 @ iterative_pinv(kernel_2, o.pinv_iterations)) @ (kernel_3 @ vs)
        if self.conv is not None:
            out = out + self.conv((vs * keep[:, None, :, None]).to(self.conv.weight.dtype)).to(dtype)
        return out.to(q.dtype)
