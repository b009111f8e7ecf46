"""Reformer LSH attention (Kitaev, Kaiser, Levskaya, ICLR 2020), §2 "Locality-sensitive hashing attention".

Shared-QK: the keys are the normalised queries, k_j = q_j/‖q_j‖ (the ``k`` input is ignored, as in
the paper; the registry reports ``shared_qk``), and the logits are q_i·k_j/√d. Per hashing round r
(``n_hashes`` rounds), a random rotation R (d × n_buckets/2, Gaussian) hashes every token to
h(x) = argmax([xR; −xR]) (angular LSH). Tokens are sorted by (bucket, position) and cut into chunks
of ``bucket_size`` (m) tokens; each query attends to the keys of its own chunk and of the previous
chunk (cyclically) in that order, the set P̃ᵢ⁽ʳ⁾ of the paper. Rounds are combined so that the result
is softmax over the union ∪ᵣ P̃ᵢ⁽ʳ⁾: within round r the logit of key j is lowered by log Nᵢⱼ, the number
of rounds whose set contains j (the paper's duplicate correction), and round outputs are mixed with
weights exp(lseᵣ − logsumexp over rounds). A token does not attend to itself (its logit is −1e5,
−1e4 in half precision) unless it is the only choice. The number of buckets is the number of chunks,
rounded up to even, so buckets hold about one chunk on average.

Complexity: O(r·n·log n) for the sort and O(r²·n·m·d) for the chunked attention (the r² is the
duplicate count), memory O(r·n·m).

Padding: padded tokens are put in an extra last bucket, after every real token, so real tokens'
buckets, order and chunks do not depend on padded content (HF Reformer does the same); padded keys
are masked in every chunk. n need not be a multiple of the bucket size: the input is padded inside.
With ``bucket_size`` ≥ n everything is one chunk and the result is exact shared-QK attention (with
the self-exclusion rule).

Randomness (``redraw``): ``"per_call"`` (default, the paper: new hashes every forward) draws the
rotations from torch's RNG each call; ``"fixed"`` derives them from a seed drawn at construction
(a buffer), the same for every call; those for ``max_len`` are drawn at construction (and again
when a state dict is loaded) into a buffer, so torch.compile traces forward as one graph (another
length redraws from the seed in Python: exact, but a graph break).

Deviations: the attention of the LRA papers (HF ``LSHSelfAttention``) projects X itself with one
shared query-key matrix; here the model's Q serves as the shared QK and K is unused. No causal mode,
no attention dropout, no reversible layers (those belong to the model, not the attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention.registry import AttentionBackend, Capabilities, check_choice, check_range, full_mask, register
from attention.softmax import key_mask


@dataclass(frozen=True)
class ReformerOptions:
    n_hashes: int = 2  # rounds of LSH bucketing (duplicates counted once)
    bucket_size: int = 64  # chunk length m; ≈ the average bucket size
    redraw: str = "per_call"  # "per_call": new rotations every forward; "fixed": one set per module

    def __post_init__(self):
        check_range("n_hashes", self.n_hashes, 1, 64, integer=True)
        check_range("bucket_size", self.bucket_size, 1, None, integer=True)
        check_choice("redraw", self.redraw, ("per_call", "fixed"))


def lsh_buckets(x: torch.Tensor, keep: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH buckets (b, h, rounds, n) of x (b, h, n, d) under rotations (d, rounds, n_buckets/2);
    padded tokens (keep False) get bucket n_buckets, after every real one."""
    proj = torch.einsum("bhnd,drk->bhrnk", x, rotations.to(x.dtype))
    buckets = torch.cat([proj, -proj], dim=-1).argmax(dim=-1)
    return torch.where(keep[:, None, None, :], buckets, torch.full_like(buckets, 2 * rotations.shape[-1]))


def chunk_order(buckets: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort by (bucket, position): perm (sorted slot -> position) and each position's chunk index."""
    n = buckets.shape[-1]
    perm = (buckets * n + torch.arange(n, device=buckets.device)).argsort(dim=-1)
    return perm, perm.argsort(dim=-1) // chunk


def _redraw_after_load(module: "ReformerAttention", incompatible_keys) -> None:
    module._draw_fixed_rotations()  # the loaded seed defines the rotations


@register("reformer")
class ReformerAttention(AttentionBackend):
    """Reformer: shared-QK LSH attention with multi-round hashing."""

    Options = ReformerOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        shared_qk=True,
        complexity="O(n log n)",
        target="softmax (shared QK, no self-attention)",
        notes="ignores k: keys are normalised q; any n (padded inside)",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        if options.redraw == "fixed":
            self.register_buffer("hash_seed", torch.randint(0, 2**62, ()))
            # The rotations for max_len (the harness pads every batch to it) live in a buffer that
            # follows the module's device, so forward seeds no generator and torch.compile traces it
            # as one graph. Not saved: redrawn from the seed, also when a state dict is loaded.
            self.register_buffer("fixed_rotations", None, persistent=False)
            self._draw_fixed_rotations()
            self.register_load_state_dict_post_hook(_redraw_after_load)

    def _seeded_rotations(self, n_buckets: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(int(self.hash_seed) + n_buckets)
        return torch.randn((self.head_dim, self.options.n_hashes, n_buckets // 2), generator=gen)

    def _draw_fixed_rotations(self) -> None:
        self.fixed_rotations = self._seeded_rotations(self.geometry(self.max_len)[2]).to(self.hash_seed.device)

    def geometry(self, n: int) -> tuple[int, int, int]:
        """(chunk length, number of chunks, number of buckets) for sequences of length n."""
        c = min(self.options.bucket_size, n)
        chunks = math.ceil(n / c)
        return c, chunks, chunks + chunks % 2

    def draw_rotations(self, n: int, device=None) -> torch.Tensor:
        """(d, n_hashes, n_buckets/2) rotations for length n; ``per_call`` consumes torch's RNG as a forward does."""
        _, _, n_buckets = self.geometry(n)
        shape = (self.head_dim, self.options.n_hashes, n_buckets // 2)
        if self.options.redraw == "per_call":
            return torch.randn(shape, device=device)
        if self.fixed_rotations.shape == shape:
            return self.fixed_rotations.to(device)
        return self._seeded_rotations(n_buckets).to(device)  # a length other than max_len (eager only)

    def forward(self, q, k, v, mask=None):
        b, h, n, d = q.shape
        r = self.options.n_hashes
        c, nch, _ = self.geometry(n)
        rotations = self.draw_rotations(n, q.device)
        pad = nch * c - n
        n_pad = n + pad
        keep = F.pad(key_mask(full_mask(q, mask)), (0, pad))  # internal padding is masked
        x, v = F.pad(q, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        perm, chunk_of = chunk_order(lsh_buckets(x, keep, rotations), c)  # (b,h,r,n_pad)

        def sort(t):  # (b,h,n_pad,e) -> (b,h,r,nch,c,e) in sorted order
            e = t.shape[-1]
            return (
                t.unsqueeze(2)
                .expand(b, h, r, n_pad, e)
                .gather(3, perm[..., None].expand(b, h, r, n_pad, e))
                .view(b, h, r, nch, c, e)
            )

        def look_back(t):  # own chunk and the previous one (cyclic), along the key axis
            return torch.cat([t, t.roll(1, dims=3)], dim=4) if nch > 1 else t

        sq = sort(x)
        kk = look_back(sort(F.normalize(x, dim=-1)))
        vv = look_back(sort(v))
        qpos = perm.view(b, h, r, nch, c)
        kpos = look_back(qpos)
        kreal = look_back(keep[:, None, None, :].expand(b, h, r, n_pad).gather(3, perm).view(b, h, r, nch, c))

        scores = (sq @ kk.transpose(-1, -2)) / math.sqrt(d)  # (b,h,r,nch,c,c or 2c)
        if r > 1:  # duplicate correction: N_ij = rounds whose chunk set of i contains j
            count = torch.zeros_like(scores)
            for r2 in range(r):
                co = chunk_of[:, :, r2]  # (b,h,n_pad)
                ci = co.gather(2, qpos.flatten(2)).view(qpos.shape)[..., None]
                cj = co.gather(2, kpos.flatten(2)).view(kpos.shape)[..., None, :]
                hit = ci == cj
                if nch > 1:
                    hit |= (ci - 1) % nch == cj
                count += hit
            scores = scores - count.log()
        self_logit = -1e4 if scores.dtype == torch.float16 else -1e5
        scores = scores.masked_fill(qpos[..., None] == kpos[..., None, :], self_logit)
        scores = scores.masked_fill(~kreal[..., None, :], torch.finfo(scores.dtype).min)

        lse = scores.logsumexp(dim=-1).view(b, h, r, n_pad)
        out = (scores.softmax(dim=-1) @ vv).view(b, h, r, n_pad, d)
        inv = perm.argsort(dim=-1)  # back to positions
        out = out.gather(3, inv[..., None].expand(b, h, r, n_pad, d))
        weights = lse.gather(3, inv).softmax(dim=2)  # mix the rounds
        return (weights[..., None] * out).sum(dim=2)[:, :, :n]
