"""Task mode's outputs: the ratio tables (backends x tasks, per part and mode), ``bench_tasks.md``,
and :func:`main_tasks`, the run that writes them with ``bench_tasks.csv``."""

from __future__ import annotations

import datetime as _dt
import sys
import time
from pathlib import Path

import torch

from lra.devices import device_name
from lra.files import git_commit, write_csv, write_text
from lra.tools.bench.rows import BASELINE, MIB
from lra.tools.bench.tasks import CSV_COLUMNS, MODES, TaskConfig, run
from lra.tools.meter.timing import Load


def _ratio(x) -> str:
    return "—" if x in ("", None) else f"{float(x):.3g}"


def ratio_tables(rows: list[dict]) -> list[str]:
    """The time- and memory-ratio tables (backends x tasks) of the step and of the attention layer."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    by = {(r["task"], r["backend"], r["part"], r["mode"]): r for r in rows}

    def cell(t, b, part, mode, key):
        r = by.get((t, b, part, mode))
        if r is None:
            return "—"
        return _ratio(r.get(key)) if r.get("status") == "ok" else r.get("status", "—")

    lines = []
    for part, title in (("step", "Whole training step"), ("attention", "Attention layer alone")):
        for key, what in (("time_ratio", "time ratio"), ("mem_ratio", "peak-memory ratio")):
            modes = [m for m in MODES if any(r["part"] == part and r["mode"] == m for r in rows)]
            if key == "mem_ratio":
                modes = [
                    m
                    for m in modes
                    if any(r["part"] == part and r["mode"] == m and r.get("mem_ratio") not in ("", None) for r in rows)
                ]
            if not modes:
                continue
            head = [f"{t} ({m})" if len(modes) > 1 else t for t in tasks for m in modes]
            lines += [
                f"## {title}: {what} to fused softmax",
                "",
                "| backend | " + " | ".join(head) + " |",
                "|---|" + "---:|" * len(head),
            ]
            for b in backends:
                lines.append(f"| {b} | " + " | ".join(cell(t, b, part, m, key) for t in tasks for m in modes) + " |")
            lines.append("")
    return lines


def render_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Benchmark at the tasks' training shapes ({meta['kind']})",
        "",
        f"{meta['date']} · device **{meta['device_name']}** (`{meta['device']}`) · torch {torch.__version__} · "
        f"{meta['threads']} threads · git {meta['git']} · hardware={meta['hardware']}"
        f"{' · quick preset shapes' if meta['quick'] else ''}",
        "",
        meta.get("load_line", "Load average: not recorded."),
        *(["", f"**{meta['load_warning']}**"] if meta.get("load_warning") else []),
        "",
        "Per task: the whole training step (forward, loss, backward, AdamW; "
        f"precision {meta['precision']}) at the micro-batch `lra.fit.plan` chooses for `hardware={meta['hardware']}`"
        + (
            f" **capped at {meta['max_batch']} without accumulation (a smoke run: the ratios are per step at that "
            "batch, not the tasks' training figures)**"
            if meta.get("max_batch")
            else ""
        )
        + ", and the first attention layer alone (fp32, forward + backward) at that micro-batch, with a padding mask "
        "of seeded per-sample lengths. Ratios are backend / fused softmax (SDPA) in the same task, part and mode, "
        "per optimizer step (micro-batch time × accumulation): below 1 is faster / smaller. "
        f"Time: median of {meta['repeats']} steps after warm-up.",
        "",
    ]
    lines += ratio_tables(rows)
    lines += [
        "## Absolute values",
        "",
        "| task | backend | n | micro × accum | part | mode | ms (median) | ms per optimizer step "
        "| first call s | peak MiB |",
        "|---|---|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ok = r.get("status") == "ok"
        ma = f"{r['micro_batch']} × {r['accum_steps']}" if r.get("micro_batch") not in ("", None) else "—"
        peak = r.get("peak_mem_bytes") if ok else ""
        lines.append(
            f"| {r['task']} | {r['backend']} | {r['n']} | {ma} | {r['part']} | {r['mode']} | "
            + (
                f"{r['time_ms']:.3g} | {r['per_opt_step_ms']:.3g} | {r['first_call_s']:.2g} | "
                + (f"{peak / MIB:.4g}" if peak != "" else "—")
                if ok
                else f"{r.get('status')} | | | "
            )
            + " |"
        )
    kern = sorted({r["sdpa_ops"] for r in rows if r["backend"] == BASELINE and r.get("sdpa_ops")})
    if kern:
        lines += [
            "",
            "Fused softmax (eager), SDPA kernel(s) that ran: "
            + "; ".join(f"`{k}`" for k in kern)
            + " (on a CPU, attention dropout sends SDPA to the math path, which holds the n×n matrix).",
        ]
    bad = [r for r in rows if r.get("status") != "ok"]
    if bad:
        lines += ["", "## Not measured", ""]
        lines += [
            f"- {r['task']}/{r['backend']} {r['part']} {r['mode']}: {r['status']}: {r.get('reason', '')}" for r in bad
        ]
    return "\n".join(lines) + "\n"


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main_tasks(cfg: TaskConfig, out: Path) -> list[dict]:
    """Task mode with its outputs, ``bench_tasks.csv`` (rewritten after every backend) and ``bench_tasks.md``.
    Progress (one line per fit and per measurement, with ``[i/N, elapsed]``) goes to stderr; the ratio
    tables and where the files are, to stdout at the end."""
    kind = "GPU" if cfg.device.startswith("cuda") else "CPU" + (" quick" if cfg.quick else "")
    modes = "eager and compiled" if (cfg.compile or cfg.device.startswith("cuda")) else "eager"
    _progress(
        f"lra.tools.bench: the {kind} benchmark at the tasks' training shapes: {len(cfg.backends)} backends × "
        f"tasks {list(cfg.tasks)} = {len(cfg.backends) * len(cfg.tasks)} items, whole training step and "
        f"attention layer, {modes}, micro-batch fitted to hardware={cfg.hardware}, on "
        f"{device_name(cfg.device)} [{cfg.device}], {cfg.threads} thread{'s' if cfg.threads != 1 else ''} → {out}"
    )
    out.mkdir(parents=True, exist_ok=True)
    load = Load(cfg.threads, cfg.device)
    t0 = time.perf_counter()
    csv_path, md_path = out / "bench_tasks.csv", out / "bench_tasks.md"
    rows = run(cfg, log=_progress, on_row=lambda rs: write_csv(csv_path, rs, CSV_COLUMNS))
    load.stop()
    precisions = sorted({r["precision"] for r in rows})
    meta = {
        "kind": kind,
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "device": cfg.device,
        "device_name": device_name(cfg.device),
        "threads": cfg.threads,
        "git": git_commit(short=True) or "?",
        "hardware": cfg.hardware,
        "quick": cfg.quick,
        "precision": ", ".join(precisions),
        "repeats": cfg.repeats,
        "max_batch": cfg.max_batch,
        "load_line": load.line(),
        "load_warning": load.warning(),
    }
    write_csv(csv_path, rows, CSV_COLUMNS)
    write_text(md_path, render_markdown(rows, meta))
    print("\n".join(ratio_tables(rows)))
    print(meta["load_line"] + (f"\n{meta['load_warning']}" if meta["load_warning"] else ""), flush=True)
    print(f"lra.tools.bench: done in {time.perf_counter() - t0:.0f} s; wrote {csv_path}, {md_path}", flush=True)
    return rows
