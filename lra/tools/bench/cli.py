"""``python -m lra.tools.bench`` (``lra-bench``, ``make bench``): the one measuring command, and its command line.

A first word picks a measurement with its own command line: ``doctor`` (``lra-doctor``: the environment and six
checks, :mod:`lra.tools.doctor`), ``share`` (``lra-share-bench``: k runs sharing a GPU, :mod:`lra.tools.share_bench`),
``fit`` (the memory fit of every task x attention config, :mod:`lra.tools.bench.fit_table`).

Otherwise three modes. ``--tasks``: the whole training step and the attention layer at each LRA task's real
shape (:mod:`lra.tools.bench.tasks`), the default on CUDA; with ``--cost PAPER`` the paper's rows x tasks, the
step alone, eager, under the hardware profile's memory cap, beside its cost tables (:mod:`lra.tools.bench.cost`;
``--predict``: the fit's decisions beside them, on any CPU).
``--layer``: one attention layer at batch 2 against n (:mod:`lra.tools.bench.layer`), the default on a CPU.
``--reference``: each attention module against the module of the papers' public code, side by side
(:mod:`lra.tools.bench.reference`). Bad input is one line before any work.
"""

from __future__ import annotations

import argparse
import importlib
import math
from pathlib import Path

import torch

from lra.cli import Parser, typed
from lra.devices import default_threads
from lra.files import runs_root
from lra.tools.bench import cost, layer, reference, rows, task_report, tasks

# layer-mode options (None = not given): naming one in task mode is an error, not silently ignored
LAYER_ONLY = {
    "lengths": None,
    "batch": 2,
    "heads": 2,
    "head_dim": 32,
    "time_budget_s": 2.0,
    "baseline_budget_factor": 4.0,
    "mem_budget_gib": None,
    "no_mask": False,
    "overrides": None,
}
HARDWARE = "v100_16gb"  # the task mode's default profile
TASK_ONLY = ("hardware", "max_batch", "compile", "spec_overrides", "cost", "budget_s", "plans", "predict")
COST_ONLY = ("budget_s", "plans", "predict")
# what --predict has no use for (nothing is measured): naming one is an error, not silently ignored
MEASURED_ONLY = ("plans", "budget_s", "compile", "max_batch", "repeats", "warmup", "threads", "device", "quick")
REFERENCE_ONLY = ("skeinformer", "skyformer", "nystromformer")  # the public code's checkouts


def whole(minimum: int):
    """An argparse type: a whole number >= ``minimum`` (``--repeats 0`` used to mean "the default")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is not allowed: a whole number >= {minimum}")
        return value

    return parse


def positive(text: str) -> float:
    """An argparse type: a finite number > 0 (NaN passes every comparison, so it is named here)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not allowed: a finite number > 0")
    return value


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m lra.tools.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m lra.tools.bench --quick                      # CPU: one layer vs n, batch 2\n"
        "  python -m lra.tools.bench --tasks --quick              # the tasks' training step, tiny shapes\n"
        "  python -m lra.tools.bench --tasks listops text --compile --hardware v100_16gb   # on a GPU\n"
        "  python -m lra.tools.bench --cost skeinformer --predict --out results/cpu/fit/skeinformer_table4  # any CPU\n"
        "  python -m lra.tools.bench --cost skeinformer --plans results/cpu/fit/skeinformer_table4.csv --out OUT"
        "   # a GPU\n"
        "  python -m lra.tools.bench --backends skeinformer nystrom --lengths 1024 4096 "
        "--set nystrom.options.landmarks=128\n"
        "  python -m lra.tools.bench --reference --skeinformer ~/src/Skeinformer --skyformer ~/src/Skyformer "
        "--nystromformer ~/src/Nystromformer   # ours vs the papers' code\n"
        "  python -m lra.tools.bench doctor --quick               # lra-doctor (doctor --help: its options)\n"
        "  python -m lra.tools.bench share ks=1,2,4               # lra-share-bench: k runs sharing a GPU\n"
        "  python -m lra.tools.bench fit hardware=v100_16gb       # the memory fit of every task x attention",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--tasks",
        nargs="*",
        metavar="TASK",
        help=f"task mode (default on CUDA): these tasks, all when none is named ({', '.join(tasks.TASKS)})",
    )
    mode.add_argument("--layer", action="store_true", help="layer mode (default on a CPU): one attention layer vs n")
    mode.add_argument(
        "--reference",
        action="store_true",
        help="reference mode: each attention module against its counterpart in the papers' public code (a "
        "checkout you fetched: --skeinformer, --skyformer, --nystromformer), forward + backward, interleaved",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="layer: n in 256, 512, 3 repeats; tasks: the quick preset's shapes at batch <= 4, softmax + "
        "skeinformer, 2 repeats",
    )
    p.add_argument("--out", type=Path, help="output folder (default: bench/ under the runs root, $LRA_RUNS or runs/)")
    p.add_argument("--backends", nargs="+", help="rows to run (the fused softmax baseline is always added)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument(
        "--repeats",
        type=whole(1),
        help="timed calls (layer: at most, default 10 CPU / 50 CUDA; tasks: 5 CPU / 20 CUDA; quick 3)",
    )
    p.add_argument("--warmup", type=whole(0), help="untimed calls before the timed ones (default 1; tasks --quick 0)")
    p.add_argument(
        "--threads",
        type=whole(1),
        help="torch threads (default: all cores available to the process; --tasks --quick: 1)",
    )
    p.add_argument("--seed", type=int, default=0)
    t = p.add_argument_group("task mode")
    t.add_argument(
        "--hardware", help="the hardware= profile the micro-batch is fitted to (conf/hardware/; default v100_16gb)"
    )
    t.add_argument(
        "--max-batch",
        type=whole(1),
        help="measure min(fitted micro-batch, N) without accumulation (quick: 4; default: the fit's choice)",
    )
    t.add_argument("--compile", action="store_true", help="also torch.compile on a CPU (always on CUDA; slow)")
    t.add_argument(
        "--cost",
        choices=tuple(cost.PAPERS),
        help="the paper's cost tables measured (Table 4 bz x accu, Table 2 minutes per 1k steps): its rows "
        "(--backends: some) x tasks (--tasks: some), one eager step each at the fitted micro-batch under the "
        "--hardware profile's memory cap, 3 timed; a GPU's work (a CPU rehearsal: --device cpu --quick)",
    )
    t.add_argument(
        "--budget-s",
        type=positive,
        help="with --cost: cells not started this many seconds after the first are skipped (default 270)",
    )
    t.add_argument(
        "--predict",
        action="store_true",
        help="with --cost: no GPU, nothing measured: the fit's decisions (lra.fit, on this CPU) beside the paper, "
        "the agreement counted; --out PATH writes PATH.md, .csv, .tex (and .theirs.csv with --skeinformer DIR: "
        "the differing ListOps and Text cells estimated again with that checkout's attention block)",
    )
    t.add_argument(
        "--plans",
        type=Path,
        metavar="CSV",
        help="with --cost: measure each cell at the micro-batch of CSV (a --predict output), forced "
        "(hardware.micro_batch): no memory fit runs here",
    )
    t.add_argument(
        "--override",
        dest="spec_overrides",
        action="append",
        metavar="KEY=VALUE",
        help="a config override for every run spec, repeatable (e.g. --override preset=quick)",
    )
    r = p.add_argument_group(
        'reference mode (docs/bench.md, "Against the papers\' code"; its code is imported and runs)'
    )
    for name in REFERENCE_ONLY:
        r.add_argument(f"--{name}", type=Path, metavar="DIR", help=f"a checkout of {reference.REPOS[name].url}")
    g = p.add_argument_group("layer mode")
    g.add_argument(
        "--lengths",
        type=whole(1),
        nargs="+",
        help=f"sequence lengths (default {list(rows.DEFAULT_LENGTHS)}; reference mode {list(reference.LENGTHS)})",
    )
    g.add_argument(
        "--time-budget-s",
        type=positive,
        help="per-point budget: a median fwd+bwd above it (default 2) " "ends the backend's sweep",
    )
    g.add_argument(
        "--baseline-budget-factor",
        type=positive,
        help="the fused softmax baseline gets this multiple of the time budget (default 4)",
    )
    g.add_argument(
        "--mem-budget-gib",
        type=positive,
        help="per-point peak budget (default: CPU min(8, half of available RAM); CUDA 80%% of free)",
    )
    g.add_argument("--batch", type=whole(1), help="default 2")
    g.add_argument("--heads", type=whole(1), help="default 2")
    g.add_argument("--head-dim", type=whole(1), help="default 32")
    g.add_argument("--no-mask", action="store_true", help="pass mask=None instead of an all-real bool mask")
    g.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar=rows.SPELLING,
        help="a backend's option, repeatable: a run's attn.options.NAME=VALUE with the backend in place "
        "of attn, VALUE in Hydra's override grammar (e.g. --set linformer.options.k=128)",
    )
    return p


def _device(args) -> str:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False; use --device cpu")
    return device


def task_mode(args, device: str) -> bool:
    """``--tasks`` or ``--layer`` as asked; otherwise the tasks' shapes on CUDA (batch 2 is launch-bound
    there) and the layer micro-benchmark on a CPU."""
    return args.tasks is not None or (not args.layer and (args.cost is not None or device == "cuda"))


def task_config(args, device: str) -> tasks.TaskConfig:
    given = [k for k in LAYER_ONLY if getattr(args, k) not in (None, False)]
    if given:
        raise ValueError(
            f"--{given[0].replace('_', '-')} belongs to the layer micro-benchmark; add --layer "
            f"(task mode takes its shapes from the task configs and lra.fit.plan)"
        )
    if args.cost:
        return cost_config(args, device)
    given = [k for k in COST_ONLY if getattr(args, k) not in (None, False)]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} belongs to --cost")
    names = args.backends or (tasks.QUICK_BACKENDS if args.quick else tasks.DEFAULT_BACKENDS)
    backends = tuple(dict.fromkeys([rows.BASELINE, *names]))  # ratios need the fused baseline, first
    cuda = device == "cuda"
    cfg = tasks.TaskConfig(
        tasks=tuple(dict.fromkeys(args.tasks)) if args.tasks else tasks.TASKS,
        backends=backends,
        hardware=args.hardware or HARDWARE,
        device=device,
        compile=args.compile or cuda,
        quick=args.quick,
        max_batch=args.max_batch if args.max_batch is not None else (4 if args.quick else None),
        repeats=args.repeats or (2 if args.quick else (20 if cuda else 5)),
        warmup=max(0, args.warmup if args.warmup is not None else (0 if args.quick else 1)),
        # quick: one thread, as a smoke run on a shared machine should (2 threads on a busy 2-core machine
        # measured 2.2x the wall time of 1: docs/bench.md)
        threads=int(args.threads or (1 if args.quick else default_threads())),
        seed=args.seed,
        overrides=tuple(args.spec_overrides or ()),
    )
    tasks.validate(cfg)
    return cfg


def cost_config(args, device: str) -> tasks.TaskConfig:
    """--cost: the paper's rows x tasks as their runs, the step alone, eager. A GPU's work: a CPU runs it only
    as a rehearsal asked for by name (--device cpu --quick); --predict: the fit's decisions, any machine."""
    paper_rows, paper_tasks = cost.PAPERS[args.cost]
    bad = [b for b in args.backends or () if b not in paper_rows]
    if bad:
        raise ValueError(f"--cost {args.cost}: {bad} are not rows of its tables; its rows: {', '.join(paper_rows)}")
    picked = tuple(dict.fromkeys(args.tasks or paper_tasks)), tuple(dict.fromkeys(args.backends or paper_rows))
    if args.predict:
        return predict_config(args, *picked)
    if device == "cpu" and args.device is None:
        raise ValueError(
            "--cost measures on a GPU and torch sees none here; a CPU rehearsal at the quick preset's shapes: "
            "add --device cpu --quick"
        )
    if device == "cpu" and not args.quick:
        raise ValueError("--cost --device cpu runs only as a rehearsal at the quick preset's shapes: add --quick")
    if args.compile or args.max_batch:
        raise ValueError(
            "--cost measures the eager step (the papers' 2021 PyTorch code had no torch.compile) at the fitted "
            "micro-batch (Table 4's bz): drop --compile and --max-batch"
        )
    cfg = tasks.TaskConfig(
        tasks=picked[0],
        backends=picked[1],
        hardware=args.hardware or HARDWARE,
        device=device,
        quick=args.quick,
        repeats=args.repeats or 3,
        warmup=args.warmup or 0,  # the first step (not timed) warms up: 80 cells in 5 GPU-minutes
        threads=int(args.threads or (1 if args.quick else default_threads())),
        seed=args.seed,
        # its preset, so Standard is its materialised softmax (the quick rehearsal's preset is quick)
        overrides=(*(() if args.quick else (f"preset={cost.PAPER_PRESET[args.cost]}",)), *(args.spec_overrides or ())),
        parts=("step",),
        modes=("eager",),
        memory=device == "cuda",  # the peak under the cap; a CPU has no cap and its meter is slow
        cost=args.cost,
        budget_s=args.budget_s or 270.0,  # with start-up and the last cell: 5 minutes
        plans=args.plans,
        micro_batches=cost.read_plans(args.plans, *picked) if args.plans else None,
    )
    tasks.validate(cfg)
    return cfg


def predict_config(args, task_names: tuple, backends: tuple) -> cost.Predict:
    """--cost --predict: the paper's rows x tasks as the fit decides them; nothing measured, so no device."""
    given = [k for k in MEASURED_ONLY if getattr(args, k) not in (None, False)]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} belongs to the measured --cost; --predict measures nothing")
    if args.skeinformer is not None:
        reference.check_roots({"skeinformer": args.skeinformer.expanduser()})
    hardware = [f"hardware={args.hardware}"] if args.hardware else []
    overrides = (*hardware, *(args.spec_overrides or ()))
    return cost.Predict(args.cost, backends, task_names, overrides, args.skeinformer and args.skeinformer.expanduser())


def reference_config(args) -> reference.ReferenceConfig:
    """The reference mode's settings; any other mode's option, or a folder without the public code, is an error."""
    other = [k for k in (*LAYER_ONLY, *TASK_ONLY) if k != "lengths" and getattr(args, k) not in (None, False)]
    if other or args.quick:
        flag = "quick" if not other else ("override" if other[0] == "spec_overrides" else other[0].replace("_", "-"))
        raise ValueError(f"--{flag} belongs to the layer or task mode, not to --reference")
    if args.device == "cuda":
        raise ValueError("--reference times on the CPU only (the public code's modules are built for it here)")
    roots = {k: getattr(args, k).expanduser() for k in REFERENCE_ONLY if getattr(args, k) is not None}
    reference.check_roots(roots)
    return reference.ReferenceConfig(
        roots=roots,
        pairs=tuple(reference.select(args.backends, roots)),
        lengths=tuple(dict.fromkeys(args.lengths or reference.LENGTHS)),
        repeats=args.repeats or 7,
        warmup=args.warmup if args.warmup is not None else 1,
        threads=args.threads or 1,
        seed=args.seed,
    )


def _other_config(args, device: str):
    """The task or layer mode's settings: (True, task config) or (False, (layer config, rows))."""
    if task_mode(args, device):
        return True, task_config(args, device)
    given = [k for k in TASK_ONLY if getattr(args, k) not in (None, False)]
    if given:
        flag = "override" if given[0] == "spec_overrides" else given[0].replace("_", "-")
        raise ValueError(
            f"--{flag} belongs to the task mode; "
            f"add --tasks (the layer micro-benchmark has no model, plan or hardware profile)"
        )
    for k, default in LAYER_ONLY.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
    return False, layer.check_layer_args(args, device)


MEASUREMENTS = {
    "doctor": "lra.tools.doctor.__main__",
    "share": "lra.tools.share_bench",
    "fit": "lra.tools.bench.fit_table",
}


def main(argv: list[str] | None = None) -> list[dict]:
    """The layer, task, cost or reference mode's rows; ``doctor``, ``share`` and ``fit`` exit with their code."""
    argv = typed(argv)
    if argv and argv[0] in MEASUREMENTS:  # imported when asked: the doctor does not load with the layer mode
        raise SystemExit(importlib.import_module(MEASUREMENTS[argv[0]]).main(argv[1:]))
    p = parser()
    args = p.parse_args(argv)
    try:
        given = [k for k in REFERENCE_ONLY if getattr(args, k) is not None]
        if given == ["skeinformer"] and args.predict:  # the cost mode's comparison with its code
            given = []
        if given and not args.reference:
            raise ValueError(f"--{given[0]} belongs to the reference mode: add --reference")
        if args.reference:
            rcfg = reference_config(args)
        else:
            tasks_run, cfg = _other_config(args, _device(args))
    except ValueError as err:
        p.error(str(err))
    out = args.out or runs_root() / "bench"  # LRA_RUNS moves it, as it moves the runs
    if args.reference:
        return reference.run_reference(rcfg, out)
    if isinstance(cfg, cost.Predict):
        return cost.main_predict(cfg, args.out or out / f"predicted_{cfg.paper}", typed(argv))
    if tasks_run and cfg.cost:
        return cost.main_cost(cfg, out)
    if tasks_run:
        return task_report.main_tasks(cfg, out)
    return layer.run_layer(*cfg, out)
