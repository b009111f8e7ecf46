"""nystrom against float64 references: exact softmax when every real token is a landmark, the Nyström
formula with a true pseudo-inverse on masked segment-mean landmarks, error shrinking with landmarks."""

import math

import pytest
import torch

import attention
from attention.nystrom import iterative_pinv
from attention.testing import masks, qkv
from tests.oracles import dense_softmax

H, D = 2, 16


def smooth_qkv(n=128, seed=0, dtype=torch.float32):
    """Random walks along the sequence: tokens vary smoothly, so segment means are representative."""
    g = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(2, H, n, D, generator=g).cumsum(2) / math.sqrt(n)).to(dtype) for _ in range(3)]


def odd_masks(n):
    """Padding in the middle and at the end, different real counts per sample."""
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 10:31] = False
    mask[1, 40:43] = False
    mask[1, n - 6 :] = False
    return mask


def reference_nystrom(q, k, v, mask, m):
    """Dense float64 loops: landmarks = means of min(m, L) contiguous segments of the L real tokens
    (segment sizes differ by at most one), then softmax(Q̃K_Lᵀ) pinv(softmax(Q_L K_Lᵀ)) softmax(Q_L K̃ᵀ) V
    with torch.linalg.pinv, over real keys only."""
    q, k, v = q.double(), k.double(), v.double()
    d = q.shape[-1]
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        L = len(real)
        used = min(m, L)
        bounds = [math.ceil(s * L / used) for s in range(used + 1)]  # rank r in segment floor(r·used/L)
        segments = [real[bounds[s] : bounds[s + 1]] for s in range(used)]
        assert all(len(s) > 0 for s in segments) and sum(len(s) for s in segments) == L
        for h in range(q.shape[1]):
            qs, ks = q[b, h] / d**0.25, k[b, h] / d**0.25
            ql = torch.stack([qs[s].mean(0) for s in segments])
            kl = torch.stack([ks[s].mean(0) for s in segments])
            k1 = torch.softmax(qs @ kl.T, -1)
            k2 = torch.softmax(ql @ kl.T, -1)
            k3 = torch.softmax(ql @ ks[real].T, -1)
            out[b, h] = k1 @ torch.linalg.pinv(k2) @ (k3 @ v[b, h, real])
    return out


@pytest.mark.parametrize("where", ["end", "middle"])
def test_exact_softmax_when_every_token_is_a_landmark(where):
    """landmarks ≥ n: segment means are the tokens themselves, the formula is exact softmax."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()[where]
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=128, pinv_iterations=30)
    real = mask[:, None, :, None].expand_as(q)
    ref = dense_softmax(q, k, v, mask)
    torch.testing.assert_close(m(q, k, v, mask)[real], ref[real], atol=1e-9, rtol=1e-8)
    m32 = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=300, pinv_iterations=30)
    out32 = m32(*(t.float() for t in (q, k, v)), mask)
    torch.testing.assert_close(out32.double()[real], ref[real], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("landmarks", [1, 7, 16])
def test_matches_nystrom_formula_with_true_pinv(landmarks):
    """n = 100 (not a multiple of the landmarks), padding in the middle: masked segment means + pinv."""
    q, k, v = smooth_qkv(n=100, dtype=torch.float64)
    mask = odd_masks(100)
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=100, landmarks=landmarks, pinv_iterations=40)
    real = mask[:, None, :, None].expand_as(q)
    ref = reference_nystrom(q, k, v, mask, landmarks)
    torch.testing.assert_close(m(q, k, v, mask)[real], ref[real], atol=1e-8, rtol=1e-6)


def test_more_pinv_iterations_approach_true_pinv():
    q, k, v = smooth_qkv(n=128, seed=3, dtype=torch.float64)
    mask = masks()["middle"]
    real = mask[:, None, :, None].expand_as(q)
    ref = reference_nystrom(q, k, v, mask, 16)
    errs = []
    for iterations in (3, 6, 12, 24):
        m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=16, pinv_iterations=iterations)
        errs.append(((m(q, k, v, mask) - ref)[real].norm() / ref[real].norm()).item())
    assert all(b < a for a, b in zip(errs, errs[1:])) and errs[1] < 0.1 and errs[-1] < 1e-8, errs


def test_error_against_softmax_shrinks_with_landmarks():
    mask = masks()["middle"]
    real = mask[:, None, :, None].expand(2, H, 128, D)
    errs = []
    for landmarks in (2, 8, 32):
        e = []
        for seed in range(3):
            q, k, v = smooth_qkv(seed=seed)
            m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=landmarks)
            ref = dense_softmax(q, k, v, mask)
            e.append(((m(q, k, v, mask).double() - ref)[real].norm() / ref[real].norm()).item())
        errs.append(sum(e) / len(e))
    assert errs[1] < 0.5 * errs[0] and errs[2] < 0.8 * errs[1], errs


def test_pinv_initialisation_is_per_matrix():
    """A sample's output does not depend on the other samples (the public code scales Z₀ by one batch max)."""
    q, k, v = smooth_qkv(n=128, seed=1)
    q2, k2 = q.clone(), k.clone()
    q2[1], k2[1] = 6 * q[1], 6 * k[1]  # peaked kernels in sample 1: much larger column sums
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=16)
    alone = m(q[:1], k[:1], v[:1])
    torch.testing.assert_close(m(q2, k2, v)[:1], alone, atol=1e-6, rtol=1e-5)


def test_iterative_pinv_converges_to_pinv():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(3, 12, 12, generator=g, dtype=torch.float64), -1)
    torch.testing.assert_close(iterative_pinv(a, 40), torch.linalg.pinv(a), atol=1e-8, rtol=1e-6)


def test_conv_residual_adds_depthwise_conv_of_masked_v():
    torch.manual_seed(0)
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=16, conv_kernel=5)
    base = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=16)
    q, k, v = qkv()
    mask = masks()["middle"]
    vm = (v * mask[:, None, :, None]).double()
    w = m.conv.weight.double()  # (H, 1, 5, 1)
    conv = torch.zeros_like(vm)
    padded = torch.nn.functional.pad(vm, (0, 0, 2, 2))
    for h in range(H):
        for t in range(5):
            conv[:, h] += w[h, 0, t, 0] * padded[:, h, t : t + 128]
    torch.testing.assert_close(m(q, k, v, mask).double(), base(q, k, v, mask).double() + conv, atol=1e-5, rtol=1e-4)
    assert sum(p.numel() for p in m.parameters()) == H * 5
    assert not list(base.parameters())


def test_all_padding_sample_is_finite():
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=16)
    q, k, v = qkv()
    mask = torch.ones(2, 128, dtype=torch.bool)
    mask[1] = False
    assert torch.isfinite(m(q, k, v, mask)).all()


@pytest.mark.parametrize(
    "bad", [{"landmarks": 0}, {"pinv_iterations": -1}, {"conv_kernel": 4}, {"conv_kernel": -3}, {"landmarks": 2.5}]
)
def test_nystrom_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, **bad)
