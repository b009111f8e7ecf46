"""reformer against shared-QK full attention in float64: exact when all tokens share one chunk, and,
with the module's own hash rotations, softmax over the union of the hashed chunk sets."""

import math

import pytest
import torch

import attention
from attention.testing import masks, qkv
from tests.test_attention_contract import LargestTensor

H, D = 2, 16


def reference_shared_qk(q, v, mask, allowed=None):
    """Dense float64 loops: keys k_j = q_j/‖q_j‖, logits q_i·k_j/√d over real j (and allowed[b,h,i,j]);
    j = i is excluded unless it is the only choice."""
    q, v = q.double(), v.double()
    b_, h_, n, d = q.shape
    out = torch.zeros_like(q)
    for b in range(b_):
        for h in range(h_):
            keys = q[b, h] / q[b, h].norm(dim=-1, keepdim=True)
            for i in range(n):
                ok = mask[b].clone() if allowed is None else mask[b] & allowed[b, h, i]
                others = ok.clone()
                others[i] = False
                sel = others if others.any() else ok
                if not sel.any():
                    continue
                idx = sel.nonzero().flatten()
                s = keys[idx] @ q[b, h, i] / math.sqrt(d)
                out[b, h, i] = torch.softmax(s, 0) @ v[b, h, idx]
    return out


def union_of_chunk_sets(q, mask, rotations, chunk):
    """The paper's P̃ᵢ, written from its definition: hash (argmax over [xR; −xR]), padded tokens in a last
    bucket, stable sort by bucket, chunks of `chunk` slots, attend own chunk and previous chunk (cyclic);
    union over rounds. Returns allowed (b, h, n, n) bool."""
    b_, h_, n, d = q.shape
    n_chunks = math.ceil(n / chunk)
    n_pad = n_chunks * chunk
    n_buckets = 2 * rotations.shape[-1]
    allowed = torch.zeros(b_, h_, n, n, dtype=torch.bool)
    for b in range(b_):
        for h in range(h_):
            for r in range(rotations.shape[1]):
                proj = q[b, h].double() @ rotations[:, r].double()
                bucket = torch.cat([proj, -proj], -1).argmax(-1).tolist()
                bucket = [bk if mask[b, i] else n_buckets for i, bk in enumerate(bucket)]
                bucket += [n_buckets] * (n_pad - n)  # internal padding
                order = sorted(range(n_pad), key=lambda i: (bucket[i], i))
                chunk_of = {pos: slot // chunk for slot, pos in enumerate(order)}
                for i in range(n):
                    for j in range(n):
                        ci, cj = chunk_of[i], chunk_of[j]
                        if cj == ci or (n_chunks > 1 and cj == (ci - 1) % n_chunks):
                            allowed[b, h, i, j] = True
    return allowed


@pytest.mark.parametrize("n_hashes", [1, 2, 3])
@pytest.mark.parametrize("where", ["end", "middle"])
def test_one_chunk_is_exact_shared_qk_attention(n_hashes, where):
    m = attention.build("reformer", num_heads=H, head_dim=D, max_len=128, n_hashes=n_hashes, bucket_size=128)
    q, k, v = qkv()
    mask = masks()[where]
    torch.manual_seed(0)
    out = m(q, k, v, mask)
    ref = reference_shared_qk(q, v, mask)
    real = mask[:, None, :, None].expand_as(q)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)
    out64 = m(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out64[real], ref[real], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("redraw", ["per_call", "fixed"])
@pytest.mark.parametrize("n,bucket,n_hashes", [(100, 16, 2), (96, 16, 3), (70, 32, 1), (50, 8, 2)])
def test_multi_round_is_softmax_over_union_of_chunk_sets(redraw, n, bucket, n_hashes):
    """n not a multiple of the bucket size, padding in the middle; duplicates across rounds counted once."""
    m = attention.build(
        "reformer", num_heads=H, head_dim=D, max_len=n, n_hashes=n_hashes, bucket_size=bucket, redraw=redraw
    )
    q, k, v = qkv(n=n)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 10:27] = False
    mask[1, 30:33] = False
    mask[1, n - 4 :] = False
    torch.manual_seed(3)
    rotations = m.draw_rotations(n)
    n_chunks = math.ceil(n / bucket)
    assert rotations.shape == (D, n_hashes, (n_chunks + n_chunks % 2) // 2)
    torch.manual_seed(3)
    out = m(q, k, v, mask)
    allowed = union_of_chunk_sets(q, mask, rotations, bucket)
    assert not allowed[:, :, :, :].all(), "the test needs sparse sets"
    ref = reference_shared_qk(q, v, mask, allowed)
    real = mask[:, None, :, None].expand_as(q)
    torch.testing.assert_close(out.double()[real], ref[real], atol=2e-5, rtol=1e-4)


def test_ignores_k_and_attends_to_self_only_when_alone():
    m = attention.build("reformer", num_heads=H, head_dim=D, max_len=64, bucket_size=16)
    q, k, v = qkv(n=64)
    other_k = torch.randn_like(k)
    torch.manual_seed(0)
    a = m(q, k, v)
    torch.manual_seed(0)
    assert torch.equal(m(q, other_k, v), a)
    assert attention.capabilities("reformer").shared_qk
    mask = torch.zeros(2, 64, dtype=torch.bool)
    mask[0, 17] = True  # a single real token: itself is its only choice
    mask[1, [3, 40]] = True  # two real tokens: each sees only the other (when they share a chunk set)
    m1 = attention.build("reformer", num_heads=H, head_dim=D, max_len=64, bucket_size=64)
    out = m1(q, k, v, mask)
    torch.testing.assert_close(out[0, :, 17], v[0, :, 17])
    torch.testing.assert_close(out[1, :, 3], v[1, :, 40])
    torch.testing.assert_close(out[1, :, 40], v[1, :, 3])


def test_per_call_redraw_and_fixed():
    q, k, v = qkv(n=256)
    m = attention.build("reformer", num_heads=H, head_dim=D, max_len=256, bucket_size=16)
    torch.manual_seed(0)
    assert not torch.equal(m(q, k, v), m(q, k, v))
    torch.manual_seed(0)
    f = attention.build("reformer", num_heads=H, head_dim=D, max_len=256, bucket_size=16, redraw="fixed")
    torch.manual_seed(1)
    a = f(q, k, v)
    torch.manual_seed(2)
    assert torch.equal(f.eval()(q, k, v), a)
    assert "hash_seed" in f.state_dict()


def test_fixed_rotations_buffer_is_the_seeded_draw():
    """The rotations kept for max_len (what forward reads) are those the seed gives at that length in
    a module with another max_len (drawn in Python there), and they follow a load."""
    long = attention.build("reformer", num_heads=H, head_dim=D, max_len=256, bucket_size=16, redraw="fixed")
    short = attention.build("reformer", num_heads=H, head_dim=D, max_len=128, bucket_size=16, redraw="fixed")
    assert not torch.equal(long.draw_rotations(128), short.draw_rotations(128))
    short.load_state_dict(long.state_dict())
    assert short.fixed_rotations.shape[-1] == 4 and long.fixed_rotations.shape[-1] == 8
    assert torch.equal(short.draw_rotations(128), long.draw_rotations(128))


def test_memory_linear_in_n():
    sizes = {}
    for n in (2048, 4096):
        m = attention.build("reformer", num_heads=1, head_dim=D, max_len=n)
        q, v = (torch.randn(1, 1, n, D, requires_grad=True) for _ in range(2))
        with LargestTensor() as probe:
            m(q, q, v).sum().backward()
        sizes[n] = probe.largest
    assert sizes[4096] <= 2.1 * sizes[2048]
    assert sizes[4096] < 4096**2 / 8


@pytest.mark.parametrize("bad", [{"n_hashes": 0}, {"bucket_size": 0}, {"bucket_size": 8.0}, {"redraw": "per_step"}])
def test_reformer_invalid_options_named(bad):
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        attention.build("reformer", num_heads=H, head_dim=D, max_len=128, **bad)
