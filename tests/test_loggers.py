"""Loggers side by side (lra/loggers.py): metrics.csv always, W&B and TensorBoard on request, one log
line per evaluation, a killed and resumed run continuing its W&B run, and none of Lightning's noise.

The runs are real ``python -m lra.train`` subprocesses on tiny ListOps, W&B offline (its run files are
read back: the tables are JSON files under ``files/media/table``)."""

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lra.config import ConfigError, load
from tests.helpers import TINY, run_env
from tests.test_resume import RESUME, _start_and_kill

wandb = pytest.importorskip("wandb")
TESTS = Path(__file__).resolve().parent
SIDE_BY_SIDE = "logger=[wandb,tensorboard]"
NOISE = ("💡 Tip", "litlogger", "litmodels", "LeafSpec")
EVAL_LINE = re.compile(
    r"eval step (\d+)/(\d+) \(\d+%\): val loss [\d.]+, val acc ([\d.]+) \(best ([\d.]+) at step "
    r"(\d+)\), elapsed \d+:\d\d:\d\d, ETA (\d+:\d\d:\d\d|n/a)"
)


def _env(tmp_path, runs="runs"):
    return run_env(tmp_path, runs, WANDB_MODE="offline")  # W&B writes offline files the tests read


def _train(tmp_path, *overrides, runs="runs", check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "lra.train", *overrides],
        env=_env(tmp_path, runs),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _run_dir(tmp_path, runs="runs"):
    return next((tmp_path / runs).rglob("result.json")).parent


def _csv_val_steps(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return [(int(r["step"]), round(float(r["val/acc"]), 6)) for r in csv.DictReader(f) if r.get("val/acc")]


def _tb_val_steps(run_dir):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars("val/acc")]


def _table(offline_run, name):
    (path,) = sorted((offline_run / "files" / "media" / "table").glob(f"{name}_*.table.json"))
    t = json.loads(path.read_text())
    return [dict(zip(t["columns"], row)) for row in t["data"]]


def _eval_lines(run_dir):
    return [m.groups() for m in EVAL_LINE.finditer((run_dir / "train.log").read_text())]


@pytest.mark.slow  # 20-30 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_wandb_and_tensorboard_beside_metrics_csv(tmp_path):
    """One run with both: metrics.csv, the W&B record and history tables, TensorBoard events agree;
    train.log has a line per evaluation; no Lightning tip or LeafSpec warning anywhere (~10 s)."""
    pytest.importorskip("tensorboard")
    proc = _train(tmp_path, *TINY, SIDE_BY_SIDE, "trainer.progress=false", "trainer.log_every_n_steps=4")
    run_dir = _run_dir(tmp_path)
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "completed"

    csv_vals = _csv_val_steps(run_dir)
    assert len(csv_vals) == 2  # eval_every=5 of 12 steps
    assert _tb_val_steps(run_dir) == csv_vals
    # every key of metrics.csv reaches TensorBoard too: lr, beta1, throughput, the evaluations' training time
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    with open(run_dir / "metrics.csv", newline="") as f:
        csv_keys = set(next(csv.reader(f))) - {"step"}
    assert {"lr", "beta1", "throughput/samples_per_s", "throughput/tokens_per_s", "time/train_s"} <= csv_keys
    assert set(acc.Tags()["scalars"]) == csv_keys

    (offline,) = sorted((run_dir / "wandb").glob("offline-run-*"))
    run_id = (run_dir / "wandb" / "run-id").read_text().strip()
    assert offline.name.endswith(f"-{run_id}") and (offline / f"run-{run_id}.wandb").exists()
    record = {r["key"]: r["value"] for r in _table(offline, "run_record")}  # the REAL record went through
    assert record["status"] == "completed" and float(record["test_acc"]) == rec["test_acc"]
    assert record["torch_version"] == rec["torch_version"] and "config" not in record
    history = _table(offline, "val_history")
    assert [round(r["val/acc"], 6) for r in history] == [a for _, a in csv_vals]

    lines = _eval_lines(run_dir)
    assert [(int(s), int(m)) for s, m, *_ in lines] == [(5, 12), (10, 12)]
    accs = [float(a) for _, _, a, *_ in lines]
    assert [float(b) for _, _, _, b, *_ in lines] == [round(max(accs[: i + 1]), 4) for i in range(len(accs))]
    out = proc.stdout + proc.stderr + (run_dir / "train.log").read_text()
    assert not [n for n in NOISE if n in out], out[-3000:]


@pytest.mark.slow
def test_killed_run_resumes_into_the_same_wandb_run(tmp_path):
    """SIGKILL after a checkpoint, same command again: the W&B run id is the same, its history table
    holds the evaluations from before the kill, TensorBoard and metrics.csv hold each evaluation once (~40 s)."""
    pytest.importorskip("tensorboard")
    step, rc, out = _start_and_kill(tmp_path, "runs", signal.SIGKILL, 9, SIDE_BY_SIDE, env=_env(tmp_path))
    assert rc == -signal.SIGKILL, out[-2000:]
    run_dir = _run_dir(tmp_path)
    first_id = (run_dir / "wandb" / "run-id").read_text().strip()

    proc = _train(tmp_path, *RESUME, SIDE_BY_SIDE)
    assert "resuming from" in proc.stdout + proc.stderr
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["resumed_from_step"] >= step and rec["status"] in ("completed", "stopped_early")
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(d.name.endswith(f"-{first_id}") for d in offline)
    assert (run_dir / "wandb" / "run-id").read_text().strip() == first_id

    csv_vals = _csv_val_steps(run_dir)
    assert len({s for s, _ in csv_vals}) == len(csv_vals) and csv_vals[0][0] < step  # each once, from the start
    assert _tb_val_steps(run_dir) == csv_vals  # purge_step hid the re-logged steps
    history = _table(offline[-1], "val_history")
    assert [round(r["val/acc"], 6) for r in history] == [a for _, a in csv_vals]
    # the eval lines of both processes are in train.log; best-so-far carried across the restart
    lines = _eval_lines(run_dir)
    assert len(lines) >= len(csv_vals) and int(lines[0][0]) < step
    assert float(lines[-1][3]) == pytest.approx(max(a for _, a in csv_vals), abs=1e-4)


def test_logger_config_composes_as_a_list(tmp_path):
    assert set(load(["preset=quick"]).logger) == {"csv"}
    assert set(load(["logger=wandb"]).logger) == {"wandb"}  # metrics.csv is written for every run
    spec = load(["logger=[wandb,tensorboard]", "logger.wandb.project=mine"])
    assert set(spec.logger) == {"wandb", "tensorboard"} and spec.logger["wandb"]["project"] == "mine"
    assert load(["logger=[]"]).logger == {}


def test_make_logger_puts_csv_first_and_adds_the_callbacks(tmp_path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

    from lra.loggers import (
        EvalLog,
        StepCSVLogger,
        StepsTakenStage,
        StepTensorBoardLogger,
        StepWandbLogger,
        make_logger,
    )
    from lra.wandb_extras import WandbTables

    spec = load(["preset=quick", "logger=[tensorboard,wandb]"])
    logs = make_logger(spec, tmp_path, None)
    # CSV, then as listed: Lightning's loggers, counting the optimizer steps taken (lra.loggers.StepsTaken)
    assert [type(lg) for lg in logs.loggers] == [StepCSVLogger, StepTensorBoardLogger, StepWandbLogger]
    assert [isinstance(lg, t) for lg, t in zip(logs.loggers, (CSVLogger, TensorBoardLogger, WandbLogger))] == [True] * 3
    assert {type(c) for c in logs.callbacks} == {StepsTakenStage, EvalLog, WandbTables}
    csv_only = make_logger(load(["preset=quick"]), tmp_path / "b", None)
    assert [type(lg) for lg in csv_only.loggers] == [StepCSVLogger]
    assert [type(c) for c in csv_only.callbacks] == [StepsTakenStage, EvalLog]


def test_a_user_logger_is_a_target_node_built_with_its_arguments(tmp_path):
    """``+logger.<name>._target_`` builds any Lightning logger with its arguments, after metrics.csv, as a
    callback is built; a bad one is one line naming it, before any work."""
    from lightning.pytorch.loggers import CSVLogger

    from lra.loggers import StepCSVLogger, check_loggers, make_logger

    sys.path.insert(0, str(TESTS))
    try:
        spec = load(["preset=quick", *_user_loggers(tmp_path)])
        logs = make_logger(spec, tmp_path / "run", None)
    finally:
        sys.path.remove(str(TESTS))
    first, other, mine = logs.loggers
    assert type(first) is StepCSVLogger and Path(first.log_dir) == tmp_path / "run"  # the harness's own, unchanged
    assert type(other) is CSVLogger and Path(other.log_dir) == tmp_path / "elsewhere" / "mine" / "version_0"
    assert type(mine).__name__ == "MetricsRecorder" and mine.label == "yours"
    for override, says in [
        ("+logger.x._target_=no_such_module.Thing", "cannot be imported"),
        ("+logger.x._target_=collections.OrderedDict", "is not a Lightning logger"),
        ("+logger.x=3", "_target_"),
    ]:
        with pytest.raises(ConfigError, match=says):
            check_loggers(load(["preset=quick", override]).logger)


def test_a_user_logger_receives_the_metrics(tmp_path):
    """A real run with Lightning's CSVLogger into another folder and a logger of the user's own: both get the
    rows metrics.csv gets (the harness's metrics.csv is still written, in the run folder), at Lightning's own
    step while training (one less than the optimizer steps taken, which metrics.csv says) (~10 s)."""
    env = {**_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "lra.train", *TINY, *_user_loggers(tmp_path), "trainer.progress=false"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = _run_dir(tmp_path)
    csv_vals = _csv_val_steps(run_dir)
    assert len(csv_vals) == 2
    other = tmp_path / "elsewhere" / "mine" / "version_0"
    assert [(s + 1, a) for s, a in _csv_val_steps(other)] == csv_vals  # Lightning's logging step: one less
    with open(run_dir / "metrics.csv", newline="") as a, open(other / "metrics.csv", newline="") as b:
        assert set(next(csv.reader(a))) == set(next(csv.reader(b)))  # the same keys reach both
    seen = json.loads((tmp_path / "recorder.json").read_text())
    assert seen["label"] == "yours" and seen["status"] == "success"
    assert [(r["step"] + 1, round(r["val/acc"], 6)) for r in seen["rows"] if "val/acc" in r] == csv_vals
    assert any("test/acc" in r for r in seen["rows"])
    with open(run_dir / "metrics.csv", newline="") as f:  # the test row: the steps taken, as given to both
        (test_step,) = [int(r["step"]) for r in csv.DictReader(f) if r.get("test/acc")]
    assert [r["step"] for r in seen["rows"] if "test/acc" in r] == [test_step] == [12]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["config"]["logger"]["mine"]["label"] == "yours"


def _user_loggers(tmp_path) -> list[str]:
    return [
        "+logger.other._target_=lightning.pytorch.loggers.CSVLogger",
        f"+logger.other.save_dir={tmp_path / 'elsewhere'}",
        "+logger.other.name=mine",
        "+logger.mine._target_=user_callbacks.MetricsRecorder",
        f"+logger.mine.out={tmp_path / 'recorder.json'}",
        "+logger.mine.label=yours",
    ]


def test_wandb_id_is_kept_only_when_resuming(tmp_path):
    from lra.loggers import wandb_run_id

    first = wandb_run_id(tmp_path, None)
    assert re.fullmatch(r"[a-z0-9]{8}", first) and (tmp_path / "wandb" / "run-id").read_text().strip() == first
    assert wandb_run_id(tmp_path, 40) == first
    fresh = wandb_run_id(tmp_path, None)  # a run started again from scratch (force=true) is a new W&B run
    assert fresh != first and wandb_run_id(tmp_path, 3) == fresh


def test_the_wandb_summary_and_artifact_carry_the_records_outcome_cost_and_identity(tmp_path):
    """Bug caught: a field dropped from its group in lra/record.py (a W&B summary without the memory or the
    commit, an artifact that no longer says which run it is)."""
    import dataclasses

    from lra.record import Record
    from lra.wandb_extras import log_record

    class Run:  # what log_record uses of a wandb Run
        def __init__(self):
            self.summary, self.logged, self.artifacts = {}, [], []

        def log(self, data):
            self.logged.append(data)

        def log_artifact(self, artifact):
            self.artifacts.append(artifact)

    record = {f.name: 1 for f in dataclasses.fields(Record) if f.name != "extra"}  # every field a record has
    (tmp_path / "result.json").write_text(json.dumps(record))
    run = Run()
    log_record(run, record, tmp_path)
    summary = "status reason test_acc test_loss best_val_acc majority_acc steps train_time_s eval_time_s"
    summary += " time_per_1k_steps_s peak_mem_bytes micro_batch accum_steps effective_batch num_params hardware"
    summary += " device git_commit"
    assert run.summary == {f"record/{k}": 1 for k in summary.split()}
    (artifact,) = run.artifacts
    assert artifact.metadata == {"task": 1, "attn": 1, "seed": 1, "preset": 1, "status": 1}
    assert {k for k, _ in run.logged[0]["run_record"].data} == set(record) - {"config"}


def test_missing_tensorboard_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    import lra.compat
    import lra.loggers

    assert lra.compat.tensorboard_available()  # installed here (the dev extra): the check below is the patch's
    monkeypatch.setattr(lra.compat, "tensorboard_available", lambda: False)
    with pytest.raises(ConfigError, match=r"lra-harness\[tensorboard\]"):
        lra.loggers.check_loggers(load(["logger=[wandb,tensorboard]"]).logger)
    lra.loggers.check_loggers(load(["logger=wandb"]).logger)  # the others are unaffected


def test_unknown_logger_is_one_line_before_any_work(tmp_path):
    proc = _train(tmp_path, *TINY, "logger=[wandb,mlflow]", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "logger/mlflow" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    single = _train(tmp_path, *TINY, "logger=mlflow", check=False)  # Hydra lists the options for one name
    assert single.returncode == 2 and "csv tensorboard wandb" in single.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("result.json"))


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_quiet_lightning_drops_exactly_the_tips():
    import warnings

    import lightning_utilities.core.rank_zero as rank_zero_module
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from lra.loggers import quiet_lightning

    quiet_lightning()
    lg, seen = rank_zero_module.log, _Collect()  # the logger rank_zero_info writes to
    old_level = lg.level
    lg.addHandler(seen)
    lg.setLevel(logging.INFO)
    try:
        rank_zero_info("💡 Tip: For seamless cloud logging, try installing [litlogger]")
        rank_zero_info("GPU available: False, used: False")
    finally:
        lg.removeHandler(seen)
        lg.setLevel(old_level)
    assert seen.messages == ["GPU available: False, used: False"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_lightning()  # its filter goes in front of "always"
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("another FutureWarning", FutureWarning)
    assert [str(w.message) for w in caught] == ["another FutureWarning"]


def _steps(path):
    with open(path, newline="") as f:
        return [(int(r["step"]), r["train/loss"] or r["val/acc"] or r["test/acc"]) for r in csv.DictReader(f)]


def test_a_resumed_run_keeps_its_rows_up_to_its_checkpoint(tmp_path):
    """A run resumed from its checkpoint at step 100 keeps the rows of steps 50 and 100 (counted as taken) and
    drops step 150's (trained again); the header stays, ``epoch`` included."""
    from lra.loggers import csv_logger

    head = "epoch,step,train/loss,val/acc,val/loss,test/acc"
    rows = ["0,50,1.0,,,", "0,50,,0.3,2.0,", "0,100,0.9,,,", "0,100,,0.4,1.9,", "0,150,0.8,,,", "0,150,,0.5,1.8,"]
    (tmp_path / "metrics.csv").write_text("\n".join([head, *rows]) + "\n")
    csv_logger(tmp_path, 100)
    assert _steps(tmp_path / "metrics.csv") == [(50, "1.0"), (50, "0.3"), (100, "0.9"), (100, "0.4")]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == head


def test_rows_are_written_at_the_steps_taken_while_fitting_and_as_given_after(tmp_path):
    """Lightning hands a logger its logging step while fitting (one less than the steps taken) and the steps
    taken after it (the test): StepsTakenStage tells the logger which at every stage's setup."""
    from types import SimpleNamespace

    from lra.loggers import StepsTakenStage, csv_logger

    logger = csv_logger(tmp_path, None)
    stage, trainer = StepsTakenStage(), SimpleNamespace(loggers=[logger])
    stage.setup(trainer, None, "fit")
    logger.log_metrics({"train/loss": 1.0}, step=49)
    logger.log_metrics({"val/acc": 0.3}, step=49)
    stage.setup(trainer, None, "test")
    logger.log_metrics({"test/acc": 0.4}, step=50)
    logger.save()
    assert _steps(tmp_path / "metrics.csv") == [(50, "1.0"), (50, "0.3"), (50, "0.4")]
