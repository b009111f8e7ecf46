"""Where the gradient accumulation is decided: micro-batch and accumulation steps for a run.

``plan(cfg)`` returns the micro-batch and ``accum_steps = effective_batch / micro_batch``. With
``hardware.micro_batch`` set, that value is used; otherwise the whole effective batch is one
micro-batch (accumulation 1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    micro_batch: int
    accum_steps: int
    effective_batch: int
    source: str  # how it was decided
    estimate_bytes: int | None = None


def plan(cfg) -> Plan:
    eff = int(cfg.train.batch_size)
    forced = cfg.hardware.get("micro_batch")
    if forced:
        micro = int(forced)
        if eff % micro:
            raise ValueError(f"hardware.micro_batch={micro} must divide train.batch_size={eff}")
        return Plan(micro, eff // micro, eff, "hardware.micro_batch")
    return Plan(eff, 1, eff, "no accumulation")
