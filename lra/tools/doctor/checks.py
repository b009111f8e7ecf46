"""The doctor's checks 1, 2, 4 and 6 (measured in this process), and the table of all six.

Shapes: the preset's (``--preset``, default skeinformer_paper), or the quick preset's with ``--quick``.
On a CPU a step of the papers' shapes takes seconds to minutes, so there the micro-batch is capped
(``CPU_MAX_BATCH``) and a figure per optimizer step is the capped micro-batch's time x the micro-batches
the step needs (said in the line).
"""

from __future__ import annotations

import gc
from typing import Callable, Iterator

import torch

import attention
from lra.config import load
from lra.fit import plan, train_step_peak
from lra.tools.bench import tasks as bench
from lra.tools.doctor import overhead as overhead_check
from lra.tools.doctor import resume as resume_check
from lra.tools.doctor.base import Budget, Options, OverBudget, Result, one_line
from lra.tools.meter import MIB
from lra.tools.meter.step import step_peak

CPU_MAX_BATCH = {True: 2, False: 4}  # quick, paper shapes: the micro-batch a CPU check measures at most
FIT_BACKENDS = ("softmax", "softmax_materialized", "skeinformer", "nystrom", "performer")
PAIR = ("softmax", "skeinformer")  # the papers' baseline and the harness's default method
FIT_TOLERANCE = 0.10  # |measured / estimate - 1| above this warns: the fit would choose on a wrong peak
COMPILE_SLOWER = 1.10  # compiled above this x eager warns: compilation costs time and saves none here


def _cuda(opts: Options) -> bool:
    return opts.device.startswith("cuda")


def _overrides(opts: Options, task: str, backend: str) -> list[str]:
    return [f"task={task}", *bench.backend_overrides(backend), f"preset={opts.shapes_preset}", *opts.run_overrides]


def _task_config(
    opts: Options,
    tasks: tuple,
    backends: tuple,
    modes: tuple,
    capped: bool = True,
    memory: bool = True,
    repeats: int | None = None,
) -> bench.TaskConfig:
    """bench's task mode for one check: the whole step only, at the fitted micro-batch, capped on a CPU
    (and at quick shapes, for check 1's smoke run) unless ``capped`` is False."""
    quick = opts.quick
    cap = capped and (quick or not _cuda(opts))
    return bench.TaskConfig(
        tasks=tasks,
        backends=backends,
        hardware=opts.hardware,
        device=opts.device,
        quick=quick,
        max_batch=CPU_MAX_BATCH[quick] if cap else None,
        repeats=repeats or (1 if quick else (20 if _cuda(opts) else 5)),
        warmup=0 if quick else 1,
        threads=torch.get_num_threads(),
        memory=memory,
        parts=("step",),
        modes=modes,
        overrides=(*([] if quick else [f"preset={opts.shapes_preset}"]), *opts.device_overrides),
    )


def all_backends(opts: Options) -> tuple:
    """What check 1 runs: ``--backends``, else the fused and materialised softmax and every other registered one."""
    return tuple(opts.backends) or tuple(bench.valid_backends())


def _measure(cfg: bench.TaskConfig, task: str, backend: str) -> list[dict]:
    """bench's rows for one (task, backend); an error outside a row (the spec, the model) becomes one."""
    try:
        rows = bench.measure_backend(cfg, task, backend, log=lambda _: None)
    except Exception as e:  # a broken backend is named, the others go on
        rows = [
            {"task": task, "backend": backend, "part": "step", "mode": m, "status": "error", "reason": one_line(e)}
            for m in cfg.modes or ("eager",)
        ]
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def _step_figure(r: dict) -> str:
    mem = f", peak {r['peak_mem_bytes'] / MIB:.1f} MiB" if r.get("peak_mem_bytes") not in ("", None) else ""
    ma = f"micro-batch {r['micro_batch']} x {r['accum_steps']}"
    return f"{r['time_ms']:.1f} ms per micro-batch ({ma}){mem}"


def _row_result(check: str, r: dict) -> Result:
    item = f"{r['task']}/{r['backend']} {r['mode']}"
    if r.get("status") == "ok":
        return Result(check, item, "pass", _step_figure(r), data=r)
    status = "warn" if r.get("status") == "does not fit" else "fail"
    return Result(check, item, status, detail=f"{r.get('status')}: {r.get('reason', '')}", data=r)


def _each(
    check: str, items: list[tuple[str, str]], budget: Budget, one: Callable[[str, str], Iterator[Result]]
) -> Iterator[Result]:
    """``one(task, backend)``'s results for each item while the check's budget lasts; a skip for the rest,
    and for the item the watchdog stopped past the budget (every item keeps its line)."""
    for task, backend in items:
        if not budget.left():
            yield budget.skip(check, f"{task}/{backend}")
            continue
        try:
            yield from one(task, backend)
        except OverBudget:
            yield Result(check, f"{task}/{backend}", "skip", detail=budget.cut_result(check).detail)


def _names(opts: Options, wanted: tuple, fallback: int) -> tuple:
    """The backends of ``wanted`` that ``--backends`` allows; else the first ``fallback`` it names."""
    return tuple(b for b in wanted if not opts.backends or b in opts.backends) or all_backends(opts)[:fallback]


def _paired_tasks(opts: Options) -> tuple:
    """ListOps and Text, the papers' two reference lengths, where asked; else the first task asked."""
    return tuple(t for t in ("listops", "text") if t in opts.tasks) or opts.tasks[:1]


def _modes(opts: Options, backend: str) -> tuple:
    """Eager, and compiled where the run would compile (train.compile=auto: on CUDA, if the backend can)."""
    if not _cuda(opts):
        return ("eager",)
    try:
        compiles = load(_overrides(opts, opts.tasks[0], backend)).hardware.compile
    except Exception:  # the measurement names the error
        compiles = False
    return ("eager", "compiled") if compiles else ("eager",)


# ----------------------------------------------------------------------------- 1. every backend runs
def backends(opts: Options, budget: Budget) -> Iterator[Result]:
    modes = {b: _modes(opts, b) for b in all_backends(opts)}

    def one(task: str, backend: str) -> Iterator[Result]:
        # does it run, at what cost: 3 timed steps (on a GPU most of an item is its compilation)
        for r in _measure(
            _task_config(opts, (task,), (backend,), modes[backend], repeats=None if opts.quick else 3), task, backend
        ):
            yield _row_result("backends", r)

    yield from _each("backends", [(t, b) for b in all_backends(opts) for t in opts.tasks], budget, one)


# ----------------------------------------------------------------------------- 2. the memory fit
def fit(opts: Options, budget: Budget) -> Iterator[Result]:
    def one(task: str, backend: str) -> Iterator[Result]:
        item = f"{task}/{backend}"
        try:
            spec = load(_overrides(opts, task, backend))
            micro = plan(spec, use_cache=False).micro_batch
            if not _cuda(opts) or opts.quick:
                micro = min(micro, 8 if opts.quick else CPU_MAX_BATCH[False])
            precision = bench.precision_on(spec, opts.device)
            est = train_step_peak(spec.model, micro, precision=precision, cuda_kernels=_cuda(opts))
            peak = step_peak(spec, micro, precision, opts.device)
        except Exception as e:
            yield Result("fit", item, "fail", detail=one_line(e))
            return
        err = peak / est - 1.0
        status = "pass" if abs(err) <= FIT_TOLERANCE else "warn"
        how = "cuda.max_memory_allocated" if _cuda(opts) else "live tensor storages"
        yield Result(
            "fit",
            item,
            status,
            f"estimate {est / MIB:.1f} MiB, measured {peak / MIB:.1f} MiB ({err:+.2%})",
            f"micro-batch {micro}, {precision}, measured as {how}"
            + ("" if status == "pass" else f"; beyond ±{FIT_TOLERANCE:.0%}"),
            data={
                "estimate_bytes": est,
                "measured_bytes": peak,
                "error": err,
                "micro_batch": micro,
                "precision": precision,
            },
        )

    names = _names(opts, FIT_BACKENDS, 3)
    yield from _each("fit", [(t, b) for t in _paired_tasks(opts) for b in names], budget, one)


# ----------------------------------------------------------------------------- 3. harness overhead
def overhead_figure(o: overhead_check.Overhead) -> str:
    """The ratio and the two times it is the quotient of (the median pair's), the host work their difference."""
    return (
        f"{o.ratio:.3f}x a bare loop, {o.host_ms:+.2f} ms of host work per step "
        f"({o.harness_ms:.2f} vs {o.bare_ms:.2f} ms)"
    )


def overhead_detail(o: overhead_check.Overhead, status: str, cut: str) -> str:
    return (
        f"the median of {o.blocks} interleaved pairs of blocks of {o.block} steps, micro-batch {o.micro_batch} x "
        f"{o.accum_steps}, {o.precision}{', compiled' if o.compiled else ''}"
        + (f"; {cut}" if o.cut else "")
        + ("" if o.ratio <= overhead_check.TARGET else f"; above {overhead_check.TARGET} on a calm machine")
    )


def overhead(opts: Options, budget: Budget) -> Iterator[Result]:
    # quick ListOps shapes on a CPU (a paper-shaped step takes seconds there); the preset's on a GPU
    preset = "quick" if opts.quick or not _cuda(opts) else opts.preset
    sizes = dict(blocks=8, block=12, warmup=8) if opts.quick else dict(blocks=10, block=25, warmup=10)

    items = [("listops", b) for b in _names(opts, PAIR, 1)]
    started = []

    def one(task: str, backend: str) -> Iterator[Result]:
        item = f"{task}/{backend} ({preset} shapes)"
        started.append(item)
        share = budget.share(len(items) - len(started) + 1)  # this item's part of what is left
        try:
            o = overhead_check.measure(
                [f"task={task}", *bench.backend_overrides(backend), f"preset={preset}", *opts.run_overrides],
                **sizes,
                budget_s=share,
            )
        except Exception as e:
            yield Result("overhead", item, "fail", detail=one_line(e))
            return
        cut = f"cut short at its share of the time budget ({share:.0f} s): {o.blocks} of {sizes['blocks']} blocks"
        why = cut + " (no pair timed)" if not o.blocks else o.unmeasured()
        if why:  # a figure that is no measurement is not printed: what stopped it is
            yield Result("overhead", item, "skip", detail=f"could not be measured: {why}", data=o.as_dict())
            return
        status = "pass" if o.ratio <= overhead_check.TARGET and not o.cut else "warn"  # cut: too few pairs to pass
        yield Result("overhead", item, status, overhead_figure(o), overhead_detail(o, status, cut), data=o.as_dict())

    yield from _each("overhead", items, budget, one)


# ----------------------------------------------------------------------------- 4. compiled vs eager
def compiled(opts: Options, budget: Budget) -> Iterator[Result]:
    tasks, names = _paired_tasks(opts), _names(opts, PAIR, 1)
    if opts.quick and not _cuda(opts):  # a CPU compiles a step in about a minute: one pair is the smoke test
        tasks, names = tasks[:1], names[-1:]

    def one(task: str, backend: str) -> Iterator[Result]:
        item = f"{task}/{backend}"
        if backend in attention.available() and not attention.capabilities(backend).compiles:
            yield Result("compile", item, "skip", detail="the backend declares it cannot be compiled: runs eager")
            return
        rows = {r["mode"]: r for r in _measure(_task_config(opts, (task,), (backend,), bench.MODES), task, backend)}
        bad = [r for r in rows.values() if r.get("status") != "ok"]
        if bad:
            yield Result(
                "compile",
                item,
                "fail",
                detail=f"{bad[0]['mode']}: {bad[0].get('status')}: " f"{bad[0].get('reason', '')}",
                data=rows,
            )
            return
        e, c = rows["eager"], rows["compiled"]
        ratio = c["time_ms"] / e["time_ms"]
        status = "pass" if ratio <= COMPILE_SLOWER else "warn"
        yield Result(
            "compile",
            item,
            status,
            f"compiled {c['time_ms']:.1f} ms vs eager {e['time_ms']:.1f} ms ({ratio:.2f}x), "
            f"compilation {c['first_call_s']:.0f} s",
            f"whole step, micro-batch {e['micro_batch']} x {e['accum_steps']}"
            + ("" if status == "pass" else "; compiled is slower here"),
            data={"eager": e, "compiled": c},
        )

    yield from _each("compile", [(t, b) for t in tasks for b in names], budget, one)


# ----------------------------------------------------------------------------- 5. kill and resume
def resume(opts: Options, budget: Budget) -> Iterator[Result]:
    yield from resume_check.check(opts, budget)


# ----------------------------------------------------------------------------- 6. what a preset costs
def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def cost(opts: Options, budget: Budget) -> Iterator[Result]:
    from lra.tools.sweep.cost import Rate, Work, seconds  # the sweep's cost model (its import: only when asked)

    def one(task: str, backend: str) -> Iterator[Result]:
        modes = _modes(opts, backend)[-1:]  # what the run would train: compiled where it compiles
        # the run's own micro-batch, but on a CPU at the papers' shapes (a step takes minutes there)
        r = _measure(
            _task_config(opts, (task,), (backend,), modes, capped=not opts.quick, memory=False), task, backend
        )[0]
        item = f"{task}/{backend} ({opts.shapes_preset})"
        if r.get("status") != "ok":
            yield _row_result("cost", {**r, "task": task, "backend": f"{backend} ({opts.shapes_preset})"})
            return
        t = load(_overrides(opts, task, backend)).train
        micro_per_step = t.batch_size // r["micro_batch"]  # capped on a CPU: more micro-batches a step
        step_s = r["time_ms"] / 1e3 * micro_per_step
        # what is measured here is the steps, not the validations
        rate = Rate(fixed_s=0.0, step_s=step_s, eval_s=0.0, source="lra-doctor", device=opts.device)
        total_s = seconds(Work(t.max_steps, t.eval_every, early_stop=bool(t.patience)), rate)
        yield Result(
            "cost",
            item,
            "pass",
            f"{_duration(step_s)} per optimizer step, {_hours(seconds(Work(1000, t.eval_every, False), rate))} "
            f"per 1k steps, {_hours(total_s)} for its {t.max_steps} steps",
            f"{r['mode']}, {micro_per_step} micro-batch(es) of {r['micro_batch']} a step; training only "
            f"(evaluation adds to it); an early stop ends sooner",
            data={"step_s": step_s, "max_steps": t.max_steps, "total_s": total_s, "row": r},
        )

    yield from _each("cost", [(t, b) for t in opts.tasks for b in _names(opts, PAIR, 1)], budget, one)


CHECK_FUNCTIONS: dict[str, Callable[[Options, Budget], Iterator[Result]]] = {
    "backends": backends,
    "fit": fit,
    "overhead": overhead,
    "compile": compiled,
    "resume": resume,
    "cost": cost,
}
