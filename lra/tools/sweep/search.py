"""Hyperparameter searches: ``python -m lra.tools.sweep grid=<search file>`` (``make sweep grid=search_quick``).

A search file (conf/sweep/<name>.yaml) has fixed ``overrides`` and a ``search`` block: ``n_trials``,
``params`` (key -> Hydra sweep syntax: ``choice(..)``, ``range(..)``, ``interval(..)``,
``tag(log, interval(..))``), and optionally ``sampler`` ({name: tpe|random, seed}), ``pruner``
({name: median|percentile|successive_halving|hyperband|threshold|none, ...options}) and ``storage``
(an RDB URL). Optuna drives the study directly, trial by trial:

* the study is persistent: ``<runs root>/<preset>/sweeps/<grid>/optuna.db`` (SQLite), study
  ``<grid>-<preset>-<task>-<attn>-<key>`` (``<key>``: a hash of the search's definition, its fixed
  overrides, space, sampler and pruner: :func:`search_definition`); ``n_trials`` is the study's
  total, so running the same command again only adds the trials still missing (``n_trials=40``: 20 more);
* every trial is an ordinary ``python -m lra.train <fixed> <sampled values>`` process in the run
  folder a plain run with those overrides gets, ``parallel`` at a time, its output in
  ``<sweep folder>/logs/``; the objective is the record's ``best_val_acc`` (result.json), maximised;
* the trial also gets the callback :class:`lra.tools.sweep.pruning.OptunaPruning`
  (``+callbacks.optuna_pruning.*``), which reports val/acc after every validation and stops a trial the
  pruner gives up on (PRUNED), and says in the trial's record which trial it is:
  ``search: {study, trial, grid, params, objective}``;
* a trial left RUNNING by a killed driver is marked FAIL (user attribute ``interrupted``; it does not
  count towards ``n_trials``) and its parameters are enqueued again: the new trial runs in the same
  run folder, where lra.train resumes from the last checkpoint, so no training is lost. (Re-queued,
  not only failed: a FAIL alone would throw that work away and make the sampler avoid a point for
  no reason of its own.) SIGINT or SIGTERM to the driver does the same at once: the trials get the
  signal (or had it already), their trials are re-queued, the manifest is written and one line says
  how to resume (exit 130/143).

The study's bookkeeping (the space, opening it, telling it each ending, re-queuing) is
:mod:`lra.tools.sweep.study`; this module reads the search file and runs the trials.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from lra import REPO_ROOT
from lra.devices import MEMORY_LIMIT_ENV
from lra.files import write_json
from lra.hydra_glue import Composer
from lra.tools.sweep.base import MARKER, STOP_GRACE_S, Interrupted, interruptible, signal_of
from lra.tools.sweep.driver import fmt_counts
from lra.tools.sweep.grid import LAUNCH_ONLY, Grid, canonical, quote, sweep_key, with_run_tag
from lra.tools.sweep.jobs import now_iso, read_json, run_status
from lra.tools.sweep.manifest import read_manifest, rel_path, sweep_lock
from lra.tools.sweep.progress import Progress
from lra.tools.sweep.pruning import OptunaPruning, check_storage, make_pruner, storage_for
from lra.tools.sweep.share import (
    ShareError,
    check_sharing,
    describe,
    device_total_gib,
    gpu_of_slot,
    hw_of,
    job_share,
    not_reported,
    visible_gpus,
)
from lra.tools.sweep.study import (
    DEFAULT_PRUNER,
    Search,
    counted,
    finish,
    open_study,
    param_overrides,
    parse_space,
    recover,
    settle,
    write_manifest,
)

log = logging.getLogger("lra.search")


SEARCH_KEYS = ("n_trials", "params", "sampler", "pruner", "storage")


# ----------------------------------------------------------------------------- running trials
class ProcessRunner:
    """Starts a trial's lra.train process; its output goes to a log file, not the driver's console."""

    def start(self, cmd: list[str], env: dict, log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            return subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT), stdout=out, stderr=subprocess.STDOUT)


@dataclass
class Active:
    number: int
    run_dir: Path
    proc: object  # Popen-like: poll(), send_signal(), wait(), pid
    t_start: float
    slot: int = 0  # 0 <= slot < parallel: which GPU(s) it holds


def trial_command(s: Search, number: int, params: dict, run_dir: Path, extra: list[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lra.train",
        *s.fixed,
        *param_overrides(params),
        *s.hydra_ovs,
        *extra,
        *pruning_callback(s, number, params),
        f"hydra.run.dir={quote(run_dir)}",
    ]


def pruning_callback(s: Search, number: int, params: dict | None = None) -> list[str]:
    """The trial's :class:`lra.tools.sweep.pruning.OptunaPruning`, given to the run as any user callback is
    (``callbacks.<name>._target_``): the run knows nothing of searches. ``params`` (the sampled values) go as
    JSON: a key such as ``++attn.options.k`` is no Hydra dict key."""
    node = "+callbacks.optuna_pruning"
    return [
        f"{node}._target_={OptunaPruning.__module__}.{OptunaPruning.__name__}",
        f"{node}.storage={quote(s.storage)}",
        f"{node}.study_name={quote(s.name)}",
        f"{node}.trial_number={number}",
        *([f"{node}.grid={quote(s.grid)}"] if s.grid else []),
        f"{node}.params={quote(json.dumps(dict(params or {}), default=str))}",
    ]


def _mark(run_dir: Path, **update) -> None:
    """The run folder's ``.sweep_job.json`` (as grid jobs have): who runs it, so a second driver waits."""
    info = read_json(run_dir / MARKER) or {}
    if "pid" in update:
        info["attempts"] = int(info.get("attempts", 0)) + 1
    info.update(update)
    write_json(run_dir / MARKER, info)


def drive(
    s: Search,
    study: optuna.Study,
    runner=None,
    progress: Progress | None = None,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.time,
) -> None:
    """Ask, launch, wait, tell, until the study holds ``s.target`` trials (or none can start)."""
    runner = runner or ProcessRunner()
    active: list[Active] = []
    deferred: list[tuple] = []  # (trial, run dir) asked while its folder is busy (a killed driver's orphan)
    durations: list[float] = []
    failed = 0

    def busy(run_dir: Path) -> bool:
        return run_dir in {a.run_dir for a in active} or run_status(run_dir)[0] == "running"

    def launch(trial, run_dir: Path) -> None:
        ovs = s.fixed + param_overrides(trial.params)
        run_dir.mkdir(parents=True, exist_ok=True)
        slot = min(set(range(s.parallel)) - {a.slot for a in active})  # the slot a finished trial freed
        place, extra = trial_placement(s, slot)
        cmd = trial_command(s, trial.number, trial.params, run_dir, extra)
        log.info("trial %d: %s -> %s", trial.number, " ".join(param_overrides(trial.params)), rel_path(run_dir, s.root))
        env = {**os.environ, **place}
        proc = runner.start(cmd, env, s.folder / "logs" / f"{s.tag or 'trial'}-{trial.number}.log")
        _mark(
            run_dir,
            host=socket.gethostname(),
            pid=proc.pid,
            started=now_iso(),
            t_start=clock(),
            finished=None,
            t_end=None,
            returncode=None,
            trial=trial.number,
            study=s.name,
            overrides=ovs,
        )
        active.append(Active(trial.number, run_dir, proc, clock(), slot))
        s.started.append(trial.number)

    try:
        while True:
            while len(active) < s.parallel:
                ready = next((d for d in deferred if not busy(d[1])), None)
                if ready is not None:
                    deferred.remove(ready)
                    launch(*ready)
                elif s.target > len(counted(study)) and len(deferred) < s.parallel:
                    trial = study.ask(s.space)  # a re-queued trial (WAITING) comes first
                    run_dir = s.job_dir(s.fixed + param_overrides(trial.params))
                    if busy(run_dir):
                        deferred.append((trial, run_dir))
                    else:
                        launch(trial, run_dir)
                else:
                    break
            if not active and not deferred:
                break
            if progress is not None:
                now = clock()
                progress.update(
                    done=len(durations),
                    running=len(active),
                    failed=failed,
                    pending=max(s.target - len(counted(study)), 0) + len(deferred),
                    durations=durations,
                    running_elapsed=[now - a.t_start for a in active],
                )
            for a in list(active):
                rc = a.proc.poll()
                if rc is None:
                    continue
                active.remove(a)
                _mark(a.run_dir, finished=now_iso(), t_end=clock(), returncode=rc)
                state = finish(study, a.number, a.run_dir, rc)
                log.info("trial %d: %s", a.number, state.name)
                if state == TrialState.FAIL:
                    failed += 1
                else:
                    durations.append(clock() - a.t_start)
                if progress is not None and not active and not deferred and s.target <= len(counted(study)):
                    progress.update(done=len(durations), running=0, failed=failed, pending=0, durations=durations)
            time.sleep(poll_s)
    except BaseException as e:  # Ctrl-C / SIGTERM: each trial writes its "interrupted" record; re-run resumes
        interrupted = isinstance(e, (KeyboardInterrupt, Interrupted))
        stop_trials(
            active,
            signal_of(e) if interrupted else signal.SIGTERM,
            grace_s=STOP_GRACE_S if interrupted else 0.0,
            clock=clock,
        )
        if interrupted:  # the study says so now, not at the next start: the manifest stays true
            for a in active:
                _mark(a.run_dir, finished=now_iso(), t_end=clock(), returncode=a.proc.poll())
            settle(study, {a.number: (a.run_dir, a.proc.poll()) for a in active}, [t.number for t, _ in deferred])
        raise


def stop_trials(
    active: list[Active], signum: int, grace_s: float, wait_s: float = 60.0, clock=time.time, poll_s: float = 0.2
) -> None:
    """The running trials end: ``grace_s`` to end on the signal they got with the driver (a Ctrl-C reaches
    the process group; a second one while lra.train writes its record is what the grace avoids), then
    ``signum`` to the rest, and up to ``wait_s`` for them."""

    def running():
        return [a for a in active if a.proc.poll() is None]

    deadline = clock() + grace_s
    while running() and clock() < deadline:
        time.sleep(poll_s)
    for a in running():
        with contextlib.suppress(Exception):
            a.proc.send_signal(signum)
    for a in active:
        with contextlib.suppress(Exception):
            a.proc.wait(timeout=wait_s)


def trial_placement(s: Search, slot: int) -> tuple[dict, list[str]]:
    """(environment, extra overrides) of the trial in ``slot``: its own share of the visible GPUs (when there
    are enough), or with jobs_per_gpu=k GPU slot // k and 1/k of its memory, as a grid job (share.job_share)."""
    if not s.jobs_per_gpu:
        visible, n = visible_gpus(), s.parallel
        per = len(visible) // n if n > 1 else 0
        return ({"CUDA_VISIBLE_DEVICES": ",".join(visible[slot * per : (slot + 1) * per])} if per else {}), []
    gpu = gpu_of_slot(slot, s.jobs_per_gpu, s.gpus)
    share = job_share(s.hw, s.jobs_per_gpu, gpu, total_of=device_total_gib)
    if share is None:
        raise not_reported(gpu, s.hw, s.jobs_per_gpu)
    return (
        {"CUDA_VISIBLE_DEVICES": gpu, MEMORY_LIMIT_ENV: f"{share['limit_gib']:.6f}"},
        [f"hardware.total_gib={share['total_gib']}"],
    )


# ----------------------------------------------------------------------------- entry
def prepare(grid: Grid, opts: dict, hydra_ovs: list[str], composer: Composer) -> Search:
    spec = dict(grid.search or {})
    unknown = set(spec) - set(SEARCH_KEYS)
    if unknown:
        raise SystemExit(
            f"lra.tools.sweep: conf/sweep/{grid.name}.yaml search has unknown keys {sorted(unknown)}; "
            f"allowed: {', '.join(SEARCH_KEYS)}"
        )
    if grid.axes:
        raise SystemExit(
            f"lra.tools.sweep: a search fixes task/attn/seed in `overrides` (one study per search file); "
            f"got the grid axes {sorted(grid.axes)}"
        )
    for o in hydra_ovs:
        if o.startswith(("hydra/launcher=", "hydra.launcher.")) and o != "hydra/launcher=basic":
            raise SystemExit(
                f"lra.tools.sweep: {o!r}: a search runs its trials as processes on this machine "
                "(parallel=N at a time); launchers apply to grids"
            )
    hydra_ovs = [o for o in hydra_ovs if not o.startswith(("hydra/launcher=", "hydra.launcher."))]
    space = parse_space(spec.get("params"))
    fixed = list(grid.overrides.values())
    try:
        primary = composer.primary(hydra_ovs + fixed)
    except Exception as e:  # Hydra's own message, cut to its first line
        raise SystemExit(
            f"lra.tools.sweep: the search's overrides do not compose ({type(e).__name__}: "
            f"{str(e).splitlines()[0]}); check `overrides` of conf/sweep/{grid.name}.yaml and the "
            "command line"
        )
    root = Path(str(primary.runs_root))
    preset, task, attn = str(primary.preset), str(primary.task.name), str(primary.attn.label)

    def job_dir(ovs: list[str]) -> Path:
        return composer.job(primary, with_run_tag(hydra_ovs + ovs))[1]

    # one sampled point composes (bad fixed overrides or keys stop here, before any trial)
    probe = {k: (d.choices[0] if isinstance(d, CategoricalDistribution) else d.low) for k, d in space.items()}
    try:
        job_dir(fixed + param_overrides(probe))
    except Exception as e:  # told in one line
        raise SystemExit(
            f"lra.tools.sweep: the search's runs do not compose ({type(e).__name__}: "
            f"{str(e).splitlines()[0]}); check `overrides` and search.params of conf/sweep/{grid.name}.yaml"
        )
    folder = root / preset / "sweeps" / grid.name
    storage = str(spec.get("storage") or f"sqlite:///{folder / 'optuna.db'}")
    target = int(opts["n_trials"] if opts["n_trials"] is not None else spec.get("n_trials", 20))
    if target < 1:
        raise SystemExit(f"lra.tools.sweep: n_trials={target}: give at least 1 (the study's total)")
    pruner = dict(spec["pruner"]) if spec.get("pruner") is not None else dict(DEFAULT_PRUNER)
    try:
        make_pruner(pruner)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"lra.tools.sweep: search.pruner={pruner}: {e}")
    k = opts.get("jobs_per_gpu") or grid.jobs_per_gpu
    gpus = visible_gpus() if k else []
    parallel = int(opts["parallel"] or (k * len(gpus) if k and gpus else grid.parallel))
    hw = hw_of(primary)
    if k:  # what a grid checks; the same one line before any trial
        try:
            check_sharing(k, parallel, gpus, "local")
            job_share(hw, k, gpus[0])
        except ShareError as e:
            raise SystemExit(f"lra.tools.sweep: {e}") from None
    sampler = dict(spec.get("sampler") or {"name": "tpe", "seed": 0})
    defn = search_definition(grid.name, fixed, space, sampler, pruner, hydra_ovs)
    key = sweep_key(defn)
    return Search(
        name=f"{grid.name}-{preset}-{task}-{attn}-{key}",
        storage=storage,
        folder=folder,
        root=root,
        space=space,
        fixed=fixed,
        target=target,
        parallel=parallel,
        jobs_per_gpu=k,
        gpus=gpus,
        hw=hw,
        job_dir=job_dir,
        hydra_ovs=hydra_ovs,
        sampler=sampler,
        pruner=pruner,
        tag=f"{task}-{attn}-{key}",
        key=key,
        definition=defn,
        command=grid.command,
        grid=grid.name,
    )


def search_definition(
    grid: str, fixed: list[str], space: dict, sampler: dict, pruner: dict, hydra_ovs: list[str]
) -> dict:
    """What a search is, whatever the spelling (lra.tools.sweep.definition for searches): the fixed overrides
    with canonical values, the space as Optuna distributions, the sampler and the pruner. Left out:
    ``n_trials`` (the same study, grown), parallel, jobs_per_gpu and the storage (where, not what)."""
    return {
        "kind": "search",
        "grid": grid,
        "fixed": dict(sorted(canonical(o) for o in fixed)),
        "space": {k: repr(space[k]) for k in sorted(space)},
        "sampler": sampler,
        "pruner": pruner,
        "hydra": sorted(o for o in hydra_ovs if not o.lstrip("+~").startswith(LAUNCH_ONLY)),
    }


def _fmt_trial_share(s: Search) -> str:
    share = job_share(s.hw, s.jobs_per_gpu, s.gpus[0])
    return (
        f" ({describe(share, s.jobs_per_gpu)}: hardware.total_gib={share['total_gib']:g}, fit budget "
        f"{share['budget_gib']:.2f} GiB each)"
        if share
        else f" (GPU {s.gpus[0]} did not report its memory here; each trial reads it at run time)"
    )


def run_search(grid: Grid, opts: dict, hydra_ovs: list[str]) -> int:
    t0, started = time.time(), now_iso()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with interruptible(), Composer() as composer:
        s = prepare(grid, opts, hydra_ovs, composer)
        if opts["dry_run"]:
            _print_plan(s, grid)
            return 0
        s.folder.mkdir(parents=True, exist_ok=True)
        with sweep_lock(s.folder):
            read_manifest(s.manifest)  # a damaged one is kept aside now, with its line, not after the trials
            study = open_study(s)
            requeued = recover(study)
            have = len(counted(study))
            print(
                f"lra.tools.sweep {grid.name}: study {s.name} ({s.storage}): {have}/{s.target} trials"
                + (f", {len(requeued)} interrupted trial(s) re-queued ({requeued})" if requeued else "")
                + (
                    f"; running {s.target - have} more, {s.parallel} at a time"
                    if have < s.target
                    else "; nothing to do"
                ),
                flush=True,
            )
            progress = Progress(
                label=f"lra.tools.sweep {grid.name}",
                parallel=s.parallel,
                every_s=30.0 if opts.get("progress") is None else float(opts["progress"]),
            )
            stopped = None
            try:
                drive(s, study, progress=progress)
            except (KeyboardInterrupt, Interrupted) as e:  # SIGINT, SIGTERM: drive re-queued the running trials
                stopped = signal_of(e)
            finally:
                body = write_manifest(
                    study,
                    s,
                    {
                        "started": started,
                        "wall_s": round(time.time() - t0, 1),
                        "launched": len(s.started),
                        "command": s.command,
                        **({"interrupted": signal.Signals(stopped).name} if stopped else {}),
                    },
                )
    states: dict[str, int] = {}
    for t in body["trials"]:
        states[t["state"]] = states.get(t["state"], 0) + 1
    if stopped:
        left = max(s.target - len(counted(study)), 0)
        print(
            f"lra.tools.sweep {grid.name}: interrupted by {signal.Signals(stopped).name}: {len(body['trials'])} trials "
            f"({fmt_counts(states)}), {left} of {s.target} to go; resume with: {s.command or 'the same command'}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stopped
    print(
        f"\nlra.tools.sweep {grid.name}: {len(body['trials'])} trials ({fmt_counts(states)}) "
        f"in {time.time() - t0:.0f} s"
    )
    if body["best"]:
        b = body["best"]
        print(f"best: trial {b['number']} val acc {b['value']:.4f} with {b['params']}")
    print(f"manifest: {s.manifest}")
    done = sum(t["state"] in ("COMPLETE", "PRUNED") for t in body["trials"])
    return 0 if done >= s.target else 1


def _print_plan(s: Search, grid: Grid) -> None:
    """dry_run=true: the study and its trials so far, nothing written."""
    n = 0
    db = s.storage[len("sqlite:///") :] if s.storage.startswith("sqlite:///") else None
    if db is None or Path(db).exists():  # reading a missing SQLite file would create it
        check_storage(s.storage)
        with contextlib.suppress(KeyError):
            n = len(counted(optuna.load_study(study_name=s.name, storage=storage_for(s.storage))))
    print(
        f"search {grid.name}: study {s.name} in {s.storage}; {n} trials so far, target {s.target}, "
        f"{s.parallel} at a time"
        + (f", {s.jobs_per_gpu} per GPU on GPUs {','.join(s.gpus)}" + _fmt_trial_share(s) if s.jobs_per_gpu else "")
        + f"; fixed {' '.join(s.fixed)}; space "
        + ", ".join(f"{k}: {v!r}" for k, v in s.space.items())
        + f"; pruner {s.pruner}; manifest {s.manifest}"
    )
