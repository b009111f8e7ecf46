"""attention/_scores.py: the score matrix every backend builds, and its mask as an additive bias."""

import math

import pytest
import torch

from attention._scores import key_bias, scores


def _ref(q, k, scale, keep):
    """The definition, in float64: scale * q k^T, -inf where the key is dropped."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    return s.masked_fill(~keep, float("-inf")) if keep is not None else s


@pytest.mark.parametrize("keep_shape", [None, (2, 1, 1, 7), (2, 3, 1, 7), (2, 3, 5, 7), (1, 1, 5, 1)])
def test_scores_equal_the_scaled_product_with_dropped_keys_at_minus_infinity(keep_shape):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    keep = None
    if keep_shape is not None:  # padding in the middle and at the end of the keys
        keep = torch.rand(keep_shape, generator=g) > 0.4
        keep[..., 0] = True
    bias = None if keep is None else key_bias(keep, q.dtype)
    got = scores(q, k, 0.5, bias)
    want = _ref(q, k, 0.5, keep)
    assert got.shape == want.shape
    assert torch.equal(torch.isinf(got), torch.isinf(want.expand_as(got)))
    fin = torch.isfinite(want.expand_as(got))
    torch.testing.assert_close(got[fin], want.expand_as(got)[fin], rtol=1e-12, atol=1e-12)
    # the gradient: through the kept entries only (a softmax's probabilities), as with a masked fill
    dq, dk = torch.autograd.grad(got.softmax(-1).square().sum(), (q, k))
    q2, k2 = q.detach().requires_grad_(), k.detach().requires_grad_()
    rq, rk = torch.autograd.grad(_ref(q2, k2, 0.5, keep).softmax(-1).square().sum(), (q2, k2))
    torch.testing.assert_close(dq, rq)
    torch.testing.assert_close(dk, rk)


def test_key_bias_is_zero_on_kept_and_the_fill_on_dropped_entries():
    keep = torch.tensor([[True, False, True]])
    assert key_bias(keep, torch.float32).tolist() == [[0.0, -math.inf, 0.0]]
    assert key_bias(keep, torch.float64, fill=-7.0).tolist() == [[0.0, -7.0, 0.0]]
    assert key_bias(keep, torch.float16).dtype == torch.float16
