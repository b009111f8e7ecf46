"""linear's public-code options (``paper`` presets) from first principles: the raw sum without the
normaliser, the n^¼ feature scale with n the padded length, and how each acts alone."""

import math

import pytest
import torch

import attention
from attention.testing import masks, qkv
from tests.oracles import dense_linear

H, D, N = 2, 16, 128
PAPER = {"normaliser": False, "feature_scale": "seq_len_quarter"}


def build(**opts):
    return attention.build("linear", num_heads=H, head_dim=D, max_len=N, **opts)


@pytest.mark.parametrize("where", ["end", "middle"])
def test_paper_form_is_raw_sum_over_sqrt_padded_length(where):
    """φ(q)/n^¼ · (φ(k)/n^¼)ᵀ v summed over real keys: the division is by √n with n = 48 the padded
    length, not by √(number of real keys); padded rows are computed too."""
    n = 48
    q, k, v = qkv(n=n)
    mask = masks(n=n)[where]
    assert (mask.sum(-1) < n).all()
    out = build(**PAPER)(q, k, v, mask)
    torch.testing.assert_close(out.double(), dense_linear(q, k, v, mask, divide_by=math.sqrt(n)), atol=1e-5, rtol=1e-5)
    out64 = build(**PAPER)(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out64, dense_linear(q, k, v, mask, divide_by=math.sqrt(n)), atol=1e-12, rtol=1e-10)


def test_normaliser_off_alone_is_the_raw_sum():
    """Without the normaliser the output is additive in the keys: duplicating every key/value doubles it
    (the normalised model is invariant to that)."""
    q, k, v = qkv(n=40, dtype=torch.float64)
    mask = torch.ones(2, 40, dtype=torch.bool)
    out = build(normaliser=False)(q, k, v, mask)
    torch.testing.assert_close(out, dense_linear(q, k, v, mask, divide_by=1.0), atol=1e-12, rtol=1e-10)
    q2, k2, v2 = (torch.cat([t, t], 2) for t in (q, k, v))
    torch.testing.assert_close(build(normaliser=False)(q2, k2, v2)[:, :, :40], 2 * out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(build(eps=0.0)(q2, k2, v2)[:, :, :40], build(eps=0.0)(q, k, v), atol=1e-12, rtol=1e-10)


def test_feature_scale_alone_only_rescales_eps():
    """With the normaliser on, dividing both features by n^¼ divides numerator and normaliser by √n,
    so it equals the default with eps multiplied by √n."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    eps = 1e-2
    got = build(feature_scale="seq_len_quarter", eps=eps)(q, k, v, mask)
    want = build(eps=eps * math.sqrt(N))(q, k, v, mask)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    assert not torch.allclose(got, build(eps=eps)(q, k, v, mask), atol=1e-6, rtol=1e-6)


def test_paper_form_ignores_padded_content():
    q, k, v = qkv()
    mask = masks()["middle"]
    pad = ~mask[:, None, :, None]
    g = torch.Generator().manual_seed(9)
    q2, k2, v2 = (torch.where(pad, 10 * torch.randn(t.shape, generator=g), t) for t in (q, k, v))
    m = build(**PAPER)
    real = (~pad).expand_as(q)
    torch.testing.assert_close(m(q2, k2, v2, mask)[real], m(q, k, v, mask)[real], atol=0, rtol=0)


@pytest.mark.parametrize("bad", [{"normaliser": "no"}, {"feature_scale": "sqrt_n"}, {"feature_scale": None}])
def test_paper_options_validated(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(**bad)
