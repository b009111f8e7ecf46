"""The LRA classifier: shapes, masked mean pooling, padding invariance, dual head, fp32 attention."""

import pytest
import torch

from lra.model import LRAClassifier, pool
from lra.module import warmup_linear_decay


def make(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=20, seq_len=64, num_classes=10, attn_name="softmax", attn_options={"dropout": 0.0})
    return LRAClassifier(**{**args, **kw}).eval()


def test_param_count_matches_paper_shape():
    m = make(vocab_size=16, seq_len=2048)
    # embeddings (16 + 2048) x 64, 2 blocks, final LN, head 64-128-10 (docs/facts.md §9.1: about 210k for ListOps)
    n = sum(p.numel() for p in m.parameters())
    assert 200_000 < n < 225_000


def test_mean_pooling_over_real_tokens_only():
    x = torch.arange(12.0).view(1, 4, 3)
    mask = torch.tensor([[True, True, False, False]])
    assert torch.allclose(pool(x, mask, "mean"), x[0, :2].mean(0, keepdim=True))
    assert torch.allclose(pool(x, mask, "padded_mean"), x[0, :2].sum(0, keepdim=True) / 4)


@pytest.mark.parametrize("where", ["end", "middle"])
def test_logits_ignore_padded_content(where):
    m = make()
    tokens = torch.randint(1, 20, (3, 64))
    mask = torch.ones(3, 64, dtype=torch.bool)
    if where == "end":
        mask[0, 40:] = False
        mask[2, 10:] = False
    else:
        mask[0, 10:30] = False
        mask[1, 5:6] = False
    a = m(tokens, mask)
    b = m(torch.where(mask, tokens, torch.randint(1, 20, tokens.shape)), mask)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert a.shape == (3, 10)


def test_dual_head_shares_encoder_and_is_order_sensitive():
    m = make(dual=True, num_classes=2)
    tokens = torch.randint(1, 20, (2, 2, 64))
    mask = torch.ones(2, 2, 64, dtype=torch.bool)
    mask[:, 1, 50:] = False
    out = m(tokens, mask)
    assert out.shape == (2, 2)
    e1 = m.embed(tokens[:, 0], mask[:, 0])
    e2 = m.embed(tokens[:, 1], mask[:, 1])
    ref = m.head(torch.cat([e1, e2, e1 * e2, e1 - e2], -1))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, m(tokens.flip(1), mask.flip(1)))


def test_attention_runs_in_fp32_under_autocast():
    m = make()
    seen = []
    m.encoder.blocks[0].mha.attn.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].dtype, out.dtype)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(torch.randint(1, 20, (2, 64)), torch.ones(2, 64, dtype=torch.bool))
    assert seen == [(torch.float32, torch.float32)]


def test_too_long_input_rejected():
    with pytest.raises(ValueError, match="seq_len"):
        make()(torch.randint(1, 20, (1, 65)), torch.ones(1, 65, dtype=torch.bool))


def test_bad_model_options_named():
    with pytest.raises(ValueError, match="pooling"):
        make(pooling="max")
    with pytest.raises(ValueError, match="unknown attention backend"):
        make(attn_name="nope")


def test_schedule_warmup_then_linear_decay():
    f = warmup_linear_decay(10, 110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.5) and f(110) == 0.0
