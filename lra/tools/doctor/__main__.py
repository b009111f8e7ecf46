"""``python -m lra.tools.doctor`` (``lra-doctor``, ``make doctor``): does the harness work here, how fast, at what cost.

Prints the environment, then one line per item of each check with its status and figure, and writes
report.md and report.json under ``doctor/<time>/`` of the runs root, rewritten after each result. Exit
code 0 when nothing failed (warnings included), 1 when an item failed, 2 for bad input, 130/143 when
stopped by Ctrl-C/SIGTERM (the report then says where).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import torch

import attention
from lra.cli import Parser
from lra.config import ConfigError, load
from lra.files import runs_root
from lra.interrupts import Interrupted, signal_of, sigterm_raises
from lra.tasks import TASK_NAMES
from lra.tools.bench.cli import positive, whole
from lra.tools.bench.tasks import check_names
from lra.tools.doctor import CHECKS, Options, report_folder, run, write_report
from lra.tools.doctor.base import STATUSES
from lra.tools.doctor.env import environment as read_environment

QUICK_BUDGET_S = 120.0  # per check with --quick: the whole doctor stays within minutes on 2 CPU cores


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m lra.tools.doctor",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="checks: backends (every backend's step at each task's shape), fit (memory estimate vs "
        "measured peak),\n  overhead (harness vs a bare loop), compile (compiled vs eager), resume "
        "(SIGKILL and resume),\n  cost (time per 1k steps x the preset's budget)\n\n"
        "examples:\n"
        "  python -m lra.tools.doctor --quick                            # every check at small shapes (CI)\n"
        "  python -m lra.tools.doctor                                    # the paper preset's shapes\n"
        "  python -m lra.tools.doctor --checks overhead resume           # two checks\n"
        "  python -m lra.tools.doctor --checks backends --backends softmax my_pkg.attn:MyAttention\n"
        "  python -m lra.tools.doctor --checks cost --preset skyformer_paper --hardware v100_16gb",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the quick preset's shapes, small repeats, a 120 s budget per check (a few minutes on a CPU)",
    )
    p.add_argument("--checks", nargs="+", choices=CHECKS, metavar="CHECK", help=f"default: all ({', '.join(CHECKS)})")
    p.add_argument(
        "--tasks", nargs="+", choices=TASK_NAMES, metavar="TASK", help=f"default: all ({', '.join(TASK_NAMES)})"
    )
    p.add_argument(
        "--backends",
        nargs="+",
        metavar="NAME",
        help="registered names (default: all, softmax fused and materialized) or module:Class of an "
        "external backend",
    )
    p.add_argument(
        "--preset",
        default="skeinformer_paper",
        help="the preset whose shapes and budget are checked "
        "(conf/preset/; default skeinformer_paper; --quick uses quick)",
    )
    p.add_argument(
        "--hardware",
        default="auto",
        help="the profile the micro-batch is fitted to (conf/hardware/; "
        "default auto: this device's memory, none on a CPU)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument(
        "--budget-s",
        type=positive,
        help="seconds per check before its remaining items are skipped " "(default 600, --quick 120)",
    )
    p.add_argument("--threads", type=whole(1), help="torch CPU threads (default: torch's)")
    p.add_argument("--out", type=Path, help="report folder (default: doctor/<time>/ under the runs root, $LRA_RUNS)")
    return p


def options(args: argparse.Namespace) -> Options:
    """The command line, checked before any work: a bad value is one line (ValueError)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch.cuda.is_available() is False here; use --device cpu")
    external = [b for b in args.backends or () if ":" in b]
    check_names((), [b for b in args.backends or () if b not in external])  # bench's one line: the names there are
    for b in external:
        try:
            attention.load_external(b)
        except Exception as e:  # the user's module: what failed, in one line
            raise ValueError(f"--backends {b}: cannot load it ({type(e).__name__}: {e})") from None
    opts = Options(
        checks=tuple(dict.fromkeys(args.checks or CHECKS)),
        quick=args.quick,
        tasks=tuple(dict.fromkeys(args.tasks or TASK_NAMES)),
        backends=tuple(dict.fromkeys(args.backends or ())),
        preset=args.preset,
        hardware=args.hardware,
        device=device,
        budget_s=args.budget_s or (QUICK_BUDGET_S if args.quick else 600.0),
        threads=args.threads,
    )
    for flag, override in (
        ("--preset", f"preset={opts.shapes_preset}"),
        ("--hardware", f"hardware={opts.hardware}"),
    ):
        try:  # they compose (Hydra's own message would otherwise come mid-check)
            load([override])
        except ConfigError as e:
            raise ValueError(f"{flag} {override.split('=', 1)[1]}: {e}") from None
    return opts


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        opts = options(args)
    except ValueError as e:
        p.error(str(e))
    if opts.threads:
        torch.set_num_threads(opts.threads)
    folder = args.out or report_folder(runs_root())
    folder.mkdir(parents=True, exist_ok=True)
    opts.out = folder
    print(
        f"lra.tools.doctor: {len(opts.checks)} checks ({', '.join(opts.checks)}) on {opts.device}, "
        f"{'quick shapes' if opts.quick else 'preset ' + opts.preset}, up to {opts.budget_s:.0f} s each -> {folder}",
        flush=True,
    )
    results: list = []
    environment = read_environment(opts.device)
    state = {"complete": False, "during": None, "not_run": list(opts.checks), "stopped": None}

    def progress(check: str, finished: bool) -> None:  # the report as it stands, after each result
        state["during"] = None if finished else check
        if check in state["not_run"]:
            state["not_run"].remove(check)
        write_report(folder, environment, results, opts, state)

    write_report(folder, environment, results, opts, state)
    with sigterm_raises() as handled:
        old_int = signal.getsignal(signal.SIGINT)
        try:
            run(
                opts,
                say=lambda line: print(line, flush=True),
                results=results,
                environment=environment,
                progress=progress,
            )
        except (KeyboardInterrupt, Interrupted) as e:  # what was found so far is still worth a report
            if handled:  # a second Ctrl-C or SIGTERM must not cut the report short
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            sig = signal.Signals(signal_of(e))
            state["stopped"] = {signal.SIGINT: "Ctrl-C (SIGINT)"}.get(sig, sig.name)
            write_report(folder, environment, results, opts, state)
            print(
                f"lra.tools.doctor: stopped by {state['stopped']}"
                + (f" during check {state['during']}" if state["during"] else "")
                + f" after {len(results)} results; partial report: {folder / 'report.md'}",
                file=sys.stderr,
                flush=True,
            )
            return 128 + int(sig)
        finally:
            if handled:
                signal.signal(signal.SIGINT, old_int)
    state.update(complete=True, during=None, not_run=[])
    write_report(folder, environment, results, opts, state)
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    print(
        f"lra.tools.doctor: {', '.join(f'{n} {s}' for s, n in counts.items())}; report: {folder / 'report.md'}",
        flush=True,
    )
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
