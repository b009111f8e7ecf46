"""The public-code options of ``skyformer`` and ``kernelized`` (https://github.com/pkuzengqi/Skyformer,
``src/models/attention_skyformer.py::Skyformer`` and ``src/models/attention.py::SoftmaxAttention_RBF``),
each checked against hand-made numbers or a float64 formula written out per sample and head."""

import math

import pytest
import torch

import attention
from attention.skyformer import newton_schulz_inverse, sample_landmarks

PAPER = dict(
    ns_init="colsum_batch",
    replacement=True,
    landmark_split="halves",
    landmark_draw="shared",
    scale_dim=32,
    zero_padded_queries=True,
)


def build(name, heads=2, head_dim=8, n=24, **opts):
    return attention.build(name, num_heads=heads, head_dim=head_dim, max_len=n, **opts).eval()


def right_padded(lengths, n):
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


# ------------------------------------------------------------------------------ landmark draws
def test_shared_halves_draw_positions_by_hand():
    """One uniform vector for the batch and every head: sample i takes ⌊u·m_i⌋ for the first d//2
    (Q rows), n + ⌊u·m_i⌋ for the rest (K rows), m_i its real count (odd d: 2 from Q, 3 from K)."""
    n = 10
    prefix = right_padded([10, 4, 7], n)
    u = torch.tensor([0.0, 0.55, 0.99, 0.25, 0.75])
    idx, valid = sample_landmarks(
        torch.cat([prefix, prefix], 1), 3, 5, replacement=True, uniforms=u, split="halves", shared=True
    )
    expected = torch.tensor(
        [
            [0, 5, 10 + 9, 10 + 2, 10 + 7],  # m = 10
            [0, 2, 10 + 3, 10 + 1, 10 + 3],  # m = 4: ⌊0.99·4⌋ = 3, ⌊0.75·4⌋ = 3
            [0, 3, 10 + 6, 10 + 1, 10 + 5],
        ]
    )  # m = 7
    assert valid.all()
    for h in range(3):  # the same for every head
        assert torch.equal(idx[:, h], expected)


def test_shared_draw_takes_one_rand_of_d_like_the_public_code():
    """Drawn from torch's RNG as ``torch.rand(d)`` (the public ``uniform_sketching``): the same seed
    gives the same landmarks, so the public code and this one agree without patching."""
    n, d = 50, 8
    prefix = right_padded([50, 13], n)
    torch.manual_seed(3)
    u = torch.rand(d)
    torch.manual_seed(3)
    idx, _ = sample_landmarks(torch.cat([prefix, prefix], 1), 2, d, replacement=True, split="halves", shared=True)
    m = torch.tensor([50.0, 13.0])[:, None]
    hand = (m * u).long()
    hand[:, d // 2 :] += n
    assert torch.equal(idx, hand[:, None, :].expand(2, 2, d))


def test_halves_per_sample_without_replacement():
    """d//2 distinct real Q rows, d − d//2 distinct real K rows; a half with fewer real rows than its
    share leaves invalid slots, never a padded row marked valid."""
    n = 12
    real = torch.zeros(2, n, dtype=torch.bool)
    real[0, [1, 4, 5, 9, 10]] = True  # padding anywhere: per-sample draws use the real rows
    real[1, :2] = True
    torch.manual_seed(0)
    idx, valid = sample_landmarks(torch.cat([real, real], 1), 3, 7, split="halves")
    assert idx.shape == (2, 3, 7)
    for b in range(2):
        rows = set(real[b].nonzero().flatten().tolist())
        for h in range(3):
            q_half, k_half = idx[b, h, :3], idx[b, h, 3:]
            vq, vk = valid[b, h, :3], valid[b, h, 3:]
            assert set(q_half[vq].tolist()) <= rows and set((k_half[vk] - n).tolist()) <= rows
            assert len(set(q_half[vq].tolist())) == int(vq.sum()) == min(3, len(rows))
            assert len(set(k_half[vk].tolist())) == int(vk.sum()) == min(4, len(rows))


def test_shared_without_replacement_one_key_per_position():
    """Shared keys: the same landmarks for every head, positions below each sample's count, distinct,
    and two samples with the same count get the same positions."""
    n = 16
    prefix = right_padded([9, 16, 9], n)
    torch.manual_seed(1)
    idx, valid = sample_landmarks(torch.cat([prefix, prefix], 1), 2, 6, split="halves", shared=True)
    assert valid.all() and torch.equal(idx[:, 0], idx[:, 1]) and torch.equal(idx[0], idx[2])
    q_half, k_half = idx[0, 0, :3], idx[0, 0, 3:] - n
    assert (q_half < 9).all() and (k_half < 9).all() and len(set(q_half.tolist())) == 3


def test_fixed_shared_landmarks_same_for_all_heads():
    m = build("skyformer", heads=3, num_landmarks=6, redraw="fixed", landmark_draw="shared", replacement=True)
    u = m.fixed_uniforms(24)
    assert u.shape == (6,)
    prefix = right_padded([24, 5], 24)
    idx, _ = sample_landmarks(torch.cat([prefix, prefix], 1), 3, 6, replacement=True, uniforms=u, shared=True)
    assert torch.equal(idx[:, 0], idx[:, 2]) and (idx[1] % 24 < 5).all()


# ------------------------------------------------------------------------------ Newton-Schulz start
def _psd_batch():
    land = randn(3, 2, 5, 4) * torch.tensor([0.3, 1.0, 3.0], dtype=torch.float64)[:, None, None, None]
    m = torch.exp(-(land[..., :, None, :] - land[..., None, :, :]).square().sum(-1) / 2)
    m = m + 0.1 * torch.eye(5, dtype=torch.float64)
    dinv = m.sum(-1).rsqrt()
    return dinv[..., :, None] * m * dinv[..., None, :]


def test_colsum_batch_start_is_one_scale_for_the_whole_batch():
    a = _psd_batch()
    c = max(a[b, h, :, j].sum().item() for b in range(3) for h in range(2) for j in range(5))
    per_matrix = a.sum(-2).amax(-1)
    assert (per_matrix.max() - per_matrix.min()) > 0.02  # a per-matrix start would differ
    torch.testing.assert_close(
        newton_schulz_inverse(a, 0, "colsum_batch"), a.transpose(-1, -2) / c, atol=1e-15, rtol=1e-13
    )
    # one step of Z ← ¼ Z(13I − AZ(15I − AZ(7I − AZ))) from that start, by hand
    eye = torch.eye(5, dtype=torch.float64)
    z0 = a.transpose(-1, -2) / c
    az = a @ z0
    hand = 0.25 * z0 @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    torch.testing.assert_close(newton_schulz_inverse(a, 1, "colsum_batch"), hand, atol=1e-14, rtol=1e-12)
    # the batch couples: changing matrix (2, ·) moves matrix (0, 0) under colsum_batch only
    a2 = a.clone()
    a2[2] = 3 * torch.eye(5, dtype=torch.float64)  # column sums 3: the new batch maximum
    assert not torch.allclose(
        newton_schulz_inverse(a2, 3, "colsum_batch")[0, 0], newton_schulz_inverse(a, 3, "colsum_batch")[0, 0]
    )
    assert torch.equal(newton_schulz_inverse(a2, 3, "colsum")[0, 0], newton_schulz_inverse(a, 3, "colsum")[0, 0])


# ------------------------------------------------------------------------------ whole forward
def reference_public(q, k, v, mask, positions, d, *, p_scale=32, gamma=0.1, iters=6):
    """The public Skyformer as a float64 formula, one (sample, head) at a time: q, k, v masked,
    q, k scaled by p_scale^(-1/4), landmarks X_S = rows ``positions[b]`` of [Q; K], M = κ(X_S, X_S) + γI,
    A = D^{-½}MD^{-½}, Z₀ = Aᵀ/c with c the largest column sum of every A in the batch, ``iters``
    hyper-power steps, out = κ(Q, X_S) D^{-½} Z D^{-½} κ(X_S, K) V."""
    b_, h_, n, _ = q.shape
    s = p_scale**-0.25

    def kern(x, y):
        return torch.exp(-(x[:, None, :] - y[None, :, :]).square().sum(-1) / 2)

    parts = {}
    for b in range(b_):
        keep = mask[b].double()[:, None]
        for h in range(h_):
            qs, ks, vs = q[b, h] * keep * s, k[b, h] * keep * s, v[b, h] * keep
            land = torch.cat([qs, ks])[positions[b]]
            m = kern(land, land) + gamma * torch.eye(d, dtype=torch.float64)
            dh = torch.diag(m.sum(1) ** -0.5)
            parts[b, h] = (qs, ks, vs, land, dh, dh @ m @ dh)
    c = max(a.sum(0).max().item() for *_, a in parts.values())
    out = torch.empty_like(q)
    eye = torch.eye(d, dtype=torch.float64)
    for (b, h), (qs, ks, vs, land, dh, a) in parts.items():
        z = a.T / c
        for _ in range(iters):
            az = a @ z
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
        out[b, h] = kern(qs, land) @ dh @ z @ dh @ (kern(land, ks) * mask[b].double()[None, :]) @ vs
    return out


@pytest.mark.parametrize("scale,padding", [(1.0, "right"), (0.5, "right"), (1.0, "inside")])
def test_paper_options_equal_public_formula(scale, padding):
    """Every output row (padded ones included) on a batch of 3 with different lengths, head_dim 8
    (so the hard-coded 32 of the scale matters), landmarks from the seed's torch.rand(d). With padding
    inside the sequence the public code still takes positions ⌊u·m_i⌋ below the real count m_i, so
    its landmarks can be (zeroed) padded rows: reproduced too."""
    n, d = 24, 6
    mask = right_padded([24, 17, 9], n)
    if padding == "inside":
        mask = mask.roll(5, dims=1)  # padding at the front, a hole in the middle
        mask[0, 10:14] = False
    counts = mask.sum(-1).tolist()
    q, k, v = (randn(3, 2, n, 8, seed=s, scale=scale if s < 2 else 1.0) for s in range(3))
    torch.manual_seed(11)
    u = torch.rand(d)
    pos = [(torch.tensor(float(m)) * u).long() + torch.tensor([0] * (d // 2) + [n] * (d - d // 2)) for m in counts]
    ref = reference_public(q, k, v, mask, pos, d)
    torch.manual_seed(11)
    out = build("skyformer", n=n, num_landmarks=d, **PAPER)(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-9)
    # the clean defaults on the same landmarks differ (start, scale, padded rows)
    torch.manual_seed(11)
    clean = build("skyformer", n=n, num_landmarks=d, replacement=True, landmark_split="halves", landmark_draw="shared")(
        q, k, v, mask
    )
    assert (clean - ref).abs().max() > 1e-3


def test_scale_dim_none_is_head_dim():
    q, k, v = (randn(2, 2, 24, 8, seed=s) for s in range(3))
    mask = right_padded([24, 11], 24)
    torch.manual_seed(0)
    a = build("skyformer", num_landmarks=6, scale_dim=8)(q, k, v, mask)
    torch.manual_seed(0)
    b = build("skyformer", num_landmarks=6)(q, k, v, mask)
    torch.manual_seed(0)
    c = build("skyformer", num_landmarks=6, scale_dim=32)(q, k, v, mask)
    assert torch.equal(a, b) and not torch.allclose(a, c)


@pytest.mark.parametrize("name", ["kernelized", "skyformer"])
def test_zero_padded_queries_changes_padded_rows_only(name):
    """A zeroed query row sees κ(0, k̃_j) = exp(−‖k̃_j‖²/2): for kernelized, padded row i outputs
    Σ_j exp(−‖k_j‖²/(2√p)) v_j over the real keys j; real rows are unchanged."""
    q, k, v = (randn(2, 2, 24, 8, seed=s) for s in range(3))
    mask = right_padded([24, 15], 24)
    opts = {"dropout": 0.0} if name == "kernelized" else {"num_landmarks": 6}
    torch.manual_seed(0)
    a = build(name, zero_padded_queries=True, **opts)(q, k, v, mask)
    torch.manual_seed(0)
    b = build(name, **opts)(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(a)
    assert torch.equal(a[real], b[real])
    assert (a[~real] - b[~real]).abs().max() > 1e-3
    if name == "kernelized":
        w = torch.exp(-k[1, :, :15].square().sum(-1) / (2 * math.sqrt(8)))  # (heads, 15)
        hand = (w[..., None] * v[1, :, :15]).sum(1)  # (heads, p): the same for every padded row
        torch.testing.assert_close(a[1, :, 15:], hand[:, None, :].expand(2, 9, 8), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "opt,bad",
    [
        ("ns_init", "global"),
        ("landmark_split", "thirds"),
        ("landmark_draw", "per_batch"),
        ("scale_dim", 0),
        ("scale_dim", 32.0),
        ("zero_padded_queries", "yes"),
    ],
)
def test_invalid_paper_options_named(opt, bad):
    with pytest.raises(ValueError, match=opt):
        build("skyformer", **{opt: bad})
