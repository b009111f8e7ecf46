"""longformer against dense float64 softmax under the same band+global mask; memory linear in n."""

import pytest
import torch

import attention
from attention.longformer import longformer_pattern
from attention.testing import qkv
from tests.oracles import dense_softmax
from tests.test_attention_contract import LargestTensor

H, D = 2, 16


def reference_pattern(n, window, num_global):
    """Written independently: loops over (i, j)."""
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            allowed[i, j] = abs(i - j) <= window // 2 or i < num_global or j < num_global
    return allowed


def some_masks(n):
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 7:30] = False
    mask[1, n // 2 : n // 2 + 3] = False
    mask[1, n - 9 :] = False
    return {"middle": mask, "end": torch.arange(n)[None, :] < torch.tensor([[n - 13], [n]])}


def test_pattern_helper_matches_definition():
    for n, w, g in [(50, 8, 1), (37, 2, 0), (20, 64, 3)]:
        assert torch.equal(longformer_pattern(n, w, g), reference_pattern(n, w, g))


@pytest.mark.parametrize("where", ["end", "middle"])
@pytest.mark.parametrize("n,window,num_global", [(100, 16, 1), (100, 2, 0), (64, 10, 3), (45, 256, 1), (128, 32, 2)])
def test_longformer_matches_masked_softmax(where, n, window, num_global):
    m = attention.build("longformer", num_heads=H, head_dim=D, max_len=n, window=window, num_global=num_global)
    q, k, v = qkv(n=n)
    mask = some_masks(n)[where]
    ref = dense_softmax(q, k, v, mask, reference_pattern(n, window, num_global))
    real = mask[:, None, :, None].expand_as(q)
    out = m(q, k, v, mask)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)
    out64 = m(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out64[real], ref[real], atol=1e-12, rtol=1e-10)


def test_global_token_sees_everything_and_window_limits_the_rest():
    n = 96
    m = attention.build("longformer", num_heads=H, head_dim=D, max_len=n, window=8)
    q, k, v = qkv(n=n)
    out = m(q, k, v)
    v2 = v.clone()
    v2[:, :, 60] += 1.0  # token 60 is seen by 56..64 and by the global token 0 only
    diff = (m(q, k, v2) - out).abs().amax(dim=(0, 1, 3))
    changed = set((diff > 0).nonzero().flatten().tolist())
    assert changed == {0, *range(56, 65)}


def test_memory_linear_in_n():
    """No tensor of n² elements: the largest one grows linearly with n (forward and backward)."""
    sizes = {}
    for n in (2048, 4096):
        m = attention.build("longformer", num_heads=1, head_dim=D, max_len=n, window=64)
        q, k, v = (torch.randn(1, 1, n, D, requires_grad=True) for _ in range(3))
        with LargestTensor() as probe:
            m(q, k, v).sum().backward()
        sizes[n] = probe.largest
    assert sizes[4096] <= 2.1 * sizes[2048]
    assert sizes[4096] < 4096**2 / 8


@pytest.mark.parametrize("bad", [{"window": 7}, {"window": 0}, {"window": 2.0}, {"num_global": -1}])
def test_longformer_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("longformer", num_heads=H, head_dim=D, max_len=128, **bad)
