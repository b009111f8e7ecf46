"""Float64 oracles and input makers shared by the attention tests, written independently of the
backends (dense loops over real keys; nothing vectorised the way the implementations are)."""

from __future__ import annotations

import math

import torch


def rand_qkv(n, seed, b=2, h=2, p=8, scale=1.0):
    """Gaussian q, k, v (b, h, n, p) in float64."""
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(b, h, n, p, generator=g, dtype=torch.float64) for _ in range(3)]


def structured_qkv(n, seed, b=2, h=2, p=32, dim=64, clusters=8):
    """Clustered tokens with correlated W_q, W_k: peaked, non-uniform attention like a trained layer."""
    g = torch.Generator().manual_seed(seed)
    centers = 1.5 * torch.randn(clusters, dim, generator=g)
    x = centers[torch.randint(clusters, (b, n), generator=g)] + torch.randn(b, n, dim, generator=g)
    x = x / x.norm(dim=-1, keepdim=True) * math.sqrt(dim)
    wq = torch.randn(h, dim, p, generator=g) / math.sqrt(dim)
    wk = wq + 0.5 * torch.randn(h, dim, p, generator=g) / math.sqrt(dim)
    wv = torch.randn(h, dim, p, generator=g) / math.sqrt(dim)
    return [torch.einsum("bnd,hdp->bhnp", x, w).double() for w in (wq, wk, wv)]


def dense_softmax(q, k, v, mask, allowed=None):
    """Row i of head h: softmax(q_i·k_j/√d) over the real keys j (and, if given, ``allowed[i, j]`` or
    ``allowed[h, i, j]``). A row with no such key is 0. Float64 dense loops."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                keep = mask[b]
                if allowed is not None:
                    keep = keep & (allowed[i] if allowed.dim() == 2 else allowed[h, i])
                keys = keep.nonzero().flatten()
                if len(keys):
                    s = k[b, h, keys] @ q[b, h, i] / math.sqrt(q.shape[-1])
                    out[b, h, i] = torch.softmax(s, 0) @ v[b, h, keys]
    return out


def dense_linear(q, k, v, mask, eps=1e-6, divide_by=None):
    """Linear attention by dense float64 loops over real keys, s_ij = φ(q_i)·φ(k_j), φ = elu + 1:
    out_i = Σ_j s_ij v_j / (Σ_j s_ij + eps) (Katharopoulos et al.), or, with ``divide_by``, the raw
    sum Σ_j s_ij v_j / divide_by (the Nyströmformer LRA code's form)."""
    q, k, v = q.double(), k.double(), v.double()
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # noqa: E731 - elu(x) + 1
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                s = phi(k[b, h, real]) @ phi(q[b, h, i])
                out[b, h, i] = (s[:, None] * v[b, h, real]).sum(0) / (s.sum() + eps if divide_by is None else divide_by)
    return out
