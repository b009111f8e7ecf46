"""performer's public-code options (``paper`` presets), each checked against small hand-made examples.

The LRA wrappers of Skyformer/Skeinformer/Nyströmformer over performer-pytorch's ``FastAttention``
(https://github.com/pkuzengqi/Skyformer ``src/models/attention_performer.py``): temperature 1/d, padded
keys zeroed before the map, stabiliser = max of the projection, one key max over the whole batch,
eps = 1e-4 inside the features, gradients through the maxima, raw LAPACK QR for the ORF blocks.
"""

import math

import pytest
import torch

import attention
from attention.performer import PerformerOptions, favor_attention, gaussian_orthogonal_features
from attention.testing import qkv

PAPER = dict(
    temperature="d",
    pad_keys_in_normaliser=True,
    stabiliser_of="projection",
    key_stabiliser="batch",
    feature_eps=1e-4,
    detach_stabilisers=False,
    qr_sign_fix=False,
)


def build(d=16, features=8, **opts):
    return attention.build("performer", num_heads=1, head_dim=d, max_len=64, features=features, **opts)


def one_feature(module, d):
    """Replace ω by the single row e₁: with m = 1 the query's feature cancels in the ratio, so the output
    is Σ_j φ(k_j) v_j / Σ_j φ(k_j) with φ(k) a function of k's first coordinate only."""
    module.omega = torch.zeros(1, d)
    module.omega[0, 0] = 1.0
    return module


def test_paper_defaults_are_off():
    o = PerformerOptions()
    assert (
        o.temperature,
        o.pad_keys_in_normaliser,
        o.stabiliser_of,
        o.key_stabiliser,
        o.feature_eps,
        o.detach_stabilisers,
        o.qr_sign_fix,
    ) == ("sqrt_d", False, "log_feature", "sample", 0.0, True, True)


@pytest.mark.parametrize("temperature,t", [("sqrt_d", 4.0), ("d", 16.0)])
def test_temperature_sets_the_softmax_being_estimated(temperature, t):
    """d = 16, q = k₁ = √2e₁, k₂ = −√2e₁ (q·k = ±2): the weight of k₁ is σ(4/T), T = √d = 4 or d = 16
    (0.731 vs 0.562); many orthogonal features make the estimate tight."""
    d = 16
    torch.manual_seed(0)
    omega = gaussian_orthogonal_features(32768, d, dtype=torch.float64)
    e1 = torch.zeros(d, dtype=torch.float64)
    e1[0] = math.sqrt(2)
    q = e1.expand(1, 1, 1, d)
    k = torch.stack([e1, -e1]).expand(1, 1, 2, d)
    v = torch.eye(2, d, dtype=torch.float64).expand(1, 1, 2, d)
    keep = torch.ones(1, 2, dtype=torch.bool)
    out = favor_attention(q, k, v, keep, omega, PerformerOptions(temperature=temperature))
    w1 = out[0, 0, 0, 0].item()
    assert abs(w1 - 1 / (1 + math.exp(-4 / t))) < 0.01
    assert abs(out[0, 0, 0, :2].sum().item() - 1) < 1e-12


def test_padded_keys_dilute_the_normaliser():
    """q = 0 and real keys 0: every key has the same weight, and a padded key is a zero key with a zero
    value, so the output is Σ_real v / n (not the mean over real keys), whatever its content was."""
    d, n = 16, 12
    torch.manual_seed(0)
    m = build(d, pad_keys_in_normaliser=True)
    g = torch.Generator().manual_seed(3)
    v = torch.randn(2, 1, n, d, generator=g)
    k = torch.zeros(2, 1, n, d)
    k[0, :, 9:] = 5 * torch.randn(1, 3, d, generator=g)  # padded content: must be ignored
    q = torch.zeros(2, 1, n, d)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 9:] = False
    out = m(q, k, v, mask)
    torch.testing.assert_close(out[0, 0], v[0, 0, :9].sum(0).expand(n, d) / n)
    torch.testing.assert_close(out[1, 0], v[1, 0].mean(0).expand(n, d))  # no padding: the plain mean
    clean = build(d)
    clean.omega = m.omega
    torch.testing.assert_close(clean(q, k, v, mask)[0, 0], v[0, 0, :9].mean(0).expand(n, d))


def test_public_stabilisers_by_hand():
    """m = 1, ω = e₁, d = 4, temperature 1/d (k' = k/2). Sample 0: keys 2·(−1, −2) on e₁ and one padded
    key; sample 1: keys 2·(1, −1, −1). Projections p = k'₁, log-features a = p − p²/2. The public key
    stabiliser is the max of p over the whole batch, padded zero keys included: c = 1 (sample 1's first
    key), so φ = exp(a − 1) + eps for every key, the padded one with a = 0 and a zero value."""
    d, eps = 4, 0.1
    m = one_feature(build(d, features=1, **{**PAPER, "feature_eps": eps}), d)
    k = torch.zeros(2, 1, 3, d)
    k[0, 0, :, 0] = torch.tensor([-2.0, -4.0, 7.0])  # the 7 is padding
    k[1, 0, :, 0] = torch.tensor([2.0, -2.0, -2.0])
    v = torch.randn(2, 1, 3, d, generator=torch.Generator().manual_seed(0))
    q = torch.randn(2, 1, 3, d, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    c = 1.0
    phi0 = [math.exp(-1.5 - c) + eps, math.exp(-4.0 - c) + eps, math.exp(0.0 - c) + eps]
    phi1 = [math.exp(0.5 - c) + eps, math.exp(-1.5 - c) + eps, math.exp(-1.5 - c) + eps]
    want0 = (phi0[0] * v[0, 0, 0] + phi0[1] * v[0, 0, 1]) / sum(phi0)
    want1 = sum(p * v[1, 0, j] for j, p in enumerate(phi1)) / sum(phi1)
    out = m(q, k, v, mask)
    torch.testing.assert_close(out[0, 0], want0.expand(3, d), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[1, 0], want1.expand(3, d), rtol=1e-5, atol=1e-6)
    # per sample (performer-pytorch >= 1.1.1): sample 0's max is its padded zero key's p = 0, not -1
    m2 = one_feature(build(d, features=1, **{**PAPER, "feature_eps": eps, "key_stabiliser": "sample"}), d)
    phi0 = [math.exp(-1.5) + eps, math.exp(-4.0) + eps, 1 + eps]
    want0_sample = (phi0[0] * v[0, 0, 0] + phi0[1] * v[0, 0, 1]) / sum(phi0)
    torch.testing.assert_close(m2(q, k, v, mask)[0, 0], want0_sample.expand(3, d), rtol=1e-5, atol=1e-6)
    # of the log-features, sample 1's max is a = 0.5, not p = 1: other numbers
    m3 = one_feature(build(d, features=1, **{**PAPER, "feature_eps": eps, "stabiliser_of": "log_feature"}), d)
    assert not torch.allclose(m3(q, k, v, mask)[0, 0, 0], want0, rtol=1e-3)


def test_eps_does_not_revive_removed_padded_keys():
    """pad_keys_in_normaliser=False with eps > 0: a padded sample gives what its real part gives alone."""
    torch.manual_seed(0)
    m = build(16, **{**PAPER, "pad_keys_in_normaliser": False, "key_stabiliser": "sample"})
    q, k, v = (t[:, :1] for t in qkv(n=32))
    mask = torch.ones(2, 32, dtype=torch.bool)
    mask[0, 20:] = False
    torch.testing.assert_close(m(q, k, v, mask)[:1, :, :20], m(q[:1, :, :20], k[:1, :, :20], v[:1, :, :20]))


def test_feature_eps_is_added_inside_each_feature():
    """d = 1, m = 4 identical rows ω = 1 (temperature √1 = 1): keys 0 and 1 have log-features 0 and ½;
    the stabiliser makes the larger feature 1, then eps is added before the 1/√m: weights
    (e^-½ + eps, 1 + eps). Adding eps after the 1/√m would give (e^-½ + 2eps, 1 + 2eps)."""
    eps = 0.1
    m = build(1, features=4, feature_eps=eps)
    m.omega = torch.ones(4, 1)
    k = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    v = torch.tensor([3.0, -5.0]).view(1, 1, 2, 1)
    q = torch.tensor([0.7, -0.2]).view(1, 1, 2, 1)
    w0, w1 = math.exp(-0.5) + eps, 1 + eps
    want = (w0 * 3.0 - w1 * 5.0) / (w0 + w1)
    torch.testing.assert_close(m(q, k, v), torch.full((1, 1, 2, 1), want))
    m0 = build(1, features=4)
    m0.omega = m.omega
    torch.testing.assert_close(m0(q, k, v), torch.full((1, 1, 2, 1), (math.exp(-0.5) * 3 - 5) / (math.exp(-0.5) + 1)))


def test_batch_stabiliser_with_eps_couples_samples():
    """With eps > 0 and one key max for the whole batch, another sample's long keys (projection ≈ 50)
    push every exp(...) of this sample ~e^-45 below eps: all its keys weigh eps, attention becomes the
    plain mean. Per sample, or with eps = 0 (the stabilisers then cancel), this sample is unaffected."""
    d = 16
    q, k, v = (t[:, :1] for t in qkv(n=32))

    def sample0(**opts):
        torch.manual_seed(0)
        m = build(d, features=64, **opts)
        longest = m.omega[m.omega.norm(dim=1).argmax()]
        k2 = k.clone()
        k2[1] = 10 * d**0.5 * longest / longest.norm()  # k' = k/√d (temperature d): ω·k' = 10‖ω‖
        return m(q[:1], k[:1], v[:1]), m(q, k2, v)[:1]

    alone, together = sample0(**PAPER)
    torch.testing.assert_close(together, v[:1].mean(2, keepdim=True).expand_as(together), rtol=1e-5, atol=1e-6)
    assert (alone - together).abs().max() > 0.05
    for opts in ({**PAPER, "key_stabiliser": "sample"}, {**PAPER, "feature_eps": 0.0}):
        alone, together = sample0(**opts)
        torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-6)


def test_projection_stabiliser_with_eps_flattens_long_queries():
    """stabiliser_of="projection": a query's largest feature is exp(−‖q'‖²/2), not 1; for ‖q'‖²/2 = 20
    that is far below eps, so every long query's features are eps: all of them get the same output."""
    d = 16
    torch.manual_seed(0)
    _, k, v = (t[:1, :1] for t in qkv(n=32))
    q = torch.nn.functional.normalize(torch.randn(1, 1, 32, d), dim=-1) * math.sqrt(40) * d**0.25  # ‖q'‖² = 40
    out = {}
    for of in ("projection", "log_feature"):
        torch.manual_seed(1)
        out[of] = build(d, features=64, stabiliser_of=of, feature_eps=1e-4)(q, k, v)
    spread = lambda o: (o - o.mean(2, keepdim=True)).abs().max().item()  # noqa: E731
    assert spread(out["projection"]) < 1e-4 * v.abs().max().item()
    assert spread(out["log_feature"]) > 0.1


@pytest.mark.parametrize(
    "eps,detach,exact", [(0.0, True, True), (0.0, False, True), (0.1, False, True), (0.1, True, False)]
)
def test_detached_stabilisers_lose_the_true_gradient_only_with_eps(eps, detach, exact):
    """Finite differences of the forward vs autograd (float64): the maxima no longer cancel when eps > 0,
    so detaching them drops a real term of the gradient."""
    torch.manual_seed(0)
    m = build(
        4, features=6, feature_eps=eps, detach_stabilisers=detach, key_stabiliser="batch", stabiliser_of="projection"
    )
    m.omega = m.omega.double()
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 1, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ok = torch.autograd.gradcheck(lambda a, b: m(a, b, v), (q, k), raise_exception=False, atol=1e-6, rtol=1e-4)
    assert ok is exact


def test_raw_qr_blocks_follow_the_public_rng_order_and_law():
    """qr_sign_fix=False: ceil(m/d) Gaussian d×d blocks, each → rows of LAPACK's Q, the last block cut,
    then chi lengths from one m×d Gaussian: the public ``gaussian_orthogonal_random_matrix``. LAPACK's Q
    is not Haar: the first row of a block always has a negative first coordinate (Haar: half the time)."""
    d, m = 16, 40
    torch.manual_seed(5)
    omega = gaussian_orthogonal_features(m, d, qr_sign_fix=False)
    torch.manual_seed(5)
    blocks = [torch.linalg.qr(torch.randn(d, d))[0].T for _ in range(3)]
    want = torch.cat(blocks)[:m] * torch.randn(m, d).norm(dim=1)[:, None]
    assert torch.equal(omega, want)
    torch.manual_seed(5)
    haar = gaussian_orthogonal_features(m, d)
    torch.testing.assert_close(haar.abs(), omega.abs())  # same rows up to sign
    torch.manual_seed(0)
    raw = torch.stack([gaussian_orthogonal_features(d, d, qr_sign_fix=False)[0, 0] for _ in range(200)])
    torch.manual_seed(0)
    fixed = torch.stack([gaussian_orthogonal_features(d, d)[0, 0] for _ in range(200)])
    assert (raw < 0).all()
    assert 0.35 < (fixed < 0).double().mean().item() < 0.65


def test_fixed_paper_draw_is_the_module_level_function():
    """The buffer comes from gaussian_orthogonal_features with the module's options (so a comparison can
    monkeypatch it and inject the public projection)."""
    torch.manual_seed(9)
    m = build(16, features=40, **PAPER)
    torch.manual_seed(9)
    assert torch.equal(m.omega, gaussian_orthogonal_features(40, 16, qr_sign_fix=False))


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": "1/d"},
        {"pad_keys_in_normaliser": "yes"},
        {"stabiliser_of": "max"},
        {"key_stabiliser": "head"},
        {"feature_eps": -1e-4},
        {"feature_eps": True},
        {"detach_stabilisers": 1.5},
        {"qr_sign_fix": None},
    ],
)
def test_paper_options_invalid_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(**bad)
