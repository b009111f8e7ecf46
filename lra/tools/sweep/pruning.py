"""Pruning of hopeless search trials from inside the run (lra.tools.sweep.search drives the study).

A search trial is an ordinary ``python -m lra.train`` run given one more callback,
``+callbacks.optuna_pruning={_target_: lra.tools.sweep.pruning.OptunaPruning, storage, study_name,
trial_number, grid, params}`` (the ``callbacks`` config group: the run instantiates it as it would any user
callback and knows nothing of searches). Its ``record_fields`` puts the trial in the run record, pruned or
not: ``search: {study, trial, grid, params, objective}`` (:data:`OBJECTIVE`, what the study maximises).
After each validation it reports ``val/acc`` at the current optimizer step to the trial, asks the study's
pruner, and if the answer is "prune" it stops training (the run ends ``stopped_early`` with its best
checkpoint tested, like any early stop) and leaves ``pruned.json`` in the run folder. The search driver
reads that file when the run's process exits and records the trial as PRUNED; the process itself never
finishes the trial, so a run killed while it reports cannot leave the study in a state the driver does
not know about.

The pruner is not stored by Optuna with the study; lra.tools.sweep.search keeps its spec in the study's user
attribute ``pruner`` (``{"name": "median", ...options}``) and :func:`make_pruner` rebuilds it here.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy.exc
from lightning.pytorch.callbacks import Callback

from lra.files import write_json
from lra.runlock import EXIT_LOCKED
from lra.tools.sweep.base import Refusal

log = logging.getLogger("lra.pruning")


PRUNED_FILE = "pruned.json"
OBJECTIVE = "best_val_acc"  # the record field a search maximises (lra.tools.sweep.search tells the study it)
PRUNERS = {
    "none": optuna.pruners.NopPruner,
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "threshold": optuna.pruners.ThresholdPruner,
}


def make_pruner(spec: dict | None) -> optuna.pruners.BasePruner:
    """``{"name": "median", "n_startup_trials": 2, ...}`` -> the Optuna pruner (None: no pruning)."""
    spec = dict(spec or {"name": "none"})
    name = str(spec.pop("name", "none"))
    if name not in PRUNERS:
        raise ValueError(f"search.pruner.name={name!r}: allowed {', '.join(PRUNERS)}")
    return PRUNERS[name](**spec)


def storage_for(url: str, tries: int = 3) -> optuna.storages.BaseStorage:
    """The study's RDB storage; SQLite waits (up to a minute) for a writer instead of failing at once,
    since the driver and every running trial write to the same file.

    Two processes opening a new database at once both create its schema and one of them fails (the
    other inserted the schema version first); the schema is then there, so opening again succeeds.
    """
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(tries):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except sqlalchemy.exc.SQLAlchemyError:
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


LOCKED_WAIT_S = 5.0  # how long a search's start waits for a SQLite study another process keeps locked


def check_storage(url: str, wait_s: float | None = None) -> None:
    """Before a search opens its study (the storage's own wait is a minute a try, for the trials' writes):
    a SQLite database another process keeps locked (a database browser, a script in a transaction) is one
    line and exit 75 after ``wait_s`` (None: :data:`LOCKED_WAIT_S`); one that is not a database, or is
    damaged, is one line and exit 2. A database not there yet, and other storages, are left to Optuna."""
    if not url.startswith("sqlite:///"):
        return
    path = Path(url[len("sqlite:///") :])
    if not path.exists():
        return
    wait_s = LOCKED_WAIT_S if wait_s is None else wait_s
    try:
        con = sqlite3.connect(path, timeout=wait_s)
        try:
            con.execute("BEGIN IMMEDIATE")  # what a write needs: waits for, then fails on, another writer
            check = con.execute("PRAGMA quick_check").fetchone()[0]
            con.rollback()
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise Refusal(
                f"lra.tools.sweep: the study's database {path} is locked by another process (waited {wait_s:g} s): "
                "end that process's transaction (a database browser, a script), then run the same command again",
                code=EXIT_LOCKED,
            ) from None
        check = str(e)
    except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
        check = str(e)
    if check != "ok":
        raise Refusal(
            f"lra.tools.sweep: the study's database {path} cannot be used ({check}): move it aside (the search "
            "then starts a new study) or put back a good copy, then run the same command again"
        )


def load_trial(storage: str, study_name: str, trial_number: int) -> optuna.trial.Trial:
    """A live handle on trial ``trial_number`` of the study, with the pruner the driver chose."""
    st = storage_for(storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        attrs = st.get_study_user_attrs(st.get_study_id_from_name(study_name))
        study = optuna.load_study(study_name=study_name, storage=st, pruner=make_pruner(attrs.get("pruner")))
    trial_id = st.get_trial_id_from_study_id_trial_number(st.get_study_id_from_name(study_name), int(trial_number))
    return optuna.trial.Trial(study, trial_id)


def pruned_info(run_dir: Path) -> dict | None:
    """What :class:`OptunaPruning` left in a run folder it pruned (None: not pruned)."""
    try:
        return json.loads((Path(run_dir) / PRUNED_FILE).read_text())
    except (OSError, ValueError):
        return None


class OptunaPruning(Callback):
    """Report the monitored metric to an Optuna trial after every validation; stop when pruned."""

    def __init__(
        self,
        storage: str,
        study_name: str,
        trial_number: int,
        monitor: str = "val/acc",
        grid: str | None = None,
        params: dict | str | None = None,
    ):
        self.storage, self.study_name, self.trial_number = str(storage), str(study_name), int(trial_number)
        self.monitor, self.grid = monitor, (None if grid is None else str(grid))
        # the sampled values come as JSON: a key such as ++attn.options.k is no Hydra dict key
        self.params = json.loads(params) if isinstance(params, str) else dict(params or {})
        self.pruned_at: int | None = None
        self._trial = None

    def _handle(self) -> optuna.trial.Trial:
        if self._trial is None:
            self._trial = load_trial(self.storage, self.study_name, self.trial_number)
        return self._trial

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        prune = False
        if trainer.is_global_zero:  # one process talks to the study; the decision goes to every rank
            value = trainer.callback_metrics.get(self.monitor)
            if value is not None:
                value, step = float(value), int(trainer.global_step)
                trial = self._handle()
                trial.report(value, step)  # a resumed run reports a step again: Optuna keeps the first
                prune = trial.should_prune()
                if prune:
                    log.info("trial %d pruned at step %d (%s %.4f)", self.trial_number, step, self.monitor, value)
                    write_json(
                        Path(trainer.default_root_dir) / PRUNED_FILE,
                        {
                            "trial": self.trial_number,
                            "study": self.study_name,
                            "step": step,
                            "value": value,
                            "monitor": self.monitor,
                        },
                    )
        prune = bool(trainer.strategy.broadcast(prune, src=0))
        if prune:
            self.pruned_at = int(trainer.global_step)
            trainer.should_stop = True

    def record_fields(self) -> dict:
        """What the run record says of this trial: which one it is (``search``, pruned or not), and if pruned,
        at which step (the collector treats it as an early stop)."""
        search = {
            "study": self.study_name,
            "trial": self.trial_number,
            "grid": self.grid,
            "params": self.params,
            "objective": OBJECTIVE,
        }
        pruned = {} if self.pruned_at is None else {"stop_reason": "pruned", "pruned_at_step": self.pruned_at}
        return {"search": search, **pruned}
