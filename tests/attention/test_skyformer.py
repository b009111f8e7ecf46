"""kernelized and skyformer against float64 references written independently (dense loops over real
keys), Skyformer's error shrinking with landmarks, per-sample independence, landmark sampling."""

import math

import pytest
import torch

import attention
from attention.skyformer import gaussian_kernel, newton_schulz_inverse, sample_landmarks
from attention.testing import masks, qkv

H, D, N = 2, 16, 128


def reference_kernelized(q, k, v, mask):
    """C_ij = exp(−‖q_i − k_j‖² / (2√p)) over the real keys of each sample, no normalisation."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros_like(q)
    p = q.shape[-1]
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        for h in range(q.shape[1]):
            diff = q[b, h][:, None, :] - k[b, h, real][None, :, :]
            c = torch.exp(-diff.square().sum(-1) / (2 * math.sqrt(p)))
            out[b, h] = c @ v[b, h, real]
    return out


def reference_nystrom_completion(q, k, v, mask, landmarks_per_sample, gamma):
    """κ(Q̃, X_S)(κ(X_S, X_S) + γI)⁻¹κ(X_S, K̃)V with an explicit float64 solve, landmark rows given."""
    q, k, v = q.double(), k.double(), v.double()
    p = q.shape[-1]
    s = p**-0.25
    out = torch.zeros_like(q)

    def kern(a, c):
        return torch.exp(-(a[:, None, :] - c[None, :, :]).square().sum(-1) / 2)

    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        for h in range(q.shape[1]):
            x = torch.cat([q[b, h] * s, k[b, h] * s])
            land = x[landmarks_per_sample[b]]
            m = kern(land, land) + gamma * torch.eye(len(land), dtype=torch.float64)
            right = kern(land, k[b, h, real] * s) @ v[b, h, real]
            out[b, h] = kern(q[b, h] * s, land) @ torch.linalg.solve(m, right)
    return out


def build(name, **opts):
    return attention.build(name, num_heads=H, head_dim=D, max_len=N, **opts).eval()


def rel_err(a, b, mask):
    real = mask[:, None, :, None].expand_as(a)
    return ((a - b)[real].norm() / b[real].norm()).item()


# ----------------------------------------------------------------------------------- kernelized
@pytest.mark.parametrize("where", ["end", "middle"])
def test_kernelized_matches_float64(where):
    q, k, v = qkv()
    mask = masks()[where]
    out = build("kernelized")(q, k, v, mask)
    ref = reference_kernelized(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], ref[real], atol=1e-5, rtol=1e-4)


def test_kernelized_float64_input_is_exact():
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    out = build("kernelized", dropout=0.0)(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], reference_kernelized(q, k, v, mask)[real], atol=1e-12, rtol=1e-10)


def test_kernelized_dropout_only_in_training():
    q, k, v = qkv()
    m = build("kernelized", dropout=0.5)
    a = m(q, k, v)
    torch.manual_seed(0)
    b = m.train()(q, k, v)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(build("kernelized", dropout=0.0).train()(q, k, v), a)


# ----------------------------------------------------------------------------------- skyformer
def test_skyformer_equals_nystrom_formula_on_its_landmarks():
    """With redraw="fixed" the landmarks are reproducible; recompute them and check the formula."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    torch.manual_seed(0)
    m = build("skyformer", num_landmarks=40, redraw="fixed", inverse="exact", gamma=0.1)
    out = m(q, k, v, mask)
    real2 = torch.cat([mask, mask], 1)
    idx, valid = sample_landmarks(real2, H, 40, uniforms=m.fixed_uniforms(q.shape[2]))
    assert valid.all()
    for h in range(H):  # the reference takes one head at a time
        lm = [idx[b, h] for b in range(q.shape[0])]
        ref = reference_nystrom_completion(q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1], mask, lm, 0.1)
        real = mask[:, None, :, None].expand_as(ref)
        torch.testing.assert_close(out[:, h : h + 1][real], ref[real], atol=1e-10, rtol=1e-8)


def test_skyformer_error_shrinks_with_landmarks():
    """Mean relative error vs kernelized attention over seeds, landmarks 8 → 32 → 128 → 256 = 2n."""
    mask = masks()["middle"]
    budgets = [8, 32, 128, 2 * N]
    errs = {d: 0.0 for d in budgets}
    seeds = range(3)
    for s in seeds:
        q, k, v = qkv(seed=s, dtype=torch.float64)
        ref = reference_kernelized(q, k, v, mask)
        for d in budgets:
            torch.manual_seed(100 + s)
            errs[d] += rel_err(build("skyformer", num_landmarks=d)(q, k, v, mask), ref, mask) / len(seeds)
    assert errs[8] > errs[32] > errs[128] > errs[2 * N], errs
    assert errs[128] < 0.6 * errs[8], errs
    # every real row of [Q; K] is a landmark: only the γ = 0.1 ridge is left (measured ≈ 0.005)
    assert errs[2 * N] < 0.02, errs


def test_skyformer_all_real_rows_as_landmarks_is_nearly_exact():
    """d ≥ 2·n_real without replacement takes every real row of [Q̃; K̃], so the Nyström
    approximation B̄ S (SᵀB̄S + γI)⁻¹ SᵀB̄ = B̄(B̄ + γI)⁻¹B̄ differs from B̄ only through γ: with the
    exact inverse and γ → 0 it reproduces kernelized attention; with Newton–Schulz it converges
    to the same as iterations grow."""
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    ref = reference_kernelized(q, k, v, mask)
    out = build("skyformer", num_landmarks=2 * N, gamma=1e-9, inverse="exact")(q, k, v, mask)
    assert rel_err(out, ref, mask) < 1e-6
    out_ns = build("skyformer", num_landmarks=2 * N, gamma=1e-4, ns_iters=40)(q, k, v, mask)
    assert rel_err(out_ns, ref, mask) < 1e-3


def test_newton_schulz_converges_to_exact_inverse():
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["end"]
    for init in ("identity", "colsum"):
        torch.manual_seed(0)
        a = build("skyformer", num_landmarks=64, ns_iters=40, ns_init=init)(q, k, v, mask)
        torch.manual_seed(0)
        b = build("skyformer", num_landmarks=64, inverse="exact")(q, k, v, mask)
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)


def test_lemma3_spectrum_and_per_matrix_init():
    """D^{-½}(M + γI)D^{-½} has eigenvalues in (0, 1]; the iteration treats each matrix alone."""
    g = torch.Generator().manual_seed(0)
    land = torch.randn(3, 24, 8, generator=g, dtype=torch.float64) * torch.tensor([4.0, 0.5, 0.05])[:, None, None]
    m = gaussian_kernel(land, land) + 0.1 * torch.eye(24, dtype=torch.float64)
    dinv = m.sum(-1).rsqrt()
    a = dinv[..., :, None] * m * dinv[..., None, :]
    eig = torch.linalg.eigvalsh(a)
    assert eig.min() > 0 and eig.max() <= 1 + 1e-12
    colsum = a.abs().sum(-2).amax(-1)
    assert colsum[1] > colsum[0] + 0.05 and colsum[1] > colsum[2] + 0.05  # a batch-wide max would differ
    for init in ("identity", "colsum"):
        z = newton_schulz_inverse(a, 6, init)
        for i in range(3):  # each matrix alone, without the others
            torch.testing.assert_close(z[i : i + 1], newton_schulz_inverse(a[i : i + 1], 6, init), atol=0, rtol=0)


@pytest.mark.parametrize("init", ["identity", "colsum"])
def test_skyformer_sample_output_independent_of_other_samples(init):
    q, k, v = qkv()
    q, k = 4 * q, 4 * k  # kernel matrices near I: column sums of A close to 1
    mask = masks()["end"]
    m = build("skyformer", num_landmarks=32, ns_init=init)
    torch.manual_seed(4)
    a = m(q, k, v, mask)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[1] /= 4  # sample 1 at unit scale: larger column sums (≈ 1.12), a batch-wide max would move
    k2[1] /= 4
    v2[1] += 3.0
    torch.manual_seed(4)
    b = m(q2, k2, v2, mask)
    torch.testing.assert_close(a[0], b[0], atol=0, rtol=0)


def test_landmarks_only_among_real_rows():
    mask = masks()["middle"]
    real2 = torch.cat([mask, mask], 1)
    torch.manual_seed(0)
    idx, valid = sample_landmarks(real2, H, 200)
    for b in range(2):
        n_real = int(real2[b].sum())
        for h in range(H):
            chosen = idx[b, h][valid[b, h]]
            assert real2[b, chosen].all()
            assert len(chosen) == min(200, n_real) == len(set(chosen.tolist()))  # no duplicates
    idx, valid = sample_landmarks(real2, H, 500, replacement=True)
    assert valid.all() and real2.gather(1, idx.flatten(1)).all()


def test_fixed_uniforms_pick_real_rows_uniformly_with_replacement():
    """redraw="fixed", replacement=True: the ⌊u·m⌋-th real row, i.e. uniform over each sample's real rows."""
    mask = masks()["middle"]
    real2 = torch.cat([mask, mask], 1)
    torch.manual_seed(0)
    u = torch.rand(1, 20000)
    idx, _ = sample_landmarks(real2, 1, 20000, replacement=True, uniforms=u)
    for b in range(2):
        rows = real2[b].nonzero().flatten()
        counts = torch.bincount(idx[b, 0], minlength=real2.shape[1]).double()
        assert counts[~real2[b]].sum() == 0
        expected = 20000 / len(rows)
        assert (counts[rows] - expected).abs().max() < 5 * math.sqrt(expected)
        # the rank is read off the uniform: the smallest u takes the first real row
        assert idx[b, 0, u[0].argmin()] == rows[0] and idx[b, 0, u[0].argmax()] == rows[-1]


@pytest.mark.parametrize("replacement", [False, True])
def test_fixed_landmarks_do_not_depend_on_batch_position(replacement):
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()["middle"]
    torch.manual_seed(0)
    m = build("skyformer", num_landmarks=24, redraw="fixed", replacement=replacement)
    both = m(q, k, v, mask)
    second = m(q[1:], k[1:], v[1:], mask[1:])
    torch.testing.assert_close(second[0], both[1], atol=1e-12, rtol=1e-10)


def test_skyformer_redraw_policy():
    q, k, v = qkv()
    torch.manual_seed(0)
    fixed = build("skyformer", num_landmarks=16, redraw="fixed")
    torch.testing.assert_close(fixed(q, k, v), fixed(q, k, v), atol=0, rtol=0)
    again = build("skyformer", num_landmarks=16, redraw="fixed")
    again.load_state_dict(fixed.state_dict())  # the landmark seed is saved with the module
    torch.testing.assert_close(again(q, k, v), fixed(q, k, v), atol=0, rtol=0)
    per_call = build("skyformer", num_landmarks=16)
    assert not torch.allclose(per_call(q, k, v), per_call(q, k, v))


@pytest.mark.parametrize(
    "name,bad",
    [
        ("kernelized", {"dropout": 1.0}),
        ("skyformer", {"num_landmarks": 0}),
        ("skyformer", {"gamma": 0.0}),
        ("skyformer", {"ns_iters": -1}),
        ("skyformer", {"ns_init": "random"}),
        ("skyformer", {"inverse": "lu"}),
        ("skyformer", {"replacement": "yes"}),
        ("skyformer", {"redraw": "per_step"}),
    ],
)
def test_invalid_options_named(name, bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(name, **bad)
