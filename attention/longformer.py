"""Longformer attention (Beltagy et al., 2020): sliding window plus global tokens.

Token i attends to the keys j with |i − j| ≤ w/2 (``window`` = w, even, as Longformer's
``attention_window``; default 256, i.e. 257 keys, the "Longformer-257" of the Nyströmformer
benchmark) and to the global tokens; global tokens attend to every key. Here the global tokens are
the first ``num_global`` positions (default 1: the first token, as YOSO's LRA wrapper with
``first_token_view``). Scores are softmax(q·k/√d) over that set of real keys (one softmax over
local and global keys together).

Implementation, pure torch, memory linear in n: the sequence is padded internally to a multiple of
c = w/2 and cut into chunks of c queries; chunk i gathers key chunks i−1, i, i+1 (3c keys) plus the
global keys, masks what lies outside the band, is padding or is a global key (counted once, in the
global part), and runs one softmax. Global query rows are computed separately against all keys.
O(n·(3w/2 + g)·d) time and O(n·(3w/2 + g)) memory; the n×n mask is never built.
(FlexAttention would express this pattern directly, but on this CPU build it has no backward and its
eager path materialises n×n scores, so it is not used.)

Deviations: no separate projections for global attention (Longformer trains distinct Q_g, K_g, V_g;
here the model's Q, K, V serve both, as in the LRA wrappers that tie them); no dilation; no
attention dropout. Global tokens are positions, so a padded position among the first ``num_global``
is simply a padded key (never attended). A sample without real tokens is treated as all real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention.registry import AttentionBackend, Capabilities, InvalidOption, check_range, full_mask, register
from attention.softmax import key_mask


@dataclass(frozen=True)
class LongformerOptions:
    window: int = 256  # total window w: each token sees w/2 keys on each side and itself
    num_global: int = 1  # the first num_global positions are global tokens

    def __post_init__(self):
        check_range("window", self.window, 2, None, integer=True)
        if self.window % 2:
            raise InvalidOption(f"option 'window'={self.window!r} must be even (w/2 keys on each side)")
        check_range("num_global", self.num_global, 0, None, integer=True)


def longformer_pattern(n: int, window: int, num_global: int) -> torch.Tensor:
    """The dense (n, n) bool pattern, True where query i may attend to key j (for tests and plots)."""
    i = torch.arange(n)
    band = (i[:, None] - i[None, :]).abs() <= window // 2
    glob = i < num_global
    return band | glob[:, None] | glob[None, :]


@register("longformer")
class LongformerAttention(AttentionBackend):
    """Longformer: sliding window (w/2 each side) plus global first tokens."""

    Options = LongformerOptions
    capabilities = Capabilities(
        padding_mask=True,
        exact=False,
        complexity="O(n)",
        target="softmax",
        notes="exact softmax restricted to the band+global pattern; any n, padding anywhere",
    )

    def pattern(self, n: int) -> torch.Tensor:
        return longformer_pattern(n, self.options.window, self.options.num_global)

    def forward(self, q, k, v, mask=None):
        o = self.options
        b, h, n, d = q.shape
        keep = key_mask(full_mask(q, mask))
        half = o.window // 2
        g = min(o.num_global, n)
        c = min(half, n)  # chunk length
        nc = math.ceil(n / c)
        pad = nc * c - n
        scale = 1.0 / math.sqrt(d)

        # local part: chunk i sees key chunks i-1, i, i+1 (zero chunks beyond the ends)
        qc = F.pad(q, (0, 0, 0, pad)).view(b, h, nc, c, d)
        kp = F.pad(k, (0, 0, c, pad + c)).view(b, h, nc + 2, c, d)
        vp = F.pad(v, (0, 0, c, pad + c)).view(b, h, nc + 2, c, d)
        kk = torch.cat([kp[:, :, :-2], kp[:, :, 1:-1], kp[:, :, 2:]], dim=3)  # (b,h,nc,3c,d)
        vv = torch.cat([vp[:, :, :-2], vp[:, :, 1:-1], vp[:, :, 2:]], dim=3)
        kpos = torch.arange(-c, (nc + 1) * c, device=q.device).view(nc + 2, c)
        kpos = torch.cat([kpos[:-2], kpos[1:-1], kpos[2:]], dim=1)  # (nc,3c)
        qpos = torch.arange(nc * c, device=q.device).view(nc, c)
        inside = (kpos >= g) & (kpos < n)  # global keys are scored once, in the global part
        band = ((qpos[:, :, None] - kpos[:, None, :]).abs() <= half) & inside[:, None, :]  # (nc,c,3c)
        kreal = F.pad(keep, (c, pad + c)).view(b, nc + 2, c)
        kreal = torch.cat([kreal[:, :-2], kreal[:, 1:-1], kreal[:, 2:]], dim=2)  # (b,nc,3c)
        allowed = band[None] & kreal[:, :, None, :]  # (b,nc,c,3c)
        scores = (qc @ kk.transpose(-1, -2)) * scale  # (b,h,nc,c,3c)
        scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
        if g:  # every query also sees the global keys
            gscores = (qc @ k[:, :, :g].transpose(-1, -2).unsqueeze(2)) * scale  # (b,h,nc,c,g)
            gscores = gscores.masked_fill(~keep[:, None, None, None, :g], torch.finfo(gscores.dtype).min)
            scores = torch.cat([gscores, scores], dim=-1)
            vv = torch.cat([v[:, :, None, :g].expand(b, h, nc, g, d), vv], dim=3)
        out = (scores.softmax(-1) @ vv).reshape(b, h, nc * c, d)[:, :, :n]
        if g:  # global queries see every real key
            gs = (q[:, :, :g] @ k.transpose(-1, -2)) * scale
            gout = gs.masked_fill(~keep[:, None, None, :], torch.finfo(gs.dtype).min).softmax(-1) @ v
            out = torch.cat([gout, out[:, :, g:]], dim=2)
        return out
