"""``python -m lra.sweep grid=<name> [overrides]``: a grid (lra.sweep) or an Optuna search (lra.search).

The one place that picks between them, so that lra.search may build on lra.sweep's jobs, manifests and
placement without lra.sweep knowing searches (optuna is the ``sweep`` extra: grids run without it).
"""

from __future__ import annotations

import sys

from lra.sweep import available_grids, command, run_grid

USAGE = """usage: python -m lra.sweep grid=<name> [overrides ...] [parallel=N] [dry_run=true] [n_trials=N] [progress=S]
                                                                 (make sweep grid=<name> ARGS='...')
Runs every job of conf/sweep/<name>.yaml that is not finished (re-run the same command to resume),
or, for a grid with a search block, an Optuna search. Each sweep (the grid with its overrides) keeps
its own manifest: <runs root>/<preset>/sweeps/<name>/manifest-<key>.json. Ctrl-C or SIGTERM stops the
jobs, updates the manifest and prints the command that resumes (exit 130/143). docs/sweeps.md has the
details.

examples:
  python -m lra.sweep grid=quick dry_run=true                  # the jobs and their run folders, nothing runs
  python -m lra.sweep grid=quick seed=0,1,2 parallel=2         # an axis from the command line, 2 at a time
  python -m lra.sweep grid=skeinformer_table1 hydra/launcher=slurm hydra.launcher.partition=gpu
  python -m lra.sweep grid=search_quick n_trials=20            # Optuna: 20 trials in all, resumable

grids: {grids}"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:   # before anything else: no logging set up, nothing read or written
        print(USAGE.format(grids=", ".join(available_grids())))
        return 0
    flags = [a for a in args if a.startswith("-")]
    if flags or not any(a.startswith("grid=") for a in args):
        what = f"unknown argument {flags[0]!r}" if flags else "no grid=<name>"
        print(f"lra.sweep: {what} (python -m lra.sweep --help lists grids and options)", file=sys.stderr)
        return 2
    return command(args, _grid_or_search)


def _grid_or_search(grid, opts: dict, hydra_ovs: list[str]) -> int:
    if grid.search is None:
        return run_grid(grid, opts, hydra_ovs)
    try:
        from lra.search import run_search  # noqa: PLC0415 - optuna is the sweep extra: grids run without it
    except ImportError as e:
        raise SystemExit(f"lra.sweep: grid={grid.name} is an Optuna search and {e.name or 'optuna'} is not "
                         "installed: pip install -e '.[sweep]' (or -c constraints.txt for the tested versions)")
    return run_search(grid, opts, hydra_ovs)


if __name__ == "__main__":
    sys.exit(main())
