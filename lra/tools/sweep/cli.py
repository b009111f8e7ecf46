"""``python -m lra.tools.sweep grid=<name> [overrides]`` (``make sweep``): a grid or an Optuna search, the one command.

Flags go through :class:`lra.cli.Parser` (``--help``; an unknown flag is one line, exit 2); everything else
is ``key=value``: the sweep's own options (:data:`lra.tools.sweep.base.SWEEP_OPTIONS`) and Hydra overrides that
join every job. A refusal is one line on stderr and exit code 2 (75: the sweep is in use).
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys

from lra.cli import Parser
from lra.config import ConfigError, renamed_overrides
from lra.tools.sweep.base import Interrupted, Refusal, process_start, signal_of
from lra.tools.sweep.driver import run_grid
from lra.tools.sweep.grid import apply_cli, available_grids, load_grid

USAGE = (
    "python -m lra.tools.sweep grid=<name> [overrides ...] [parallel=N] [dry_run=true] [budget=T [carry=true]] "
    "[n_trials=N] [progress=S]"
)
ABOUT = """Runs every job of conf/sweep/<name>.yaml that is not finished (re-run the same command to resume),
or, for a grid with a search block, an Optuna search up to n_trials (the study's total). Each sweep (the
grid with its overrides) keeps its own manifest: <runs root>/<preset>/sweeps/<name>/manifest-<key>.json.
Ctrl-C or SIGTERM stops the jobs, updates the manifest and prints the command that resumes (exit 130/143).
docs/sweeps.md has the details."""
EPILOG = """options (key=value; any other key=value joins every job, and key=a,b adds or replaces an axis):
  parallel=N            jobs (trials) at a time on this machine
  jobs_per_gpu=k        k jobs share each visible GPU (a smaller profile keeps its fit, else 1/k of the card);
                        auto: the k make share-bench measured fastest on this device
  dry_run=true          the jobs, their run folders and estimates on this device (a search: the study and its
                        space); nothing runs (probe=true: measure the kinds of job not measured yet first)
  budget=T              start, in the grid's order, the jobs expected to finish within T (600, 90s, 10m, 1.5h;
                        at least 15s) and those without an estimate; data and probes (at most T/4) count; at
                        T the runs still training get SIGTERM, SIGKILL 15 s later: the sweep ends by T + 20 s
  carry=true            with budget: also start jobs that cannot finish, to stop at T and carry (lra.tools.carry)
  probe=false           with budget: estimate from measured runs only (no probe)
  progress=S            seconds between progress lines (0: on changes only)
  n_trials=N            a search: the study's total number of trials
  search.<key>=value    a search: edit its search block (search.pruner.name=hyperband); ~search.<key> deletes
  key=interval(a,b)     a search: add a search parameter (also choice(a,b), range(a,b))

examples:
  python -m lra.tools.sweep grid=quick dry_run=true                  # the jobs and their run folders, nothing runs
  python -m lra.tools.sweep grid=quick seed=0,1,2 parallel=2         # an axis from the command line, 2 at a time
  python -m lra.tools.sweep grid=quick dry_run=true probe=true       # what each job will cost here, and the total
  python -m lra.tools.sweep grid=skeinformer_table1 task=listops budget=8m carry=true jobs_per_gpu=5   # a window
  python -m lra.tools.sweep grid=skeinformer_table1 hydra/launcher=slurm hydra.launcher.partition=gpu
  python -m lra.tools.sweep grid=search_quick n_trials=20            # Optuna: 20 trials in all, resumable

grids: {grids}"""


def parser() -> Parser:
    p = Parser(
        prog="python -m lra.tools.sweep",
        usage=USAGE,
        description=ABOUT,
        epilog=EPILOG.format(grids=", ".join(available_grids())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="grid=<name>, the sweep's options, overrides")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_intermixed_args(argv).overrides  # --help exits here: nothing read or written
    if not any(a.startswith("grid=") for a in args):
        p.error("no grid=<name>")
    return command(args, functools.partial(grid_or_search, t0=process_start()))  # a budget counts the imports too


def grid_or_search(grid, opts: dict, hydra_ovs: list[str], t0: float | None = None) -> int:
    """A grid runs through :func:`lra.tools.sweep.driver.run_grid` (``t0``: the command's start); a grid with a
    search block through :func:`lra.tools.sweep.search.run_search` (optuna is the ``sweep`` extra)."""
    if grid.search is None:
        return run_grid(grid, opts, hydra_ovs, t0)
    given = [k for k in ("budget", "carry", "probe") if opts.get(k) not in (None, False)]
    if given:
        raise SystemExit(
            f"lra.tools.sweep: {given[0]}= plans a grid's jobs; grid={grid.name} is an Optuna search: give it n_trials "
            "(and stop it with Ctrl-C or SIGTERM, which it survives: the same command continues the study)"
        )
    try:
        from lra.tools.sweep.search import run_search  # an optional dependency, not a cycle
    except ImportError as e:
        raise SystemExit(
            f"lra.tools.sweep: grid={grid.name} is an Optuna search and {e.name or 'optuna'} is not "
            "installed: pip install -e '.[sweep]' (or -c constraints.txt for the tested versions)"
        )
    return run_search(grid, opts, hydra_ovs)


def refuse_old_spellings(grid) -> None:
    """``experiment=`` / ``semantics=`` in the grid or on the command line: one line naming the new spelling
    (:func:`lra.config.renamed_overrides`), before any job is composed."""
    params = ((grid.search or {}).get("params") or {}).items()
    every = [*grid.overrides.values(), *(x for xs in grid.axes.values() for x in xs), *(f"{k}={v}" for k, v in params)]
    try:
        renamed_overrides(every)
    except ConfigError as e:
        raise SystemExit(f"lra.tools.sweep: {e}") from None


def command(args: list[str], run) -> int:
    """``python -m lra.tools.sweep`` (a grid, or a search: lra.tools.sweep.search) once the flags are checked: the
    grid of ``grid=``, the command line folded in, ``run(grid, opts, hydra_ovs)``. A refusal is one line on stderr
    and exit code 2 (75: the sweep is in use); an interruption before any job started is one line and 130/143."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # optuna's SQLite storage is chatty
    name = [a for a in args if a.startswith("grid=")][-1].split("=", 1)[1]
    grid = None
    try:
        grid = load_grid(name)
        opts, hydra_ovs = apply_cli(grid, args)
        refuse_old_spellings(grid)
        return run(grid, opts, hydra_ovs)
    except Refusal as e:
        print(e, file=sys.stderr)
        raise
    except (KeyboardInterrupt, Interrupted) as e:
        # before any job started (run_grid and run_search say it themselves after); before SystemExit: it is one
        print(
            f"lra.tools.sweep {name}: interrupted by {signal.Signals(signal_of(e)).name} before any job started; "
            f"resume with: {(grid.command if grid else '') or 'the same command'}",
            file=sys.stderr,
        )
        return 128 + signal_of(e)
    except SystemExit as e:
        if isinstance(e.code, str):  # the sweep's one-line refusals: bad input, exit 2 (README)
            print(e.code, file=sys.stderr)
            raise Refusal(e.code) from None
        raise
