"""Sweeps: ``python -m lra.sweep grid=<name> [overrides]`` (``make sweep grid=<name> ARGS='...'``).

A sweep is a file ``conf/sweep/<name>.yaml``: fixed ``overrides``, a ``grid`` of axes (cartesian
product) and the ``launcher`` and ``parallel`` to use; or, with a ``search`` block, an Optuna search
(:mod:`lra.sweep.search`). Command-line overrides join every job; one with several values (``seed=0,1,2``)
replaces that axis or adds one (in a search: adds or replaces a search parameter). ``parallel=N``,
``jobs_per_gpu=k`` (k runs share each GPU, each with 1/k of its memory: :func:`share_plan`),
``dry_run=true``, ``progress=S``, ``n_trials=N`` (searches) and ``hydra/launcher=...``,
``hydra.launcher.*`` steer the sweep itself. docs/sweeps.md has the commands for a laptop, a GPU box
and a SLURM cluster.

Every job is an ordinary run: ``python -m lra.train <its overrides>``, in the run folder Hydra names
(``runs/<preset>/<task>/<attn>/seed<seed>[/<other overrides>]``), so the collector reads sweeps and
single runs alike. A grid is:

1. expanded and composed job by job with Hydra (the run folder of each; two jobs that would share a
   folder stop the sweep before anything runs);
2. written to ``<runs root>/<preset>/sweeps/<name>/manifest-<key>.json`` with each job's status read
   from its run folder: ``completed``/``stopped_early``/``stuck`` (finished: skipped), ``running`` (a
   live job holds it: skipped), ``failed``, ``interrupted`` (a job started there and died: launched,
   and lra.train resumes it from its last checkpoint), ``pending``, ``invalid`` (does not compose).
   ``<key>`` is a short hash of the sweep's definition (:func:`definition`: its jobs' overrides with
   the values as Hydra reads them, order-free), so two sweeps of one grid with other overrides keep
   their own manifests and the same command again finds its own (:func:`find_manifest`);
3. launched as one Hydra multirun of the unfinished jobs through the chosen launcher (Hydra's
   ``basic``, ``local`` = submitit_local, ``slurm`` = submitit_slurm; conf/hydra/launcher/), in
   batches of ``parallel`` on one machine, as one job array on SLURM;
4. watched while the launcher blocks (a progress line with an ETA, :class:`GridWatch`), and
   summarised (and the manifest updated) when it returns. SIGINT or SIGTERM to the driver
   (:func:`interruptible`) stops the jobs (:func:`stop_jobs`), re-reads every job's status from its
   folder, writes the manifest and says so in one line with the command that resumes (exit 130/143).

Run the same command again and it finishes where it stopped. Why not ``python -m lra.train -m``
with the basic sweeper: that can only launch cartesian products, not "the jobs still to do", and
Lightning's DDP re-executes ``sys.argv`` for every extra device, which must be a single run. So the
multirun is driven from here with Hydra's own launchers and config loader, and each job runs
lra.train in a child process (:func:`lra.sweep.jobs.run_job`).

The package, one job per module (dependencies point down this list; nothing below ``lra.sweep``
imports it, and a run knows nothing of the sweep that launched it):

- :mod:`~lra.sweep.base`: the shared constants, the one-line :class:`Refusal`, the driver's signal handling;
- :mod:`~lra.sweep.grid`: the grid file, the command line folded into it, the sweep's definition and key,
  and each job's run-folder tag (Hydra's loader itself is :mod:`lra.hydra_glue`, shared with lra.train);
- :mod:`~lra.sweep.share`: the visible GPUs, k runs per GPU and each run's share of its memory;
- :mod:`~lra.sweep.jobs`: one job (the Hydra task function) and the liveness of a run folder;
- :mod:`~lra.sweep.manifest`: the manifest and the one-driver-per-sweep lock (:mod:`lra.runlock`'s flock);
- :mod:`~lra.sweep.progress`: the progress line and its watcher thread;
- :mod:`~lra.sweep.driver`: a grid sweep from plan to summary;
- :mod:`~lra.sweep.search` and :mod:`~lra.sweep.pruning`: Optuna searches (the ``sweep`` extra) and the
  callback that prunes a trial from inside its run;
- :mod:`~lra.sweep.cli`: ``python -m lra.sweep``.
"""

from lra.hydra_glue import Composer
from lra.sweep.base import (
    FINISHED,
    LEGACY_MANIFEST,
    MANIFEST_VERSION,
    MARKER,
    SWEEP_OPTIONS,
    Interrupted,
    Refusal,
    interruptible,
    signal_of,
)
from lra.sweep.driver import run_grid
from lra.sweep.grid import Grid, apply_cli, available_grids, definition, load_grid, sweep_key, switch
from lra.sweep.manifest import Job
from lra.sweep.progress import GridWatch, Progress
from lra.sweep.share import ShareError, check_sharing, gpu_of_slot, job_share, share_plan

__all__ = [
    "FINISHED",
    "LEGACY_MANIFEST",
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
