"""A search's Optuna study (:mod:`lra.tools.sweep.search` runs its trials): the space in Hydra's sweep syntax, the
study opened with its sampler and pruner, how each trial ended told to it, a trial an interruption cut short
re-queued (FAIL, marked ``interrupted``, not counted towards ``n_trials``), and the search's manifest."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from lra.files import write_json
from lra.tools.sweep.base import FINISHED, MANIFEST_VERSION
from lra.tools.sweep.grid import override_parser
from lra.tools.sweep.jobs import now_iso, run_status
from lra.tools.sweep.manifest import read_manifest, rel_path
from lra.tools.sweep.pruning import OBJECTIVE, check_storage, make_pruner, pruned_info, storage_for

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


@dataclass
class Search:
    """One study and the plumbing around it (what :func:`lra.tools.sweep.search.drive` needs, built by
    :func:`lra.tools.sweep.search.prepare`)."""

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
    key: str = ""  # lra.tools.sweep.sweep_key of ``definition``: in the study's and manifest's names
    started: list[int] = field(default_factory=list)  # trials this driver launched (the invocation's count)
    definition: dict = field(default_factory=dict)
    command: str = ""  # the lra.tools.sweep command line (the resume line)
    grid: str = ""  # the search file (conf/sweep/<grid>.yaml), for the trials' records

    @property
    def manifest(self) -> Path:
        return self.folder / (f"manifest-{self.tag}.json" if self.tag else "manifest.json")


def open_study(s: Search) -> optuna.Study:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        check_storage(s.storage)
        study = optuna.create_study(
            study_name=s.name, storage=storage_for(s.storage), direction="maximize", load_if_exists=True
        )
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


def _tid(study: optuna.Study, number: int) -> int:
    """The storage's id of trial ``number`` (the study's own storage object: public API on it)."""
    storage = study._storage
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def recover(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a killed driver (the sweep lock says no driver is live): FAIL, marked
    ``interrupted``, and their parameters enqueued again (the same run folder: lra.train resumes it)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        requeue(study, t)
        out.append(t.number)
    return out


def requeue(study: optuna.Study, trial, status: str | None = None) -> None:
    """An interrupted trial: FAIL, marked ``interrupted`` (it does not count), its parameters enqueued again."""
    tid = _tid(study, trial.number)
    study._storage.set_trial_user_attr(tid, "interrupted", True)
    if status:
        study._storage.set_trial_user_attr(tid, "status", status)
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
    storage, tid = study._storage, _tid(study, number)
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


def settle(study: optuna.Study, stopped: dict[int, tuple[Path, int | None]], deferred: list[int]) -> None:
    """After an interruption, the trials the study still has RUNNING: one whose run finished anyway is
    told as usual (:func:`finish`); the others (stopped, or asked while their folder was busy) are
    re-queued as :func:`recover` would at the next start, with the status their folder shows."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number in stopped:
            run_dir, returncode = stopped[t.number]
            status = run_status(run_dir)[0]
            if status in FINISHED:
                finish(study, t.number, run_dir, returncode)
            else:
                requeue(study, t, status)
        elif t.number in deferred:
            requeue(study, t)


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
