"""Sweeps: ``python -m lra.tools.sweep grid=<name> [overrides]`` (``make sweep grid=<name> ARGS='...'``).

A sweep is a file ``conf/sweep/<name>.yaml``: fixed ``overrides``, a ``grid`` of axes (cartesian
product) and the ``launcher`` and ``parallel`` to use; or, with a ``search`` block, an Optuna search
(:mod:`lra.tools.sweep.search`). Command-line overrides join every job; one with several values (``seed=0,1,2``)
replaces that axis or adds one (in a search: adds or replaces a search parameter). ``parallel=N``,
``jobs_per_gpu=k`` (k runs share each GPU: each keeps a smaller profile's fit, or gets 1/k of the card:
:func:`share_plan`), ``dry_run=true`` (the jobs and their estimates), ``budget=<time>`` with ``carry=`` and
``probe=`` (:mod:`lra.tools.sweep.budget`), ``progress=S``, ``n_trials=N`` (searches) and ``hydra/launcher=...``,
``hydra.launcher.*`` steer the sweep itself. docs/sweeps.md has the commands for a laptop, a GPU box
and a SLURM cluster.

Every job is an ordinary run (``python -m lra.train <its overrides>`` in a child process, in the folder a single
run would have), so the collector reads sweeps and single runs alike. How a grid is planned, recorded in its
manifest, launched, watched and resumed, and why it is not ``lra.train -m``: docs/sweeps.md.

The package, one job per module (dependencies point down this list; nothing below ``lra.tools.sweep``
imports it, and a run knows nothing of the sweep that launched it):

- :mod:`~lra.tools.sweep.base`: the shared constants, the one-line :class:`Refusal`, the driver's signal handling;
- :mod:`~lra.tools.sweep.grid`: the grid file, the command line folded into it, the sweep's definition and key,
  and each job's run-folder tag (Hydra's loader itself is :mod:`lra.hydra_glue`, shared with lra.train);
- :mod:`~lra.tools.sweep.share`: the visible GPUs, k runs per GPU and each run's share of its memory;
- :mod:`~lra.tools.sweep.jobs`: one job (the Hydra task function) and the liveness of a run folder;
- :mod:`~lra.tools.sweep.manifest`: the manifest and the one-driver-per-sweep lock (:mod:`lra.runlock`'s flock);
- :mod:`~lra.tools.sweep.progress`: the progress line and its watcher thread;
- :mod:`~lra.tools.sweep.cost` and :mod:`~lra.tools.sweep.budget`: each job's estimate on this device, and a
  sweep against a time budget;
- :mod:`~lra.tools.sweep.driver`: a grid sweep from plan to summary; :mod:`~lra.tools.sweep.wandb_table` its
  W&B ``jobs`` table;
- :mod:`~lra.tools.sweep.search`, :mod:`~lra.tools.sweep.study` and :mod:`~lra.tools.sweep.pruning`: Optuna
  searches (the ``sweep`` extra): their trials, their study, and the callback that prunes a trial from its run;
- :mod:`~lra.tools.sweep.cli`: ``python -m lra.tools.sweep``.
"""

from lra.hydra_glue import Composer
from lra.tools.sweep.base import (
    FINISHED,
    MANIFEST_VERSION,
    MARKER,
    SWEEP_OPTIONS,
    Interrupted,
    Refusal,
    interruptible,
    signal_of,
)
from lra.tools.sweep.driver import run_grid
from lra.tools.sweep.grid import Grid, apply_cli, available_grids, definition, load_grid, sweep_key, switch
from lra.tools.sweep.manifest import Job
from lra.tools.sweep.progress import GridWatch, Progress
from lra.tools.sweep.share import ShareError, check_sharing, gpu_of_slot, job_share, share_plan

__all__ = [
    "FINISHED",
    "MANIFEST_VERSION",
    "MARKER",
    "SWEEP_OPTIONS",
    "Composer",
    "Grid",
    "GridWatch",
    "Interrupted",
    "Job",
    "Progress",
    "Refusal",
    "ShareError",
    "apply_cli",
    "available_grids",
    "check_sharing",
    "definition",
    "gpu_of_slot",
    "interruptible",
    "job_share",
    "load_grid",
    "run_grid",
    "share_plan",
    "signal_of",
    "switch",
    "sweep_key",
]
