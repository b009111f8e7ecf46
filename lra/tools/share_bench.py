"""Aggregate training throughput of k runs sharing one GPU: ``python -m lra.tools.share_bench`` (``make share-bench``).

For each k (default 1, 2, 4, 8) it runs ``python -m lra.tools.sweep grid=gpu_share jobs_per_gpu=k parallel=k
seed=range(0,k)`` (k ListOps Skeinformer runs at once on the first visible GPU, each with 1/k of its
memory) under its own runs root ``<out>/k<k>``, then reads the runs' records: aggregate steps/s =
sum over the k runs of 1000 / time_per_1k_steps_s (they ran side by side), and the sweep's wall time.
``dry_run=true`` prints the commands only. Options: ``ks=1,2,4,8``, ``out=`` (default
``<runs root>/share_bench``; the runs root is ``runs_root=``, else ``$LRA_RUNS``, else the checkout's
``runs/``, as for every run); anything else joins every sweep (``train.max_steps=1000``,
``hardware=h100_80gb``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from lra import REPO_ROOT
from lra.cli import Parser
from lra.devices import GIB
from lra.files import runs_root, write_json
from lra.tools.sweep import Interrupted, Refusal, interruptible, signal_of, switch

OPTIONS = ("ks", "out", "runs_root", "dry_run")  # consumed here; anything else goes to every sweep


def parser() -> Parser:
    """The command line: key=value options (its own, and overrides for every sweep); no flag but --help."""
    p = Parser(
        prog="python -m lra.tools.share_bench",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [ks=1,2,4,8] [out=DIR] [runs_root=DIR] [dry_run=true] [overrides ...]\n"
        "                                                                        (make share-bench ARGS='...')",
        description="Throughput of k runs sharing one GPU: for each k, `python -m lra.tools.sweep grid=gpu_share "
        "jobs_per_gpu=k\nparallel=k seed=range(0,k)` under its own runs root <out>/k<k>, then a table of "
        "aggregate steps/s\n(sum over the k runs), its ratio to the first k, steps/s per run, micro-batch, "
        "peak memory and wall\ntime, also written to <out>/share_bench.json. Needs a GPU (docs/sweeps.md, "
        '"Several runs per GPU").',
        epilog="""key=value options:
  ks=1,2,4,8       the k values to measure
  out=DIR          where the k<k> runs roots and share_bench.json go (default <runs root>/share_bench)
  runs_root=DIR    the runs root (default $LRA_RUNS, else the checkout's runs/)
  dry_run=true     print the sweep commands, run nothing
  key=value        any other override joins every sweep (train.max_steps=1000, hardware=h100_80gb)

examples:
  python -m lra.tools.share_bench dry_run=true
  python -m lra.tools.share_bench ks=1,2,4 train.max_steps=1000
  LRA_RUNS=/scratch/runs python -m lra.tools.share_bench""",
    )
    p.add_overrides("the options below, and overrides for every sweep")
    return p


def commands(ks: list[int], out: Path, extra: list[str]) -> list[tuple[int, dict, list[str]]]:
    return [
        (
            k,
            {"LRA_RUNS": str(out / f"k{k}")},
            [
                sys.executable,
                "-m",
                "lra.tools.sweep",
                "grid=gpu_share",
                f"jobs_per_gpu={k}",
                f"parallel={k}",
                f"seed=range(0,{k})",
                *extra,
            ],
        )
        for k in ks
    ]


def _sweep_manifest(root: Path) -> Path | None:
    """The gpu_share sweep's latest manifest (manifest-<key>.json) under one k's runs root."""
    found = list(Path(root).rglob("sweeps/gpu_share/manifest-*.json"))
    return max(found, key=lambda p: (json.loads(p.read_text()).get("updated") or ""), default=None)


def summarise(k: int, root: Path) -> dict:
    """One k's row from its runs root: runs, finished, aggregate and per-run steps/s, sweep wall time."""
    recs = [json.loads(p.read_text()) for p in sorted(Path(root).rglob("result.json"))]
    rates = [1000.0 / r["time_per_1k_steps_s"] for r in recs if r.get("time_per_1k_steps_s")]
    manifest = _sweep_manifest(root)
    inv = (json.loads(manifest.read_text()).get("invocations") or [{}])[-1] if manifest else {}
    return {
        "k": k,
        "device": next((r["device"] for r in recs if r.get("device")), None),  # jobs_per_gpu=auto reads it
        "runs": len(recs),
        "completed": sum(r.get("status") == "completed" for r in recs),
        "steps_per_s": sum(rates),
        "per_run_steps_per_s": sum(rates) / len(rates) if rates else None,
        "micro_batch": sorted({r.get("micro_batch") for r in recs} - {None}),
        "peak_gib": max((r.get("peak_mem_bytes") or 0) / GIB for r in recs) if recs else None,
        "wall_s": inv.get("wall_s"),
    }


def table(rows: list[dict]) -> str:
    base = rows[0]["steps_per_s"] if rows and rows[0]["steps_per_s"] else None
    lines = [
        "| k | runs done | aggregate steps/s | x k=first | steps/s per run | micro-batch | peak GiB | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = lambda v, d=2: "n/a" if v is None else f"{v:.{d}f}"  # noqa: E731
        lines.append(
            f"| {r['k']} | {r['completed']}/{r['runs']} | {f(r['steps_per_s'])} | "
            f"{f(r['steps_per_s'] / base if base else None)} | {f(r['per_run_steps_per_s'])} | "
            f"{','.join(map(str, r['micro_batch']))} | {f(r['peak_gib'])} | {f(r['wall_s'], 0)} |"
        )
    return "\n".join(lines)


def _refuse(message: str) -> Refusal:
    """Bad input: one line, exit 2, before anything runs."""
    print(f"lra.tools.share_bench: {message}", file=sys.stderr)
    return Refusal(f"lra.tools.share_bench: {message}")


def parse(args: list[str]) -> tuple[list[int], Path, bool, list[str]]:
    """(ks, out folder, dry run, overrides for every sweep) from the command line, or a one-line refusal."""
    opts: dict[str, str] = {}
    extra = []
    for a in args:
        if a.startswith("-"):
            raise _refuse(f"unknown argument {a!r}: options are key=value (python -m lra.tools.share_bench --help)")
        key, _, value = a.partition("=")
        if key in OPTIONS:
            opts[key] = value
        else:
            extra.append(a)
    try:
        ks = [int(k) for k in opts.get("ks", "1,2,4,8").split(",")]
        assert ks and min(ks) >= 1
    except (ValueError, AssertionError):
        raise _refuse(f"ks={opts['ks']}: give whole numbers >= 1, e.g. ks=1,2,4,8") from None
    root = Path(opts["runs_root"]).expanduser().resolve() if opts.get("runs_root") else runs_root()  # as LRA_RUNS
    out = Path(opts["out"]).expanduser() if opts.get("out") else root / "share_bench"
    try:
        dry = switch("dry_run", opts.get("dry_run", "false"))
    except SystemExit as e:
        raise _refuse(str(e.code)) from None
    return ks, out, dry, extra


def run_sweep(cmd: list[str], env: dict) -> int:
    """One k's sweep, waited for. Interrupted, this process forwards the signal (a no-op if the sweep
    had it too: it acts on the first) and waits while the sweep stops its runs and writes its manifest;
    subprocess.run would kill it a quarter of a second after a Ctrl-C."""
    proc = subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT))
    with interruptible():
        try:
            return proc.wait()
        except (KeyboardInterrupt, Interrupted) as e:
            with contextlib.suppress(OSError):
                proc.send_signal(signal_of(e))
            return proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, unknown = p.parse_known_intermixed_args(argv)  # --help: before anything runs or is written
    if unknown:
        p.error(f"unknown argument {unknown[0]!r}: options are key=value")
    ks, out, dry, extra = parse(args.overrides)
    rows = []
    for k, env, cmd in commands(ks, out, extra):
        print(" ".join(f"{n}={shlex.quote(v)}" for n, v in env.items()) + " " + shlex.join(cmd), flush=True)
        if dry:
            continue
        rc = run_sweep(cmd, {**os.environ, **env})
        if rc == 2:  # bad input: the sweep said why; every other k would say the same
            return rc
        if rc in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            print(
                f"lra.tools.share_bench: interrupted at k={k}; the same command again resumes (finished runs are "
                "skipped)",
                file=sys.stderr,
            )
            return rc
        rows.append(summarise(k, out / f"k{k}"))
    if rows:
        print(table(rows))
        write_json(out / "share_bench.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
