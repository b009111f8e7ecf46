"""performer (FAVOR+) against float64 recomputations: with the module's own ω exactly, against softmax
statistically (error shrinking with features), and the positive estimator's expectation exp(q·k/√d)."""

import math

import pytest
import torch

import attention
from attention.performer import gaussian_orthogonal_features
from attention.testing import masks, qkv
from tests.oracles import dense_softmax

H, D, N = 2, 16, 128


def reference_favor(q, k, v, mask, omega):
    """Dense float64 loops over real keys, no stabiliser: φ(x) = exp(ω x' − ‖x'‖²/2)/√m, x' = x/d^¼."""
    q, k, v, omega = q.double(), k.double(), v.double(), omega.double()
    d, m = q.shape[-1], omega.shape[0]

    def phi(x):
        x = x / d**0.25
        return torch.exp(x @ omega.T - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(m)

    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        for h in range(q.shape[1]):
            s = phi(q[b, h]) @ phi(k[b, h, real]).T  # (n, real)
            out[b, h] = (s @ v[b, h, real]) / s.sum(1, keepdim=True)
    return out


def rel_err(out, ref, mask):
    real = mask[:, None, :, None].expand_as(ref)
    return ((out.double() - ref)[real].norm() / ref[real].norm()).item()


@pytest.mark.parametrize("where", ["end", "middle"])
def test_favor_matches_float64_with_same_features(where):
    torch.manual_seed(0)
    m = attention.build("performer", num_heads=H, head_dim=D, max_len=N, features=64)
    q, k, v = qkv()
    mask = masks()[where]
    ref = reference_favor(q, k, v, mask, m.omega)
    real = mask[:, None, :, None].expand_as(ref)
    torch.testing.assert_close(m(q, k, v, mask).double()[real], ref[real], atol=2e-5, rtol=1e-4)
    out64 = m(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out64[real], ref[real], atol=1e-11, rtol=1e-9)


def test_per_call_redraw_uses_torch_rng():
    m = attention.build("performer", num_heads=H, head_dim=D, max_len=N, features=32, redraw="per_call")
    q, k, v = qkv()
    mask = masks()["middle"]
    torch.manual_seed(7)
    omega = m.draw_features()
    torch.manual_seed(7)
    out = m(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], reference_favor(q, k, v, mask, omega)[real], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(m(q, k, v, mask), out)  # a second call draws new features


def test_fixed_features_are_fixed_and_saved():
    torch.manual_seed(0)
    m = attention.build("performer", num_heads=H, head_dim=D, max_len=N)
    q, k, v = qkv()
    a = m.train()(q, k, v)
    torch.manual_seed(123)
    b = m.eval()(q, k, v)
    assert torch.equal(a, b)
    assert m.omega.shape == (256, D) and "omega" in m.state_dict()


@pytest.mark.parametrize("orthogonal", [True, False])
def test_positive_features_estimate_exp_kernel(orthogonal):
    """E_ω[φ(q)·φ(k)] = exp(q·k/√d): temperature 1/√d once (1/d, the public wrappers' double scaling, fails)."""
    d, m = D, 8192
    g = torch.Generator().manual_seed(0)
    q = 0.3 * torch.randn(48, d, generator=g, dtype=torch.float64)
    k = q.roll(1, 0) + 0.3 * torch.randn(48, d, generator=g, dtype=torch.float64)  # some correlated pairs
    exact = torch.exp(q @ k.T / math.sqrt(d))
    ratios = []
    for seed in range(4):
        torch.manual_seed(seed)
        omega = gaussian_orthogonal_features(m, d, orthogonal=orthogonal, dtype=torch.float64)
        assert omega.shape == (m, d)

        def phi(x):
            return torch.exp((x / d**0.25) @ omega.T - (x / d**0.25).square().sum(-1, keepdim=True) / 2)

        ratios.append((phi(q) @ phi(k).T / m) / exact)
    ratio = torch.stack(ratios).mean(0)
    assert (ratio.mean() - 1).abs() < 0.005  # unbiased
    assert (ratio - 1).abs().mean() < 0.02 and (ratio - 1).abs().max() < 0.1
    wrong = torch.exp(q @ k.T / d)  # the double-scaled kernel of the public wrappers is far off
    assert (ratio * exact / wrong - 1).abs().mean() > 0.05


def test_orthogonal_rows_within_blocks():
    torch.manual_seed(0)
    omega = gaussian_orthogonal_features(40, D, dtype=torch.float64)
    block = omega[:D] / omega[:D].norm(dim=1, keepdim=True)
    torch.testing.assert_close(block @ block.T, torch.eye(D, dtype=torch.float64))
    norms = gaussian_orthogonal_features(4096, D, dtype=torch.float64).norm(dim=1)
    assert abs(norms.square().mean().item() - D) < 1.0  # rows have Gaussian (chi) lengths


def test_error_against_softmax_shrinks_with_features():
    mask = masks()["middle"]
    errs = []
    for features in (16, 64, 256, 1024):
        e = []
        for seed in range(4):
            q, k, v = qkv(seed=seed)
            q, k = 0.5 * q, 0.5 * k  # moderate norms: the positive estimator's variance grows like exp(‖q'+k'‖²)
            torch.manual_seed(100 + seed)
            m = attention.build("performer", num_heads=H, head_dim=D, max_len=N, features=features)
            e.append(rel_err(m(q, k, v, mask), dense_softmax(q, k, v, mask), mask))
        errs.append(sum(e) / len(e))
    assert all(b < 0.8 * a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.15, errs


def test_stabiliser_is_per_sample():
    """A sample's output does not depend on the other samples (the JAX/public code takes one max over the batch)."""
    torch.manual_seed(0)
    m = attention.build("performer", num_heads=H, head_dim=D, max_len=N, features=64)
    q, k, v = qkv()
    mask = masks()["middle"]
    alone = m(q[:1], k[:1], v[:1], mask[:1])
    k2 = k.clone()
    longest = m.omega[m.omega.norm(dim=1).argmax()]
    k2[1] = D**0.25 * longest  # the other sample's keys maximise ω·k' − ‖k'‖²/2: its features dwarf ours
    together = m(q, k2, v, mask)
    torch.testing.assert_close(together[:1], alone, atol=1e-6, rtol=1e-5)
    assert torch.isfinite(together).all()


def test_all_padding_sample_is_finite():
    m = attention.build("performer", num_heads=H, head_dim=D, max_len=N)
    q, k, v = qkv()
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1] = False
    assert torch.isfinite(m(q, k, v, mask)).all()


@pytest.mark.parametrize("bad", [{"features": 0}, {"features": 1.5}, {"redraw": "sometimes"}, {"orthogonal": "yes"}])
def test_performer_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("performer", num_heads=H, head_dim=D, max_len=N, **bad)
