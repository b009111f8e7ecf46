"""yoso_e against a float64 dense-loop reference, the LSH bucket-sum trick against the dense Bernoulli
matrix, SimHash collision frequencies, yoso → yoso_e as hashes grow (≈ 1/√m), the surrogate backward."""

import math

import pytest
import torch
import torch.nn.functional as F

import attention
from attention.testing import masks, qkv
from attention.yoso import auto_hash_bits, draw_hyperplanes, lsh_attention, simhash_codes

H, D, N = 2, 16, 128
TAU = 8


def reference_yoso_e(q, k, v, mask, tau, output_norm="l2"):
    """Σ_j (1 − arccos(q̂_i·k̂_j)/π)^τ v_j over the real keys, then an L2 normalisation per row."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                qi = q[b, h, i] / q[b, h, i].norm()
                acc = torch.zeros(v.shape[-1], dtype=torch.float64)
                for j in real.tolist():
                    kj = k[b, h, j] / k[b, h, j].norm()
                    cos = torch.clamp(qi @ kj, -1.0, 1.0)
                    acc += (1 - math.acos(cos.item()) / math.pi) ** tau * v[b, h, j]
                out[b, h, i] = acc / acc.norm() if output_norm == "l2" else acc
    return out


def build(name, **opts):
    return attention.build(name, num_heads=H, head_dim=D, max_len=N, **opts).eval()


def correlated_qkv(seed, dtype=torch.float64):
    """Keys near their queries, so the collision weights are far from uniform (a realistic regime)."""
    q, k, v = qkv(seed=seed, dtype=dtype)
    return q, q + 0.5 * k, v


def rel_err(a, b, mask):
    real = mask[:, None, :, None].expand_as(a)
    return ((a - b)[real].norm() / b[real].norm()).item()


# ------------------------------------------------------------------------------------- yoso_e
@pytest.mark.parametrize("where", ["end", "middle"])
@pytest.mark.parametrize("output_norm", ["l2", "none"])
def test_yoso_e_matches_float64(where, output_norm):
    q, k, v = qkv(n=48)
    mask = masks(n=48)[where]
    out = build("yoso_e", hash_bits=TAU, output_norm=output_norm)(q, k, v, mask)
    ref = reference_yoso_e(q, k, v, mask, TAU, output_norm)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)


def test_yoso_e_float64_input_is_exact():
    q, k, v = qkv(n=40, dtype=torch.float64)
    mask = masks(n=40)["middle"]
    out = build("yoso_e", hash_bits=5)(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], reference_yoso_e(q, k, v, mask, 5)[real], atol=1e-12, rtol=1e-10)


def test_yoso_e_backward_options():
    """lower_bound: ∂w/∂x = (τ/2)·w (paper eq. 13); exact: autograd of the expectation itself."""
    q, k, v = correlated_qkv(0)
    mask = masks()["middle"]
    g = torch.randn(2, H, N, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    real = mask[:, None, :, None].to(torch.float64)
    grads = {}
    for mode in ("lower_bound", "exact"):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        m = build("yoso_e", hash_bits=TAU, output_norm="none", backward=mode)
        (m(qq, kk, vv, mask) * g * real).sum().backward()
        grads[mode] = (qq.grad, kk.grad, vv.grad)
    # hand-written surrogate, chained through q̂ = q/‖q‖ by autograd on a detached-weight expression
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    qn, kn = F.normalize(qq, dim=-1), F.normalize(kk, dim=-1)
    x = qn @ kn.transpose(-1, -2)
    w = ((1 - torch.arccos(x.detach().clamp(-1, 1)) / math.pi) ** TAU) * mask[:, None, None, :]
    surrogate = (w + (TAU / 2) * w * (x - x.detach())) @ vv
    (surrogate * g * real).sum().backward()
    for got, want in zip(grads["lower_bound"], (qq.grad, kk.grad, vv.grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)
    # exact: plain autograd through arccos (inputs stay away from ±1 here)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    x = F.normalize(qq, dim=-1) @ F.normalize(kk, dim=-1).transpose(-1, -2)
    assert x.detach().abs().max() < 1 - 1e-6
    w = ((1 - torch.arccos(x) / math.pi) ** TAU) * mask[:, None, None, :]
    ((w @ vv) * g * real).sum().backward()
    for got, want in zip(grads["exact"], (qq.grad, kk.grad, vv.grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)
    assert not torch.allclose(grads["exact"][0], grads["lower_bound"][0])


# ---------------------------------------------------------------------------------- LSH pieces
def test_bucket_sum_equals_dense_bernoulli_product_and_surrogate_grads():
    g = torch.Generator().manual_seed(0)
    b, h, n, d, dv, m, tau = 2, 2, 50, 8, 5, 3, 3
    qn = F.normalize(torch.randn(b, h, n, d, generator=g, dtype=torch.float64), dim=-1).requires_grad_()
    kn = F.normalize(torch.randn(b, h, n, d, generator=g, dtype=torch.float64), dim=-1).requires_grad_()
    v = torch.randn(b, h, n, dv, generator=g, dtype=torch.float64).requires_grad_()
    planes = draw_hyperplanes(h, m, d, tau, dtype=torch.float64, generator=g)
    cq, ck = simhash_codes(qn.detach(), planes), simhash_codes(kn.detach(), planes)
    out = lsh_attention(qn, kn, v, cq, ck, tau)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    out.backward(up)
    bern = torch.zeros(b, h, n, n, dtype=torch.float64)  # dense B, loop by loop
    for t in range(m):
        for i in range(n):
            for j in range(n):
                bern[:, :, i, j] += (cq[:, :, t, i] == ck[:, :, t, j]).double() / m
    torch.testing.assert_close(out, bern @ v, atol=1e-12, rtol=1e-10)
    gx = (tau / 2) * bern * (up @ v.detach().transpose(-1, -2))  # surrogate ∂L/∂(q̂·k̂)
    torch.testing.assert_close(qn.grad, gx @ kn.detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(kn.grad, gx.transpose(-1, -2) @ qn.detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(v.grad, bern.transpose(-1, -2) @ up, atol=1e-12, rtol=1e-10)


def test_simhash_collision_frequency_matches_formula():
    """Over many random hyperplane draws, P[h(x) = h(y)] = (1 − θ/π)^τ."""
    g = torch.Generator().manual_seed(1)
    d, tau, m = 8, 3, 20000
    x = F.normalize(torch.randn(1, 1, 4, d, generator=g, dtype=torch.float64), dim=-1)
    planes = draw_hyperplanes(1, m, d, tau, dtype=torch.float64, generator=g)
    codes = simhash_codes(x, planes)[0, 0]  # (m, 4)
    freq = (codes[:, :, None] == codes[:, None, :]).double().mean(0)
    p = (1 - torch.arccos((x[0, 0] @ x[0, 0].T).clamp(-1, 1)) / math.pi) ** tau
    assert ((freq - p).abs() <= 4 * torch.sqrt(p * (1 - p) / m) + 1e-12).all()


def test_hash_bits_default_follows_yoso_lra_configs():
    for max_len, tau in [(2000, 11), (2048, 11), (4000, 12), (4096, 12), (1024, 10)]:
        assert auto_hash_bits(max_len) == tau
        assert attention.build("yoso", num_heads=2, head_dim=32, max_len=max_len).tau == tau
    assert attention.build("yoso_e", num_heads=2, head_dim=32, max_len=4096, hash_bits=9).tau == 9


# ----------------------------------------------------------------------------- yoso vs yoso_e
def test_yoso_converges_to_yoso_e_at_monte_carlo_rate():
    """Unbiased estimator: relative error ≈ c/√m, so 16× the hashes divide it by about 4."""
    mask = masks()["middle"]
    budgets = [4, 16, 64]
    errs = {m: 0.0 for m in budgets}
    seeds = range(3)
    for s in seeds:
        q, k, v = correlated_qkv(s)
        ref = build("yoso_e", hash_bits=TAU, output_norm="none")(q, k, v, mask)
        for m in budgets:
            torch.manual_seed(10 + s)
            out = build("yoso", num_hashes=m, hash_bits=TAU, output_norm="none")(q, k, v, mask)
            errs[m] += rel_err(out, ref, mask) / len(seeds)
    assert errs[4] > errs[16] > errs[64], errs
    assert 2.5 < errs[4] / errs[64] < 6.5, errs  # 1/√m predicts 4
    # the normalised output (the paper's) converges too
    q, k, v = correlated_qkv(0)
    ref = build("yoso_e", hash_bits=TAU)(q, k, v, mask)
    torch.manual_seed(0)
    few = rel_err(build("yoso", num_hashes=4, hash_bits=TAU)(q, k, v, mask), ref, mask)
    torch.manual_seed(0)
    many = rel_err(build("yoso", num_hashes=256, hash_bits=TAU)(q, k, v, mask), ref, mask)
    assert many < 0.4 * few


def test_yoso_gradients_converge_to_yoso_e_lower_bound():
    """The LSH surrogate backward is unbiased for yoso_e's lower-bound backward."""
    q, k, v = correlated_qkv(1)
    mask = masks()["end"]
    up = torch.randn(2, H, N, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grads(name, **opts):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        (build(name, hash_bits=TAU, output_norm="none", **opts)(qq, kk, vv, mask) * up).sum().backward()
        return qq.grad, kk.grad, vv.grad

    ref = grads("yoso_e")
    errs = {}
    for m in (8, 128):
        torch.manual_seed(5)
        errs[m] = [((g - r).norm() / r.norm()).item() for g, r in zip(grads("yoso", num_hashes=m), ref)]
    for i in range(3):
        assert errs[128][i] < 0.5 * errs[8][i], errs


def test_yoso_conv_is_yoso_plus_depthwise_conv():
    q, k, v = qkv()
    mask = masks()["middle"]
    torch.manual_seed(0)
    yc = build("yoso_conv", conv_kernel=5)
    assert yc.options.num_hashes == 16
    torch.manual_seed(1)
    a = yc(q, k, v, mask)
    torch.manual_seed(1)
    b = build("yoso", num_hashes=16)(q, k, v, mask)
    vm = v * mask[:, None, :, None]
    conv = torch.zeros_like(v)  # depthwise over the sequence: one 5-tap filter per head
    w = yc.conv.weight.detach()[:, 0, :, 0]  # (H, 5)
    vp = F.pad(vm, (0, 0, 2, 2))
    for h in range(H):
        for t in range(5):
            conv[:, h] += w[h, t] * vp[:, h, t : t + N]
    torch.testing.assert_close(a, b + conv, atol=1e-5, rtol=1e-5)


def test_yoso_redraw_policy():
    q, k, v = qkv()
    torch.manual_seed(0)
    fixed = build("yoso", num_hashes=4, redraw="fixed")
    torch.testing.assert_close(fixed(q, k, v), fixed(q, k, v), atol=0, rtol=0)
    assert "planes" in fixed.state_dict()
    per_call = build("yoso", num_hashes=4)
    assert not torch.allclose(per_call(q, k, v), per_call(q, k, v))


@pytest.mark.parametrize(
    "name,bad",
    [
        ("yoso", {"num_hashes": 0}),
        ("yoso", {"hash_bits": 0}),
        ("yoso", {"hash_bits": 21}),
        ("yoso_conv", {"conv_kernel": 4}),
        ("yoso", {"redraw": "per_step"}),
        ("yoso_e", {"output_norm": "sum"}),
        ("yoso_e", {"backward": "straight_through"}),
        ("yoso_e", {"hash_bits": 2.5}),
    ],
)
def test_invalid_options_named(name, bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(name, **bad)
