"""Cost mode (``python -m lra.tools.bench --cost skeinformer``): Skeinformer Table 4 (bz, accu) and Table 2's
time and accu beside the paper's numbers, two ways with one comparison (:mod:`lra.tools.bench.paper`).

``--predict`` (any machine, no GPU): the fit's decisions (:func:`lra.tools.bench.fit_table.decision_table` under
preset=skeinformer_paper hardware=v100_16gb) beside the paper in ``PATH.md``, ``.csv``, ``.tex`` (:func:`main_predict`).

Measured (a GPU): every row x task of the paper (the attention configs of conf/sweep/skeinformer_table1.yaml) is
the task mode's ``step`` (:mod:`lra.tools.bench.tasks`): built as its run (preset=skeinformer_paper, so Standard is
materialised and recomputed), at the micro-batch and accumulation ``lra.fit.plan`` gives for ``hardware=v100_16gb``
(``--plans CSV``: the micro-batch of a ``--predict`` CSV, forced, so no fit runs on the GPU's machine), in the
run's precision, eager only (the papers' 2021 PyTorch code had no torch.compile), with the caching allocator
capped at the profile's memory less its CUDA context (15.02 GiB for a V100, the cap lra.tools.sweep gives a V100
run). Per cell: whether the steps ran under the cap (an OOM: the fit chose too large), one step at twice the
micro-batch where the accumulation is even (an OOM there: the fit chose the largest), and minutes per 1,000
optimizer steps = median step ms x 1000 / 60000. The pairing with the paper's bz and accus and the agreement
count are the predicted comparison's (:func:`~lra.tools.bench.paper.paper_cells`, ``agreement``); the paper's
minutes come from lra/tools/collect/paper_results.csv. Writes ``cost_<paper>.csv`` (a line per cell, rewritten
after every cell) and ``cost_<paper>.md``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lra.devices import MEMORY_LIMIT_ENV, device_name, limit_gpu_memory
from lra.files import git_commit, write_csv, write_text
from lra.tools.bench.paper import agreement_line, paper_cells, predict, recorded
from lra.tools.bench.rows import MIB
from lra.tools.bench.tasks import TaskConfig, run, spec_for
from lra.tools.collect.tables import PAPER_PRESET, TABLES, paper_lookup
from lra.tools.collect.tables import PAPERS as PAPER_NAMES
from lra.tools.display import SKEIN_ROWS, SKEIN_TASKS
from lra.tools.meter import GIB
from lra.tools.meter.timing import Load

PAPERS = {"skeinformer": (tuple(a for a, _ in SKEIN_ROWS), tuple(t for t, _ in SKEIN_TASKS))}  # rows, tasks
HEADS = dict(SKEIN_TASKS)
MEASURED = ("status", "reason", "time_ms", "time_ms_min", "time_ms_max", "repeats", "peak_mem_bytes")
MEASURED += ("double_micro_batch", "double_status", "n", "effective_batch", "fit_micro_batch", "fit_accum_steps")
MEASURED += ("precision", "checkpointing", "options", "plan_source", "hardware", "device", "device_name")
MEASURED += ("torch_version", "threads")
COLUMNS = ("row", "attn", "task", "micro_batch", "accum_steps", "paper_bz", "paper_accu", "verdict", "under_cap")
COLUMNS += ("cap_gib", "min_per_1k", "paper_min_per_1k", "paper_t2_accu", "time_vs_paper", *MEASURED)


def paper_minutes(paper: str) -> dict:
    """{(attn, task): the paper's Table 2 minutes per 1,000 training steps}."""
    spec = next(t for t in TABLES if t.key == f"{paper}_table2")
    return {(a, t): v for (a, t, m), (v, _) in paper_lookup(spec).items() if m == "min_per_1k"}


def cells(rows: list[dict], cap_gib: float | None, paper: str = "skeinformer") -> list[dict]:
    """A line per measured row x task, in the paper's row and column order: ours beside the paper's."""
    ours = {(r["backend"], r["task"]): r for r in rows}
    tasks = [t for t in PAPERS[paper][1] if any(t == task for _, task in ours)]
    minutes = paper_minutes(paper)
    out = []
    for c in paper_cells([{**r, "attn": r["backend"]} for r in rows], tasks):
        r = ours.get((c["attn"], c["task"]))
        if r is None:  # a row of the paper not asked for
            continue
        c.update({k: r.get(k, "") for k in MEASURED}, cap_gib=cap_gib or "")
        ok = r["status"] == "ok"
        c["under_cap"] = "OOM" if r["status"] == "oom" else ("yes" if cap_gib else "no cap") if ok else ""
        c["min_per_1k"] = r["time_ms"] / 60 if ok else ""  # ms per step x 1000 steps / 60,000 ms per minute
        c["paper_min_per_1k"] = minutes.get((c["attn"], c["task"]), "")
        c["time_vs_paper"] = c["min_per_1k"] / c["paper_min_per_1k"] if ok and c["paper_min_per_1k"] else ""
        out.append(c)
    return out


def cap_memory(cfg: TaskConfig) -> float | None:
    """Cap this process's caching allocator at the profile's memory less its CUDA context, as a run on that card
    has (GiB; None on a CPU or for a profile without a budget)."""
    if not cfg.device.startswith("cuda"):
        return None
    hw = spec_for(cfg, cfg.tasks[0], cfg.backends[0]).hardware
    if hw.total_bytes is None:
        return None
    gib = hw.total_bytes / GIB - hw.cuda_context_gib
    dev = torch.device(cfg.device)  # with an index: set_per_process_memory_fraction refuses a bare "cuda"
    dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    limit_gpu_memory(dev, env={MEMORY_LIMIT_ENV: f"{gib:.6f}"})
    return gib


def _bz(bz, accu) -> str:
    return "—" if bz in ("", None) else f"{bz}×{accu}"


def _ours4(c: dict) -> str:
    """Our bz×accu with what the cell showed: the verdict where not equal, OOM, 2x fitting."""
    if c["status"] not in ("ok", "oom"):
        return c["status"] or "—"
    text = _bz(c["micro_batch"], c["accum_steps"])
    text += "" if c["verdict"] == "equal" else f" ({c['verdict']})"
    text += " **OOM**" if c["status"] == "oom" else ""
    return text + (" (2× fits)" if c["double_status"] == "fits" else "")


def _median(xs: list) -> float:
    xs = [x for x in xs if x != ""]
    return statistics.median(xs) if xs else math.nan


def render_markdown(cs: list[dict], meta: dict) -> str:
    tasks = list(dict.fromkeys(c["task"] for c in cs))
    names = list(dict.fromkeys(c["row"] for c in cs))
    by = {(c["row"], c["task"]): c for c in cs}
    ran = [c for c in cs if c["status"] in ("ok", "oom")]
    oom = [f"{c['row']} / {HEADS[c['task']]}" for c in ran if c["status"] == "oom"]
    probed = [c for c in ran if c["double_status"]]
    room = [f"{c['row']} / {HEADS[c['task']]}" for c in probed if c["double_status"] == "fits"]
    full = sum(c["double_status"] == "oom" for c in probed)
    cap = f"capped at {meta['cap_gib']:.2f} GiB" if meta["cap_gib"] else "not capped (a CPU)"
    under = f"under the {meta['cap_gib']:.2f} GiB cap" if meta["cap_gib"] else "(no cap)"
    lines = [
        f"# {meta['title']} measured: micro-batch, accumulation and minutes per 1,000 steps beside the paper's",
        "",
        f"Command (its defaults written out): `{meta['command']}`",
        "",
        f"{meta['date']} · device **{meta['device_name']}** (`{meta['device']}`) · torch {torch.__version__} · "
        f"{meta['threads']} thread{'s' if meta['threads'] != 1 else ''} · git {meta['git']} · "
        f"hardware={meta['hardware']}, caching allocator {cap} · "
        f"micro-batches {meta['plans']} · preset {meta['preset']} · precision {meta['precision']} · "
        "**eager** (the papers' 2021 PyTorch code had no torch.compile) · "
        f"median of {meta['repeats']} optimizer steps after the first"
        + (" · **a CPU rehearsal at the quick preset's shapes, not the paper's**" if meta["quick"] else ""),
        "",
        meta["load_line"],
        *(["", f"**{meta['load_warning']}**"] if meta["load_warning"] else []),
        "",
        "## Table 4: actual batch size (bz × accu), ours beside the paper's",
        "",
        "Agreement of our bz with the paper's (as --predict counts it): "
        + agreement_line(cs)
        + f", of {len(cs)} cells. One optimizer step at our micro-batch ran {under} in "
        f"{len(ran) - len(oom)} of {len(ran)} cells measured; OOM (the fit chose too large): "
        f"{', '.join(oom) or 'none'}. "
        f"One step at twice our micro-batch (cells with an even accu): OOM in {full} of "
        f"{len(probed)} (the fit chose the largest), fits in {', '.join(room) or 'none'}.",
        "",
        "| Model | " + " | ".join(f"{HEADS[t]} ours | {HEADS[t]} paper" for t in tasks) + " |",
        "|:---|" + "---:|" * (2 * len(tasks)),
    ]
    for n in names:
        row = [f"{_ours4(by[n, t])} | {_bz(by[n, t]['paper_bz'], by[n, t]['paper_accu'])}" for t in tasks]
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    ratios = [c["time_vs_paper"] for c in cs]
    lines += [
        "",
        "## Table 2: minutes per 1,000 optimizer steps (accu), ours beside the paper's",
        "",
        f"Ratio = ours / paper, **across cards and code**: ours is this harness's eager optimizer step alone (all "
        f"accu micro-batches and AdamW; no data loading, no evaluation) on {meta['device_name']}, the paper's is its "
        f"own timing on a 16 GB V100. Median ratio over the {sum(r != '' for r in ratios)} cells timed: "
        f"{_median(ratios):.3g}.",
        "",
        "| Model | " + " | ".join(f"{HEADS[t]} ours | {HEADS[t]} paper | ratio" for t in tasks) + " | median ratio |",
        "|:---|" + "---:|" * (3 * len(tasks) + 1),
    ]
    for n in names:
        row = []
        for t in tasks:
            c = by[n, t]
            ours = f"{c['min_per_1k']:.3g} ({c['accum_steps']})" if c["min_per_1k"] != "" else c["status"]
            paper = f"{c['paper_min_per_1k']:g} ({c['paper_t2_accu']})" if c["paper_min_per_1k"] != "" else "—"
            ratio = f"{c['time_vs_paper']:.3g}" if c["time_vs_paper"] != "" else "—"
            row.append(f"{ours} | {paper} | {ratio}")
        lines.append(f"| {n} | " + " | ".join(row) + f" | {_median([by[n, t]['time_vs_paper'] for t in tasks]):.3g} |")
    peaks = [c for c in cs if c["peak_mem_bytes"] not in ("", None)]
    if peaks:
        top = max(peaks, key=lambda c: c["peak_mem_bytes"])
        lines += [
            "",
            f"Highest peak of a step: {top['peak_mem_bytes'] / MIB:.0f} MiB ({top['row']} / {HEADS[top['task']]}).",
        ]
    bad = [c for c in cs if c["status"] != "ok"]
    if bad:
        lines += ["", "## Not measured, or failed", ""]
        lines += [f"- {c['row']} / {HEADS[c['task']]}: {c['status']}: {c['reason']}" for c in bad]
    return "\n".join(lines) + "\n"


def command(cfg: TaskConfig, out: Path) -> str:
    """The command that measures ``cfg`` again, its defaults written out (only lra.cli reads the typed one)."""
    argv = ["--cost", cfg.cost, "--tasks", *cfg.tasks, "--backends", *cfg.backends, "--hardware", cfg.hardware]
    argv += ["--repeats", str(cfg.repeats), "--warmup", str(cfg.warmup), "--threads", str(cfg.threads)]
    argv += ["--budget-s", f"{cfg.budget_s:g}"] if cfg.budget_s else []
    argv += ["--seed", str(cfg.seed), "--out", str(out)] + (["--plans", str(cfg.plans)] if cfg.plans else [])
    argv += [a for o in cfg.overrides if o != f"preset={PAPER_PRESET[cfg.cost]}" for a in ("--override", o)]
    argv += ["--device", "cpu", "--quick"] if cfg.quick else ["--device", cfg.device]
    return shlex.join(["python", "-m", "lra.tools.bench", *argv])


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main_cost(cfg: TaskConfig, out: Path) -> list[dict]:
    """Measure, then write ``cost_<paper>.csv`` (after every cell too) and ``cost_<paper>.md``; the agreement
    and the median time ratio on stdout. Returns the cells."""
    cap = cap_memory(cfg)
    _progress(
        f"lra.tools.bench --cost {cfg.cost}: {len(cfg.backends)} rows × {len(cfg.tasks)} tasks = "
        f"{len(cfg.backends) * len(cfg.tasks)} cells, one eager optimizer step each at the micro-batch "
        + (f"of {cfg.plans} (no fit here)" if cfg.plans else f"fitted to hardware={cfg.hardware}")
        + f", {cfg.repeats} timed, on {device_name(cfg.device)} [{cfg.device}], caching "
        f"allocator {f'capped at {cap:.2f} GiB' if cap else 'not capped'}"
        + (f", skipping cells not started within {cfg.budget_s:g} s" if cfg.budget_s else "")
        + f" → {out}"
    )
    out.mkdir(parents=True, exist_ok=True)
    load = Load(cfg.threads, cfg.device)
    t0 = time.perf_counter()
    csv_path, md_path = out / f"cost_{cfg.cost}.csv", out / f"cost_{cfg.cost}.md"
    rows = run(cfg, log=_progress, on_row=lambda rs: write_csv(csv_path, cells(rs, cap, cfg.cost), COLUMNS))
    load.stop()
    cs = cells(rows, cap, cfg.cost)
    meta = {
        "title": f"{PAPER_NAMES[cfg.cost]}, Tables 4 and 2",
        "command": command(cfg, out),
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "device": cfg.device,
        "device_name": device_name(cfg.device),
        "threads": cfg.threads,
        "git": git_commit(short=True) or "?",
        "hardware": cfg.hardware,
        "cap_gib": cap,
        "preset": "quick" if cfg.quick else PAPER_PRESET[cfg.cost],
        "plans": f"from `{cfg.plans}` (forced; no fit ran here)" if cfg.plans else "fitted here (lra.fit.plan)",
        "precision": ", ".join(sorted({c["precision"] for c in cs if c["precision"]})) or "—",
        "repeats": cfg.repeats,
        "quick": cfg.quick,
        "load_line": load.line(),
        "load_warning": load.warning(),
    }
    write_csv(csv_path, cs, COLUMNS)
    write_text(md_path, render_markdown(cs, meta))
    ratios = [c["time_vs_paper"] for c in cs]
    print(
        f"Table 4 (bz vs the paper's): {agreement_line(cs)}; "
        f"OOM under the cap: {sum(c['status'] == 'oom' for c in cs)}; not measured: "
        f"{sum(c['status'] not in ('ok', 'oom') for c in cs)}, of {len(cs)} cells\n"
        f"Table 2 (minutes per 1k steps, ours / paper, across cards): median {_median(ratios):.3g} over "
        f"{sum(r != '' for r in ratios)} cells\n{meta['load_line']}\n"
        f"lra.tools.bench: done in {time.perf_counter() - t0:.0f} s; wrote {csv_path}, {md_path}",
        flush=True,
    )
    return cs


def read_plans(path: Path, task_names: tuple, backends: tuple) -> dict:
    """{(task, backend): micro-batch} of a --predict CSV for every cell asked; a cell it lacks is an error."""
    try:
        with open(path, newline="") as f:
            got = {(r["task"], r["attn"]): r["micro_batch"] for r in csv.DictReader(f)}
    except (OSError, KeyError) as err:
        raise ValueError(f"--plans {path}: not a --predict CSV ({type(err).__name__}: {err})") from None
    plans = {(t, b): got.get((t, b)) for t in task_names for b in backends}
    missing = [f"{b}/{t}" for (t, b), m in plans.items() if not (m or "").isdigit()]
    if missing:
        raise ValueError(f"--plans {path}: no micro-batch for {', '.join(missing[:3])}" + (" ..." * (len(missing) > 3)))
    return {k: int(m) for k, m in plans.items()}


@dataclass
class Predict:
    """--predict: the fit's decisions for ``rows`` x ``tasks`` beside ``paper``; ``root``: its code's checkout."""

    paper: str
    rows: tuple
    tasks: tuple
    overrides: tuple
    root: Path | None


def main_predict(cfg: Predict, out: Path, argv: list[str]) -> list[dict]:
    """The predicted comparison on stdout, written to ``out`` + .md, .csv, .tex (.theirs.csv with a checkout)."""
    files = predict(cfg.rows, cfg.tasks, list(cfg.overrides), cfg.root, recorded(argv))
    print(files[".md"])
    for suffix, text in files.items():
        write_text(out.parent / (out.name + suffix), text)
    print(f"lra.tools.bench: wrote {out}{{{','.join(files)}}}", file=sys.stderr)
    return files
