"""Aggregate training throughput of k runs sharing one GPU: ``python -m lra.share_bench`` (``make share-bench``).

For each k (default 1, 2, 4, 8) it runs ``python -m lra.sweep grid=gpu_share jobs_per_gpu=k parallel=k
seed=range(0,k)`` (k ListOps Skeinformer runs at once on the first visible GPU, each with 1/k of its
memory) under its own runs root ``<out>/k<k>``, then reads the runs' records: aggregate steps/s =
sum over the k runs of 1000 / time_per_1k_steps_s (they ran side by side), and the sweep's wall time.
``dry_run=true`` prints the commands only. Options: ``ks=1,2,4,8 out=runs/share_bench``; anything else
joins every sweep (``train.max_steps=1000``, ``hardware=h100_80gb``).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from lra import REPO_ROOT
from lra.files import write_json


def commands(ks: list[int], out: Path, extra: list[str]) -> list[tuple[int, dict, list[str]]]:
    return [(k, {"LRA_RUNS": str(out / f"k{k}")},
             [sys.executable, "-m", "lra.sweep", "grid=gpu_share", f"jobs_per_gpu={k}", f"parallel={k}",
              f"seed=range(0,{k})", *extra]) for k in ks]


def summarise(k: int, root: Path) -> dict:
    """One k's row from its runs root: runs, finished, aggregate and per-run steps/s, sweep wall time."""
    recs = [json.loads(p.read_text()) for p in sorted(Path(root).rglob("result.json"))]
    rates = [1000.0 / r["time_per_1k_steps_s"] for r in recs if r.get("time_per_1k_steps_s")]
    manifest = next(Path(root).rglob("sweeps/gpu_share/manifest.json"), None)
    inv = (json.loads(manifest.read_text()).get("invocations") or [{}])[-1] if manifest else {}
    return {"k": k, "runs": len(recs), "completed": sum(r.get("status") == "completed" for r in recs),
            "steps_per_s": sum(rates), "per_run_steps_per_s": sum(rates) / len(rates) if rates else None,
            "micro_batch": sorted({r.get("micro_batch") for r in recs} - {None}),
            "peak_gib": max((r.get("peak_mem_bytes") or 0) / 2 ** 30 for r in recs) if recs else None,
            "wall_s": inv.get("wall_s")}


def table(rows: list[dict]) -> str:
    base = rows[0]["steps_per_s"] if rows and rows[0]["steps_per_s"] else None
    lines = ["| k | runs done | aggregate steps/s | x k=first | steps/s per run | micro-batch | peak GiB | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = lambda v, d=2: "n/a" if v is None else f"{v:.{d}f}"   # noqa: E731
        lines.append(f"| {r['k']} | {r['completed']}/{r['runs']} | {f(r['steps_per_s'])} | "
                     f"{f(r['steps_per_s'] / base if base else None)} | {f(r['per_run_steps_per_s'])} | "
                     f"{','.join(map(str, r['micro_batch']))} | {f(r['peak_gib'])} | {f(r['wall_s'], 0)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = {"ks": "1,2,4,8", "out": str(REPO_ROOT / "runs" / "share_bench"), "dry_run": "false"}
    extra = []
    for a in args:
        key, _, value = a.partition("=")
        if key in opts:
            opts[key] = value
        else:
            extra.append(a)
    try:
        ks = [int(k) for k in opts["ks"].split(",")]
        assert ks and min(ks) >= 1
    except (ValueError, AssertionError):
        raise SystemExit(f"lra.share_bench: ks={opts['ks']}: give whole numbers >= 1, e.g. ks=1,2,4,8") from None
    out = Path(opts["out"])
    dry = opts["dry_run"].lower() in ("1", "true", "yes", "")
    rows = []
    for k, env, cmd in commands(ks, out, extra):
        print(" ".join(f"{n}={shlex.quote(v)}" for n, v in env.items()) + " " + shlex.join(cmd), flush=True)
        if not dry:
            subprocess.run(cmd, env={**os.environ, **env}, cwd=str(REPO_ROOT), check=False)
            rows.append(summarise(k, out / f"k{k}"))
    if rows:
        print(table(rows))
        write_json(out / "share_bench.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
