"""``python -m lra.sweep grid=<name> [overrides]``: a grid (lra.sweep) or an Optuna search (lra.search).

The one place that picks between them, so that lra.search may build on lra.sweep's jobs, manifests and
placement without lra.sweep knowing searches (optuna is the ``sweep`` extra: grids run without it).
"""

from __future__ import annotations

import logging
import sys

from lra.sweep import apply_cli, available_grids, load_grid, run_grid

USAGE = """usage: python -m lra.sweep grid=<name> [overrides ...] [parallel=N] [dry_run=true] [n_trials=N] [progress=S]
                                                                 (make sweep grid=<name> ARGS='...')
Runs every job of conf/sweep/<name>.yaml that is not finished (re-run the same command to resume),
or, for a grid with a search block, an Optuna search. docs/sweeps.md has the details.

examples:
  python -m lra.sweep grid=quick dry_run=true                  # the jobs and their run folders, nothing runs
  python -m lra.sweep grid=quick seed=0,1,2 parallel=2         # an axis from the command line, 2 at a time
  python -m lra.sweep grid=skeinformer_table1 hydra/launcher=slurm hydra.launcher.partition=gpu
  python -m lra.sweep grid=search_quick n_trials=20            # Optuna: 20 trials in all, resumable

grids: {grids}"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)   # optuna's SQLite storage is chatty
    if "-h" in args or "--help" in args:
        print(USAGE.format(grids=", ".join(available_grids())))
        return 0
    flags = [a for a in args if a.startswith("-")]
    grid_arg = [a for a in args if a.startswith("grid=")]
    if flags or not grid_arg:
        what = f"unknown argument {flags[0]!r}" if flags else "no grid=<name>"
        print(f"lra.sweep: {what} (python -m lra.sweep --help lists grids and options)", file=sys.stderr)
        return 2
    grid = load_grid(grid_arg[-1].split("=", 1)[1])
    opts, hydra_ovs = apply_cli(grid, args)
    try:
        if grid.search is not None:
            from lra.search import run_search  # noqa: PLC0415 - optuna is the sweep extra: grids run without it

            return run_search(grid, opts, hydra_ovs)
        return run_grid(grid, opts, hydra_ovs)
    except KeyboardInterrupt:  # Ctrl-C: every job records itself as interrupted; one line here, no traceback
        print(f"lra.sweep: interrupted; run the same command again to resume grid={grid.name}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
