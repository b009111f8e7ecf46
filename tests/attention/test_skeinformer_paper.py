"""Skeinformer's public-code options (``paper`` presets), each from first principles.

The public code (https://github.com/pkuzengqi/Skeinformer, ``src/models/attention_skeinformer.py``)
draws one vector u of uniforms for the batch and takes rows ⌊u·m_i⌋ of the padded sequence for every
head, uses d = min(256, shortest length − 1) for the whole batch, reuses every copy of a duplicated
pilot row (so its gradient counts once per copy) and leaves the ``w/o row normalization`` sketch
unweighted. Each test below checks one of these against a hand-made index set or a float64 formula.
"""

import math

import pytest
import torch
import torch._dynamo

import attention
from attention import skeinformer as sk
from tests.oracles import dense_softmax, rand_qkv

B, H, P = 2, 2, 8
PAPER = dict(
    pilot_sampling="with_replacement",
    pilot_heads="shared",
    pilot_batch="shared",
    draw_from="prefix",
    budget="batch_shortest",
    pilot_duplicate_grad="per_copy",
)


def build(name="skeinformer", n=16, **opts):
    return attention.build(name, num_heads=H, head_dim=P, max_len=n, **opts)


def exact_rows(out, q, k, v, mask):
    """Per (b, h): the set of real rows where ``out`` equals softmax attention (the reused pilot rows)."""
    ref = dense_softmax(q, k, v, mask)
    hit = ((out - ref).abs().amax(-1) < 1e-10) & mask[:, None, :]
    return [[set(hit[b, h].nonzero().flatten().tolist()) for h in range(out.shape[1])] for b in range(out.shape[0])]


def force_uniforms(monkeypatch, u):
    monkeypatch.setattr(sk, "pilot_uniforms", lambda shape, device: torch.tensor(u, dtype=torch.float32).expand(shape))


def adaptive_ref(q, k, v, mask, cols):
    """Eq. (6) row by row in float64: cols[b][h] the selected real columns."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten().tolist()
        for h in range(q.shape[1]):
            sel = cols[b][h]
            rest = [j for j in real if j not in sel]
            for i in range(q.shape[2]):
                logit = {j: float(q[b, h, i] @ k[b, h, j]) / math.sqrt(q.shape[-1]) for j in real}
                g = math.exp(sum(logit[j] for j in sel) / len(sel))
                num = sum(math.exp(logit[j]) * v[b, h, j] for j in sel) + g * sum(v[b, h, j] for j in rest)
                out[b, h, i] = num / (sum(math.exp(logit[j]) for j in sel) + len(rest) * g)
    return out


# ---------------------------------------------------------------- pilot positions
def test_nth_allowed_hand_example():
    """u = (0, 0.45, 0.95): prefix m=16 -> 0, 7, 15; prefix m=10 -> 0, 4, 9; 10 real tokens 0-3, 10-15 -> 0, 10, 15."""
    u = torch.tensor([[[0.0, 0.45, 0.95]]])
    prefix = torch.arange(16)[None, :] < torch.tensor([[16], [10]])
    assert sk.nth_allowed(prefix[:, None, :], u).tolist() == [[[0, 7, 15]], [[0, 4, 9]]]
    real = torch.ones(1, 1, 16, dtype=torch.bool)
    real[..., 4:10] = False
    assert sk.nth_allowed(real, u).tolist() == [[[0, 10, 15]]]
    # the product is taken in float32 and truncated, as the public code's ``(u * n_i).long()``
    u32 = torch.tensor([[[0.7]]], dtype=torch.float32)  # 0.7f = 0.69999998...: times 10 rounds to 7.0 in float32
    assert int(float(u32) * 10.0) == 6  # (6.9999998 in float64)
    assert sk.nth_allowed(torch.ones(1, 1, 10, dtype=torch.bool), u32).item() == 7


@pytest.mark.parametrize("draw_from,rows1", [("prefix", {0}), ("real", {0, 10, 15})])
def test_shared_pilot_rows_across_batch_and_heads(monkeypatch, draw_from, rows1):
    """One u for the batch: sample 0 (16 real) reuses rows 0, 7, 15 in both heads; sample 1 (real 0-3, 10-15)
    rows 0, 4, 9 of the padded sequence (only 0 is real) under "prefix", the 0th, 4th, 9th real under "real"."""
    n = 16
    q, k, v = rand_qkv(n, 0, b=B, h=H, p=P)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 4:10] = False
    force_uniforms(monkeypatch, [0.0, 0.45, 0.95])
    opts = {**PAPER, "budget": "per_sample", "draw_from": draw_from}
    out = build(n=n, num_features=3, **opts)(q, k, v, mask)
    assert exact_rows(out, q, k, v, mask) == [[{0, 7, 15}] * H, [rows1] * H]


def test_pilot_heads_shared_vs_per_head():
    """Independent draws per sample: "shared" gives both heads the same pilot rows, "per_head" (almost surely) not."""
    n = 64
    q, k, v = rand_qkv(n, 1, b=B, h=H, p=P)
    mask = torch.ones(B, n, dtype=torch.bool)
    for heads, same in (("shared", True), ("per_head", False)):
        torch.manual_seed(0)
        rows = exact_rows(build(n=n, num_features=6, pilot_heads=heads)(q, k, v, mask), q, k, v, mask)
        assert all(len(r[0]) == 6 for r in rows)
        assert all((r[0] == r[1]) == same for r in rows)


# ---------------------------------------------------------------- the batch's shortest length sets d
def test_batch_shortest_budget_matches_eq6(monkeypatch):
    """Lengths 16 and 4 (right padding), num_features=8: d = min(8, 4 - 1) = 3 for BOTH samples; eq. (6) with the
    first 3 columns drawn and fill (m_i - 3) g; no pilot reuse here (checked separately)."""
    n, d_slots = 16, 8
    q, k, v = rand_qkv(n, 2, b=B, h=H, p=P)
    mask = torch.arange(n)[None, :] < torch.tensor([[16], [4]])
    draws = torch.tensor(
        [
            [[5, 1, 12, 0, 2, 3, 4, 6], [15, 9, 3, 7, 8, 10, 11, 13]],
            [[2, 0, 3, 1, 4, 5, 6, 7], [1, 3, 0, 2, 4, 5, 6, 7]],
        ]
    )

    kths = []

    def fake_topk(log_w, d, kth=None):
        assert d == d_slots
        kths.append(kth)
        return draws.clone(), torch.full(draws.shape[:-1] + (1,), float("-inf"), dtype=log_w.dtype)

    monkeypatch.setattr(sk, "gumbel_topk", fake_topk)
    out = build("skeinformer_uniform", n=n, num_features=8, budget="batch_shortest")(q, k, v, mask)
    assert int(kths.pop()) == 3  # the threshold key of a 3-sample (for Horvitz-Thompson weights)
    cols = [[row[:3] for row in sample] for sample in draws.tolist()]
    ref = adaptive_ref(q, k, v, mask, cols)
    keep = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-9)
    # per sample (the default): sample 0 uses all 8 of its columns, sample 1 its 4 real tokens (exact)
    out = build("skeinformer_uniform", n=n, num_features=8)(q, k, v, mask)
    assert kths.pop() is None
    ref = adaptive_ref(q, k, v, mask, [[row for row in draws[0].tolist()], [[0, 1, 2, 3]] * H])
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-9)


def test_gumbel_topk_first_slots_are_a_smaller_sample():
    """Slot kth of a d-slot draw: the same indices and threshold key as a kth-sample with the same noise."""
    log_w = torch.randn(3, 2, 20, dtype=torch.float64)
    torch.manual_seed(5)
    idx8, kappa3 = sk.gumbel_topk(log_w, 8, torch.tensor(3))
    torch.manual_seed(5)
    idx3, kappa = sk.gumbel_topk(log_w, 3)
    assert torch.equal(idx8[..., :3], idx3) and torch.equal(kappa3, kappa)


def test_batch_shortest_is_one_graph_when_lengths_change():
    """d is a tensor (fixed slots, validity masks): no .item() graph break, no recompile as the shortest moves."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    n = 32
    f = torch.compile(build(n=n, num_features=8, **PAPER), backend=backend)
    q, k, v = (x.float().requires_grad_() for x in rand_qkv(n, 3, b=B, h=H, p=P))
    for lengths in ([32, 5], [20, 31], [2, 32]):
        mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
        out = f(q, k, v, mask)
        out.sum().backward()
        assert torch.isfinite(out).all()
    torch._dynamo.reset()
    assert len(graphs) == 1


def test_one_token_sample_keeps_one_column():
    """The public code's d = shortest - 1 is 0 for a 1-token sample (it fails); here d clamps to 1."""
    n = 16
    q, k, v = rand_qkv(n, 4, b=B, h=H, p=P)
    mask = torch.arange(n)[None, :] < torch.tensor([[16], [1]])
    torch.manual_seed(0)
    out = build(n=n, num_features=8, **PAPER)(q, k, v, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1, :, 0], v[1, :, 0])  # one real key: attention is v_0


# ---------------------------------------------------------------- draw_from="prefix": padded pilot rows
def test_prefix_pilot_on_padding_counts_as_a_uniform_row(monkeypatch):
    """A pilot at a padded position has a zeroed query (the public code masks q): its B_J row is 1/m on the
    m real keys and it enters eq. (5): p̂_i ∝ sqrt(b_{0i}² + (1/m)²) ‖v_i‖."""
    n = 12
    q, k, v = rand_qkv(n, 5, b=1, h=1, p=P)
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[0, 3:6] = False  # m = 9: prefix positions 0..8, among them padded 3, 4, 5
    force_uniforms(monkeypatch, [0.0, 0.4])  # rows 0 and ⌊3.6⌋ = 3 (padding)
    seen = {}

    def fake_topk(log_w, d, kth=None):
        seen["log_w"] = log_w
        cols = torch.tensor([[[0, 1]]])
        return cols, torch.full((1, 1, 1), float("-inf"), dtype=log_w.dtype)

    monkeypatch.setattr(sk, "gumbel_topk", fake_topk)
    attention.build(
        "skeinformer", num_heads=1, head_dim=P, max_len=n, num_features=2, **{**PAPER, "budget": "per_sample"}
    )(q, k, v, mask)
    real = mask[0].nonzero().flatten().tolist()
    a0 = {j: math.exp(float(q[0, 0, 0] @ k[0, 0, j]) / math.sqrt(P)) for j in real}
    want = torch.zeros(n, dtype=torch.float64)
    for j in real:
        want[j] = math.sqrt((a0[j] / sum(a0.values())) ** 2 + (1 / 9) ** 2) * float(v[0, 0, j].norm())
    torch.testing.assert_close(seen["log_w"].softmax(-1)[0, 0], want / want.sum(), atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------- w/o row normalisation: unweighted sketch
def test_no_rownorm_unweighted_sketch(monkeypatch):
    """sketch_weights="none": out_i = Σ_{j∈J'} a_ij v_j / Σ_{real j} a_ij (the public ablation), no 1/π_j."""
    n = 20
    q, k, v = rand_qkv(n, 6, b=B, h=H, p=P)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 7:13] = False
    cols = [[[0, 3, 17], [5, 6, 14]], [[2, 15, 19], [0, 1, 13]]]
    monkeypatch.setattr(
        sk,
        "gumbel_topk",
        lambda log_w, d, kth=None: (torch.tensor(cols), torch.full((B, H, 1), 0.3, dtype=log_w.dtype)),
    )  # a finite kappa: HT would weight
    out = build("skeinformer_no_rownorm", n=n, num_features=3, pilot_reuse=False, sketch_weights="none")(q, k, v, mask)
    ref = torch.zeros_like(q)
    for b in range(B):
        real = mask[b].nonzero().flatten().tolist()
        for h in range(H):
            for i in range(n):
                a = {j: math.exp(float(q[b, h, i] @ k[b, h, j]) / math.sqrt(P)) for j in real}
                ref[b, h, i] = sum(a[j] * v[b, h, j] for j in cols[b][h]) / sum(a.values())
    keep = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-9)


# ---------------------------------------------------------------- duplicated pilot rows: gradient per copy
@pytest.mark.parametrize("mode,copies", [("per_copy", 2.0), ("once", 1.0)])
def test_duplicate_pilot_gradient(monkeypatch, mode, copies):
    """Row 2 drawn twice (u = 0.2, 0.25 with m = 10): its output is the exact softmax row either way; the
    gradient of out[2] wrt v is c · softmax(q_2 Kᵀ/√p) with c = 2 copies (public code) or 1."""
    n = 10
    q, k, v = rand_qkv(n, 7, b=1, h=1, p=P)
    v.requires_grad_()
    mask = torch.ones(1, n, dtype=torch.bool)
    force_uniforms(monkeypatch, [0.2, 0.25, 0.9])
    out = attention.build(
        "skeinformer", num_heads=1, head_dim=P, max_len=n, num_features=3, **{**PAPER, "pilot_duplicate_grad": mode}
    )(q, k, v, mask)
    exact = dense_softmax(q, k, v.detach(), mask)
    torch.testing.assert_close(out[0, 0, 2], exact[0, 0, 2], atol=1e-12, rtol=1e-10)
    out[0, 0, 2].sum().backward()
    s = (q[0, 0, 2] @ k[0, 0].T / math.sqrt(P)).softmax(-1)
    torch.testing.assert_close(v.grad[0, 0, :, 0], copies * s, atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------- options
@pytest.mark.parametrize(
    "bad",
    [
        {"pilot_heads": "all"},
        {"pilot_batch": "global"},
        {"draw_from": "left"},
        {"budget": "shortest"},
        {"sketch_weights": "ht"},
        {"pilot_duplicate_grad": 2},
    ],
)
def test_invalid_paper_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        build(**bad)


def test_shared_batch_needs_replacement():
    with pytest.raises(ValueError, match="pilot_batch"):
        build(pilot_batch="shared")


def test_defaults_are_clean():
    d = attention.option_defaults("skeinformer")
    assert (
        d["pilot_heads"],
        d["pilot_batch"],
        d["draw_from"],
        d["budget"],
        d["sketch_weights"],
        d["pilot_duplicate_grad"],
    ) == ("per_head", "independent", "real", "per_sample", "horvitz_thompson", "once")
