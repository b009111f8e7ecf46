"""Layer mode: forward+backward time, peak memory and FLOPs of ONE attention layer per backend vs n.

``python -m lra.tools.bench --layer [--quick] [--out DIR] [--lengths ...] [--backends ...] [--device cpu|cuda]
[--set BACKEND.options.NAME=VALUE ...]`` (the default of ``make bench`` on a CPU; ``make bench
ARGS='...'``). See docs/bench.md for how to read the output. At its default batch 2 a GPU is
launch-bound, so on CUDA the tasks' real training shapes (:mod:`lra.tools.bench.tasks`) are the default instead.

One process measures every registered attention backend (``attention.available()``) plus the
softmax baseline in both implementations, ``softmax`` (fused SDPA, the reference every ratio is
taken against) and ``softmax_materialized`` (the papers' n×n score matrix), at each sequence length.
The shapes are those of one LRA attention layer: ``(batch, heads=2, n, head_dim=32)``, fp32, an
all-real bool padding mask, module in training mode with any ``dropout`` option set to 0.

The parts: :mod:`~lra.tools.bench.rows` (the rows, the configuration, ``--set``), :mod:`~lra.tools.bench.measure`
(one point and the sweep; timer and memory meter :mod:`lra.tools.meter`, FLOPs :mod:`~lra.tools.bench.flops`),
:mod:`~lra.tools.bench.analyse` (ratios, crossover, growth), :mod:`~lra.tools.bench.render` (``bench.md``,
``bench.png``); this module turns the command line into a :class:`Config` and writes the outputs
(atomic writes) in ``--out``: ``bench.csv``, ``bench.md``, ``bench.png``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
from pathlib import Path

import torch

from lra.devices import default_threads, device_name
from lra.files import git_commit, write_csv, write_text
from lra.tools.bench.measure import run
from lra.tools.bench.render import plot, render_markdown
from lra.tools.bench.rows import (
    CSV_COLUMNS,
    DEFAULT_LENGTHS,
    GIB,
    QUICK_LENGTHS,
    Config,
    Row,
    check_options,
    parse_options,
    select_rows,
)
from lra.tools.meter.timing import Load


def _default_mem_budget(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return int(0.8 * free)
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(min(8 * GIB, 0.5 * avail)) if avail else 8 * GIB


def config_from_args(args: argparse.Namespace, device: str) -> Config:
    """The layer benchmark's :class:`Config` from the command line (``ValueError``: one line)."""
    lengths = tuple(args.lengths) if args.lengths else (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    if any(n < 1 for n in lengths):
        raise ValueError(f"--lengths must be positive, got {list(lengths)}")
    repeats = args.repeats or (3 if args.quick else (50 if device == "cuda" else 10))
    threads = args.threads or default_threads()
    mem = int(args.mem_budget_gib * GIB) if args.mem_budget_gib else _default_mem_budget(device)
    batch = args.batch if args.batch is not None else 2
    for name, value in (("batch", batch), ("heads", args.heads), ("head_dim", args.head_dim)):
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return Config(
        lengths=tuple(sorted(set(lengths))),
        batch=batch,
        heads=args.heads,
        head_dim=args.head_dim,
        device=device,
        repeats=repeats,
        min_repeats=min(3, repeats),
        warmup=max(0, 1 if args.warmup is None else args.warmup),
        time_budget_s=args.time_budget_s,
        baseline_budget_factor=args.baseline_budget_factor,
        mem_budget_bytes=mem,
        threads=int(threads),
        seed=args.seed,
        mask=not args.no_mask,
        overrides=parse_options(args.overrides),
    )


def check_layer_args(args: argparse.Namespace, device: str) -> tuple[Config, list[Row]]:
    """Everything the layer mode needs, checked before any work (``ValueError``: one line)."""
    rows = select_rows(args.backends)
    cfg = config_from_args(args, device)
    check_options(cfg, rows)
    return cfg, rows


def run_layer(cfg: Config, rows: list[Row], out: Path) -> list[dict]:
    """The layer micro-benchmark with its outputs (bench.csv, bench.md, bench.png in ``out``)."""
    torch.set_num_threads(cfg.threads)
    if cfg.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    out.mkdir(parents=True, exist_ok=True)
    start = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    load = Load(cfg.threads, cfg.device)
    meta = {
        "date": start,
        "device": cfg.device,
        "device_name": device_name(cfg.device),
        "threads": cfg.threads,
        "git": git_commit(short=True) or "?",
        "batch": cfg.batch,
        "heads": cfg.heads,
        "head_dim": cfg.head_dim,
        "dtype": str(cfg.dtype).replace("torch.", ""),
        "mask": "all-real bool" if cfg.mask else "none",
        "repeats": cfg.repeats,
        "time_budget_s": cfg.time_budget_s,
        "baseline_budget_factor": cfg.baseline_budget_factor,
        "mem_budget_gib": cfg.mem_budget_bytes / GIB,
        "mem_method": (
            "torch.cuda.max_memory_allocated"
            if cfg.device == "cuda"
            else "peak of live tensor storages (TorchDispatchMode, exact at op level)"
        ),
    }
    kind = "CPU" if cfg.device == "cpu" else "GPU"
    print(
        f"lra.tools.bench: the {kind} micro-benchmark of ONE attention layer at batch {cfg.batch} "
        f"(not the tasks' training shapes: `--tasks` measures those): {len(rows)} backends × "
        f"n={list(cfg.lengths)} on {meta['device_name']} [{cfg.device}], {cfg.threads} threads, heads {cfg.heads}, "
        f"head_dim {cfg.head_dim}, time budget {cfg.time_budget_s} s/point, memory budget "
        f"{cfg.mem_budget_bytes / GIB:.1f} GiB → {out}",
        flush=True,
    )
    t0 = time.perf_counter()
    csv_path = out / "bench.csv"
    results = run(
        cfg, rows, log=lambda s: print(s, flush=True), on_point=lambda res: write_csv(csv_path, res, CSV_COLUMNS)
    )
    load.stop()
    meta.update(load_line=load.line(), load_warning=load.warning())
    write_csv(csv_path, results, CSV_COLUMNS)
    write_text(out / "bench.md", render_markdown(results, meta))
    pngs = plot(results, out / "bench.png", meta)
    print(meta["load_line"] + (f"\n{meta['load_warning']}" if meta["load_warning"] else ""), flush=True)
    print(
        f"lra.tools.bench: done in {time.perf_counter() - t0:.0f} s; wrote {csv_path}, {out / 'bench.md'}, "
        f"{', '.join(str(p) for p in pngs)}",
        flush=True,
    )
    return results
