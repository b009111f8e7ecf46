"""Informer ProbSparse (mask-blind ``informer`` and padding-aware ``informer_mask``) against float64
references written as dense loops, with the sampled keys injected where the formula is checked."""

import math

import pytest
import torch

import attention
from attention import informer as inf
from attention.testing import padding_shift
from tests.oracles import dense_softmax, rand_qkv, structured_qkv

NAMES = ["informer", "informer_mask"]
B, H, P = 2, 2, 8


def pad_masks(n):
    end = torch.ones(B, n, dtype=torch.bool)
    end[0, n - 17 :] = False
    end[1, n - 5 :] = False
    middle = torch.ones(B, n, dtype=torch.bool)
    middle[0, 10:27] = False
    middle[1, 30:34] = False
    middle[1, n - 3 :] = False
    start = torch.ones(B, n, dtype=torch.bool)
    start[0, :20] = False
    start[1, :2] = False
    return {"end": end, "middle": middle, "start": start}


def expected_u(num_features, max_len, n):
    """Skeinformer paper: factor = ceil(num_features / ln max_len); Informer: u = factor * ceil(ln n), capped at n."""
    return min(n, math.ceil(num_features / math.log(max_len)) * math.ceil(math.log(n)))


def ref_informer(q, k, v, mask, idx, u, mask_aware):
    """Dense loop: M = max - mean over the sampled keys; top-u rows exact softmax, others mean(V)."""
    b_, h_, n, p = q.shape
    out = torch.zeros_like(q)
    for b in range(b_):
        real = [j for j in range(n) if mask[b, j]] if mask_aware else list(range(n))
        for h in range(h_):
            score = []
            for i in range(n):
                if i not in real:
                    score.append(-math.inf)
                    continue
                s = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(p) for j in idx[b, i].tolist()]
                score.append(max(s) - sum(s) / len(s))
            top = sorted(range(n), key=lambda i: -score[i])[:u]
            mean_v = sum(v[b, h, j] for j in real) / len(real)
            for i in range(n):
                if i in top:
                    s = torch.tensor([float(q[b, h, i] @ k[b, h, j]) / math.sqrt(p) for j in real], dtype=q.dtype)
                    w = torch.exp(s - s.max())
                    out[b, h, i] = sum(w[t] * v[b, h, j] for t, j in enumerate(real)) / w.sum()
                else:
                    out[b, h, i] = mean_v
    return out


def build(name, max_len, **opts):
    return attention.build(name, num_heads=H, head_dim=P, max_len=max_len, **opts)


# ---------------------------------------------------------------- formula with injected samples
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("where", ["middle", "start"])
def test_matches_dense_reference(monkeypatch, name, where):
    n, nf = 48, 8
    u = expected_u(nf, n, n)
    assert 1 < u < n
    q, k, v = rand_qkv(n, 0, scale=1.5)
    mask = pad_masks(n)[where]
    aware = name == "informer_mask"
    g = torch.Generator().manual_seed(1)
    idx = torch.zeros(B, n, u, dtype=torch.long)  # u sampled keys per query, real ones for the masked twin
    for b in range(B):
        pool = mask[b].nonzero().flatten() if aware else torch.arange(n)
        idx[b] = pool[torch.randint(len(pool), (n, u), generator=g)]

    def fake(real, u_keys):
        assert u_keys == u
        assert aware or real.all(), "informer must ignore the mask"
        return idx.clone()

    monkeypatch.setattr(inf, "sample_keys", fake)
    out = build(name, n, num_features=nf)(q, k, v, mask)
    ref = ref_informer(q, k, v, mask, idx, u, aware)
    keep = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-9)


def test_sample_keys_uniform_over_real_positions():
    torch.manual_seed(0)
    n = 12
    real = torch.zeros(2, n, dtype=torch.bool)
    real[0, [1, 4, 5, 11]] = True  # scattered
    real[1, :] = True
    idx = inf.sample_keys(real, 2000)
    assert idx.shape == (2, n, 2000)
    counts = torch.bincount(idx[0].flatten(), minlength=n).double() / idx[0].numel()
    assert (counts[~real[0]] == 0).all()
    torch.testing.assert_close(counts[real[0]], torch.full((4,), 0.25, dtype=torch.float64), atol=0.01, rtol=0)
    counts = torch.bincount(idx[1].flatten(), minlength=n).double() / idx[1].numel()
    torch.testing.assert_close(counts, torch.full((n,), 1 / n, dtype=torch.float64), atol=0.01, rtol=0)


@pytest.mark.parametrize("max_len", [1024, 2048, 4096])
def test_about_num_features_rows_are_exact(max_len):
    m = build("informer", max_len)  # num_features = 256
    u = m.sizes(max_len)
    assert u == expected_u(256, max_len, max_len)
    assert abs(u - 256) <= 0.1 * 256


# ---------------------------------------------------------------- budget >= n
def test_exact_when_budget_covers_n():
    """u = n: every row exact; informer_mask = softmax over real keys, informer = softmax over all positions."""
    n = 40
    q, k, v = rand_qkv(n, 2, scale=1.5)
    mask = pad_masks(n)["middle"]
    keep = mask[:, None, :, None].expand_as(q)
    out = build("informer_mask", n, num_features=256)(q, k, v, mask)
    torch.testing.assert_close(out[keep], dense_softmax(q, k, v, mask)[keep], atol=1e-12, rtol=1e-10)
    out = build("informer", n, num_features=256)(q, k, v, mask)
    everything = torch.ones_like(mask)
    torch.testing.assert_close(out, dense_softmax(q, k, v, everything), atol=1e-12, rtol=1e-10)
    assert (out[keep] - dense_softmax(q, k, v, mask)[keep]).abs().max() > 1e-3  # it did see the padding


def test_informer_ignores_mask():
    n = 64
    q, k, v = rand_qkv(n, 3)
    m = build("informer", n, num_features=8)
    torch.manual_seed(4)
    a = m(q, k, v, pad_masks(n)["middle"])
    torch.manual_seed(4)
    b = m(q, k, v)
    assert torch.equal(a, b)
    assert not attention.capabilities("informer").padding_mask
    assert attention.capabilities("informer_mask").padding_mask


# ---------------------------------------------------------------- padding and gradients below the budget
@pytest.mark.parametrize("where", ["end", "middle", "start"])
def test_informer_mask_padding_invariance_small_budget(where):
    """Padded queries with huge content must not steal a top-u slot; sampled keys must be real."""
    n = 96
    q, k, v = (t.float() for t in rand_qkv(n, 5))
    mask = pad_masks(n)[where]
    m = build("informer_mask", n, num_features=8)
    assert padding_shift(m, q, k, v, mask, scale=30.0, call_seed=1, noise_seed=2) < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_gradients_small_budget(name):
    n = 96
    q, k, v = (t.float().requires_grad_() for t in rand_qkv(n, 6))
    mask = pad_masks(n)["middle"]
    torch.manual_seed(0)
    out = build(name, n, num_features=8).train()(q, k, v, mask)
    assert torch.isfinite(out).all()
    (out * mask[:, None, :, None]).square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


# ---------------------------------------------------------------- approximation quality
def mean_error(name, n, budget, seeds=4):
    m = attention.build(name, num_heads=2, head_dim=32, max_len=n, num_features=budget)
    err = 0.0
    for seed in range(seeds):
        q, k, v = structured_qkv(n, seed)
        ref = ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).softmax(-1) @ v
        torch.manual_seed(100 + seed)
        out = m(q, k, v)
        err += ((out - ref).norm(dim=(-1, -2)) / ref.norm(dim=(-1, -2))).mean().item() / seeds
    return err


@pytest.mark.parametrize("name", NAMES)
def test_error_shrinks_with_budget(name):
    small, large = mean_error(name, 256, 16), mean_error(name, 256, 128)
    assert large < 0.75 * small, f"{name}: error {small:.3f} at 16 features, {large:.3f} at 128"


# ---------------------------------------------------------------- options
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [0, -1, 3.5, "many"])
def test_invalid_num_features_named(name, bad):
    with pytest.raises(ValueError, match="num_features"):
        attention.build(name, num_heads=H, head_dim=P, max_len=64, num_features=bad)
