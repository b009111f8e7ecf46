"""Where the gradient accumulation is decided: the largest micro-batch whose estimated peak training memory
fits the hardware profile.

``plan(spec)`` (a :class:`lra.config.RunSpec`) returns ``Plan(micro_batch, accum_steps, effective_batch, ...)``
with ``effective_batch = micro_batch x accum_steps x devices`` equal to the preset's ``train.batch_size``.
``hardware.micro_batch`` forces the micro-batch, ``train.chunks`` caps it (the public code's chunks under its
quirks), a profile without a memory budget takes the whole batch; otherwise the peak of one training iteration
is estimated on the CPU with fake tensors inside torch's MemTracker, and the search tries 1-4 divisors. What
the estimate models of a CUDA run, the search and the cache: docs/protocol.md, "Memory-fitted accumulation".

``python -m lra.fit task=<t> attn=<a> hardware=<h> [overrides]`` (``make fit``) prints a decision; the
table of every task x attention config (Skeinformer Table 4's shape) is a measurement, ``lra-bench fit``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import attention
from lra.cli import Parser
from lra.compat import fake_copy, fake_tensor_mode, mem_tracker
from lra.config import ConfigError, ModelSpec, RunSpec, load
from lra.devices import GIB
from lra.files import write_json
from lra.model import build_model, loss_and_correct

log = logging.getLogger("lra.fit")

ESTIMATOR_VERSION = 3  # bump when the estimate or its key changes (2: keyed by the typed run spec; 3: _CudaKernels)


class FitError(RuntimeError):
    """The run cannot fit the memory budget (even micro-batch 1), said before training starts."""


@dataclass(frozen=True)
class Plan:
    micro_batch: int
    accum_steps: int
    effective_batch: int
    source: str  # how it was decided
    estimate_bytes: int | None = None  # estimated peak tensor memory of one training step at micro_batch
    budget_bytes: int | None = None  # what an estimate may reach (total minus context, over the margin)
    devices: int = 1
    estimates: dict = field(default_factory=dict)  # micro-batch -> estimated peak bytes, for every one tried
    seconds: float | None = None  # time spent estimating (0 on a cache hit)
    cached: bool = False

    def describe(self) -> str:
        s = (
            f"effective batch {self.effective_batch} = micro-batch {self.micro_batch} x accumulation "
            f"{self.accum_steps}" + (f" x {self.devices} devices" if self.devices > 1 else "") + f" ({self.source})"
        )
        if self.estimate_bytes is not None:
            s += f"; estimated peak {self.estimate_bytes / GIB:.2f} GiB"
        if self.budget_bytes is not None:
            s += f" of a {self.budget_bytes / GIB:.2f} GiB budget"
        return s


# ---------------------------------------------------------------------------------------------
# The estimate


def _cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """What CUDA's SDPA allocates for a masked call: the memory-efficient kernel (O(n) per head)."""
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:  # as aten: where(~mask, -inf, 0) in the query dtype, mask-shaped
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
        else:
            bias = attn_mask
        n = key.shape[-2]
        if n % 16:  # the kernel needs the last dimension aligned: aten pads the bias and slices it back
            bias = torch.nn.functional.pad(bias, (0, 16 - n % 16))[..., :n]
        bias = bias.expand(*query.shape[:-1], n)
    need_lse = query.requires_grad or key.requires_grad or value.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, need_lse, dropout_p, is_causal, scale=scale
    )[0]


@contextlib.contextmanager
def _sdpa_as_cuda():
    F = torch.nn.functional
    orig = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _cuda_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig


class _CudaKernels(TorchDispatchMode):
    """What a CUDA kernel allocates beside its output where the CPU's does not, which no fake tensor sees:
    softmax's backward writes ``grad * output`` to an input-sized temporary first (aten/src/ATen/native/cuda/
    SoftMax.cu, ``softmax_backward_cuda_out``), one more n x n matrix at the peak of a materialised softmax."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        temp = args[0] * args[1] if func is torch.ops.aten._softmax_backward_data.default else None
        out = func(*args, **(kwargs or {}))
        del temp  # held until the output exists, as the kernel holds it
        return out


def _to_fake(model: nn.Module, mode) -> nn.Module:
    """Swap every parameter and buffer for a fake tensor of the same shape (one-element buffers keep
    their value, so code that reads a seed or a counter with ``int()`` still works)."""
    for m in model.modules():
        for k, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[k] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for k, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[k] = fake_copy(mode, b, constant=b.numel() <= 1)
    return model


def autocast(precision: str, device: str = "cpu"):
    """The run's autocast for ``precision`` on ``device`` (the estimate's and the tools' one): 16-mixed is fp16 on
    CUDA and bf16 on a CPU (same size; the CPU estimate runs there), the attention kernel stays fp32 (model.py)."""
    kind = torch.device(device).type
    if precision in ("16-mixed", "16", "bf16-mixed", "bf16"):
        half = precision.startswith("16") and kind == "cuda"
        return torch.autocast(kind, dtype=torch.float16 if half else torch.bfloat16)
    if precision not in ("32-true", "32", "64-true"):
        raise ValueError(f"no autocast for precision {precision!r}")
    return contextlib.nullcontext()


def train_step_peak(
    model: ModelSpec,
    micro_batch: int,
    *,
    precision: str = "32-true",
    fake: bool = True,
    cuda_kernels: bool = True,
    lr: float = 1e-4,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    swap: Callable[[nn.Module], object] | None = None,
) -> int:
    """Peak tensor bytes of one training iteration (optimizer states present) at ``micro_batch``.

    ``fake=False`` runs the same iteration on real CPU tensors (for checking the fake estimate);
    ``cuda_kernels`` estimates CUDA's kernels (fake tensors only): fused SDPA routed to the memory-efficient
    kernel, and the softmax backward's temporary (:class:`_CudaKernels`); ``swap``
    changes the built model in place first (e.g. another code's attention block in place of ours).
    The global RNG is left untouched, so estimating never changes a run's initialisation.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    spec = model
    n, vocab, classes = spec.seq_len, spec.vocab_size, spec.num_classes
    shape = (micro_batch, 2, n) if spec.dual else (micro_batch, n)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(spec)  # real and small (parameters only); made fake below
        if swap is not None:
            swap(model)
        model.train()
        mode = fake_tensor_mode() if fake else None
        if fake:
            _to_fake(model, mode)
        cuda = fake and cuda_kernels
        sdpa = _sdpa_as_cuda() if cuda else contextlib.nullcontext()
        with mode or contextlib.nullcontext(), sdpa:
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=weight_decay, foreach=True)  # CUDA's default
            tokens = torch.randint(1, vocab, shape)
            mask = torch.ones(shape, dtype=torch.bool)
            labels = torch.randint(0, classes, (micro_batch,))
            tracker = mem_tracker()
            tracker.track_external(model, opt, tokens, mask, labels)
            with tracker, _CudaKernels() if cuda else contextlib.nullcontext():
                for p in params:  # first step on zero gradients: creates the AdamW states
                    p.grad = torch.zeros_like(p)
                opt.step()
                opt.zero_grad(set_to_none=True)
                tracker.reset_mod_stats()
                with autocast(precision):
                    loss, _ = loss_and_correct(model(tokens, mask), labels)
                loss.backward()
                opt.step()
            snap = tracker.get_tracker_snapshot("peak")
    return int(max(d["Total"] for d in snap.values()))


# ---------------------------------------------------------------------------------------------
# The decision


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cache_file(spec: RunSpec, per_device: int, precision: str, budget: int, top: int) -> Path | None:
    """Where the decision is cached: keyed by everything that changes the memory of a step (and the
    largest micro-batch allowed, where the public code's chunks cap it)."""
    if spec.fit_cache_dir is None:
        return None
    key = {
        "model": spec.model.kwargs(),
        "checkpointing": spec.attn.checkpointing,
        "per_device_batch": per_device,
        "precision": precision,
        "budget_bytes": budget,
        "torch": torch.__version__.split("+")[0],
        "estimator": ESTIMATOR_VERSION,
        **({"micro_batch_max": top} if top < per_device else {}),
    }
    return (
        spec.fit_cache_dir
        / f"{hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]}.json"
    )


def _cached(path: Path | None, per_device: int, eff: int, devices: int, top: int) -> Plan | None:
    """The cached decision at ``path``; None (estimated again) when there is none, it is for another cap, or the
    file is damaged (one warning: not JSON, not a decision, unreadable, a folder)."""
    if path is None or not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
        d["estimates"] = dict(sorted((int(k), v) for k, v in d.get("estimates", {}).items()))
        p = Plan(**{**d, "cached": True, "seconds": 0.0, "devices": devices, "effective_batch": eff})
        if not all(type(v) is int and v > 0 for v in (p.micro_batch, p.accum_steps)):
            raise ValueError(f"micro_batch {p.micro_batch!r} and accum_steps {p.accum_steps!r}")
        return p if p.micro_batch * p.accum_steps == per_device and p.micro_batch <= top else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("fit cache %s is damaged (%s: %s): estimating again", path, type(e).__name__, e)
        return None


def chunk_cap(spec: RunSpec) -> int:
    """The largest micro-batch ``train.chunks`` allows: the largest divisor of the per-device batch up to
    the public code's chunk ``batch_size / chunks`` (their code ran one GPU); the per-device batch if 1."""
    per_dev, chunk = spec.train.batch_size // spec.hardware.devices, spec.train.batch_size // spec.train.chunks
    return max(d for d in _divisors(per_dev) if d <= chunk)


def plan(spec: RunSpec, *, use_cache: bool = True) -> Plan:
    """Decide micro-batch and accumulation for ``spec`` (see the module docstring)."""
    hw, eff, dev = spec.hardware, spec.train.batch_size, spec.hardware.devices
    per_dev = eff // dev  # RunSpec checked that the devices divide the batch
    if hw.micro_batch:
        return Plan(hw.micro_batch, per_dev // hw.micro_batch, eff, "hardware.micro_batch", devices=dev)
    top = chunk_cap(spec)  # per_dev unless the public code's chunks are smaller
    capped = f" within train.chunks={spec.train.chunks} (micro-batch <= {top})" if top < per_dev else ""
    budget = hw.budget_bytes
    if budget is None:
        return Plan(top, per_dev // top, eff, f"no memory budget (hardware={hw.name}){capped}", devices=dev)
    precision = hw.planned_precision
    cache_file = _cache_file(spec, per_dev, precision, budget, top) if use_cache else None
    cached = _cached(cache_file, per_dev, eff, dev, top)
    if cached is not None:
        return cached

    t0 = time.perf_counter()
    est: dict[int, int] = {}

    def fits(m: int) -> bool:
        if m not in est:
            est[m] = train_step_peak(spec.model, m, precision=precision, lr=spec.train.lr, eps=spec.train.eps)
        return est[m] <= budget

    cands = [d for d in _divisors(per_dev) if d <= top]
    where = f"{spec.where} at n={spec.model.seq_len} on {hw.name}"
    try:
        whole = fits(top)
    except attention.BackendContractError:  # a broken backend: no estimate could make it train
        raise
    except Exception as e:  # an op the fake tensors cannot trace must not block training
        log.warning(
            "%s: the memory estimate failed (%s: %s); training at micro-batch %d",
            where,
            type(e).__name__,
            str(e).splitlines()[0][:200],
            top,
        )
        return Plan(
            top,
            per_dev // top,
            eff,
            f"no estimate ({type(e).__name__}): " + (capped.removeprefix(" within ") if capped else "no accumulation"),
            budget_bytes=budget,
            devices=dev,
            seconds=round(time.perf_counter() - t0, 3),
        )
    if whole:
        micro = top
    elif not fits(1):
        raise FitError(
            f"{where}: micro-batch 1 does not fit. Estimated peak training memory "
            f"{est[1] / GIB:.2f} GiB > budget {budget / GIB:.2f} GiB (total {hw.total_bytes / GIB:.2f} GiB minus "
            f"{hw.cuda_context_gib:.2f} GiB CUDA context, over a {hw.allocator_margin:.0%} allocator margin). "
            "Use a device with more memory (hardware=a100_40gb|h100_80gb), a shorter task.seq_len, "
            "or a cheaper attention."
        )
    else:
        slope = (est[top] - est[1]) / (top - 1)
        guess = max([m for m in cands if est[1] + slope * (m - 1) <= budget], default=1)
        i = cands.index(guess)
        while not fits(cands[i]):  # verify; walk down where the line was optimistic (1 fits)
            i -= 1
        micro = cands[i]
    seconds = time.perf_counter() - t0
    p = Plan(
        micro,
        per_dev // micro,
        eff,
        f"memory fit{capped}",
        estimate_bytes=est[micro],
        budget_bytes=budget,
        devices=dev,
        estimates=dict(sorted(est.items())),
        seconds=round(seconds, 3),
    )
    log.debug("%s: %s (%d estimates, %.1f s)", where, p.describe(), len(est), seconds)  # the run says the plan
    if cache_file is not None:
        d = {k: v for k, v in asdict(p).items() if k not in ("cached", "seconds")}
        d["source"] = f"memory fit (cached){capped}"
        try:
            write_json(cache_file, d)
        except OSError as e:
            log.warning("could not write the fit cache %s: %s", cache_file, e)
    return p


# ---------------------------------------------------------------------------------------------
# Command line: one decision (every task x attention config: ``lra-bench fit``)


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog="python -m lra.fit",
        usage="%(prog)s [hydra overrides ...]   (make fit)",
        description="The micro-batch x accumulation a run would use under its hardware= memory budget; "
        "nothing is trained. Every task x attention config: python -m lra.tools.bench fit.",
        epilog="example:\n  python -m lra.fit task=listops attn=softmax hardware=v100_16gb",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_overrides("Hydra overrides: task=, attn=, hardware=, preset=, attn.options.<name>=<value>, ...")
    args, unknown = p.parse_known_intermixed_args(argv)
    if unknown:  # --table was this command's until the table became a measurement
        p.error(
            "--table is now python -m lra.tools.bench fit"
            if unknown[0] == "--table"
            else f"unknown argument {unknown[0]!r}"
        )
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    try:
        spec = load(list(args.overrides))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        decided = plan(spec)
    except FitError as e:
        print(f"does not fit: {e}")
        return 3
    print(
        f"{spec.where} (n={spec.model.seq_len}, options {spec.attn.options}), hardware={spec.hardware.name}, "
        f"precision {spec.hardware.planned_precision}: {decided.describe()}"
    )
    if decided.estimates:
        print(
            "estimates (micro-batch: GiB): "
            + ", ".join(f"{m}: {b / GIB:.2f}" for m, b in decided.estimates.items())
            + (" [cached]" if decided.cached else f" [{decided.seconds:.1f} s]")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
