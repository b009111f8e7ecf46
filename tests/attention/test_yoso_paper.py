"""yoso's public-code options (``paper`` presets) from first principles: the fast Hadamard hash on hand
4-dimensional examples (sign order, part numbering, zero padding) and its orthogonal hyperplanes,
hyperplanes drawn per sample, padded query rows set to zero, the normalisation eps, and YOSO-E's
0.98 cosine factor with its true derivative."""

import math

import pytest
import torch
import torch.nn.functional as F

import attention
import attention.yoso as Y
from attention.testing import masks, qkv

H, D, N, TAU = 2, 16, 128, 6
H4 = torch.tensor([[1.0, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64)


def build(name, **opts):
    return attention.build(name, num_heads=H, head_dim=D, max_len=N, **opts)


def code_of(y, bits):
    """Σ_i [y_i > 0]·2^i."""
    return sum(int(y[i] > 0) << i for i in range(bits))


def fast_hash_by_hand(x, signs, bits, m):
    """The transform as a sequence: y = H(s3 ⊙ H(s2 ⊙ H(s1 ⊙ x))) per part, x zero-padded to 4."""
    x = F.pad(x, (0, 4 - x.shape[0]))
    codes = []
    for p in range(signs.shape[1]):
        s1, s2, s3 = signs[0, p], signs[1, p], signs[2, p]
        y = H4 @ (s3 * (H4 @ (s2 * (H4 @ (s1 * x)))))
        for j in range(4 // bits):
            codes.append(code_of(y[j * bits : (j + 1) * bits], bits))
    return codes[:m]


# --------------------------------------------------------------------------------- fast hash
def test_hadamard_planes_hand_example_all_plus():
    """All signs +1: y = H³x = 4·Hx; x = (1, 2, 3, 5) gives Hx = (11, −3, −5, 1), bits 1,0,0,1."""
    signs = torch.ones(3, 1, 4, dtype=torch.float64)
    planes = Y.hadamard_planes(signs, 4, 2, 2)  # (m=2, d=4, τ=2)
    x = torch.tensor([1.0, 2, 3, 5], dtype=torch.float64)
    y = torch.cat([x @ planes[t] for t in range(2)])  # the 4 projections, code by code
    torch.testing.assert_close(y, torch.tensor([44.0, -12, -20, 4], dtype=torch.float64))
    codes = Y.simhash_codes(x.view(1, 1, 1, 4), planes[None])[0, 0, :, 0].tolist()
    assert codes == [1, 2]  # bits (1, 0) -> 1, (0, 1) -> 2


def test_hadamard_planes_sign_order_and_parts():
    """Distinct signs per stage: D₁ is applied first, D₃ last; with τ = 3 each transform of width 4
    yields one code, so code t comes from part t."""
    g = torch.Generator().manual_seed(0)
    for bits, m, parts in ((2, 4, 2), (3, 2, 2), (1, 7, 2)):
        signs = (2 * torch.randint(0, 2, (3, parts, 4), generator=g) - 1).double()
        assert not torch.equal(signs[0], signs[2])
        planes = Y.hadamard_planes(signs, 4, bits, m)
        xs = torch.randn(20, 4, generator=g, dtype=torch.float64)
        got = Y.simhash_codes(xs.view(1, 1, 20, 4), planes[None])[0, 0]  # (m, 20)
        for i in range(20):
            assert got[:, i].tolist() == fast_hash_by_hand(xs[i], signs, bits, m), (bits, i)


def test_hadamard_planes_zero_pad_head_dim():
    """A 3-dim x is hashed as (x, 0) in width 4: the planes are the first 3 rows."""
    g = torch.Generator().manual_seed(1)
    signs = (2 * torch.randint(0, 2, (3, 2, 4), generator=g) - 1).double()
    planes = Y.hadamard_planes(signs, 3, 2, 4)
    assert planes.shape == (4, 3, 2)
    xs = torch.randn(10, 3, generator=g, dtype=torch.float64)
    got = Y.simhash_codes(xs.view(1, 1, 10, 3), planes[None])[0, 0]
    for i in range(10):
        assert got[:, i].tolist() == fast_hash_by_hand(xs[i], signs, 2, 4)


def test_hadamard_sizes_and_orthogonal_hyperplanes():
    assert [Y.hadamard_dim(d) for d in (4, 16, 32, 48, 64)] == [32, 32, 32, 64, 64]
    # the YOSO LRA configs: d = 32, m = 32; τ = 10 -> 3 codes per transform, τ = 11, 12 -> 2
    assert [Y.hadamard_parts(32, t, 32) for t in (10, 11, 12)] == [11, 16, 16]
    signs = Y.draw_hadamard_signs(2, 3, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    planes = Y.hadamard_planes(signs, 32, 10, 8)  # (2, 8, 32, 10)
    gram = planes.transpose(-1, -2) @ planes  # τ hyperplanes of a code: orthogonal, each of norm² 32³
    torch.testing.assert_close(gram, 32.0**3 * torch.eye(10, dtype=torch.float64).expand_as(gram))
    # codes 0..2 share a transform: together 30 distinct orthogonal columns
    cols = planes[0, :3].permute(1, 0, 2).reshape(32, 30)
    torch.testing.assert_close(cols.T @ cols, 32.0**3 * torch.eye(30, dtype=torch.float64))


def test_module_hadamard_matches_dense_bernoulli(monkeypatch):
    """yoso with the fast hash = normalise(mean_t B_t v) with B_t from the hand-built planes."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["end"]
    m = 5
    width = Y.hadamard_dim(D)
    signs = Y.draw_hadamard_signs(
        H, Y.hadamard_parts(m, TAU, width), width, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    calls = []
    monkeypatch.setattr(Y, "draw_hadamard_signs", lambda *a, **kw: calls.append((a, kw)) or signs)
    out = build("yoso", num_hashes=m, hash_bits=TAU, hash_family="hadamard")(q, k, v, mask)
    assert calls and calls[0][0] == (H, Y.hadamard_parts(m, TAU, width), width) and calls[0][1]["batch"] is None
    planes = Y.hadamard_planes(signs, D, TAU, m)  # (H, m, D, τ)
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    cq = ((torch.einsum("bhnd,hmdt->bhmnt", qn, planes) > 0).long() << torch.arange(TAU)).sum(-1)
    ck = ((torch.einsum("bhnd,hmdt->bhmnt", kn, planes) > 0).long() << torch.arange(TAU)).sum(-1)
    bern = (cq[..., :, None] == ck[..., None, :]).double().mean(2) * mask[:, None, None, :]
    ref = F.normalize(bern @ v, dim=-1)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], ref[real], atol=1e-12, rtol=1e-10)


# ------------------------------------------------------------------------------ draw_per_sample
@pytest.mark.parametrize("family", ["gaussian", "hadamard"])
def test_draw_per_sample_uses_each_samples_own_planes(monkeypatch, family):
    """Sample b of the batch is hashed with planes[b]; it equals a per-head run on sample b alone."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    m = 4
    g = torch.Generator().manual_seed(4)
    if family == "gaussian":
        drawn = Y.draw_hyperplanes(H, m, D, TAU, batch=2, dtype=torch.float64, generator=g)
        name = "draw_hyperplanes"
    else:
        drawn = Y.draw_hadamard_signs(H, Y.hadamard_parts(m, TAU, 32), 32, batch=2, dtype=torch.float64, generator=g)
        name = "draw_hadamard_signs"
    seen = []
    monkeypatch.setattr(Y, name, lambda *a, batch=None, **kw: seen.append(batch) or drawn)
    out = build("yoso", num_hashes=m, hash_bits=TAU, hash_family=family, draw_per_sample=True)(q, k, v, mask)
    assert seen == [2]
    for b in range(2):
        monkeypatch.setattr(Y, name, lambda *a, batch=None, **kw: drawn[b])
        alone = build("yoso", num_hashes=m, hash_bits=TAU, hash_family=family)(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], mask[b : b + 1]
        )
        torch.testing.assert_close(out[b : b + 1], alone, atol=1e-12, rtol=1e-10)


def test_draw_per_sample_decouples_identical_samples():
    """Two identical samples get the same hashes when planes are shared, different ones per sample."""
    q, k, v = (t[:1].expand(2, -1, -1, -1).contiguous() for t in qkv())
    for per_sample, same in ((False, True), (True, False)):
        torch.manual_seed(0)
        out = build("yoso", num_hashes=2, hash_bits=TAU, draw_per_sample=per_sample)(q, k, v)
        assert torch.equal(out[0], out[1]) is same


def test_draw_per_sample_needs_per_call():
    with pytest.raises(ValueError, match="draw_per_sample"):
        build("yoso", draw_per_sample=True, redraw="fixed")
    fixed = build("yoso", num_hashes=3, hash_bits=TAU, hash_family="hadamard", redraw="fixed")
    assert fixed.planes.shape == (H, 3, D, TAU)
    q, k, v = qkv()
    torch.testing.assert_close(fixed(q, k, v), fixed(q, k, v), atol=0, rtol=0)


# ------------------------------------------------------------------------- zero_padded_queries
@pytest.mark.parametrize("name", ["yoso", "yoso_e", "yoso_conv"])
def test_zero_padded_queries(name):
    """Padded rows: 0 (plus the conv of V·mask); real rows unchanged; no gradient from padded rows."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    pad = ~mask[:, None, :, None].expand_as(q)
    opts = {"hash_bits": TAU} if name == "yoso_e" else {"hash_bits": TAU, "num_hashes": 4}
    outs, grads = {}, {}
    for zero in (False, True):
        torch.manual_seed(0)
        mod = build(name, zero_padded_queries=zero, **opts).double()
        vv = v.clone().requires_grad_()
        torch.manual_seed(1)
        outs[zero] = mod(q, k, vv, mask)
        outs[zero].sum().backward()
        grads[zero] = vv.grad
    torch.testing.assert_close(outs[True][~pad], outs[False][~pad], atol=0, rtol=0)
    conv = mod.conv(v * mask[:, None, :, None]) if mod.conv is not None else torch.zeros_like(v)
    torch.testing.assert_close(outs[True][pad], conv[pad], atol=1e-12, rtol=0)
    assert outs[False][pad].abs().max() > 0.1  # computed like real rows by default
    # the gradient with zeroed padded rows = the default's gradient with the upstream zeroed there
    torch.manual_seed(0)
    mod = build(name, **opts).double()
    vv = v.clone().requires_grad_()
    torch.manual_seed(1)
    (mod(q, k, vv, mask) * mask[:, None, :, None]).sum().backward()
    if mod.conv is None:
        torch.testing.assert_close(grads[True], vv.grad, atol=1e-10, rtol=1e-8)
    assert not torch.allclose(grads[True], grads[False])


# ----------------------------------------------------------------------------------- norm_eps
def test_norm_eps_of_the_output():
    """Rows of norm ν < eps come out as num/eps: tiny values give norm ν/1e-6 by default, 1 at 1e-12."""
    q, k, v = qkv(dtype=torch.float64)
    v = v * 1e-9
    num = build("yoso_e", hash_bits=TAU, output_norm="none")(q, k, v)
    nu = num.norm(dim=-1)
    assert nu.max() < 1e-6
    default = build("yoso_e", hash_bits=TAU)(q, k, v)
    torch.testing.assert_close(default.norm(dim=-1), nu / 1e-6, rtol=1e-10, atol=0)
    paper = build("yoso_e", hash_bits=TAU, norm_eps=1e-12)(q, k, v)
    torch.testing.assert_close(paper.norm(dim=-1), torch.ones_like(nu), rtol=1e-10, atol=0)


# ----------------------------------------------------------------------------------- cos_scale
def test_cos_scale_forward_and_exact_gradient_at_cos_one():
    """w = (1 − arccos(0.98·q̂·k̂)/π)^τ; with backward=exact the gradient is autograd of that formula,
    finite even where q̂ = k̂ (cos 1), where the unscaled derivative is infinite."""
    q, k, v = qkv(n=24, dtype=torch.float64)
    k = k.clone()
    k[:, :, 5] = 2 * q[:, :, 5]  # cos(q_5, k_5) = 1
    mask = masks(n=24)["end"]
    up = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    out = build("yoso_e", hash_bits=TAU, cos_scale=0.98, backward="exact")(qa, ka, va, mask)
    (out * up).sum().backward()
    qb, kb, vb = (t.clone().requires_grad_() for t in (q, k, v))
    x = 0.98 * (F.normalize(qb, dim=-1) @ F.normalize(kb, dim=-1).transpose(-1, -2))
    w = (1 - torch.acos(x) / math.pi) ** TAU * mask[:, None, None, :]
    ref = F.normalize(w @ vb, dim=-1)
    (ref * up).sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    for got, want in zip((qa.grad, ka.grad, va.grad), (qb.grad, kb.grad, vb.grad)):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7)


def test_cos_scale_lower_bound_slope():
    """lower_bound with a scale s: ∂w/∂x = s·(τ/2)·w(s·x), the chain rule applied to the surrogate."""
    q, k, v = qkv(n=16, dtype=torch.float64)
    up = torch.randn(q.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    qa = q.clone().requires_grad_()
    (build("yoso_e", hash_bits=TAU, cos_scale=0.9, output_norm="none")(qa, k, v) * up).sum().backward()
    qb = q.clone().requires_grad_()
    x = F.normalize(qb, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    w = (1 - torch.acos(0.9 * x.detach()) / math.pi) ** TAU
    ((w + 0.9 * (TAU / 2) * w * (x - x.detach())) @ v * up).sum().backward()
    torch.testing.assert_close(qa.grad, qb.grad, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "name,bad",
    [
        ("yoso", {"hash_family": "fast"}),
        ("yoso", {"draw_per_sample": 1}),
        ("yoso_e", {"zero_padded_queries": "yes"}),
        ("yoso", {"norm_eps": 0.0}),
        ("yoso_e", {"norm_eps": 1.0}),
        ("yoso_e", {"cos_scale": 0.0}),
        ("yoso_e", {"cos_scale": 1.1}),
    ],
)
def test_paper_options_validated(name, bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(name, **bad)
