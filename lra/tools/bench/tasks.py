"""Task mode: the model's whole training step, and its attention layer alone, at each LRA task's real shape.

``python -m lra.tools.bench --tasks [--hardware v100_16gb] [--backends ...] [--compile] [--quick]`` (the
default of ``make bench`` on CUDA). Why: at the layer mode's batch 2 a GPU is launch-bound and its
crossover table says the opposite of what training shows (docs/facts.md §10); what a run pays is one
optimizer step of the whole model at the micro-batch the memory fit chooses.

For every task and backend the run spec is resolved as ``python -m lra.train`` would
(``lra.config.load``: preset, ``hardware=``, attention options and recomputation), and
``lra.fit.plan`` gives micro-batch x accumulation for ``hardware=``. Then, eager and (on CUDA, or with
``--compile``) ``torch.compile``-d in the default mode:

* ``step``: one optimizer step: ``accum`` micro-batches of forward, loss
  (``lra.model.loss_and_correct``), backward, then the AdamW step, under the precision the run
  would use on this device (16-mixed: fp16 autocast and a GradScaler on CUDA; fp32 on CPU);
* ``attention``: the first block's attention module as the model holds it (recomputed where the
  spec says), forward + backward at the micro-batch, fp32 as in the model; ``per_opt_step_ms`` is it
  times ``accum``, so it compares with the step.

Inputs: random tokens, padded from a seeded per-sample length drawn uniformly in [n/8, n] (a padding
mask with real lengths, as the data gives), a few batches cycled so every micro-batch differs.
Time = median over the timed steps, synchronised on CUDA; the first compiled call (compilation) is
``first_call_s``, not in the median. Peak memory: ``torch.cuda.max_memory_allocated`` over one step
(the step's parameters, AdamW states and inputs included); on CPU the exact live-tensor tracker
(``lra.tools.meter.LiveTensorBytes``) for eager and nothing for compiled (inductor's kernels bypass the
dispatcher); both through the one meter, :func:`lra.tools.meter.measure_peak`. The step and its inputs are
:mod:`lra.tools.meter.step`'s; the timer is :func:`lra.tools.meter.timed`.
On CUDA the peak counted is the rise of ``max_memory_allocated`` over the idle level plus the part's
own state and inputs, so the attention row does not carry the model's parameters. Ratios are to
fused softmax (SDPA, no recomputation) in the same part, mode and task, per optimizer
step: every backend has the preset's effective batch, whatever its micro-batch. The tables, the
Markdown and the run with its files are :mod:`lra.tools.bench.task_report`.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from lra.config import ConfigError, RunSpec, attn_configs, load, resolve_precision
from lra.devices import device_name, is_oom
from lra.fit import FitError, Plan, plan
from lra.model import MultiHeadAttention
from lra.tasks import TASK_NAMES
from lra.tools.bench.flops import OpNames
from lra.tools.bench.rows import BASELINE, MATERIALIZED, MIB
from lra.tools.meter import measure_peak, timed, timing_columns
from lra.tools.meter.step import StepRunner, TrainStep, attention_inputs, make_batches

TASKS = TASK_NAMES  # the task registry's (lra.tasks), in its order
DEFAULT_BACKENDS = (BASELINE, MATERIALIZED, "skeinformer", "nystrom", "performer")  # docs/facts.md §10's set
QUICK_BACKENDS = (BASELINE, "skeinformer")
PARTS = ("step", "attention")
MODES = ("eager", "compiled")

CSV_COLUMNS = tuple(  # the columns in order
    "task backend part mode status reason n dual micro_batch accum_steps fit_micro_batch fit_accum_steps "
    "effective_batch plan_source hardware precision checkpointing options device device_name "
    "torch_version threads time_ms time_ms_min time_ms_max repeats per_opt_step_ms first_call_s "
    "peak_mem_bytes mem_method time_ratio mem_ratio sdpa_ops".split()
)


@dataclass
class TaskConfig:
    tasks: tuple = TASKS
    backends: tuple = DEFAULT_BACKENDS
    hardware: str = "v100_16gb"
    device: str = "cpu"
    compile: bool = False  # torch.compile as well (always on CUDA)
    quick: bool = False  # the quick preset's shapes (preset=quick)
    max_batch: int | None = None  # measure min(fitted micro-batch, this) without accumulation (a smoke run)
    repeats: int = 10
    warmup: int = 1
    threads: int = 1
    seed: int = 0
    overrides: tuple = ()  # extra Hydra overrides for every spec (e.g. preset=..., fit.cache=false)
    parts: tuple = PARTS  # what to time: the whole step, the attention layer alone
    modes: tuple | None = None  # None: eager, and compiled with --compile or on CUDA
    memory: bool = True  # measure the peak (one more step; on a CPU under a dispatch mode, slow)
    cost: str | None = None  # --cost PAPER: rows built as their runs (no fused baseline, no ratios), 2x probe
    budget_s: float | None = None  # --cost: cells not started this many seconds after the first are skipped
    plans: Path | None = None  # --cost --plans: the file micro_batches came from
    micro_batches: dict | None = None  # {(task, backend): micro-batch} forced (hardware.micro_batch): no fit runs


# ----------------------------------------------------------------------------- specs and plans
def backend_overrides(label: str, as_run: bool = False) -> list[str]:
    """The config overrides of a benchmark row. The fused baseline is never recomputed in backward
    (an O(n) kernel gains nothing from it); every other row is built as its run would be. ``as_run``: every
    row as its run (--cost: the paper's Standard is the preset's softmax, materialised and recomputed)."""
    if as_run:
        return [f"attn={label}"]
    if label == BASELINE:
        return ["attn=softmax", "attn.options.impl=fused", "attn_checkpointing=[]"]
    if label == MATERIALIZED:
        return ["attn=softmax", "attn.options.impl=materialized"]
    if ":" in label:  # an external backend, module:Class (README: external attention)
        return ["attn=external", f"attn.target={label}"]
    return [f"attn={label}"]


def valid_backends() -> list[str]:
    return [BASELINE, MATERIALIZED] + [a for a in attn_configs() if a != "softmax"]


def check_names(tasks, backends) -> None:
    """Unknown task or backend names: one line with the valid ones (before any work)."""
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown task(s) {bad}; known: {', '.join(TASKS)}")
    valid = valid_backends()
    bad = [b for b in backends if b not in valid]
    if bad:
        raise ValueError(f"unknown attention backend(s) {bad}; available: {', '.join(valid)}")


def spec_for(cfg: TaskConfig, task: str, backend: str) -> RunSpec:
    quick = ["preset=quick"] if cfg.quick else []
    attn = backend_overrides(backend, as_run=cfg.cost is not None)
    forced = (cfg.micro_batches or {}).get((task, backend))
    forced = [f"hardware.micro_batch={forced}"] if forced else []  # last: the plan's micro-batch wins
    return load([f"task={task}", *attn, f"hardware={cfg.hardware}", *quick, *cfg.overrides, *forced])


def precision_on(spec: RunSpec, device: str) -> str:
    """What the run would train in on ``device`` (``trainer.precision=auto``: 16-mixed on CUDA, fp32 on CPU)."""
    return resolve_precision(spec.hardware.precision_setting, device.startswith("cuda"))


def measure(call: Callable[[int], None], cfg: TaskConfig, compiled: bool, known: Callable[[], list]) -> dict:
    """Time ``call(i)`` (i: which input to use): first call (compilation; eager: which SDPA kernels ran),
    warm-up, median of the repeats; peak memory of one more call (CUDA allocator, or live tensors on CPU
    for eager)."""
    i = 0

    def step():
        nonlocal i
        call(i)
        i += 1

    ops = OpNames()  # SDPA falls back between kernels silently: record which one ran
    with ops if not compiled else contextlib.nullcontext():
        first = timed(step, cfg.device)
    for _ in range(cfg.warmup):
        timed(step, cfg.device)
    times = [timed(step, cfg.device) for _ in range(cfg.repeats)]
    peak, method = "", ""
    # CUDA: the part's own tensors only (as on CPU): the other part's inputs are allocated too, so the
    # meter counts the rise above the idle level plus this part's state and inputs. A CPU measures the
    # live tensors of eager calls only: inductor's kernels bypass the dispatcher.
    if cfg.memory and (cfg.device.startswith("cuda") or not compiled):
        peak, method = measure_peak(step, known(), cfg.device)
    return {
        **timing_columns(times),
        "first_call_s": first,
        "peak_mem_bytes": peak,
        "mem_method": method,
        "sdpa_ops": " ".join(sorted(ops.sdpa)),
    }


# ----------------------------------------------------------------------------- one (task, backend)
def measure_backend(cfg: TaskConfig, task: str, backend: str, log: Callable[[str], None] = print) -> list[dict]:
    """Every (part, mode) row of one backend on one task."""
    spec = spec_for(cfg, task, backend)
    precision = precision_on(spec, cfg.device)
    common = {
        "task": task,
        "backend": backend,
        "n": spec.model.seq_len,
        "dual": spec.model.dual,
        "effective_batch": spec.train.batch_size,
        "hardware": cfg.hardware,
        "precision": precision,
        "checkpointing": spec.attn.checkpointing,
        "device": cfg.device,
        "device_name": device_name(cfg.device),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "options": " ".join(f"{k}={v}" for k, v in sorted(spec.attn.options.items())),
    }
    modes = cfg.modes or (MODES if (cfg.compile or cfg.device.startswith("cuda")) else MODES[:1])
    rows = [{**common, "part": part, "mode": mode} for part in cfg.parts for mode in modes]
    try:
        p: Plan = plan(spec)
    except FitError as e:
        for r in rows:
            r.update(status="does not fit", reason=" ".join(str(e).split())[:300])
        log(f"{task}/{backend}: does not fit {cfg.hardware} ({e})")
        return rows
    micro, accum, source = p.micro_batch, p.accum_steps, p.source
    if cfg.max_batch is not None:  # a smoke run: one small micro-batch per step, the same for every backend
        micro, accum, source = (
            min(micro, cfg.max_batch),
            1,
            f"{p.source}, capped at {cfg.max_batch} without accumulation",
        )
    # the fit can take seconds per backend (memory estimates): say what it decided and what it cost
    log(
        f"fit {task}/{backend}: micro-batch {p.micro_batch} x {p.accum_steps} "
        f"({'cached' if p.cached else p.source if p.seconds is None else f'{p.seconds:.1f} s'})"
        + (f"; measured at {micro} x {accum} (--max-batch {cfg.max_batch})" if cfg.max_batch is not None else "")
    )
    for r in rows:
        r.update(
            micro_batch=micro,
            accum_steps=accum,
            fit_micro_batch=p.micro_batch,
            fit_accum_steps=p.accum_steps,
            effective_batch=micro * accum,
            plan_source=source,
        )

    runner = StepRunner(spec, micro, accum, precision, cfg.device, cfg.seed, pool=min(accum, 4) + 1)
    model, train = runner.model, runner.step
    attn = next(m for m in model.modules() if isinstance(m, MultiHeadAttention)).attn
    # only when timed: on --cost's capped GPU they would take memory a run does not have (1 GiB for text)
    q, k, v, amask, dout = (
        attention_inputs(spec, micro, cfg.device, cfg.seed) if "attention" in cfg.parts else [None] * 5
    )

    def attn_call(fn):
        def call(i):
            out = fn(q, k, v, amask)
            out.backward(dout)
            q.grad = k.grad = v.grad = None
            attn.zero_grad(set_to_none=True)

        return call

    known = {"step": runner.known, "attention": lambda: [q, k, v, amask, dout, *attn.parameters(), *attn.buffers()]}
    for r in rows:
        tag = f"{task}/{backend} {r['part']} {r['mode']} (micro-batch {micro} x {accum}, n={r['n']})"
        compiled = r["mode"] == "compiled"
        try:
            if compiled:
                torch.compiler.reset()  # dynamo's recompile limit (8) is per process, not per model
            target = model if r["part"] == "step" else attn
            net = torch.compile(target) if compiled else target
            call = (lambda i, net=net: runner(net, i)) if r["part"] == "step" else attn_call(net)
            r.update(measure(call, cfg, compiled, known[r["part"]]), status="ok")
            if backend == BASELINE and not compiled and not r["sdpa_ops"]:  # composite: no SDPA op reaches dispatch
                r["sdpa_ops"] = "none: SDPA took the math path (matmul + softmax, n x n)"
        except Exception as err:  # a backend dynamo or the device cannot run must not end the benchmark
            r.update(
                status="oom" if is_oom(err) else "error", reason=" ".join(f"{type(err).__name__}: {err}".split())[:300]
            )
            log(f"{tag}: {r['status']} ({r['reason']})")
            if cfg.device.startswith("cuda"):
                torch.cuda.empty_cache()
            continue
        finally:
            train.opt.zero_grad(set_to_none=True)
        r["per_opt_step_ms"] = r["time_ms"] * (accum if r["part"] == "attention" else 1)
        mem = f", peak {r['peak_mem_bytes'] / MIB:.1f} MiB" if r["peak_mem_bytes"] != "" else ""
        comp = f", first call {r['first_call_s']:.1f} s" if compiled else ""
        log(f"{tag}: {r['time_ms']:.2f} ms (median of {r['repeats']}){mem}{comp}")
        if cfg.cost and r["part"] == "step" and accum % 2 == 0:
            r.update(double_micro_batch=2 * micro, double_status=double_probe(train, model, spec, 2 * micro, cfg))
            log(f"{task}/{backend}: one step at micro-batch {2 * micro} (2x): {r['double_status']}")
    model = train = attn = runner = None  # release them (the closures above share these cells) before empty_cache
    gc.collect()
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def double_probe(train: TrainStep, model, spec: RunSpec, micro: int, cfg: TaskConfig) -> str:
    """One optimizer step of one micro-batch of ``micro``: ``fits`` or ``oom`` (under --cost's cap, an OOM at
    twice the fit's micro-batch shows the fit chose the largest), or the error."""
    try:
        train(model, make_batches(spec, micro, 1, cfg.device, cfg.seed))
        return "fits"
    except Exception as err:  # a probe that fails is a finding, not the end of the table
        return "oom" if is_oom(err) else " ".join(f"error: {type(err).__name__}: {err}".split())[:200]
    finally:
        train.opt.zero_grad(set_to_none=True)


def add_ratios(rows: list[dict]) -> list[dict]:
    """``time_ratio`` (per optimizer step) and ``mem_ratio`` to fused softmax in the same task, part, mode."""
    base = {(r["task"], r["part"], r["mode"]): r for r in rows if r["backend"] == BASELINE and r.get("status") == "ok"}
    for r in rows:
        b = base.get((r["task"], r["part"], r["mode"]))
        r["time_ratio"] = r["mem_ratio"] = ""
        if b is None or r.get("status") != "ok":
            continue
        r["time_ratio"] = r["per_opt_step_ms"] / b["per_opt_step_ms"]
        if r["peak_mem_bytes"] != "" and b["peak_mem_bytes"] not in ("", 0):
            r["mem_ratio"] = r["peak_mem_bytes"] / b["peak_mem_bytes"]
    return rows


def _unmeasured(task: str, backend: str, status: str, reason: str) -> dict:
    """The row of a (task, backend) not measured: skipped, or failed before its parts ran."""
    why = " ".join(reason.split())[:300]
    return {"task": task, "backend": backend, "part": "step", "mode": "eager", "status": status, "reason": why}


def run(
    cfg: TaskConfig, log: Callable[[str], None] = print, on_row: Callable[[list[dict]], None] | None = None
) -> list[dict]:
    """Every task x backend (the fused baseline first, so the ratios have their reference). Every line
    logged ends with ``[i/N, elapsed]``: which (task, backend) of how many, so a slow run is seen to move."""
    torch.set_num_threads(cfg.threads)
    rows: list[dict] = []
    items = [(task, backend) for task in cfg.tasks for backend in cfg.backends]
    t0 = time.perf_counter()
    for i, (task, backend) in enumerate(items, 1):

        def counted(text: str, i: int = i) -> None:
            log(f"{text} [{i}/{len(items)}, {time.perf_counter() - t0:.0f} s]")

        if cfg.budget_s is not None and time.perf_counter() - t0 > cfg.budget_s:
            rows.append(_unmeasured(task, backend, "skipped", f"not started within --budget-s {cfg.budget_s:g}"))
            counted(f"{task}/{backend}: {rows[-1]['reason']}")
        else:
            try:
                rows += measure_backend(cfg, task, backend, counted)
            except Exception as err:  # its spec, fit or model failing is one line; the table goes on
                why = f"{type(err).__name__}: {err}"
                rows.append(_unmeasured(task, backend, "oom" if is_oom(err) else "error", why))
                counted(f"{task}/{backend}: {rows[-1]['status']} ({rows[-1]['reason']})")
                gc.collect()
                if cfg.device.startswith("cuda"):
                    torch.cuda.empty_cache()
        if cfg.cost is None:  # --cost has no fused baseline: its Standard is the paper's, materialised
            add_ratios(rows)
        if on_row is not None:
            on_row(rows)
    return rows


def validate(cfg: TaskConfig) -> None:
    """Bad names or overrides: one line before any work (a spec per backend is resolved once here)."""
    check_names(cfg.tasks, cfg.backends)
    if cfg.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {cfg.repeats}")
    if cfg.max_batch is not None and cfg.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {cfg.max_batch}")
    try:
        for b in cfg.backends:
            spec_for(cfg, cfg.tasks[0], b)
    except ConfigError as e:
        raise ValueError(str(e)) from None
