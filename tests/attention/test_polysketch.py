"""polynomial (exact) against a float64 dense-loop reference, the causal block lower-triangular
algorithm against the masked product, polysketch → polynomial as the sketch size grows, sketch
unbiasedness and non-negativity."""

import math

import pytest
import torch

import attention
from attention.polysketch import (
    causal_block_lower_triangular,
    degree2_features,
    draw_degree2_sketch,
    hadamard,
    self_tensor,
)
from attention.testing import masks, qkv

H, D, N = 2, 16, 128


def layer_norm(x, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt((x - mu).square().mean(-1, keepdim=True) + eps)


def reference_polynomial(q, k, v, mask, p, bias=1.0, causal=False, qk_norm=True):
    """Σ_j (q_i·k_j)^p v_j / (bias + Σ_j (q_i·k_j)^p) over the real (and, if causal, earlier) keys."""
    q, k, v = q.double(), k.double(), v.double()
    if qk_norm:
        q, k = layer_norm(q), layer_norm(k)
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                keys = [j for j in range(q.shape[2]) if mask[b, j] and (not causal or j <= i)]
                w = torch.stack([(q[b, h, i] @ k[b, h, j]) ** p for j in keys])
                out[b, h, i] = (w[:, None] * v[b, h, keys]).sum(0) / (bias + w.sum())
    return out


def build(name, **opts):
    return attention.build(name, num_heads=H, head_dim=D, max_len=N, **opts).eval()


def rel_err(a, b, mask):
    real = mask[:, None, :, None].expand_as(a)
    return ((a - b)[real].norm() / b[real].norm()).item()


# --------------------------------------------------------------------------------- polynomial
@pytest.mark.parametrize("degree", [2, 4, 6])
@pytest.mark.parametrize("where", ["end", "middle"])
@pytest.mark.parametrize("causal", [False, True])
def test_polynomial_matches_float64(degree, where, causal):
    q, k, v = qkv(n=40)
    mask = masks(n=40)[where]
    out = build("polynomial", degree=degree, causal=causal)(q, k, v, mask)
    ref = reference_polynomial(q, k, v, mask, degree, causal=causal)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)


def test_polynomial_float64_exact_without_layernorm_and_bias():
    q, k, v = qkv(n=40, dtype=torch.float64)
    mask = masks(n=40)["middle"]
    out = build("polynomial", qk_norm="none", normalizer_bias=0.0)(q, k, v, mask)
    ref = reference_polynomial(q, k, v, mask, 4, bias=0.0, qk_norm=False)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], ref[real], atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------------- block lower-triangular
@pytest.mark.parametrize("block_size", [1, 3, 8, 10, 37, 64])
def test_causal_block_algorithm_equals_masked_product(block_size):
    g = torch.Generator().manual_seed(block_size)
    n = 37  # prime: most block sizes do not divide it
    phi_q = torch.randn(2, 3, n, 6, generator=g, dtype=torch.float64)
    phi_k = torch.randn(2, 3, n, 6, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64)
    ref = torch.zeros_like(v)  # row i = Σ_{j ≤ i} (φ_q,i·φ_k,j) v_j, loop by loop
    for i in range(n):
        for j in range(i + 1):
            ref[..., i, :] += (phi_q[..., i, :] * phi_k[..., j, :]).sum(-1, keepdim=True) * v[..., j, :]
    out = causal_block_lower_triangular(phi_q, phi_k, v, block_size)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_polysketch_causal_equals_dense_masked_formula_on_its_features():
    q, k, v = qkv(n=50, dtype=torch.float64)
    mask = masks(n=50)["middle"]
    torch.manual_seed(0)
    m = build("polysketch", causal=True, block_size=16).double()
    out = m(q, k, v, mask)
    qn, kn = layer_norm(q), layer_norm(k)
    phi_q, phi_k = m.features(qn, m.sketch_matrices), m.features(kn, m.sketch_matrices)
    w = (phi_q @ phi_k.transpose(-1, -2)).tril() * mask[:, None, None, :]
    ref = (w @ v) / (1 + w.sum(-1, keepdim=True))
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], ref[real], atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("name", ["polysketch", "polynomial"])
def test_causal_prefix_unaffected_by_suffix(name):
    torch.manual_seed(0)
    m = build(name, causal=True, **({"block_size": 32} if name == "polysketch" else {}))
    q, k, v = qkv()
    a = m(q, k, v)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, :, 70:] += 1
    k2[:, :, 70:] += 5
    v2[:, :, 70:] -= 3
    b = m(q2, k2, v2)
    torch.testing.assert_close(a[:, :, :70], b[:, :, :70])
    assert not torch.allclose(a[:, :, 70:], b[:, :, 70:])


# ---------------------------------------------------------------------------------- polysketch
def test_polysketch_error_shrinks_with_sketch_size():
    """Mean relative error vs exact degree-4 polynomial attention, r = 8 → 32 → 128 (≈ 1/√r)."""
    mask = masks()["middle"]
    sizes = [8, 32, 128]
    errs = {r: 0.0 for r in sizes}
    seeds = range(4)
    for s in seeds:
        q, k, v = qkv(seed=s, dtype=torch.float64)
        k = q + 0.3 * k  # keys near their queries: concentrated attention, as in trained models
        ref = build("polynomial").double()(q, k, v, mask)
        for r in sizes:
            torch.manual_seed(100 + s)
            out = build("polysketch", sketch_size=r).double()(q, k, v, mask)
            errs[r] += rel_err(out, ref, mask) / len(seeds)
    assert errs[8] > errs[32] > errs[128], errs
    assert errs[128] < 0.6 * errs[8], errs


@pytest.mark.parametrize("kind", ["srht", "gaussian"])
def test_degree2_sketch_is_unbiased(kind):
    """E[φ₂(x)·φ₂(y)] = (x·y)², checked over 4000 independent sketches (drawn as 4000 'heads')."""
    g = torch.Generator().manual_seed(0)
    d, r, draws = 12, 8, 4000  # d not a power of two: the SRHT pads to 16
    x = torch.randn(1, 1, 3, d, generator=g, dtype=torch.float64)
    sk = draw_degree2_sketch(draws, d, r, kind, dtype=torch.float64, generator=g)
    phi = degree2_features(x.expand(1, draws, 3, d), sk)[0]  # (draws, 3, r)
    est = phi @ phi.transpose(-1, -2)  # (draws, 3, 3)
    exact = (x[0, 0] @ x[0, 0].T) ** 2
    se = est.std(0) / math.sqrt(draws)
    assert ((est.mean(0) - exact).abs() < 4 * se + 1e-9).all()


def test_self_tensored_weights_are_nonnegative():
    q, k, _ = qkv(dtype=torch.float64)
    sk = draw_degree2_sketch(H, D, 32, dtype=torch.float64)
    w = self_tensor(degree2_features(q, sk)) @ self_tensor(degree2_features(k, sk)).transpose(-1, -2)
    assert w.min() >= 0
    assert (w < 0).sum() == 0 and ((q @ k.transpose(-1, -2)) < 0).any()  # although q·k is not


def test_hadamard_is_orthogonal():
    h = hadamard(16, dtype=torch.float64)
    torch.testing.assert_close(h @ h.T, 16 * torch.eye(16, dtype=torch.float64))
    with pytest.raises(ValueError):
        hadamard(12)


def test_polysketch_redraw_policy():
    q, k, v = qkv()
    torch.manual_seed(0)
    fixed = build("polysketch")
    torch.testing.assert_close(fixed(q, k, v), fixed(q, k, v), atol=0, rtol=0)
    assert "sketch_matrices" in fixed.state_dict()
    per_call = build("polysketch", redraw="per_call")
    assert not torch.allclose(per_call(q, k, v), per_call(q, k, v))


@pytest.mark.parametrize(
    "name,bad",
    [
        ("polysketch", {"sketch_size": 0}),
        ("polysketch", {"sketch": "countsketch"}),
        ("polysketch", {"block_size": 0}),
        ("polysketch", {"normalizer_bias": -1.0}),
        ("polysketch", {"redraw": "per_step"}),
        ("polysketch", {"qk_norm": "rms"}),
        ("polynomial", {"degree": 3}),
        ("polynomial", {"degree": 0}),
        ("polynomial", {"causal": "yes"}),
    ],
)
def test_invalid_options_named(name, bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(name, **bad)
