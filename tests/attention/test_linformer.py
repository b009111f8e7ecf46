"""Linformer (learned E, F) and Linformer w/ unreduced JLT against float64 references (dense loops)."""

import math

import pytest
import torch

import attention
from attention.testing import padding_shift
from tests.oracles import dense_softmax, rand_qkv

B, H, P = 2, 2, 8
SHARING = ["none", "headwise", "kv", "layerwise"]


def pad_masks(n):
    middle = torch.ones(B, n, dtype=torch.bool)
    middle[0, 10:27] = False
    middle[1, 30:34] = False
    middle[1, n - 3 :] = False
    start = torch.ones(B, n, dtype=torch.bool)
    start[0, :20] = False
    start[1, :2] = False
    end = torch.ones(B, n, dtype=torch.bool)
    end[0, n - 17 :] = False
    return {"middle": middle, "start": start, "end": end}


def ref_linformer(q, k, v, mask, e, f):
    """softmax(q_i · (Σ_j E_jr k_j)/√p over r) · Σ_j F_jr v_j, sums over real j only. e, f: [h] -> (n, k)."""
    b_, h_, n, p = q.shape
    out = torch.zeros_like(q)
    for b in range(b_):
        real = [j for j in range(n) if mask[b, j]]
        for h in range(h_):
            kk = e[h].shape[1]
            kp = [sum(e[h][j, r] * k[b, h, j] for j in real) for r in range(kk)]
            vp = [sum(f[h][j, r] * v[b, h, j] for j in real) for r in range(kk)]
            for i in range(n):
                s = torch.stack([q[b, h, i] @ kp[r] for r in range(kk)]) / math.sqrt(p)
                w = torch.exp(s - s.max())
                out[b, h, i] = sum(w[r] * vp[r] for r in range(kk)) / w.sum()
    return out


def build(name, max_len, **opts):
    torch.manual_seed(0)
    return attention.build(name, num_heads=H, head_dim=P, max_len=max_len, **opts).double()


# ---------------------------------------------------------------- linformer
@pytest.mark.parametrize("sharing", SHARING)
@pytest.mark.parametrize("where", ["middle", "start"])
def test_linformer_matches_dense_reference_shorter_than_max_len(sharing, where):
    n, max_len, kk = 40, 64, 6
    m = build("linformer", max_len, k=kk, sharing=sharing)
    q, k, v = rand_qkv(n, 0, scale=1.5)
    mask = pad_masks(n)[where]
    out = m(q, k, v, mask)
    E = m.E.detach()
    F = E if m.F is None else m.F.detach()
    e = [E[h, :n] if E.dim() == 3 else E[:n] for h in range(H)]
    f = [F[h, :n] if F.dim() == 3 else F[:n] for h in range(H)]
    ref = ref_linformer(q, k, v, mask, e, f)
    keep = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize(
    "sharing,shapes",
    [
        ("none", {"E": (H, 64, 16), "F": (H, 64, 16)}),
        ("headwise", {"E": (64, 16), "F": (64, 16)}),
        ("kv", {"E": (64, 16)}),
        ("layerwise", {"E": (64, 16)}),
    ],
)
def test_linformer_parameters_registered_and_trained(sharing, shapes):
    """E, F are real parameters (in state_dict, optimiser-visible, receive gradients): the seed code's were not."""
    m = attention.build("linformer", num_heads=H, head_dim=P, max_len=64, k=16, sharing=sharing)
    params = {name: tuple(t.shape) for name, t in m.named_parameters()}
    assert params == shapes
    assert set(m.state_dict()) == set(shapes)
    q, k, v = (t.float() for t in rand_qkv(50, 1))
    m(q, k, v, pad_masks(50)["middle"]).square().sum().backward()
    for t in m.parameters():
        assert t.grad is not None and t.grad.abs().sum() > 0
        assert (t.grad[50:] == 0).all() if t.dim() == 2 else (t.grad[:, 50:] == 0).all()  # unused rows


def test_linformer_init_scale_is_jl():
    """Entries N(0, 1/k), so E[E Eᵀ] = I (checked on the diagonal of E Eᵀ)."""
    torch.manual_seed(0)
    m = attention.build("linformer", num_heads=H, head_dim=P, max_len=512, k=64, sharing="kv")
    diag = (m.E @ m.E.T).diagonal()
    assert abs(diag.mean().item() - 1.0) < 0.05


def test_linformer_too_long_rejected():
    m = attention.build("linformer", num_heads=H, head_dim=P, max_len=32, k=8)
    q, k, v = (t.float() for t in rand_qkv(40, 2))
    with pytest.raises(ValueError, match="max_len"):
        m(q, k, v)


@pytest.mark.parametrize("bad", [{"k": 0}, {"k": -5}, {"k": 1.5}, {"sharing": "global"}])
def test_linformer_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("linformer", num_heads=H, head_dim=P, max_len=64, **bad)


# ---------------------------------------------------------------- linformer_jlt
@pytest.mark.parametrize("where", ["middle", "start", "end"])
def test_jlt_exact_when_sketch_is_orthogonal(where):
    """S Sᵀ = I (S square orthogonal, injected into the fixed buffer): D⁻¹ A S Sᵀ V = D⁻¹ A V exactly."""
    n = 32
    m = build("linformer_jlt", n, k=n, redraw="fixed")
    g = torch.Generator().manual_seed(3)
    s = torch.linalg.qr(torch.randn(H, n, n, generator=g, dtype=torch.float64))[0]
    m.S.copy_(s)
    q, k, v = rand_qkv(n, 4, scale=1.5)
    mask = pad_masks(n)[where]
    out = m(q, k, v, mask)
    keep = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[keep], dense_softmax(q, k, v, mask)[keep], atol=1e-10, rtol=1e-9)


def test_jlt_matches_dense_formula_with_given_sketch():
    """Any S (here a fixed Gaussian one, n > k, shorter input than max_len):
    Σ_j B_ij Σ_r S_jr Σ_l S_lr v_l, real j, l."""
    n, max_len, kk = 24, 40, 5
    m = build("linformer_jlt", max_len, k=kk, redraw="fixed")
    q, k, v = rand_qkv(n, 5)
    mask = pad_masks(n)["middle"]
    out = m(q, k, v, mask)
    soft = dense_softmax(q, k, v, mask)  # only used through its attention weights below
    ref = torch.zeros_like(q)
    for b in range(B):
        real = [j for j in range(n) if mask[b, j]]
        for h in range(H):
            S = m.S[h, :n]
            sv = {j: sum(sum(S[j, r] * S[ln, r] for r in range(kk)) * v[b, h, ln] for ln in real) for j in real}
            for i in range(n):
                s = torch.tensor([float(q[b, h, i] @ k[b, h, j]) / math.sqrt(P) for j in real], dtype=q.dtype)
                w = torch.softmax(s, 0)
                ref[b, h, i] = sum(w[t] * sv[j] for t, j in enumerate(real))
    keep = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-9)
    assert (out[keep] - soft[keep]).abs().max() > 1e-3  # a k < n sketch is not exact


def jlt_error(kk, n=64, seeds=6):
    m = build("linformer_jlt", n, k=kk)
    err = 0.0
    for seed in range(seeds):
        q, k, v = rand_qkv(n, 10 + seed, scale=1.5)
        ref = ((q @ k.transpose(-1, -2)) / math.sqrt(P)).softmax(-1) @ v  # the target, vectorised
        torch.manual_seed(seed)
        err += ((m(q, k, v) - ref).norm() / ref.norm()).item() / seeds
    return err


def test_jlt_error_shrinks_with_sketch_size():
    small, large = jlt_error(8), jlt_error(512)
    assert large < 0.25 * small, (small, large)  # error ~ 1/sqrt(k)


def test_jlt_unbiased():
    """E[S Sᵀ] = I: the mean of many independent draws tends to softmax attention."""
    n = 32
    m = build("linformer_jlt", n, k=4)
    q, k, v = rand_qkv(n, 20, scale=1.5)
    mask = pad_masks(n)["middle"]
    ref = dense_softmax(q, k, v, mask)
    keep = mask[:, None, :, None].expand_as(ref)
    torch.manual_seed(0)
    draws = torch.stack([m(q, k, v, mask) for _ in range(400)])
    single = (draws[0] - ref)[keep].norm() / ref[keep].norm()
    avg = (draws.mean(0) - ref)[keep].norm() / ref[keep].norm()
    assert avg < 0.15 * single, (single.item(), avg.item())


def test_jlt_redraw_policy():
    n = 32
    q, k, v = rand_qkv(n, 21)
    fixed = build("linformer_jlt", 48, k=8, redraw="fixed")
    assert "S" in fixed.state_dict() and fixed.S.shape == (H, 48, 8)
    assert torch.equal(fixed(q, k, v), fixed(q, k, v))
    call = build("linformer_jlt", 48, k=8, redraw="call")
    assert "S" not in call.state_dict()
    torch.manual_seed(1)
    a = call(q, k, v)
    torch.manual_seed(1)
    b = call(q, k, v)
    assert torch.equal(a, b) and not torch.equal(b, call(q, k, v))


@pytest.mark.parametrize(
    "name,opts", [("linformer", {"k": 8}), ("linformer_jlt", {"k": 8}), ("linformer_jlt", {"k": 8, "redraw": "fixed"})]
)
def test_padding_at_start_invariance(name, opts):
    n = 48
    m = build(name, n, **opts).float()
    q, k, v = (t.float() for t in rand_qkv(n, 22))
    mask = pad_masks(n)["start"]
    assert padding_shift(m, q, k, v, mask, scale=10.0, call_seed=1, noise_seed=2) < 1e-5


@pytest.mark.parametrize("bad", [{"k": 0}, {"k": "big"}, {"redraw": "step"}])
def test_jlt_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("linformer_jlt", num_heads=H, head_dim=P, max_len=64, **bad)
