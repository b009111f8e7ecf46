"""Informer ProbSparse self-attention (Zhou et al., AAAI 2021, §"ProbSparse Self-attention"), as used
as a baseline in the Skeinformer and Skyformer LRA tables, plus the padding-aware twin of the
Skeinformer paper (§4.4, "Informer w/ padding mask").

For every (sample, head), with s_ij = q_i·k_j/√p:
  1. each query i gets U keys drawn uniformly with replacement, and the query sparsity measurement
     M̄(q_i) = max_j s_ij − mean_j s_ij over those sampled keys (Informer eq. 4, sampled form);
  2. the top-u queries by M̄ get their exact softmax row over all keys;
  3. the other ("lazy") queries output mean(V).
U = u = factor·⌈ln n⌉ (capped at n) with factor = ⌈num_features / ln max_len⌉, the Skeinformer
paper's "(256/log n) as the factor in Informer", so about ``num_features`` rows are exact at
n = max_len. Complexity O(n·U·p + u·n·p) = O(n log n) for fixed factor; the measurement is computed
without gradient (the top-u choice is discrete) in query chunks to bound memory.

Registered names:
  * ``informer``: DELIBERATELY MASK-BLIND, reproducing the papers' maskless Informer row (their port
    ran ProbSparse with ``mask_flag=False`` and ignored the padding mask): padded keys are sampled,
    take part in every softmax and in mean(V). ``capabilities.padding_mask`` is False.
  * ``informer_mask``: keys are sampled only among real tokens, padded queries are never selected
    (M̄ = −∞), the exact rows are softmax over real keys, and mean(V) is over real tokens; padding
    may sit anywhere and each sample uses its own number of real tokens m.

Budget ≥ n: u = n, so every row is exact and the output equals softmax attention (over all
positions for ``informer``, over real keys for ``informer_mask``) up to float rounding.

Deviations from the Informer code and the LRA port, and why:
  * M̄'s mean term divides by the number of sampled keys (the sample mean the paper's estimator
    stands for); the code divides a sum over U sampled keys by n, mixing scales.
  * sampled keys are drawn per sample and per query and shared across heads (the code shares one
    draw across the batch too; per-sample draws are needed once samples have different m).
  * ``informer_mask`` uses the same factor rule as ``informer`` (the unreachable public mask file used
    ``factor = num_features``), so the two rows differ only in masking.
  * randomness is redrawn on every call from torch's global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention.registry import AttentionBackend, Capabilities, check_range, full_mask, register
from attention.softmax import key_mask

NEG_INF = float("-inf")
_CHUNK_ELEMS = 1 << 24  # elements of the gathered (b, h, chunk, U, p) key block per step


@dataclass(frozen=True)
class InformerOptions:
    num_features: int = 256  # about this many exact rows (and sampled keys per query) at n = max_len

    def __post_init__(self):
        check_range("num_features", self.num_features, 1, None, integer=True)


def sample_keys(real: torch.Tensor, u_keys: int) -> torch.Tensor:
    """For each sample and query, ``u_keys`` key positions uniform with replacement among the real ones.

    real (b, n) bool with at least one True per row -> (b, n, u_keys) long. Padding may sit anywhere:
    a uniform rank r < m is mapped to the r-th real position.
    """
    b, n = real.shape
    order = torch.argsort((~real).to(torch.int8), dim=-1, stable=True)  # real positions first, in order
    m = real.sum(-1)[:, None, None]
    r = (torch.rand(b, n, u_keys, device=real.device) * m).long().minimum(m - 1)
    return order.gather(1, r.reshape(b, -1)).view(b, n, u_keys)


def sparsity_measure(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """M̄(q_i) = max − mean of q_i·k_j/√p over the sampled keys j = idx[b, i, :]: (b, h, n)."""
    b, h, n, p = q.shape
    u_keys = idx.shape[-1]
    chunk = max(1, _CHUNK_ELEMS // max(1, b * h * u_keys * p))
    out = []
    for i0 in range(0, n, chunk):
        ids = idx[:, i0 : i0 + chunk]  # (b, c, U)
        c = ids.shape[1]
        ks = k.gather(2, ids.reshape(b, 1, c * u_keys, 1).expand(b, h, c * u_keys, p)).view(b, h, c, u_keys, p)
        s = torch.einsum("bhcp,bhcup->bhcu", q[:, :, i0 : i0 + c], ks) / math.sqrt(p)
        out.append(s.amax(-1) - s.mean(-1))
    return torch.cat(out, dim=-1)


class _ProbSparse(AttentionBackend):
    Options = InformerOptions
    mask_aware: bool = True

    def sizes(self, n: int) -> int:
        """u (= U): exact rows and sampled keys per query for length n."""
        factor = math.ceil(self.options.num_features / max(math.log(self.max_len), 1.0))
        log_n = max(1, math.ceil(math.log(n))) if n > 1 else 1
        return min(n, factor * log_n)

    def forward(self, q, k, v, mask=None):
        b, h, n, p = q.shape
        real = full_mask(q, mask)
        real = key_mask(real) if self.mask_aware else torch.ones_like(real)
        u = self.sizes(n)
        keyreal = real[:, None, None, :]
        with torch.no_grad():
            idx = sample_keys(real, u)
            score = sparsity_measure(q.detach(), k.detach(), idx).masked_fill(~real[:, None, :], NEG_INF)
            top = score.topk(u, dim=-1).indices  # (b, h, u) active queries
        q_top = q.gather(2, top[..., None].expand(b, h, u, p))
        s = ((q_top @ k.transpose(-1, -2)) / math.sqrt(p)).masked_fill(~keyreal, NEG_INF)
        v = v.masked_fill(~real[:, None, :, None], 0.0)
        exact = s.softmax(-1) @ v  # (b, h, u, p)
        lazy = v.sum(-2, keepdim=True) / real.sum(-1).to(v.dtype)[:, None, None, None]  # mean(V) over real
        return lazy.expand(b, h, n, p).scatter(2, top[..., None].expand(b, h, u, p), exact)


@register("informer")
class InformerAttention(_ProbSparse):
    """Informer ProbSparse attention, mask-blind as in the papers' Informer row."""

    mask_aware = False
    capabilities = Capabilities(
        padding_mask=False,
        exact=False,
        randomized=True,
        complexity="O(n log n)",
        notes="ignores the padding mask on purpose (papers' maskless Informer row); " "exact when u = n",
    )


@register("informer_mask")
class InformerMaskAttention(_ProbSparse):
    """Informer ProbSparse attention with padding mask (Skeinformer §4.4)."""

    mask_aware = True
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        complexity="O(n log n)",
        notes="sampling, sparsity measure and mean(V) over real tokens; exact when u = n",
    )
