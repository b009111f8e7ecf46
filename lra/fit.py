"""Where the gradient accumulation is decided: the largest micro-batch that fits the GPU's memory.

``plan(cfg)`` returns ``Plan(micro_batch, accum_steps, effective_batch, ...)`` with
``effective_batch = micro_batch x accum_steps x devices`` equal to the preset's ``train.batch_size``
for any number of devices. How the micro-batch is chosen:

1. ``hardware.micro_batch`` set: that value (must divide the per-device batch).
2. A profile without a memory budget (``hardware=cpu``, or ``auto`` on a machine without CUDA): the
   whole per-device batch is one micro-batch.
3. Otherwise the peak training memory of one micro-batch is ESTIMATED ON THE CPU, without a GPU and
   without allocating: the real model with the real attention backend, its parameters turned into
   fake tensors (``FakeTensorMode``), runs one AdamW step on zero gradients (so the optimizer states
   exist, as from the second iteration on) and then a full training iteration (forward, backward,
   AdamW step) inside ``torch.distributed._tools.mem_tracker.MemTracker``, which rounds every
   tensor to the CUDA caching allocator's 512-byte blocks. The peak it reports is what
   ``torch.cuda.max_memory_allocated`` measures for the same iteration (LRA_FACTS §7). A micro-batch
   fits when ``peak x (1 + allocator_margin) + cuda_context <= total`` (see ``budget_bytes``).
   Candidates are the divisors of the per-device batch; the search tries the whole batch first,
   then micro-batch 1, then interpolates (peak memory is affine in the batch) and verifies the
   largest divisor on the line below the budget, so a decision costs 1-4 estimates. Decisions are cached as JSON under ``fit.cache_dir``, keyed by
   everything that changes the memory (model, attention options, sequence length, precision,
   per-device batch, budget, torch version, estimator version).

What the CPU estimate models of a CUDA run (docs/protocol.md has the numbers):
* Fused softmax (``attn.options.impl=fused``): on CUDA, ``scaled_dot_product_attention`` with a
  padding mask and dropout runs the memory-efficient kernel, which keeps O(n) per head (output and
  log-sum-exp) instead of the n x n matrix. The CPU kernel differs (with dropout it falls back to
  the materialising math path), so during the estimate SDPA is routed to
  ``aten._scaled_dot_product_efficient_attention``, whose fake-tensor implementation allocates
  exactly the CUDA kernel's outputs (the boolean mask becomes an additive bias of the mask's shape,
  as on CUDA). Its small backward scratch (one float per query row) is not counted.
* Mixed precision (``16-mixed``, the default on a GPU, as in the papers): the estimate runs under
  CPU autocast in bfloat16, which has the size of float16; the attention kernel itself is fp32.
* ``attn_checkpointing``: the papers' softmax baseline recomputes attention in backward
  (``torch.utils.checkpoint``); :func:`checkpoint_attention` wraps the backend the same way for the
  estimate and for training.
* Not modelled (covered by the margins): the CUDA context and library handles (outside the
  caching allocator, ``cuda_context_gib``), fragmentation of the caching allocator and cuBLAS /
  cuDNN workspaces (``allocator_margin``), evaluation (no gradients; lower than training).

``python -m lra.fit task=<t> attn=<a> hardware=<h> [overrides]`` (``make fit``) prints a decision;
``python -m lra.fit --table [hardware=...] [experiment=...]`` prints the decisions for every task x
attention config (the shape of Skeinformer Table 4: micro-batch and accumulation).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

log = logging.getLogger("lra.fit")

ESTIMATOR_VERSION = 1  # bump when the estimate changes, so cached decisions are recomputed
GIB = 2 ** 30


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
        s = (f"effective batch {self.effective_batch} = micro-batch {self.micro_batch} x accumulation "
             f"{self.accum_steps}" + (f" x {self.devices} devices" if self.devices > 1 else "") + f" ({self.source})")
        if self.estimate_bytes is not None:
            s += f"; estimated peak {self.estimate_bytes / GIB:.2f} GiB"
        if self.budget_bytes is not None:
            s += f" of a {self.budget_bytes / GIB:.2f} GiB budget"
        return s


# ---------------------------------------------------------------------------------------------
# Hardware budgets


def device_count(cfg) -> int:
    """Devices the effective batch is split over (``trainer.devices``: int, list or "auto")."""
    d = cfg.trainer.get("devices", 1)
    if isinstance(d, str):
        if d.isdigit():
            return max(1, int(d))
        if d == "auto":
            return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
        return max(1, len([x for x in d.split(",") if x.strip()]))
    if isinstance(d, int):
        return max(1, d) if d != -1 else max(1, torch.cuda.device_count())
    return max(1, len(list(d)))


def total_bytes(hw) -> int | None:
    """Device memory of the profile; ``auto`` reads the CUDA device present (None without one)."""
    if hw.get("total_gib") is not None:
        return int(float(hw.total_gib) * GIB)
    if hw.get("name") == "auto" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


def budget_bytes(hw) -> int | None:
    """Largest estimated peak that fits: (total - CUDA context) / (1 + allocator margin)."""
    total = total_bytes(hw)
    if total is None:
        return None
    context = float(hw.get("cuda_context_gib") or 0.0) * GIB
    return int((total - context) / (1.0 + float(hw.get("allocator_margin") or 0.0)))


def estimate_precision(cfg) -> str:
    """The precision the fitted run trains in: ``trainer.precision``, where ``auto`` means 16-mixed on a GPU."""
    p = str(cfg.trainer.get("precision", "auto"))
    if p != "auto":
        return p
    return "16-mixed" if total_bytes(cfg.hardware) is not None else "32-true"


# ---------------------------------------------------------------------------------------------
# Gradient checkpointing of the attention call (the papers' softmax baseline)


class CheckpointedAttention(nn.Module):
    """Recomputes the wrapped attention in backward (``torch.utils.checkpoint``, RNG state preserved,
    so dropout draws the same mask twice and results equal the unwrapped module's)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, q, k, v, mask=None):
        if self.training and torch.is_grad_enabled():
            return checkpoint(self.inner, q, k, v, mask, use_reentrant=False)
        return self.inner(q, k, v, mask)


def checkpoint_attention(model: nn.Module) -> nn.Module:
    """Wrap every attention backend of an ``LRAClassifier`` in :class:`CheckpointedAttention`."""
    from lra.model import MultiHeadAttention

    for m in model.modules():
        if isinstance(m, MultiHeadAttention) and not isinstance(m.attn, CheckpointedAttention):
            m.attn = CheckpointedAttention(m.attn)
    return model


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
        query, key, value, bias, need_lse, dropout_p, is_causal, scale=scale)[0]


@contextlib.contextmanager
def _sdpa_as_cuda():
    F = torch.nn.functional
    orig = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _cuda_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig


def _to_fake(model: nn.Module, mode) -> nn.Module:
    """Swap every parameter and buffer for a fake tensor of the same shape (one-element buffers keep
    their value, so code that reads a seed or a counter with ``int()`` still works)."""
    conv = mode.fake_tensor_converter
    for m in model.modules():
        for k, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[k] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for k, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[k] = conv.from_real_tensor(mode, b, make_constant=b.numel() <= 1)
    return model


def _autocast(precision: str):
    if precision in ("16-mixed", "bf16-mixed", "16", "bf16"):
        # CPU autocast runs bf16; the size equals CUDA's fp16. The attention kernel stays fp32 (model.py).
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision not in ("32-true", "32", "64-true"):
        raise ValueError(f"cannot estimate memory for precision {precision!r}")
    return contextlib.nullcontext()


def train_step_peak(model_kwargs: dict, micro_batch: int, *, precision: str = "32-true",
                    attn_checkpointing: bool = False, fake: bool = True, cuda_sdpa: bool = True,
                    lr: float = 1e-4, eps: float = 1e-6, weight_decay: float = 0.0) -> int:
    """Peak tensor bytes of one training iteration (optimizer states present) at ``micro_batch``.

    ``fake=False`` runs the same iteration on real CPU tensors (for checking the fake estimate);
    ``cuda_sdpa`` routes fused SDPA to the CUDA memory-efficient kernel (fake tensors only).
    The global RNG is left untouched, so estimating never changes a run's initialisation.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from lra.model import LRAClassifier, loss_and_correct

    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    n, vocab, classes = int(model_kwargs["seq_len"]), int(model_kwargs["vocab_size"]), int(model_kwargs["num_classes"])
    shape = (micro_batch, 2, n) if model_kwargs.get("dual") else (micro_batch, n)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LRAClassifier(**model_kwargs)  # real and small (parameters only); made fake below
        if attn_checkpointing:
            checkpoint_attention(model)
        model.train()
        mode = FakeTensorMode() if fake else None
        if fake:
            _to_fake(model, mode)
        sdpa = _sdpa_as_cuda() if (fake and cuda_sdpa) else contextlib.nullcontext()
        with (mode or contextlib.nullcontext()), sdpa:
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=weight_decay, foreach=True)  # CUDA's default
            tokens = torch.randint(1, vocab, shape)
            mask = torch.ones(shape, dtype=torch.bool)
            labels = torch.randint(0, classes, (micro_batch,))
            tracker = MemTracker()
            tracker.track_external(model, opt, tokens, mask, labels)
            with tracker:
                for p in params:  # first step on zero gradients: creates the AdamW states
                    p.grad = torch.zeros_like(p)
                opt.step()
                opt.zero_grad(set_to_none=True)
                tracker.reset_mod_stats()
                with _autocast(precision):
                    loss, _ = loss_and_correct(model(tokens, mask), labels)
                loss.backward()
                opt.step()
            snap = tracker.get_tracker_snapshot("peak")
    return int(max(d["Total"] for d in snap.values()))


# ---------------------------------------------------------------------------------------------
# The decision


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cache_key(mk: dict, per_device: int, precision: str, ckpt: bool, budget: int) -> str:
    key = {"model": mk, "per_device_batch": per_device, "precision": precision, "attn_checkpointing": ckpt,
           "budget_bytes": budget, "torch": torch.__version__.split("+")[0], "estimator": ESTIMATOR_VERSION}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _fit_inputs(cfg) -> tuple[dict, bool]:
    from lra.train import finalize, model_kwargs, uses_attn_checkpointing

    cfg = finalize(cfg)
    return model_kwargs(cfg), uses_attn_checkpointing(cfg)


def plan(cfg, *, use_cache: bool | None = None) -> Plan:
    """Decide micro-batch and accumulation for ``cfg`` (see the module docstring)."""
    eff = int(cfg.train.batch_size)
    dev = device_count(cfg)
    if eff % dev:
        raise ValueError(f"train.batch_size={eff} is not divisible by trainer.devices={dev}")
    per_dev = eff // dev
    hw = cfg.hardware
    forced = hw.get("micro_batch")
    if forced:
        micro = int(forced)
        if per_dev % micro:
            raise ValueError(f"hardware.micro_batch={micro} must divide the per-device batch {per_dev} "
                             f"(train.batch_size={eff} over {dev} devices)")
        return Plan(micro, per_dev // micro, eff, "hardware.micro_batch", devices=dev)
    budget = budget_bytes(hw)
    if budget is None:
        return Plan(per_dev, 1, eff, f"no memory budget (hardware={hw.name})", devices=dev)

    mk, ckpt = _fit_inputs(cfg)
    precision = estimate_precision(cfg)
    fit_cfg = cfg.get("fit") or {}
    use_cache = bool(fit_cfg.get("cache", True)) if use_cache is None else use_cache
    cache_file = None
    if use_cache and fit_cfg.get("cache_dir"):
        cache_file = Path(str(fit_cfg.cache_dir)) / f"{_cache_key(mk, per_dev, precision, ckpt, budget)}.json"
        if cache_file.exists():
            try:
                d = json.loads(cache_file.read_text())
                d["estimates"] = dict(sorted((int(k), v) for k, v in d.get("estimates", {}).items()))
                p = Plan(**{**d, "cached": True, "seconds": 0.0, "devices": dev, "effective_batch": eff})
                if p.micro_batch * p.accum_steps == per_dev:
                    return p
            except (ValueError, TypeError, KeyError):
                log.warning("ignoring unreadable fit cache %s", cache_file)

    t0 = time.perf_counter()
    est: dict[int, int] = {}

    def fits(m: int) -> bool:
        if m not in est:
            est[m] = train_step_peak(mk, m, precision=precision, attn_checkpointing=ckpt,
                                     lr=float(cfg.train.lr), eps=float(cfg.train.eps))
        return est[m] <= budget

    cands = _divisors(per_dev)
    where = f"{cfg.task.name}/{cfg.attn.get('label', cfg.attn.name)} at n={mk['seq_len']} on {hw.name}"
    try:
        whole = fits(per_dev)
    except Exception as e:  # noqa: BLE001 - an op the fake tensors cannot trace must not block training
        log.warning("%s: the memory estimate failed (%s: %s); training without accumulation", where,
                    type(e).__name__, str(e).splitlines()[0][:200])
        return Plan(per_dev, 1, eff, f"no estimate ({type(e).__name__}): no accumulation", budget_bytes=budget,
                    devices=dev, seconds=round(time.perf_counter() - t0, 3))
    if whole:
        micro = per_dev
    elif not fits(1):
        raise FitError(
            f"{where}: micro-batch 1 does not fit. Estimated peak training memory "
            f"{est[1] / GIB:.2f} GiB > budget {budget / GIB:.2f} GiB (total {total_bytes(hw) / GIB:.2f} GiB minus "
            f"{float(hw.get('cuda_context_gib') or 0):.2f} GiB CUDA context, over a "
            f"{float(hw.get('allocator_margin') or 0):.0%} allocator margin). Use a device with more memory "
            f"(hardware=a100_40gb|h100_80gb), a shorter task.seq_len, or a cheaper attention.")
    else:
        slope = (est[per_dev] - est[1]) / (per_dev - 1)
        guess = max([m for m in cands if est[1] + slope * (m - 1) <= budget], default=1)
        i = cands.index(guess)
        while not fits(cands[i]):  # verify; walk down where the line was optimistic (1 fits)
            i -= 1
        micro = cands[i]
    seconds = time.perf_counter() - t0
    p = Plan(micro, per_dev // micro, eff, "memory fit", estimate_bytes=est[micro], budget_bytes=budget,
             devices=dev, estimates=dict(sorted(est.items())), seconds=round(seconds, 3))
    log.info("%s: %s (%d estimates, %.1f s)", where, p.describe(), len(est), seconds)
    if cache_file is not None:
        from lra.record import write_json_atomic

        d = {k: v for k, v in asdict(p).items() if k not in ("cached", "seconds")}
        d["source"] = "memory fit (cached)"
        try:
            write_json_atomic(cache_file, d)
        except OSError as e:
            log.warning("could not write the fit cache %s: %s", cache_file, e)
    return p


# ---------------------------------------------------------------------------------------------
# Command line: one decision, or the Table-4-shaped table

TABLE_TASKS = ("text", "listops", "retrieval", "pathfinder", "image")  # the papers' column order


def _compose(overrides: list[str]):
    from lra.config import compose
    from lra.train import finalize

    return finalize(compose(overrides), overrides)


def _attn_configs() -> list[str]:
    from lra import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "attn").glob("*.yaml"))


def decision_table(overrides: list[str], tasks=TABLE_TASKS, attns=None, progress=True) -> list[dict]:
    """One row per (attention config, task): micro-batch, accumulation, estimate, or why it was skipped."""
    rows = []
    attns = list(attns or _attn_configs())
    extra = [("softmax_fused", ["attn=softmax", "attn.options.impl=fused"])]
    for label, ov in [(a, [f"attn={a}"]) for a in attns] + extra:
        for task in tasks:
            row = {"attn": label, "task": task}
            try:
                cfg = _compose([f"task={task}", *ov, *overrides])
                p = plan(cfg)
                row.update(micro_batch=p.micro_batch, accum_steps=p.accum_steps, effective_batch=p.effective_batch,
                           estimate_gib=None if p.estimate_bytes is None else round(p.estimate_bytes / GIB, 3),
                           seconds=p.seconds, cached=p.cached, impl=cfg.attn.options.get("impl"))
            except FitError as e:
                row.update(error="micro-batch 1 does not fit", detail=str(e))
            except Exception as e:  # noqa: BLE001 - a missing task config or a backend the estimator cannot trace
                row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            rows.append(row)
            if progress:
                print(f"  {label:28s} {task:10s} {row.get('micro_batch', '-')!s:>5} x {row.get('accum_steps', '-')!s:>3}"
                      f"  {row.get('seconds') or 0:6.1f}s {row.get('error', '')}", file=sys.stderr, flush=True)
    return rows


def format_table(rows: list[dict], tasks=TABLE_TASKS) -> str:
    by = {(r["attn"], r["task"]): r for r in rows}
    attns = list(dict.fromkeys(r["attn"] for r in rows))
    out = ["| attention | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for a in attns:
        cells = []
        for t in tasks:
            r = by.get((a, t), {})
            if "micro_batch" in r:
                cells.append(f"{r['micro_batch']} (x{r['accum_steps']})")
            else:
                cells.append("OOM at 1" if r.get("error", "").startswith("micro-batch 1") else "n/a")
        out.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    table = "--table" in args
    out = None
    if "--out" in args:
        i = args.index("--out")
        out = Path(args[i + 1])
        del args[i:i + 2]
    args = [a for a in args if a != "--table"]
    if table:
        if not any(a.startswith("hardware=") for a in args):
            args.append("hardware=v100_16gb")
        tasks = TABLE_TASKS
        for a in list(args):
            if a.startswith("task="):
                tasks = tuple(a.split("=", 1)[1].split(","))
                args.remove(a)
        attns = None
        for a in list(args):
            if a.startswith("attn="):
                attns = a.split("=", 1)[1].split(",")
                args.remove(a)
        t0 = time.perf_counter()
        rows = decision_table(args, tasks=tasks, attns=attns)
        text = format_table(rows, tasks)
        print(text)
        print(f"\n{len(rows)} decisions in {time.perf_counter() - t0:.0f} s "
              f"({', '.join(args)}; cell = micro-batch (x accumulation))")
        if out:
            from lra.record import write_json_atomic

            write_json_atomic(out.with_suffix(".json"), rows)
            out.with_suffix(".md").write_text(text + "\n")
        return 0
    cfg = _compose(args)
    try:
        p = plan(cfg)
    except FitError as e:
        print(f"does not fit: {e}")
        return 3
    print(f"{cfg.task.name}/{cfg.attn.label} (n={cfg.task.seq_len}, options {dict(cfg.attn.options)}), "
          f"hardware={cfg.hardware.name}, precision {estimate_precision(cfg)}: {p.describe()}")
    if p.estimates:
        print("estimates (micro-batch: GiB): " + ", ".join(f"{m}: {b / GIB:.2f}" for m, b in p.estimates.items())
              + (" [cached]" if p.cached else f" [{p.seconds:.1f} s]"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
