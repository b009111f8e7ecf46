"""softmax and none against an exact float64 reference, with padding at the end and in the middle."""

import pytest
import torch

import attention
from attention.testing import masks, qkv
from tests.oracles import dense_softmax


@pytest.mark.parametrize("impl", ["fused", "materialized"])
@pytest.mark.parametrize("where", ["end", "middle"])
def test_softmax_matches_float64(impl, where):
    m = attention.build("softmax", num_heads=2, head_dim=16, max_len=128, dropout=0.1, impl=impl).eval()
    q, k, v = qkv()
    mask = masks()[where]
    out = m(q, k, v, mask)
    ref = dense_softmax(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)


def test_softmax_float64_input_is_exact():
    m = attention.build("softmax", num_heads=2, head_dim=16, max_len=128, dropout=0.0, impl="materialized")
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    out = m(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], dense_softmax(q, k, v, mask)[real], atol=1e-12, rtol=1e-10)


def test_softmax_dropout_only_in_training():
    m = attention.build("softmax", num_heads=2, head_dim=16, max_len=128, dropout=0.5)
    q, k, v = qkv()
    m.eval()
    a = m(q, k, v)
    m.train()
    torch.manual_seed(0)
    b = m(q, k, v)
    assert not torch.allclose(a, b)
    m0 = attention.build("softmax", num_heads=2, head_dim=16, max_len=128, dropout=0.0).train()
    torch.testing.assert_close(m0(q, k, v), a)


def test_softmax_causal_prefix_unaffected_by_suffix():
    m = attention.build("softmax", num_heads=2, head_dim=16, max_len=128, dropout=0.0, causal=True)
    q, k, v = qkv()
    a = m(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 70:] += 5
    v2[:, :, 70:] -= 3
    b = m(q, k2, v2)
    torch.testing.assert_close(a[:, :, :70], b[:, :, :70])
    assert not torch.allclose(a[:, :, 70:], b[:, :, 70:])


def test_all_padding_sample_is_finite():
    m = attention.build("softmax", num_heads=2, head_dim=16, max_len=128, dropout=0.0)
    q, k, v = qkv()
    mask = torch.ones(2, 128, dtype=torch.bool)
    mask[1] = False
    assert torch.isfinite(m(q, k, v, mask)).all()


@pytest.mark.parametrize("bad", [{"dropout": -0.1}, {"dropout": 1.0}, {"impl": "flash3"}])
def test_softmax_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("softmax", num_heads=2, head_dim=16, max_len=128, **bad)


def test_none_returns_v():
    m = attention.build("none", num_heads=2, head_dim=16, max_len=128)
    q, k, v = qkv()
    assert torch.equal(m(q, k, v, masks()["middle"]), v)
