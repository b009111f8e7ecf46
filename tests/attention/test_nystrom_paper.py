"""nystrom's public-code options (``paper`` presets) from first principles: landmarks that average the
padded zeros in (a hand example and a float64 loop reference), the pseudo-inverse start scaled by
one max over the whole batch (hand matrices, and the coupling it causes), the exact-softmax fallback
when every position is a landmark."""

import math

import pytest
import torch

import attention
from attention.nystrom import pinv_start
from attention.testing import masks, qkv

H, D = 2, 16
PAPER = {"landmark_mean": "padded", "pinv_init": "batch_colsum"}


def smooth_qkv(n=128, seed=0, batch=2):
    """float64 random walks along the sequence (segment means are then representative)."""
    g = torch.Generator().manual_seed(seed)
    return [
        2 * torch.randn(batch, H, n, D, generator=g, dtype=torch.float64).cumsum(2) / math.sqrt(n) for _ in range(3)
    ]


def with_garbage(x, mask, value=50.0):
    """x with large values at the padded positions: a correct module must not see them."""
    return x.masked_fill(~mask[:, None, :, None], value)


def reference_padded(q, k, v, mask, m, conv_weight=None, scale=None):
    """Dense float64 loops: Q, K zeroed at padded positions and divided by d^¼; landmark s is the mean
    of positions s·n/m … (s+1)·n/m − 1, padded zeros included; kernel_1 and kernel_2 over every
    landmark, kernel_3 over real keys only; the pseudo-inverse is torch.linalg.pinv, or Z₀ = Aᵀ/scale
    (no iteration) when ``scale`` is given. ``conv_weight`` (H, 1, t, 1): depthwise conv of V·mask
    along the sequence, zero-padded by t//2 on both sides, added."""
    b, h, n, d = q.shape
    seg = n // m
    out = torch.zeros_like(q)
    for i in range(b):
        real = mask[i].nonzero().flatten()
        keep = mask[i].double()[:, None]
        for j in range(h):
            qs, ks = q[i, j] * keep / d**0.25, k[i, j] * keep / d**0.25
            ql = torch.stack([qs[s * seg : (s + 1) * seg].mean(0) for s in range(m)])
            kl = torch.stack([ks[s * seg : (s + 1) * seg].mean(0) for s in range(m)])
            k1 = torch.softmax(qs @ kl.T, -1)
            k2 = torch.softmax(ql @ kl.T, -1)
            k3 = torch.softmax(ql @ ks[real].T, -1)
            inv = torch.linalg.pinv(k2) if scale is None else k2.T / scale
            out[i, j] = k1 @ inv @ (k3 @ v[i, j, real])
            if conv_weight is not None:
                t = conv_weight.shape[2]
                vm = torch.nn.functional.pad(v[i, j] * keep, (0, 0, t // 2, t // 2))
                for r in range(n):
                    out[i, j, r] += (conv_weight[j, 0, :, 0, None] * vm[r : r + t]).sum(0)
    return out


def test_padded_landmarks_hand_example():
    """n = 4, m = 2, d = 1, one head, the last token padded. Padded-sequence landmarks: Q̃ = (1, 3, 5, 0)
    gives Q_L = ((1+3)/2, (5+0)/2) = (2, 2.5) (over real tokens they would be (2, 5)), likewise
    K_L = (1, 1.5); the padded query row is zero, so its kernel_1 row is uniform."""
    q = torch.tensor([1.0, 3.0, 5.0, 100.0], dtype=torch.float64).view(1, 1, 4, 1)
    k = torch.tensor([0.0, 2.0, 3.0, -40.0], dtype=torch.float64).view(1, 1, 4, 1)
    v = torch.tensor([1.0, -1.0, 2.0, 7.0], dtype=torch.float64).view(1, 1, 4, 1)
    mask = torch.tensor([[True, True, True, False]])
    f64 = {"dtype": torch.float64}
    ql, kl = torch.tensor([2.0, 2.5], **f64), torch.tensor([1.0, 1.5], **f64)
    qs, ks = torch.tensor([1.0, 3.0, 5.0, 0.0], **f64), torch.tensor([0.0, 2.0, 3.0], **f64)
    k1 = torch.softmax(qs[:, None] * kl[None, :], -1)
    assert torch.allclose(k1[3], torch.tensor([0.5, 0.5], **f64))
    k2 = torch.softmax(ql[:, None] * kl[None, :], -1)
    k3 = torch.softmax(ql[:, None] * ks[None, :], -1)
    expected = k1 @ torch.linalg.inv(k2) @ (k3 @ torch.tensor([1.0, -1.0, 2.0], **f64))
    m = attention.build("nystrom", num_heads=1, head_dim=1, max_len=4, landmarks=2, pinv_iterations=60, **PAPER)
    torch.testing.assert_close(m(q, k, v, mask).flatten(), expected, atol=1e-10, rtol=1e-9)
    clean = attention.build("nystrom", num_heads=1, head_dim=1, max_len=4, landmarks=2, pinv_iterations=60)
    assert (clean(q, k, v, mask).flatten()[:3] - expected[:3]).abs().max() > 1e-2  # real-token landmarks differ


@pytest.mark.parametrize("where", ["end", "middle"])
def test_padded_landmarks_match_loop_reference_with_conv(where):
    """Every row (padded ones too) against the loop reference; garbage at padded positions of q, k, v
    must not leak in (they are zeroed before the means and masked in kernel_3 and the conv)."""
    q, k, v = smooth_qkv(n=128, seed=2)
    mask = masks()[where]
    torch.manual_seed(0)
    m = attention.build(
        "nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=16, pinv_iterations=60, conv_kernel=5, **PAPER
    ).double()
    ref = reference_padded(q, k, v, mask, 16, conv_weight=m.conv.weight.detach().double())
    out = m(*(with_garbage(t, mask) for t in (q, k, v)), mask)
    torch.testing.assert_close(out, ref, atol=1e-8, rtol=1e-6)


def test_padded_landmarks_depend_on_the_amount_of_padding():
    """Appending padding changes the padded-sequence landmarks (zeros averaged in) but not the
    real-token ones: the quirk in one line."""
    q, k, v = smooth_qkv(n=64, seed=4, batch=1)
    mask = torch.ones(1, 64, dtype=torch.bool)
    ext = [torch.cat([t, torch.zeros_like(t)], 2) for t in (q, k, v)]
    mask_ext = torch.cat([mask, torch.zeros_like(mask)], 1)
    for opts, same in (({}, True), (PAPER, False)):
        m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=128, landmarks=8, **opts)
        diff = (m(q, k, v, mask) - m(*ext, mask_ext)[:, :, :64]).abs().max().item()
        assert (diff < 1e-10) == same, (opts, diff)


def test_padded_landmarks_need_n_divisible_by_landmarks():
    q, k, v = qkv(n=100)
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=100, landmarks=16, **PAPER)
    with pytest.raises(ValueError, match="divisible"):
        m(q, k, v)


def test_pinv_start_hand_matrices():
    """Four 2×2 matrices, (batch 2, heads 2). Column sums: A1 (2, 2), A2 (6, 0); row sums: A1 (4, 0),
    A2 (3, 3). batch_colsum divides all by the largest column sum anywhere (6); batch_norm1_inf by
    the largest column sum times the largest row sum anywhere (6·4 = 24, not the largest per-matrix
    product 18); per_matrix each by its own ‖A‖₁‖A‖∞."""
    a1 = torch.tensor([[2.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    a2 = torch.tensor([[3.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    small = torch.tensor([[0.5, 0.25], [0.25, 0.5]], dtype=torch.float64)
    a = torch.stack([torch.stack([a1, small]), torch.stack([0.1 * small, a2])])
    at = a.transpose(-1, -2)
    torch.testing.assert_close(pinv_start(a, "batch_colsum"), at / 6)
    torch.testing.assert_close(pinv_start(a, "batch_norm1_inf"), at / 24)
    per = torch.tensor([[2 * 4, 0.75 * 0.75], [0.075 * 0.075, 6 * 3]], dtype=torch.float64)
    torch.testing.assert_close(pinv_start(a, "per_matrix"), at / per[..., None, None])
    stochastic = torch.softmax(a, -1)  # row sums 1: the two batch starts coincide
    torch.testing.assert_close(pinv_start(stochastic, "batch_norm1_inf"), pinv_start(stochastic, "batch_colsum"))


def test_batch_colsum_start_couples_the_samples():
    """With no iteration the output is kernel_1 · Aᵀ/c · kernel_3 V, c the largest column sum of any
    sample's and head's landmark kernel A: against the loop reference with that global c, and a
    sample computed alone is rescaled by exactly c_alone / c_batch."""
    q, k, v = smooth_qkv(n=64, seed=5)
    q[1], k[1] = 4 * q[1], 4 * k[1]  # peaked kernels in sample 1: larger column sums
    mask = torch.ones(2, 64, dtype=torch.bool)
    mask[0, 40:] = False
    d, seg = D, 8
    colmax = []
    for i in range(2):
        keep = mask[i].double()[None, :, None]
        qs, ks = q[i] * keep / d**0.25, k[i] * keep / d**0.25
        ql, kl = qs.view(H, 8, seg, D).mean(2), ks.view(H, 8, seg, D).mean(2)
        colmax.append(torch.softmax(ql @ kl.transpose(-1, -2), -1).sum(-2).max())
    c = max(colmax)
    m = attention.build("nystrom", num_heads=H, head_dim=D, max_len=64, landmarks=8, pinv_iterations=0, **PAPER)
    out = m(q, k, v, mask)
    torch.testing.assert_close(out, reference_padded(q, k, v, mask, 8, scale=c), atol=1e-10, rtol=1e-9)
    alone = m(q[:1], k[:1], v[:1], mask[:1])
    assert colmax[1] > 1.2 * colmax[0]
    torch.testing.assert_close(alone * colmax[0], out[:1] * c, atol=1e-10, rtol=1e-9)
    per = attention.build(
        "nystrom", num_heads=H, head_dim=D, max_len=64, landmarks=8, pinv_iterations=0, landmark_mean="padded"
    )
    torch.testing.assert_close(per(q[:1], k[:1], v[:1], mask[:1]), per(q, k, v, mask)[:1], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("opts", [PAPER, {}])
def test_exact_if_full_gives_masked_softmax(opts):
    """m = n with exact_if_full: softmax(Q̃K̃ᵀ) over real keys; with padded landmarks a padded query is
    zero, so its row is the plain mean of the real values. Without the option, 6 iterations at m = n
    are not exact."""
    mask = masks(64)["end"]
    q, k, v = (with_garbage(t, mask) for t in qkv(n=64, dtype=torch.float64))
    s = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~mask[:, None, None, :], -math.inf)
    ref = s.softmax(-1) @ v
    real = mask[:, None, :, None].expand_as(q)
    full = attention.build("nystrom", num_heads=H, head_dim=D, max_len=64, landmarks=64, exact_if_full=True, **opts)
    out = full(q, k, v, mask)
    torch.testing.assert_close(out[real], ref[real], atol=1e-12, rtol=1e-10)
    if opts:
        for i in range(2):
            mean_v = v[i][:, mask[i]].mean(1)  # (H, D)
            torch.testing.assert_close(out[i][:, ~mask[i]], mean_v[:, None].expand(H, int((~mask[i]).sum()), D))
    plain = attention.build("nystrom", num_heads=H, head_dim=D, max_len=64, landmarks=64, **opts)
    assert (plain(q, k, v, mask)[real] - ref[real]).abs().max() > 1e-4


@pytest.mark.parametrize("bad", [{"landmark_mean": "masked"}, {"pinv_init": "global"}, {"exact_if_full": "yes"}])
def test_paper_options_invalid_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("nystrom", num_heads=H, head_dim=D, max_len=64, **bad)
