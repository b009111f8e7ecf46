"""What a method's output is compared with, and how.

The exact attentions: softmax (B V), Reformer's full shared-QK softmax, kernelized (Gaussian)
attention C V of Skyformer, or a registered exact backend of a method's ``target``; and the metric

    relative error = ||B V - R||_2 / ||B V||_2   (spectral norm, in float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import attention
from lra.tools.approx.methods import NOT_STUDIED


@dataclass
class Reference:
    """Exact attention a method is compared with: name -> fn(q, k, v) (heads, n, d) fp32."""

    name: str
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    note: str = ""


# ----------------------------------------------------------------------------- references
def softmax_attention(q, k, v):
    """Exact softmax(QK^T/sqrt(p)) V (the reference B V)."""
    return F.scaled_dot_product_attention(q, k, v)


def shared_qk_attention(q, k, v):
    """Full shared-QK attention of Reformer (Sec. 2): keys k_j = q_j/||q_j||, logits q_i·k_j/sqrt(p),
    a token does not attend to itself unless it has no other key. ``k`` is ignored."""
    kn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    n = q.shape[-2]
    scores = (q @ kn.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if n > 1:
        scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    return scores.softmax(dim=-1) @ v


def gaussian_attention(q, k, v):
    """Kernelized attention C V, C_ij = exp(-||q_i - k_j||^2 / (2 sqrt(p))) (Skyformer Eq. 3),
    used only when no exact ``gaussian`` backend is registered."""
    s = 1.0 / q.shape[-1] ** 0.25
    qs, ks = q * s, k * s
    d2 = (qs * qs).sum(-1, keepdim=True) - 2 * qs @ ks.transpose(-1, -2) + (ks * ks).sum(-1)[..., None, :]
    return torch.exp(-0.5 * d2.clamp_min(0)) @ v


def reference_for(target: str, registered: list[str]) -> Reference | None:
    """Exact attention of ``target``: softmax, else a registered exact backend of that target
    (``kernelized`` for "gaussian"), else our own formula for "gaussian", else None."""
    if target == "softmax":
        return Reference("softmax", softmax_attention)
    exact = [
        n
        for n in registered
        if n not in NOT_STUDIED and _safe_describe(n).get("exact") and _safe_describe(n).get("target") == target
    ]
    exact.sort(key=lambda n: (n != "kernelized", n))
    if exact:
        name = exact[0]
        defaults = attention.option_defaults(name)
        opts = {"dropout": 0.0} if "dropout" in defaults else {}

        def fn(q, k, v, _name=name, _opts=opts):
            mod = attention.build(
                _name, num_heads=q.shape[0], head_dim=q.shape[-1], max_len=q.shape[-2], **_opts
            ).eval()
            return mod(q[None], k[None], v[None])[0]

        return Reference(name, fn, f"registered exact backend {name!r}")
    if target == "gaussian":
        return Reference("kernelized", gaussian_attention, "own formula (no exact gaussian backend registered)")
    return None


def _safe_describe(name: str) -> dict:
    try:
        return attention.describe(name)
    except Exception:
        return {}


# ----------------------------------------------------------------------------- metric
def spectral_norm(m: torch.Tensor) -> torch.Tensor:
    """Largest singular value of each matrix in ``m`` (..., rows, cols), in float64.

    sqrt of the top eigenvalue of the smaller Gram matrix: cheap for tall n×32 outputs.
    """
    m = m.double()
    g = m.transpose(-1, -2) @ m if m.shape[-2] >= m.shape[-1] else m @ m.transpose(-1, -2)
    return torch.linalg.eigvalsh(g)[..., -1].clamp_min(0).sqrt()


def relative_error(exact: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
    """||exact - approx||_2 / ||exact||_2 per matrix (leading dims kept)."""
    return spectral_norm(exact.double() - approx.double()) / spectral_norm(exact)
