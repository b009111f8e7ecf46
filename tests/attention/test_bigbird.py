"""bigbird against dense float64 softmax under the same block pattern; pattern rules; randomness policy;
memory linear in n."""

import pytest
import torch

import attention
from attention.testing import qkv
from tests.oracles import dense_softmax
from tests.test_attention_contract import LargestTensor

H, D = 2, 16


def some_masks(n):
    middle = torch.ones(2, n, dtype=torch.bool)
    middle[0, 20:57] = False
    middle[1, 60:64] = False
    middle[1, n - 3 :] = False
    end = torch.arange(n)[None, :] < torch.tensor([[n - 37], [n - 5]])
    return {"end": end, "middle": middle}


def check_layout_rules(layout, window_blocks, random_blocks):
    """Global first/last rows and columns, the window, and the number of random blocks per row."""
    h, nb, _ = layout.shape
    w = window_blocks // 2
    assert layout[:, [0, -1]].all() and layout[:, :, [0, -1]].all()
    for i in range(1, nb - 1):
        window = set(range(max(0, i - w), min(nb, i + w + 1)))
        for hh in range(h):
            cols = set(layout[hh, i].nonzero().flatten().tolist())
            assert window | {0, nb - 1} <= cols
            extra = cols - window - {0, nb - 1}
            available = set(range(1, nb - 1)) - window
            assert extra <= available and len(extra) == min(random_blocks, len(available))


@pytest.mark.parametrize("redraw", ["fixed", "per_call"])
@pytest.mark.parametrize("where", ["end", "middle"])
@pytest.mark.parametrize(
    "n,block,window_blocks,random_blocks", [(200, 16, 3, 3), (128, 8, 5, 2), (90, 32, 3, 3), (150, 10, 1, 0)]
)
def test_bigbird_matches_masked_softmax(redraw, where, n, block, window_blocks, random_blocks):
    m = attention.build(
        "bigbird",
        num_heads=H,
        head_dim=D,
        max_len=n,
        block_size=block,
        redraw=redraw,
        window_blocks=window_blocks,
        random_blocks=random_blocks,
    )
    q, k, v = qkv(n=n)
    mask = some_masks(n)[where]
    torch.manual_seed(4)
    layout = m.block_layout(n)
    check_layout_rules(layout, window_blocks, random_blocks)
    torch.manual_seed(4)
    allowed = m.pattern(n)
    torch.manual_seed(4)
    out = m(q, k, v, mask)
    blk = torch.arange(n) // block
    assert torch.equal(allowed, layout[:, blk][:, :, blk])
    ref = dense_softmax(q, k, v, mask, allowed)
    real = mask[:, None, :, None].expand_as(q)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)
    torch.manual_seed(4)
    out64 = m(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out64[real], ref[real], atol=1e-12, rtol=1e-10)


def test_bigbird_defaults_match_masked_softmax():
    n = 1000  # 16 blocks of 64, the last one partly internal padding
    m = attention.build("bigbird", num_heads=H, head_dim=D, max_len=n)
    q, k, v = qkv(n=n)
    mask = some_masks(n)["middle"]
    check_layout_rules(m.block_layout(n), 3, 3)
    ref = dense_softmax(q, k, v, mask, m.pattern(n))
    real = mask[:, None, :, None].expand_as(q)
    torch.testing.assert_close(m(q, k, v, mask).double()[real], ref[real], atol=2e-5, rtol=1e-4)


def test_fixed_pattern_same_in_train_eval_and_after_reload():
    torch.manual_seed(0)
    m = attention.build("bigbird", num_heads=H, head_dim=D, max_len=512, block_size=16)
    q, k, v = qkv(n=512)
    torch.manual_seed(1)
    a = m.train()(q, k, v)
    torch.manual_seed(2)
    b = m.eval()(q, k, v)
    assert torch.equal(a, b)
    torch.manual_seed(5)
    other = attention.build("bigbird", num_heads=H, head_dim=D, max_len=512, block_size=16)
    assert not torch.equal(other.block_layout(512), m.block_layout(512))
    other.load_state_dict(m.state_dict())
    assert torch.equal(other.block_layout(512), m.block_layout(512))
    assert torch.equal(other(q, k, v), a)
    layout = m.block_layout(512)
    assert not torch.equal(layout[0], layout[1]), "heads draw their own random blocks"


def test_fixed_pattern_buffer_is_the_seeded_draw():
    """The pattern kept for max_len (what forward reads, compile-friendly) is the one the seed gives
    at that length in a module with another max_len (drawn in Python there), and it follows a load."""
    long = attention.build("bigbird", num_heads=H, head_dim=D, max_len=512, block_size=16)
    short = attention.build("bigbird", num_heads=H, head_dim=D, max_len=256, block_size=16)
    assert not torch.equal(long.block_layout(256), short.block_layout(256))
    short.load_state_dict(long.state_dict())
    assert short.fixed_idx.shape[1] == 256 // 16 - 2 and long.fixed_idx.shape[1] == 512 // 16 - 2
    assert torch.equal(short.block_layout(256), long.block_layout(256))


def test_per_call_pattern_changes_between_calls():
    m = attention.build("bigbird", num_heads=H, head_dim=D, max_len=512, block_size=16, redraw="per_call")
    q, k, v = qkv(n=512)
    torch.manual_seed(0)
    a = m(q, k, v)
    b = m(q, k, v)
    assert not torch.equal(a, b)
    m.eval()
    torch.manual_seed(0)
    assert torch.equal(m(q, k, v), a), "eval draws the same way as training"


def test_random_blocks_cover_all_candidates_over_draws():
    """Random blocks are uniform over the non-window, non-global blocks (no 'first 1024 tokens' plan)."""
    m = attention.build("bigbird", num_heads=1, head_dim=D, max_len=64 * 40, redraw="per_call")
    torch.manual_seed(0)
    counts = torch.stack([m.block_layout(64 * 40)[0, 5] for _ in range(400)]).sum(0).double()
    cand = [j for j in range(1, 39) if abs(j - 5) > 1]
    freq = counts[cand] / 400
    assert (freq - 3 / len(cand)).abs().max() < 0.06


def test_memory_linear_in_n():
    sizes = {}
    for n in (2048, 4096):
        m = attention.build("bigbird", num_heads=1, head_dim=D, max_len=n)
        q, k, v = (torch.randn(1, 1, n, D, requires_grad=True) for _ in range(3))
        with LargestTensor() as probe:
            m(q, k, v).sum().backward()
        sizes[n] = probe.largest
    assert sizes[4096] <= 2.1 * sizes[2048]
    assert sizes[4096] < 4096**2 / 4


@pytest.mark.parametrize(
    "bad",
    [{"block_size": 0}, {"random_blocks": -1}, {"window_blocks": 2}, {"window_blocks": 0}, {"redraw": "per_step"}],
)
def test_bigbird_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("bigbird", num_heads=H, head_dim=D, max_len=128, **bad)
