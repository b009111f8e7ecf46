"""Hyperparameter searches: ``python -m lra.tools.sweep grid=<search file>`` (``make sweep grid=search_quick``).

A search file (conf/sweep/<name>.yaml) has fixed ``overrides`` and a ``search`` block: ``n_trials``,
``params`` (key -> Hydra sweep syntax: ``choice(..)``, ``range(..)``, ``interval(..)``,
``tag(log, interval(..))``), and optionally ``sampler`` ({name: tpe|random, seed}), ``pruner``
({name: median|percentile|successive_halving|hyperband|threshold|none, ...options}) and ``storage``
(an RDB URL). Optuna drives the study directly, trial by trial:

* the study is persistent: ``<runs root>/<preset>/sweeps/<grid>/optuna.db`` (SQLite), study
  ``<grid>-<preset>-<task>-<attn>-<key>`` (``<key>``: a hash of the search's definition, its fixed
  overrides, space, sampler and pruner: :func:`search_definition`; a study named without the key by an
  earlier version is continued when its fixed overrides are these); ``n_trials`` is the study's
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
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from lra import REPO_ROOT
from lra.devices import MEMORY_LIMIT_ENV
from lra.files import write_json
from lra.hydra_glue import Composer
from lra.tools.sweep.base import FINISHED, MANIFEST_VERSION, MARKER, STOP_GRACE_S, Interrupted, interruptible, signal_of
from lra.tools.sweep.driver import fmt_counts
from lra.tools.sweep.grid import LAUNCH_ONLY, Grid, canonical, override_parser, quote, sweep_key, with_run_tag
from lra.tools.sweep.jobs import now_iso, read_json, run_status
from lra.tools.sweep.manifest import read_manifest, rel_path, sweep_lock
from lra.tools.sweep.progress import Progress
from lra.tools.sweep.pruning import OBJECTIVE, OptunaPruning, check_storage, make_pruner, pruned_info, storage_for
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

log = logging.getLogger("lra.search")


SEARCH_KEYS = ("n_trials", "params", "sampler", "pruner", "storage")
DEFAULT_PRUNER = {"name": "median", "n_startup_trials": 3, "n_warmup_steps": 0}
SAMPLERS = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}


# ----------------------------------------------------------------------------- the space
def parse_space(params: dict) -> dict[str, optuna.distributions.BaseDistribution]:
    """Hydra's sweep syntax -> Optuna distributions (the key, ``++`` included, names the parameter)."""
    space = {}
    for key, spec in (params or {}).items():
        try:
            ov = override_parser().parse_override(f"{key}={spec}")
        except Exception as e:  # Hydra's grammar error, told in one line
            raise SystemExit(
                f"lra.tools.sweep: search.params.{key}={spec!r} does not parse ({str(e).splitlines()[0]}); "
                "use choice(a,b), range(lo,hi,step=s), interval(lo,hi) or tag(log, interval(lo,hi))"
            )
        sweep = ov.value()
        kind = type(sweep).__name__
        if kind == "ChoiceSweep":
            space[key] = CategoricalDistribution(list(sweep.list))
        elif kind == "RangeSweep":
            values = list(ov.sweep_iterator())
            if not values:
                raise SystemExit(f"lra.tools.sweep: search.params.{key}={spec!r} is an empty range")
            if all(isinstance(v, int) for v in values):
                space[key] = IntDistribution(values[0], values[-1], step=int(sweep.step or 1))
            else:
                space[key] = CategoricalDistribution(values)
        elif kind == "IntervalSweep":
            space[key] = FloatDistribution(float(sweep.start), float(sweep.end), log="log" in sweep.tags)
        else:
            raise SystemExit(
                f"lra.tools.sweep: search.params.{key}={spec!r} is one value, not a range to search; "
                "put fixed values in `overrides`"
            )
    if not space:
        raise SystemExit(
            "lra.tools.sweep: the search has no params; add search.params (e.g. train.lr: "
            "tag(log, interval(1e-5, 3e-3)))"
        )
    return space


def param_overrides(params: dict) -> list[str]:
    return [f"{k}={v}" for k, v in params.items()]


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


@dataclass
class Search:
    """One study and the plumbing around it (what :func:`drive` needs, built by :func:`prepare`)."""

    name: str
    storage: str
    folder: Path
    root: Path
    space: dict
    fixed: list[str]
    target: int
    parallel: int
    job_dir: Callable[[list[str]], Path]  # overrides -> the run folder lra.train will use
    hydra_ovs: list[str] = field(default_factory=list)
    sampler: dict = field(default_factory=dict)
    pruner: dict = field(default_factory=lambda: dict(DEFAULT_PRUNER))
    tag: str = ""
    jobs_per_gpu: int | None = None  # k trials share each GPU of ``gpus`` (lra.tools.sweep's jobs_per_gpu)
    gpus: list[str] = field(default_factory=list)
    hw: dict = field(default_factory=dict)  # the trials' hardware profile (their share is computed from it)
    legacy_name: str | None = None  # the study's name before keys (continued when its fixed overrides match)
    key: str = ""  # lra.tools.sweep.sweep_key of ``definition``: in the study's and manifest's names
    started: list[int] = field(default_factory=list)  # trials this driver launched (the invocation's count)
    definition: dict = field(default_factory=dict)
    command: str = ""  # the lra.tools.sweep command line (the resume line)
    grid: str = ""  # the search file (conf/sweep/<grid>.yaml), for the trials' records

    @property
    def manifest(self) -> Path:
        return self.folder / (f"manifest-{self.tag}.json" if self.tag else "manifest.json")


def adopt_legacy(s: Search, storage) -> None:
    """A study an earlier version named without the key (``<grid>-<preset>-<task>-<attn>``) is this
    search's when no keyed one exists and it was run with the same fixed overrides: go on with it."""
    if not s.legacy_name:
        return
    names = set(optuna.get_all_study_names(storage))
    if s.name in names or s.legacy_name not in names:
        return
    old = optuna.load_study(study_name=s.legacy_name, storage=storage)
    if old.user_attrs.get("fixed_overrides") == list(s.fixed):
        log.info("continuing study %s (named before studies had a key)", s.legacy_name)
        s.name = s.legacy_name


def open_study(s: Search) -> optuna.Study:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        check_storage(s.storage)
        storage = storage_for(s.storage)
        adopt_legacy(s, storage)
        study = optuna.create_study(study_name=s.name, storage=storage, direction="maximize", load_if_exists=True)
        n = len(study.trials)
        spec = dict(s.sampler or {})
        name = str(spec.pop("name", "tpe"))
        if name not in SAMPLERS:
            raise SystemExit(f"lra.tools.sweep: search.sampler.name={name!r}: allowed {', '.join(SAMPLERS)}")
        if spec.get("seed") is not None:  # a continued study must not replay the first invocation's draws
            spec["seed"] = int(spec["seed"]) + n
        study.sampler = SAMPLERS[name](**spec)
        study.pruner = make_pruner(s.pruner)
        study.set_user_attr("pruner", dict(s.pruner or {"name": "none"}))  # the trial process rebuilds it
        study.set_user_attr("fixed_overrides", list(s.fixed))
    return study


def recover(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a killed driver (the sweep lock says no driver is live): FAIL, marked
    ``interrupted``, and their parameters enqueued again (the same run folder: lra.train resumes it)."""
    storage = study._storage  # the study's own storage object (public API on it)
    sid = storage.get_study_id_from_name(study.study_name)
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        requeue(study, t, storage.get_trial_id_from_study_id_trial_number(sid, t.number))
        out.append(t.number)
    return out


def requeue(study: optuna.Study, trial, tid: int, status: str | None = None) -> None:
    """An interrupted trial: FAIL, marked ``interrupted`` (it does not count), its parameters enqueued again."""
    storage = study._storage
    storage.set_trial_user_attr(tid, "interrupted", True)
    if status:
        storage.set_trial_user_attr(tid, "status", status)
    study.tell(trial.number, state=TrialState.FAIL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.enqueue_trial(dict(trial.params), user_attrs={"requeued_from": trial.number})


def counted(study: optuna.Study) -> list:
    """The trials that make up ``n_trials``: all but interrupted ones (re-queued) and the queue itself."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if not t.user_attrs.get("interrupted") and t.state != TrialState.WAITING
    ]


def finish(study: optuna.Study, number: int, run_dir: Path, returncode: int | None) -> TrialState:
    """Tell the study how trial ``number`` ended, from what its run left in ``run_dir``."""
    status, rec = run_status(run_dir)
    pruned = pruned_info(run_dir)
    storage = study._storage
    tid = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)
    storage.set_trial_user_attr(tid, "status", status)
    storage.set_trial_user_attr(tid, "returncode", returncode)
    if pruned is not None and status in FINISHED:
        storage.set_trial_user_attr(tid, "pruned_at_step", pruned.get("step"))
        study.tell(number, state=TrialState.PRUNED)
        return TrialState.PRUNED
    value = rec.get(OBJECTIVE)
    if status in FINISHED and value is not None:
        study.tell(number, float(value))
        return TrialState.COMPLETE
    reason = rec.get("reason") or f"lra.train exited {returncode}, status {status!r}"
    storage.set_trial_user_attr(tid, "reason", str(reason)[:500])
    study.tell(number, state=TrialState.FAIL)
    return TrialState.FAIL


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


def settle(study: optuna.Study, stopped: dict[int, tuple[Path, int | None]], deferred: list[int]) -> None:
    """After an interruption, the trials the study still has RUNNING: one whose run finished anyway is
    told as usual (:func:`finish`); the others (stopped, or asked while their folder was busy) are
    re-queued as :func:`recover` would at the next start, with the status their folder shows."""
    storage = study._storage
    sid = storage.get_study_id_from_name(study.study_name)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number in stopped:
            run_dir, returncode = stopped[t.number]
            status = run_status(run_dir)[0]
            if status in FINISHED:
                finish(study, t.number, run_dir, returncode)
            else:
                requeue(study, t, storage.get_trial_id_from_study_id_trial_number(sid, t.number), status)
        elif t.number in deferred:
            requeue(study, t, storage.get_trial_id_from_study_id_trial_number(sid, t.number))


def _gpu_slot(k: int, parallel: int, visible: list[str] | None = None) -> dict:
    """Parallel trials on a multi-GPU box: trial slot k gets its own share of the visible GPUs."""
    visible = visible_gpus() if visible is None else visible
    if parallel > 1 and len(visible) >= parallel:
        per = len(visible) // parallel
        return {"CUDA_VISIBLE_DEVICES": ",".join(visible[k * per : (k + 1) * per])}
    return {}


def trial_placement(s: Search, slot: int) -> tuple[dict, list[str]]:
    """(environment, extra overrides) of the trial in ``slot``: its own GPUs, or with jobs_per_gpu=k GPU
    slot // k and 1/k of its memory, exactly as a grid job (lra.tools.sweep.job_share)."""
    if not s.jobs_per_gpu:
        return _gpu_slot(slot, s.parallel), []
    gpu = gpu_of_slot(slot, s.jobs_per_gpu, s.gpus)
    share = job_share(s.hw, s.jobs_per_gpu, gpu, total_of=device_total_gib)
    if share is None:
        raise not_reported(gpu, s.hw, s.jobs_per_gpu)
    return (
        {"CUDA_VISIBLE_DEVICES": gpu, MEMORY_LIMIT_ENV: f"{share['limit_gib']:.6f}"},
        [f"hardware.total_gib={share['total_gib']}"],
    )


# ----------------------------------------------------------------------------- manifest
def trial_rows(study: optuna.Study, s: Search) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        params = t.params or dict(t.system_attrs.get("fixed_params") or {})  # a queued trial: what it will run
        run_dir = None
        with contextlib.suppress(Exception):
            run_dir = rel_path(s.job_dir(s.fixed + param_overrides(params)), s.root)
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "params": params,
                "run_dir": run_dir,
                **{k: v for k, v in t.user_attrs.items()},
                "last_step": max(t.intermediate_values) if t.intermediate_values else None,
            }
        )
    return rows


def write_manifest(study: optuna.Study, s: Search, invocation: dict) -> dict:
    best = None
    with contextlib.suppress(ValueError):
        best = {"number": study.best_trial.number, "value": study.best_value, "params": study.best_params}
    old = read_manifest(s.manifest)
    body = {
        "schema_version": MANIFEST_VERSION,
        "created": old.get("created", now_iso()),
        "updated": now_iso(),
        "kind": "search",
        "study": s.name,
        "storage": s.storage,
        "runs_root": str(s.root),
        "n_trials_target": s.target,
        "fixed_overrides": s.fixed,
        "space": {k: repr(v) for k, v in s.space.items()},
        "pruner": s.pruner,
        "key": s.key,
        "definition": s.definition,
        "command": s.command,
        "invocations": old.get("invocations", []) + ([invocation] if invocation else []),
        "best": best,
        "trials": trial_rows(study, s),
    }
    write_json(s.manifest, body)
    return body


# ----------------------------------------------------------------------------- entry
def prepare(grid: Grid, opts: dict, hydra_ovs: list[str], composer: Composer) -> Search:
    spec = dict(grid.search or {})
    unknown = set(spec) - set(SEARCH_KEYS)
    if unknown:
        raise SystemExit(
            f"lra.tools.sweep: conf/sweep/{grid.name}.yaml search has unknown keys {sorted(unknown)}; "
            f"allowed: {', '.join(SEARCH_KEYS)} (the Hydra sweeper plugin is gone: no `sweeper`)"
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
        legacy_name=f"{grid.name}-{preset}-{task}-{attn}",
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
    t0 = time.time()
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
                        "started": _dt_iso(t0),
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
    """dry_run=true: the study (the one an earlier version named, when it is taken over), nothing written."""
    n = 0
    db = s.storage[len("sqlite:///") :] if s.storage.startswith("sqlite:///") else None
    if db is None or Path(db).exists():  # reading a missing SQLite file would create it
        check_storage(s.storage)
        storage = storage_for(s.storage)
        adopt_legacy(s, storage)
        with contextlib.suppress(KeyError):
            n = len(counted(optuna.load_study(study_name=s.name, storage=storage)))
    print(
        f"search {grid.name}: study {s.name} in {s.storage}; {n} trials so far, target {s.target}, "
        f"{s.parallel} at a time"
        + (f", {s.jobs_per_gpu} per GPU on GPUs {','.join(s.gpus)}" + _fmt_trial_share(s) if s.jobs_per_gpu else "")
        + f"; fixed {' '.join(s.fixed)}; space "
        + ", ".join(f"{k}: {v!r}" for k, v in s.space.items())
        + f"; pruner {s.pruner}; manifest {s.manifest}"
    )


def _dt_iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")
