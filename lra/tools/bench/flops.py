"""FLOPs of a call, and which SDPA kernel ran: ``FlopCounterMode`` with formulas for the CPU fused
SDPA kernels that torch does not price (:data:`EXTRA_FLOP_FORMULAS`), and :class:`OpNames`."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode


def _sdpa_fwd_flops(b: int, h: int, nq: int, nk: int, dqk: int, dv: int) -> int:
    # S = Q Kᵀ (2·nq·nk·dqk) and O = P V (2·nq·nk·dv); softmax and scaling are not matmuls.
    return b * h * (2 * nq * nk * dqk + 2 * nq * nk * dv)


def _sdpa_bwd_flops(b: int, h: int, nq: int, nk: int, dqk: int, dv: int) -> int:
    # Recompute S (qk), dV = Pᵀ dO (v), dP = dO Vᵀ (v), dQ = dS K (qk), dK = dSᵀ Q (qk): 2.5× fwd at dqk = dv.
    return b * h * (2 * nq * nk * dqk * 3 + 2 * nq * nk * dv * 2)


def cpu_sdpa_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``aten._scaled_dot_product_flash_attention_for_cpu`` (shapes (b, h, n, d)).

    4·n²·d per head per sample at d_qk = d_v, the FlashAttention convention; causal is not
    discounted (as in torch's own SDPA formulas).
    """
    b, h, nq, dqk = query
    nk, dv = key[-2], value[-1]
    return _sdpa_fwd_flops(b, h, nq, nk, dqk, dv)


def cpu_sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``aten._scaled_dot_product_flash_attention_for_cpu_backward`` (2.5× forward)."""
    b, h, nq, dqk = query
    nk, dv = key[-2], value[-1]
    return _sdpa_bwd_flops(b, h, nq, nk, dqk, dv)


aten = torch.ops.aten
EXTRA_FLOP_FORMULAS: dict = {}
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
    EXTRA_FLOP_FORMULAS[aten._scaled_dot_product_flash_attention_for_cpu] = cpu_sdpa_flops
    EXTRA_FLOP_FORMULAS[aten._scaled_dot_product_flash_attention_for_cpu_backward] = cpu_sdpa_backward_flops


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` that also prices the CPU fused SDPA kernels (torch counts them as 0)."""
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)


class OpNames(TorchDispatchMode):
    """Records which SDPA kernels ran (SDPA falls back silently between kernels)."""

    def __init__(self):
        super().__init__()
        self.sdpa: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if "scaled_dot_product" in name or "attention_forward" in name or "attention_backward" in name:
            self.sdpa.add(name)
        return func(*args, **(kwargs or {}))
