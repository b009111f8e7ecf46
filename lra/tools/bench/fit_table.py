"""``lra-bench fit``: the memory fit's decision for every task x attention config, the shape of Skeinformer
Table 4 (micro-batch and accumulation). One decision is ``python -m lra.fit`` (the run library's); the table,
minutes of estimates on a CPU, is the bench's: a line per decision on stderr, then the table on stdout.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from lra.cli import Parser
from lra.config import ConfigError, attn_configs, load
from lra.devices import GIB
from lra.files import write_json, write_text
from lra.fit import FitError, plan
from lra.tools.display import SKEIN_TASKS

TABLE_TASKS = tuple(t for t, _ in SKEIN_TASKS)  # the papers' column order
FUSED = [("softmax_fused", ["attn=softmax", "attn.options.impl=fused"])]  # a row no attention config names


def _progress_line(row: dict, i: int, total: int, elapsed: float) -> str:
    """``fit listops/skeinformer: micro-batch 32 x 1 (3.1 s) [4/130, 41 s]``: a table takes minutes, so each
    decision says which of how many it is and the time since the table started."""
    what = f"fit {row['task']}/{row['attn']}: "
    if "micro_batch" in row:
        took = "cached" if row.get("cached") else f"{row.get('seconds') or 0:.1f} s"
        what += f"micro-batch {row['micro_batch']} x {row['accum_steps']} ({took})"
    else:
        what += row["error"]
    return f"{what} [{i}/{total}, {elapsed:.0f} s]"


def decision_table(overrides: list[str], tasks=TABLE_TASKS, attns=None, progress=True, extra=FUSED) -> list[dict]:
    """One row per (attention config, task): micro-batch, accumulation, estimate, or why it was skipped.
    ``progress``: a line per decision on stderr; ``extra``: (label, overrides) rows."""
    rows = []
    attns = list(attns or attn_configs())
    cells = [(label, ov, task) for label, ov in [(a, [f"attn={a}"]) for a in attns] + extra for task in tasks]
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else (lambda line: None)
    say(
        f"lra-bench fit: {len(cells)} decisions ({len(attns) + len(extra)} attention configs x {len(tasks)} tasks); "
        "one not cached yet takes 1-4 memory estimates of seconds each on a CPU; a line per decision, then the table"
    )
    t0 = time.perf_counter()
    for i, (label, ov, task) in enumerate(cells, 1):
        row = {"attn": label, "task": task}
        try:
            spec = load([f"task={task}", *ov, *overrides])
            p = plan(spec)
            row.update(
                micro_batch=p.micro_batch,
                accum_steps=p.accum_steps,
                effective_batch=p.effective_batch,
                estimate_gib=None if p.estimate_bytes is None else round(p.estimate_bytes / GIB, 3),
                seconds=p.seconds,
                cached=p.cached,
                impl=spec.attn.options.get("impl"),
                capped="train.chunks" in p.source,  # the public code's chunks, not the memory, set it
            )
        except FitError as e:
            row.update(error="micro-batch 1 does not fit", detail=str(e))
        except Exception as e:  # a missing task config or a backend the estimator cannot trace
            row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
        rows.append(row)
        say(_progress_line(row, i, len(cells), time.perf_counter() - t0))
    return rows


def format_table(rows: list[dict], tasks=TABLE_TASKS) -> str:
    by = {(r["attn"], r["task"]): r for r in rows}
    out = ["| attention | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for a in dict.fromkeys(r["attn"] for r in rows):
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
    """The table; bad input is one line and exit 2 (an unknown flag, or an override, before any estimate)."""
    p = Parser(
        prog="python -m lra.tools.bench fit",
        usage="%(prog)s [--out PATH] [hydra overrides ...]",
        description="The micro-batch x accumulation every task x attention config would use under the hardware= "
        "memory budget (default v100_16gb), a line per decision on stderr (the first table takes many minutes "
        "on a CPU, YOSO's estimates most of it; cached decisions take none), then the table on stdout.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog="examples:\n"
        "  python -m lra.tools.bench fit [hardware=...] [preset=...] [task=a,b] [attn=x,y] [--out runs/fit/table]\n"
        "  python -m lra.fit task=listops attn=softmax hardware=v100_16gb   # one decision",
    )
    p.add_argument("--out", type=Path, metavar="PATH", help="write PATH.json and PATH.md")
    p.add_overrides("Hydra overrides: hardware=, preset=, task=a,b, attn=x,y, attn.options.<name>=<value>, ...")
    args, unknown = p.parse_known_intermixed_args(argv)
    if unknown:
        p.error(f"unknown argument {unknown[0]!r}")
    overrides = list(args.overrides)
    if not any(a.startswith("hardware=") for a in overrides):
        overrides.append("hardware=v100_16gb")
    picked = {k: a.split("=", 1)[1].split(",") for a in overrides for k in ("task", "attn") if a.startswith(f"{k}=")}
    overrides = [a for a in overrides if not a.startswith(("task=", "attn="))]
    try:
        load(overrides)  # a bad override is one line before hours of estimates
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.getLogger("lra.fit").setLevel(logging.WARNING)  # plan()'s line per decision would repeat the progress
    t0 = time.perf_counter()
    tasks = tuple(picked.get("task", TABLE_TASKS))
    rows = decision_table(overrides, tasks=tasks, attns=picked.get("attn"))
    text = format_table(rows, tasks)
    print(text)
    print(
        f"\n{len(rows)} decisions in {time.perf_counter() - t0:.0f} s "
        f"({', '.join(overrides)}; cell = micro-batch (x accumulation))"
    )
    if args.out:
        write_json(args.out.with_suffix(".json"), rows)
        write_text(args.out.with_suffix(".md"), text + "\n")
    return 0
