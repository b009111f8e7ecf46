"""linformer's public-code options (``paper`` presets) from first principles: one projection per head
for both keys and values (a float64 loop reference), N(0, 0.02²) entries in the public code's draw
order, and a fixed projection that is saved but never trained."""

import math

import pytest
import torch

import attention
from tests.oracles import rand_qkv

B, H, P = 2, 2, 8
PAPER = {"sharing": "kv_per_head", "init": "normal_0.02", "trainable": False}


def right_padded(n, lengths=(29, 40)):
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def loop_reference(q, k, v, mask, e):
    """Head h: K̃_r = Σ_j E_h[j, r] k_j and Ṽ_r = Σ_j E_h[j, r] v_j over real j (the SAME E_h for both),
    out_i = Σ_r softmax_r(q_i·K̃_r/√p) Ṽ_r for every query, padded ones too (queries are not masked)."""
    b_, h_, n, p = q.shape
    out = torch.zeros_like(q)
    for b in range(b_):
        real = [j for j in range(n) if mask[b, j]]
        for h in range(h_):
            kp = torch.stack([sum(e[h, j, r] * k[b, h, j] for j in real) for r in range(e.shape[-1])])
            vp = torch.stack([sum(e[h, j, r] * v[b, h, j] for j in real) for r in range(e.shape[-1])])
            for i in range(n):
                out[b, h, i] = torch.softmax(kp @ q[b, h, i] / math.sqrt(p), 0) @ vp
    return out


def test_kv_per_head_projects_keys_and_values_with_one_matrix_per_head():
    n, kk = 40, 6
    torch.manual_seed(0)
    m = attention.build("linformer", num_heads=H, head_dim=P, max_len=n, k=kk, **PAPER).double()
    assert {name: tuple(t.shape) for name, t in m.named_buffers()} == {"E": (H, n, kk)} and m.F is None
    assert not torch.allclose(m.E[0], m.E[1])  # per head, not shared across heads
    q, k, v = rand_qkv(n, 0, scale=1.5)
    mask = right_padded(n)
    k, v = (t.masked_fill(~mask[:, None, :, None], 30.0) for t in (k, v))  # padded keys/values must not count
    torch.testing.assert_close(m(q, k, v, mask), loop_reference(q, k, v, mask, m.E), atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("sharing", ["kv_per_head", "none", "kv"])
def test_normal_002_entries_in_public_draw_order(sharing):
    """E[..., j, r] is entry (..., r, j) of 0.02·(the next H·k·max_len standard normals of torch's RNG,
    laid out (…, k, max_len)): the public (heads, k, max_seq_len) matrix drawn from the same seed. The
    scale is 0.02 whatever k (the JL init's is 1/√k)."""
    n, kk = 64, 16
    lead = (H,) if sharing != "kv" else ()
    torch.manual_seed(7)
    m = attention.build("linformer", num_heads=H, head_dim=P, max_len=n, k=kk, sharing=sharing, init="normal_0.02")
    torch.manual_seed(7)
    z = 0.02 * torch.randn(*lead, kk, n)
    torch.testing.assert_close(m.E.detach(), z.transpose(-1, -2), atol=0, rtol=0)
    if sharing == "none":  # F is the next draw of the same shape
        torch.testing.assert_close(m.F.detach(), 0.02 * torch.randn(*lead, kk, n).transpose(-1, -2), atol=0, rtol=0)
    torch.manual_seed(0)
    big = attention.build("linformer", num_heads=H, head_dim=P, max_len=512, k=128, sharing=sharing, init="normal_0.02")
    assert abs(big.E.std().item() - 0.02) < 0.0005


@pytest.mark.parametrize("sharing,names", [("kv_per_head", {"E"}), ("none", {"E", "F"})])
def test_fixed_projection_is_saved_but_not_trained(sharing, names):
    """trainable=False: no parameters, no gradient, unchanged by an optimiser step over the model's
    parameters; saved in the state_dict, so a module built from another seed and loaded from it gives
    the same output."""
    opts = {**PAPER, "sharing": sharing}
    torch.manual_seed(0)
    m = attention.build("linformer", num_heads=H, head_dim=P, max_len=48, k=8, **opts)
    assert not list(m.parameters()) and set(m.state_dict()) == names
    before = {name: t.clone() for name, t in m.state_dict().items()}
    q, k, v = (t.float().requires_grad_() for t in rand_qkv(48, 3))
    mask = right_padded(48, (48, 30))
    m(q, k, v, mask).square().sum().backward()
    assert q.grad is not None and all(t.grad is None and not t.requires_grad for t in m.buffers())
    torch.manual_seed(1)
    other = attention.build("linformer", num_heads=H, head_dim=P, max_len=48, k=8, **opts)
    assert not torch.equal(other.E, m.E)
    other.load_state_dict(m.state_dict())
    torch.testing.assert_close(other(q, k, v, mask), m(q, k, v, mask), atol=0, rtol=0)
    assert all(torch.equal(before[name], t) for name, t in m.state_dict().items())


def test_modules_do_not_share_projections():
    """No class-level sharing: a second module (layer or model) draws and owns its own E, and
    training one leaves the other alone (cross-layer sharing is a tie the model makes)."""
    torch.manual_seed(0)
    a = attention.build(
        "linformer", num_heads=H, head_dim=P, max_len=32, k=4, sharing="kv_per_head", init="normal_0.02"
    )
    b = attention.build(
        "linformer", num_heads=H, head_dim=P, max_len=32, k=4, sharing="kv_per_head", init="normal_0.02"
    )
    assert a.E is not b.E and not torch.equal(a.E, b.E)


@pytest.mark.parametrize("bad", [{"init": "normal"}, {"trainable": "no"}, {"sharing": "per_head"}])
def test_paper_options_invalid_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("linformer", num_heads=H, head_dim=P, max_len=64, **bad)
