"""linear (Katharopoulos elu+1 with normaliser) against its exact kernel form in float64."""

import pytest
import torch

import attention
from attention.testing import masks, qkv
from tests.oracles import dense_linear


@pytest.mark.parametrize("where", ["end", "middle"])
def test_linear_matches_float64_kernel(where):
    m = attention.build("linear", num_heads=2, head_dim=16, max_len=128)
    q, k, v = qkv()
    mask = masks()[where]
    real = mask[:, None, :, None].expand_as(q)
    out = m(q, k, v, mask)
    torch.testing.assert_close(out.double()[real], dense_linear(q, k, v, mask)[real], atol=1e-5, rtol=1e-4)
    out64 = m(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out64[real], dense_linear(q, k, v, mask)[real], atol=1e-12, rtol=1e-10)


def test_linear_has_normaliser():
    """Scaling all values by 3 scales the output by 3; duplicating every key/value leaves it unchanged."""
    m = attention.build("linear", num_heads=2, head_dim=16, max_len=128)
    q, k, v = qkv(n=64)
    torch.testing.assert_close(m(q, k, 3 * v), 3 * m(q, k, v), rtol=1e-5, atol=1e-5)
    q2 = torch.cat([q, q], dim=2)
    out = m(q2, torch.cat([k, k], 2), torch.cat([v, v], 2))[:, :, :64]
    torch.testing.assert_close(out, m(q, k, v), rtol=1e-5, atol=1e-5)


def test_linear_all_padding_sample_finite():
    m = attention.build("linear", num_heads=2, head_dim=16, max_len=128, eps=0.0)
    q, k, v = qkv()
    mask = torch.ones(2, 128, dtype=torch.bool)
    mask[1] = False
    assert torch.isfinite(m(q, k, v, mask)).all()


@pytest.mark.parametrize("bad", [{"eps": -1e-3}, {"eps": 2.0}, {"eps": "small"}])
def test_linear_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("linear", num_heads=2, head_dim=16, max_len=128, **bad)
