"""BigBird block-sparse attention (Zaheer et al., NeurIPS 2020), the ITC variant used on LRA.

The sequence is cut into blocks of ``block_size`` (64) tokens. Key block sets per query block i:
  * global: the first and the last block attend to every block, and every block attends to them;
  * sliding window: blocks i−w … i+w, with ``window_blocks`` = 2w+1 (3 as in ITC BigBird);
  * random: ``random_blocks`` (3) blocks drawn uniformly without replacement, per head, among the
    non-global blocks outside the window (fewer when fewer remain).
Within that pattern the scores are softmax(q·k/√d) over real keys.

Implementation, pure torch, memory linear in n: the input is padded internally to a multiple of the
block; for every non-global query block the (2w+1)+2+r key blocks are gathered by index
((b,h,n/bs, keys, bs, d), i.e. (2w+3+r)× K) and one masked softmax runs per block; duplicated blocks
(a global block inside the window) are masked, so no key is counted twice. The two global query
blocks attend to all keys. O(n·(2w+3+r)·bs·d) time and O(n·(2w+3+r)·bs) memory.
(FlexAttention's BlockMask would express this pattern, but on this CPU build it has no backward and
its eager path materialises n×n scores, so it is not used.)

Randomness (``redraw``): ``"fixed"`` (default) draws a seed from torch's RNG at construction (a
buffer, saved with the model) and derives the pattern for each block count from it, so the pattern
is the same for every call, in train and in eval, like the Skyformer/Skeinformer code (which reseeds
numpy on every call); ``"per_call"`` draws a new pattern from torch's RNG on every forward (HF
BigBird in training). The same pattern logic runs in train and eval in both modes. With
``"fixed"`` the pattern for ``max_len`` is drawn at construction (and again when a state dict is
loaded) into buffers, so forward holds no Python-side state and torch.compile traces it as one
graph; another length redraws its pattern from the seed in Python (exact, but a graph break).

Deviations: any n (internal padding; HF and the papers' port need n % 64 == 0 and fall back to full
attention for short inputs); padding may sit anywhere (padded keys masked everywhere, including
inside the global blocks); HF draws eval patterns as empty (no random blocks) and, for some lengths,
draws random blocks only from the first 1024 tokens ("old plans"); here random blocks come from the
whole sequence in both modes. The last global block is the last block of the internally padded
sequence. No attention dropout (the papers' port has none). A sample without real tokens is
treated as all real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention.registry import (
    AttentionBackend,
    Capabilities,
    InvalidOption,
    check_choice,
    check_range,
    full_mask,
    register,
)
from attention.softmax import key_mask


@dataclass(frozen=True)
class BigBirdOptions:
    block_size: int = 64  # tokens per block, the unit of the sparse pattern
    random_blocks: int = 3  # random key blocks each query block attends to
    window_blocks: int = 3  # odd: the block itself and (window_blocks-1)/2 on each side
    redraw: str = "fixed"  # "fixed": one pattern per module (per block count); "per_call": new every forward

    def __post_init__(self):
        check_range("block_size", self.block_size, 1, None, integer=True)
        check_range("random_blocks", self.random_blocks, 0, None, integer=True)
        check_range("window_blocks", self.window_blocks, 1, None, integer=True)
        if self.window_blocks % 2 == 0:
            raise InvalidOption(f"option 'window_blocks'={self.window_blocks!r} must be odd")
        check_choice("redraw", self.redraw, ("fixed", "per_call"))


def pattern_indices(
    nb: int, num_heads: int, window_blocks: int, random_blocks: int, generator=None, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-block indices of the non-global query blocks 1 … nb−2.

    Returns idx (heads, nb−2, K) long and valid (heads, nb−2, K) bool, K = window + 2 + random;
    invalid entries (outside the sequence, duplicates, missing random blocks) point at block 0.
    Random blocks are drawn with ``torch.rand`` (from ``generator`` if given, else torch's RNG).
    """
    w = window_blocks // 2
    rows = torch.arange(1, nb - 1, device=device)  # (R,)
    nrows = rows.numel()
    win = rows[:, None] + torch.arange(-w, w + 1, device=device)  # (R, 2w+1)
    win_valid = (win >= 0) & (win < nb)
    glob = torch.tensor([0, nb - 1], device=device).expand(nrows, 2)
    glob_valid = (glob - rows[:, None]).abs() > w  # not already in the window
    r = min(random_blocks, nb)
    if r:
        u = torch.rand(num_heads, nrows, nb, generator=generator, device=device if generator is None else "cpu")
        u = u.to(device)
        cols = torch.arange(nb, device=device)
        candidate = (cols > 0) & (cols < nb - 1) & ((cols[None, :] - rows[:, None]).abs() > w)  # (R, nb)
        u = torch.where(candidate, u, torch.full_like(u, 2.0))
        rnd = u.topk(r, dim=-1, largest=False).indices  # (h, R, r)
        rnd_valid = candidate.expand(num_heads, nrows, nb).gather(-1, rnd)
    else:
        rnd = torch.zeros(num_heads, nrows, 0, dtype=torch.long, device=device)
        rnd_valid = torch.zeros(num_heads, nrows, 0, dtype=torch.bool, device=device)
    idx = torch.cat([win.expand(num_heads, -1, -1), glob.expand(num_heads, -1, -1), rnd], dim=-1)
    valid = torch.cat([win_valid.expand(num_heads, -1, -1), glob_valid.expand(num_heads, -1, -1), rnd_valid], dim=-1)
    return idx.masked_fill(~valid, 0), valid


def _redraw_after_load(module: "BigBirdAttention", incompatible_keys) -> None:
    module._draw_fixed_pattern()  # the loaded seed defines the pattern


@register("bigbird")
class BigBirdAttention(AttentionBackend):
    """BigBird ITC: global, sliding-window and random key blocks."""

    Options = BigBirdOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        randomized=True,
        complexity="O(n)",
        target="softmax",
        notes="exact softmax restricted to the block pattern; any n (padded inside)",
    )

    def __init__(self, num_heads, head_dim, max_len, options):
        super().__init__(num_heads, head_dim, max_len, options)
        if options.redraw == "fixed":
            self.register_buffer("pattern_seed", torch.randint(0, 2**62, ()))
            # The pattern for max_len (the harness pads every batch to it) is drawn once into buffers
            # that follow the module's device: forward reads them instead of seeding a generator,
            # so torch.compile traces it as one graph. Not saved: they are redrawn from the seed.
            self.register_buffer("fixed_idx", None, persistent=False)
            self.register_buffer("fixed_valid", None, persistent=False)
            self._draw_fixed_pattern()
            self.register_load_state_dict_post_hook(_redraw_after_load)

    def _seeded_pattern(self, nb: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.options
        gen = torch.Generator().manual_seed(int(self.pattern_seed) + nb)
        return pattern_indices(nb, self.num_heads, o.window_blocks, o.random_blocks, generator=gen, device=device)

    def _draw_fixed_pattern(self) -> None:
        nb = math.ceil(self.max_len / self.options.block_size)
        if nb > 2:
            self.fixed_idx, self.fixed_valid = self._seeded_pattern(nb, self.pattern_seed.device)

    def _pattern(self, nb: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.options
        if o.redraw == "per_call":
            return pattern_indices(nb, self.num_heads, o.window_blocks, o.random_blocks, device=device)
        if self.fixed_idx is not None and self.fixed_idx.shape[1] == nb - 2:
            return self.fixed_idx.to(device), self.fixed_valid.to(device)
        return self._seeded_pattern(nb, device)  # a length other than max_len: drawn again (eager only)

    def block_layout(self, n: int, device=None) -> torch.Tensor:
        """(heads, nb, nb) bool block adjacency used for sequences of length n; with
        ``redraw="per_call"`` it consumes torch's RNG exactly as one forward does (seed, then call)."""
        nb = math.ceil(n / self.options.block_size)
        layout = torch.zeros(self.num_heads, nb, nb, dtype=torch.bool, device=device)
        layout[:, [0, nb - 1], :] = True
        if nb > 2:
            idx, valid = self._pattern(nb, device)
            layout[:, 1:-1] = (F.one_hot(idx, nb).bool() & valid[..., None]).any(dim=-2)
        return layout

    def pattern(self, n: int, device=None) -> torch.Tensor:
        """Token-level (heads, n, n) bool pattern (for tests): True where query i may attend key j."""
        bs = self.options.block_size
        lay = self.block_layout(n, device)
        blk = torch.arange(n, device=device) // bs
        return lay[:, blk][:, :, blk]

    def forward(self, q, k, v, mask=None):
        o = self.options
        b, h, n, d = q.shape
        bs = o.block_size
        nb = math.ceil(n / bs)
        pad = nb * bs - n
        keep = F.pad(key_mask(full_mask(q, mask)), (0, pad))  # (b, n_pad); internal padding is masked
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        scale = 1.0 / math.sqrt(d)

        # global query blocks (first and last) see every key
        gq = q.view(b, h, nb, bs, d)[:, :, [0, nb - 1] if nb > 1 else [0]].flatten(2, 3)
        gs = (gq @ k.transpose(-1, -2)) * scale
        gout = gs.masked_fill(~keep[:, None, None, :], torch.finfo(gs.dtype).min).softmax(-1) @ v  # (b,h,(1|2)·bs,d)
        if nb <= 2:
            return gout[:, :, :n]

        # middle query blocks see their gathered key blocks
        idx, valid = self._pattern(nb, q.device)  # (h, nb-2, K)
        K = idx.shape[-1]
        heads = torch.arange(h, device=q.device)[:, None, None]
        kb = k.view(b, h, nb, bs, d)[:, heads, idx].reshape(b, h, nb - 2, K * bs, d)
        vb = v.view(b, h, nb, bs, d)[:, heads, idx].reshape(b, h, nb - 2, K * bs, d)
        kreal = keep.view(b, nb, bs)[:, idx] & valid[None, ..., None]  # (b,h,nb-2,K,bs)
        qb = q.view(b, h, nb, bs, d)[:, :, 1:-1]
        scores = (qb @ kb.transpose(-1, -2)) * scale  # (b,h,nb-2,bs,K·bs)
        scores = scores.masked_fill(~kreal.view(b, h, nb - 2, 1, K * bs), torch.finfo(scores.dtype).min)
        mid = (scores.softmax(-1) @ vb).flatten(2, 3)
        return torch.cat([gout[:, :, :bs], mid, gout[:, :, bs:]], dim=2)[:, :, :n]
