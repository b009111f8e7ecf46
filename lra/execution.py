"""How a run executes the function its configuration defines (docs/protocol.md, "Execution: paper or fast"):
``paper``, the preset's memory plan (the hardware= fit, materialised softmax recomputed in backward), or ``fast``,
the same function run fastest. :mod:`lra.config` resolves a fast run under both (``spec`` below is its RunSpec:
not imported, it imports this), so that an unfinished paper run asked to run fast continues as paper."""

from __future__ import annotations

import dataclasses
import os

from omegaconf import DictConfig, OmegaConf

import attention
from lra import CONF_DIR
from lra.devices import MEMORY_LIMIT_ENV

EXECUTIONS = ("paper", "fast")


def micro_batch_semantics(spec) -> str | None:
    """Why the micro-batch is part of what ``spec`` computes, so that execution=fast must keep the paper's;
    None where it is not (a sample's result does not depend on the other samples of its micro-batch)."""
    attn = spec.attn
    if attention.capabilities(attn.name).randomized and attn.options.get("redraw") != "fixed":
        return "it draws from torch's RNG at every call, so each micro-batch draws its own"
    code = [f"{k.removeprefix('attn.options.')}={v}" for k, v in spec.quirks.items() if k.startswith("attn.options.")]
    if code:  # all of them, not only the known batch-coupled ones (docs/fidelity.md M7): a new quirk stays safe
        return f"the public code's options {', '.join(code)} may couple the samples of a micro-batch"
    return None


def fast_profile(cfg: DictConfig) -> DictConfig:
    """The memory profile execution=fast fits to: the card it runs on (conf/hardware/auto.yaml; none on a CPU),
    or on a GPU a sweep shares (LRA_MEMORY_LIMIT_GIB) the profile the sweep gave; a forced micro-batch stays."""
    if os.environ.get(MEMORY_LIMIT_ENV):
        return cfg.hardware
    node = OmegaConf.load(CONF_DIR / "hardware" / "auto.yaml")
    node.micro_batch = cfg.hardware.get("micro_batch")
    return node


def fast(spec, hardware):
    """``spec`` (the paper execution) as execution=fast runs it on ``hardware`` (:func:`fast_profile`'s): softmax
    fused where the preset's tables chose materialized (one function: attention/softmax.py), nothing recomputed in
    backward; ``train.chunks`` still caps the micro-batch (lra.fit.plan). Where the micro-batch is part of the
    function (:func:`micro_batch_semantics`): the paper execution, with a note saying why."""
    why = micro_batch_semantics(spec)
    if why:
        return dataclasses.replace(spec, execution_note=f"execution=fast runs {spec.attn.label} as paper: {why}")
    options = dict(spec.attn.options)
    if spec.attn.name == "softmax" and spec.attn.preset_options.get("impl") == "materialized":
        options["impl"] = "fused"  # the command line's impl= is the user's and stays
    attn = dataclasses.replace(spec.attn, options=options, checkpointing=False)
    model = dataclasses.replace(spec.model, attn=attn)
    return dataclasses.replace(spec, model=model, hardware=hardware, execution="fast")


def as_execution(spec, execution: str, note: str | None = None):
    """``spec`` under ``execution``: its hardware, model and execution from ``spec.other`` (a fast run's paper
    execution, resolved with it; ``spec`` itself where there is none); folder, data and configuration stay."""
    if execution == spec.execution or spec.other is None:
        return spec
    o, back = spec.other, dataclasses.replace(spec, other=None)
    return dataclasses.replace(
        spec, hardware=o.hardware, model=o.model, execution=o.execution, execution_note=note, other=back
    )
