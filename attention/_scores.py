"""Score matrices and their masks, the way every backend here builds them.

Why not ``(q @ kᵀ * scale).masked_fill(~keep, -inf)``: on a CPU an out-of-place ``masked_fill`` with a
broadcast mask copies the whole n × m score matrix in the forward pass and once more in the backward pass
(its gradient is another masked fill), and the scaling is a third pass. Measured on one layer (batch 2, 2
heads, n = 2048, head dim 32, one thread, forward + backward) that pattern made materialised softmax 1.13x
the papers' own code; a 0/−inf bias added inside the GEMM (``baddbmm``) is 0.73x (docs/bench.md, "Against
the papers' code"). The outputs are the same: s + 0 = s exactly, and s + (−inf) = −inf for any finite s,
so the softmax of the kept entries and the zeros of the dropped ones do not change; the gradient reaching a
dropped entry is zero either way (its probability is 0).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def key_bias(keep: torch.Tensor, dtype: torch.dtype, fill: float = NEG_INF) -> torch.Tensor:
    """``keep`` (bool, any shape) as an additive bias: 0 where True, ``fill`` where False, in ``dtype``.

    Keep it small (broadcast dims of size 1): it is added to every score matrix it broadcasts to."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, fill)


def scores(q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``scale · q kᵀ + bias`` in one batched GEMM: q (..., n, p), k (..., m, p) -> (..., n, m).

    ``bias`` broadcasts to (..., n, m) and carries no gradient (a mask: :func:`key_bias`).

    Example:
        >>> keep = torch.tensor([[True, True, False]])               # (batch, keys)
        >>> q = k = torch.ones(1, 2, 3, 4)                           # (batch, heads, n, head dim)
        >>> scores(q, k, 0.5, key_bias(keep[:, None, None, :], q.dtype))[0, 0, 0]
        tensor([2., 2., -inf])
    """
    *batch, n, _ = q.shape
    return flat_scores(q, k, scale, bias).view(*batch, n, k.shape[-2])


def flat_scores(q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`scores` with the batch dims flattened, (B, n, m): the GEMM's own output, not a view of it, so a
    caller may go on in place (``s.sub_(c).exp_()``) where autograd would copy a view's whole base back."""
    *batch, n, p = q.shape
    m = k.shape[-2]
    qf, kt = q.reshape(-1, n, p), k.reshape(-1, m, p).transpose(1, 2)
    if bias is None:  # beta=0: the input is ignored (the scaling still happens inside the GEMM)
        return torch.baddbmm(qf.new_zeros(1, 1, 1), qf, kt, beta=0.0, alpha=scale)
    rows, cols = bias.shape[-2:]
    bias = bias.expand(*batch, rows, cols).reshape(-1, rows, cols)
    return torch.baddbmm(bias, qf, kt, alpha=scale)
