"""Optuna searches (lra/tools/sweep/search.py, study.py) and trial pruning (lra/tools/sweep/pruning.py): the
search space, the driver with a fake job runner (parallel trials, n_trials as the study's total, failures, a killed
driver's trials re-queued into their own run folder, progress lines), the pruning callback on a tiny Lightning
model, and (slow) a real search on tiny ListOps that is killed and resumed."""

import contextlib
import itertools
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

import torch  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from test_sweep import TINY, sweep_env  # noqa: E402

from lra.files import write_json  # noqa: E402
from lra.tools.sweep import MARKER, Progress  # noqa: E402
from lra.tools.sweep.pruning import PRUNED_FILE, OptunaPruning, make_pruner, pruned_info, storage_for  # noqa: E402
from lra.tools.sweep.search import drive  # noqa: E402
from lra.tools.sweep.study import Search, counted, finish, open_study, parse_space, recover  # noqa: E402

SPACE = {
    "train.lr": "tag(log, interval(1e-5, 3e-3))",
    "train.warmup": "range(0, 300, step=50)",
    "model.dropout": "interval(0.0, 0.3)",
    "++attn.options.num_features": "choice(16, 32, 64, 128)",
}


# ----------------------------------------------------------------------------- the space
def test_hydra_sweep_syntax_maps_to_optuna_distributions():
    d = parse_space(SPACE)
    assert d["train.lr"] == optuna.distributions.FloatDistribution(1e-5, 3e-3, log=True)
    assert d["train.warmup"] == optuna.distributions.IntDistribution(0, 250, step=50)  # range() excludes its end
    assert d["model.dropout"] == optuna.distributions.FloatDistribution(0.0, 0.3)
    assert d["++attn.options.num_features"] == optuna.distributions.CategoricalDistribution([16, 32, 64, 128])


@pytest.mark.parametrize("bad", [{"train.lr": "3e-4"}, {"train.lr": "interval(1e-5"}, {}])
def test_bad_space_is_one_line(bad):
    with pytest.raises(SystemExit) as e:
        parse_space(bad)
    assert str(e.value).startswith("lra.tools.sweep: ") and "\n" not in str(e.value)


def test_pruner_spec():
    assert isinstance(make_pruner({"name": "median", "n_startup_trials": 1}), optuna.pruners.MedianPruner)
    assert isinstance(make_pruner(None), optuna.pruners.NopPruner)
    with pytest.raises(ValueError, match="search.pruner.name='nope'"):
        make_pruner({"name": "nope"})


# ----------------------------------------------------------------------------- the driver, fake jobs
class FakeProc:
    """A trial 'process' that ends after ``polls`` polls, leaving the record lra.train would write."""

    pids = itertools.count(10_000_000)

    def __init__(self, run_dir, value, polls, status, pruned):
        self.run_dir, self.value, self.left, self.status, self.pruned = run_dir, value, polls, status, pruned
        self.pid, self.rc = next(self.pids), None

    def poll(self):
        if self.rc is None:
            self.left -= 1
            if self.left <= 0:
                rec = {
                    "status": self.status,
                    "best_val_acc": self.value if self.status != "failed" else None,
                    "reason": "boom" if self.status == "failed" else None,
                }
                write_json(self.run_dir / "result.json", rec)
                if self.pruned:
                    write_json(self.run_dir / PRUNED_FILE, {"step": 5, "value": self.value})
                self.rc = 1 if self.status == "failed" else 0
        return self.rc

    def send_signal(self, sig):
        self.rc = -sig

    def wait(self, timeout=None):
        return self.rc


class FakeRunner:
    """Reads the trial's overrides from its command line like lra.train would; value = f(lr, warmup)."""

    def __init__(self, polls=3, fail_if=lambda n: False, prune_if=lambda n: False):
        self.polls, self.fail_if, self.prune_if = polls, fail_if, prune_if
        self.started, self.live, self.max_live = [], set(), 0

    def start(self, cmd, env, log_path):
        assert cmd[1:3] == ["-m", "lra.train"]
        params = dict(a.split("=", 1) for a in cmd[3:] if "=" in a and not a.startswith(("hydra.", "+callbacks.")))
        run_dir = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1].strip("'"))
        trial = int(next(a for a in cmd if a.startswith("+callbacks.optuna_pruning.trial_number=")).split("=", 1)[1])
        self.started.append((trial, run_dir, params))
        value = 1.0 / (1.0 + abs(float(params["train.lr"]) - 1e-3) * 1e3) - int(params["train.warmup"]) * 1e-4
        proc = FakeProc(
            run_dir, value, self.polls, "failed" if self.fail_if(trial) else "completed", self.prune_if(trial)
        )
        self.live.add(proc)
        self.max_live = max(self.max_live, sum(p.rc is None for p in self.live))
        return proc


def make_search(tmp_path, target=4, parallel=2, space=None):
    space = parse_space(
        space or {"train.lr": "tag(log, interval(1e-5, 3e-3))", "train.warmup": "range(0, 300, step=50)"}
    )

    def job_dir(ovs):  # a folder per configuration, as Hydra's override_dirname gives
        return tmp_path / "runs" / "_".join(sorted(o for o in ovs if o.startswith("train.")))

    return Search(
        name="s-quick-listops-softmax",
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        folder=tmp_path / "sweep",
        root=tmp_path / "runs",
        space=space,
        fixed=["task=listops"],
        target=target,
        parallel=parallel,
        job_dir=job_dir,
        sampler={"name": "random", "seed": 0},
        pruner={"name": "none"},
    )


def _study(s):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.load_study(study_name=s.name, storage=s.storage)


def test_driver_runs_trials_in_parallel_to_the_target_and_records_values(tmp_path):
    s = make_search(tmp_path, target=5, parallel=2)
    runner, lines = FakeRunner(polls=3), []
    clock = itertools.count(0.0, 10.0).__next__  # every call: 10 s later
    drive(
        s,
        open_study(s),
        runner=runner,
        poll_s=0,
        clock=clock,
        progress=Progress("t", parallel=2, every_s=1e9, clock=clock, emit=lines.append),
    )
    study = _study(s)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5 and runner.max_live == 2
    for number, run_dir, params in runner.started:
        rec = json.loads((run_dir / "result.json").read_text())
        assert study.trials[number].value == rec["best_val_acc"]
        assert float(params["train.lr"]) == study.trials[number].params["train.lr"]
        marker = json.loads((run_dir / MARKER).read_text())
        assert marker["trial"] == number and marker["returncode"] == 0 and marker["t_end"] > marker["t_start"]
    assert lines[0].startswith("[t] 0 done, 2 running, 0 failed, 3 pending; ETA after the first job")
    assert lines[-1].startswith("[t] 5 done, 0 running, 0 failed, 0 pending")
    assert any("ETA" in ln and "mean" in ln for ln in lines)

    # the same target again: nothing runs; a larger one: only the missing trials
    drive(s, open_study(s), runner=runner, poll_s=0)
    assert len(runner.started) == 5
    s.target = 7
    drive(s, open_study(s), runner=runner, poll_s=0)
    study = _study(s)
    assert len(runner.started) == 7 and len(study.trials) == 7
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 7, "a continued study replayed draws"


def test_failed_and_pruned_trials_count_towards_n_trials(tmp_path):
    s = make_search(tmp_path, target=6, parallel=1)
    runner = FakeRunner(polls=1, fail_if=lambda n: n % 3 == 1, prune_if=lambda n: n % 3 == 2)
    drive(s, open_study(s), runner=runner, poll_s=0)
    study = _study(s)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED] * 2
    for t in study.trials[1::3]:
        assert t.user_attrs["reason"] == "boom" and t.user_attrs["returncode"] == 1
    assert all(t.user_attrs["pruned_at_step"] == 5 for t in study.trials[2::3])


def test_killed_driver_trials_are_requeued_into_their_run_folder(tmp_path):
    s = make_search(tmp_path, target=3, parallel=1)
    study = open_study(s)
    runner = FakeRunner(polls=1)
    drive(s, study, runner=runner, poll_s=0)
    # a driver killed while trial 3 ran: RUNNING in the study, its folder holds a checkpoint
    s.target = 4
    study = open_study(s)
    stale = study.ask(s.space)
    run_dir = s.job_dir(s.fixed + [f"{k}={v}" for k, v in stale.params.items()])
    (run_dir / "checkpoints").mkdir(parents=True)
    write_json(run_dir / MARKER, {"host": "elsewhere", "pid": 1, "t_start": 0, "finished": None})

    study = open_study(s)
    assert recover(study) == [stale.number]
    t = _study(s).trials[stale.number]
    assert t.state == TrialState.FAIL and t.user_attrs["interrupted"] is True
    assert len(counted(study)) == 3  # the interrupted trial does not count; the queue neither
    drive(s, study, runner=runner, poll_s=0)
    trials = _study(s).trials
    assert len(trials) == 5 and trials[-1].user_attrs["requeued_from"] == stale.number
    assert trials[-1].params == stale.params and trials[-1].state == TrialState.COMPLETE
    assert runner.started[-1][1] == run_dir  # the same folder: lra.train resumes its checkpoint
    assert json.loads((run_dir / MARKER).read_text())["attempts"] == 1


def test_busy_folder_waits_for_the_process_still_in_it(tmp_path):
    """A killed driver's trial process may outlive it: the re-queued trial starts once it has ended."""
    s = make_search(tmp_path, target=1, parallel=1)
    study = open_study(s)
    stale = study.ask(s.space)
    run_dir = s.job_dir(s.fixed + [f"{k}={v}" for k, v in stale.params.items()])
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    threading.Thread(target=orphan.wait, daemon=True).start()  # reaped when it ends, as init would

    write_json(
        run_dir / MARKER, {"host": socket.gethostname(), "pid": orphan.pid, "t_start": time.time(), "finished": None}
    )
    study = open_study(s)
    recover(study)
    runner = FakeRunner(polls=1)
    t0 = time.time()
    drive(s, study, runner=runner, poll_s=0.2)
    assert time.time() - t0 >= 2.0 and len(runner.started) == 1 and runner.started[0][1] == run_dir


def test_finish_needs_a_finished_record(tmp_path):
    s = make_search(tmp_path, target=1)
    study = open_study(s)
    t = study.ask(s.space)
    write_json(
        tmp_path / "r" / "result.json", {"status": "interrupted", "best_val_acc": 0.5, "reason": "KeyboardInterrupt"}
    )
    assert finish(study, t.number, tmp_path / "r", -2) == TrialState.FAIL
    assert _study(s).trials[0].user_attrs["reason"] == "KeyboardInterrupt"


# ----------------------------------------------------------------------------- progress lines
def test_progress_prints_on_change_and_every_n_seconds_with_an_eta():
    now = [0.0]
    lines = []
    p = Progress("g", parallel=2, every_s=30, clock=lambda: now[0], emit=lines.append)
    assert p.update(0, 2, 0, 4).endswith("ETA after the first job")
    assert p.update(0, 2, 0, 4) is None  # same counts, 0 s later: quiet
    now[0] = 31
    assert p.update(0, 2, 0, 4) is not None  # same counts, 31 s later: a line
    now[0] = 32
    # 2 done (mean 100 s), 2 running for 40 s (60 s left each), 2 pending: (60+60+200)/2 = 160 s
    line = p.update(2, 2, 0, 2, durations=[80, 120], running_elapsed=[40, 40])
    assert line == "[g] 2 done, 2 running, 0 failed, 2 pending; mean 100 s/job, ETA 160 s"
    assert len(lines) == 3


def test_grid_watch_reads_job_folders(tmp_path):
    from lra.tools.sweep import GridWatch

    t0 = time.time()
    dirs = [tmp_path / f"j{i}" for i in range(4)]
    write_json(dirs[0] / MARKER, {"t_start": t0, "t_end": t0 + 50})
    write_json(dirs[0] / "result.json", {"status": "completed"})
    write_json(dirs[1] / MARKER, {"t_start": t0, "t_end": t0 + 10})
    write_json(dirs[1] / "result.json", {"status": "failed"})
    write_json(dirs[2] / MARKER, {"t_start": t0, "t_end": None})
    write_json(dirs[3] / MARKER, {"t_start": t0 - 3600, "t_end": None})  # an earlier invocation's
    lines = []
    w = GridWatch(dirs, Progress("g", parallel=1, emit=lines.append), since=t0 - 1)
    line = w.tick()
    assert line.startswith("[g] 1 done, 1 running, 1 failed, 1 pending; mean 50 s/job")


# ----------------------------------------------------------------------------- the pruning callback
def _tiny_fit(tmp_path, storage, study_name, number, accs, max_steps=20, **cb_args):
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)
            self.vals = iter(accs)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.lin(x), y)

        def validation_step(self, batch, _):
            self.log("val/acc", torch.tensor(next(self.vals)))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(400, 4), torch.randint(0, 2, (400,)))
    train = torch.utils.data.DataLoader(data, batch_size=4)
    val = torch.utils.data.DataLoader(data, batch_size=400)
    cb = OptunaPruning(storage, study_name, number, **cb_args)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=max_steps,
        max_epochs=-1,
        val_check_interval=5,
        check_val_every_n_epoch=None,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Tiny(), train, val)
    return trainer, cb


def _callback_study(tmp_path, pruner):
    s = make_search(tmp_path, target=1)
    s.pruner = pruner
    study = open_study(s)
    return s, study, study.ask(s.space)


def test_pruning_callback_reports_each_validation_and_lets_a_good_trial_run(tmp_path):
    s, study, trial = _callback_study(tmp_path, {"name": "threshold", "lower": 0.3})
    trainer, cb = _tiny_fit(tmp_path, s.storage, s.name, trial.number, [0.5, 0.6, 0.7, 0.8])
    assert trainer.global_step == 20 and cb.pruned_at is None and pruned_info(tmp_path) is None
    t = _study(s).trials[trial.number]
    assert t.intermediate_values == pytest.approx({5: 0.5, 10: 0.6, 15: 0.7, 20: 0.8}) and t.state == TrialState.RUNNING


def test_pruned_trial_stops_training_and_ends_pruned_in_the_study(tmp_path):
    s, study, trial = _callback_study(tmp_path, {"name": "threshold", "lower": 0.3})
    trainer, cb = _tiny_fit(tmp_path, s.storage, s.name, trial.number, [0.5, 0.2, 0.9, 0.9])
    assert cb.pruned_at == 10 and trainer.global_step == 10  # stopped at the second validation
    info = pruned_info(tmp_path)
    assert info["trial"] == trial.number and info["step"] == 10 and info["value"] == pytest.approx(0.2)
    assert _study(s).trials[trial.number].intermediate_values == {5: 0.5, 10: pytest.approx(0.2)}
    # lra.train records a stop before max_steps as stopped_early; the driver then tells PRUNED
    write_json(tmp_path / "result.json", {"status": "stopped_early", "best_val_acc": 0.5})
    assert finish(study, trial.number, tmp_path, 0) == TrialState.PRUNED
    t = _study(s).trials[trial.number]
    assert t.state == TrialState.PRUNED and t.user_attrs["pruned_at_step"] == 10


def test_median_pruner_from_the_study_attrs_prunes_below_earlier_trials(tmp_path):
    """The trial process rebuilds the driver's pruner from the study (Optuna does not store pruners)."""
    s, study, first = _callback_study(tmp_path, {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0})
    _tiny_fit(tmp_path / "a", s.storage, s.name, first.number, [0.6, 0.7, 0.8, 0.9])
    write_json(tmp_path / "a" / "result.json", {"status": "completed", "best_val_acc": 0.9})
    assert finish(study, first.number, tmp_path / "a", 0) == TrialState.COMPLETE
    second = study.ask(s.space)
    # Optuna's median rule compares the trial's best value so far with the median of the others' at
    # that step: 0.65 >= 0.6 at step 5 goes on; 0.65 < 0.7 at step 10 is pruned
    trainer, cb = _tiny_fit(tmp_path / "b", s.storage, s.name, second.number, [0.65, 0.5, 0.9, 0.9])
    assert cb.pruned_at == 10 and trainer.global_step == 10


def test_trial_record_says_study_trial_params_pruned_or_not(tmp_path):
    """Issue 27: a trial's record said nothing of its search unless it was pruned (record_fields gave {} for a
    trial that ran on), so the tables could not tell a trial from a plain run nor pick the study's best."""
    s, study, trial = _callback_study(tmp_path, {"name": "threshold", "lower": 0.3})
    params = {"train.lr": 1e-3, "++attn.options.num_features": 32}

    def want(number):
        return {"study": s.name, "trial": number, "grid": "search_quick", "params": params, "objective": "best_val_acc"}

    _, ran_on = _tiny_fit(
        tmp_path / "a",
        s.storage,
        s.name,
        trial.number,
        [0.5, 0.6, 0.7, 0.8],
        grid="search_quick",
        params=json.dumps(params),
    )  # as the command line gives them
    assert ran_on.record_fields() == {"search": want(trial.number)}
    other = study.ask(s.space)
    _, pruned = _tiny_fit(
        tmp_path / "b", s.storage, s.name, other.number, [0.5, 0.2, 0.9, 0.9], grid="search_quick", params=params
    )
    assert pruned.record_fields() == {"search": want(other.number), "stop_reason": "pruned", "pruned_at_step": 10}


def test_trial_command_gives_the_run_its_search_fields(tmp_path):
    """The sampled values reach the trial's record through lra.train's own config: keys such as
    ++attn.options.num_features survive the command line (no Hydra dict key can hold them), values keep
    their types, and the callback is built from the trial's config as lra.train builds it."""
    from lra.config import load
    from lra.loop import user_callbacks
    from lra.tools.sweep.pruning import OBJECTIVE
    from lra.tools.sweep.search import trial_command

    s = make_search(tmp_path, space={**SPACE, "train.eval_every": "choice(5, 10)"})
    s.fixed, s.grid = ["preset=quick", "attn=skeinformer"], "search_quick"
    study = open_study(s)
    trial = study.ask(s.space)
    cmd = trial_command(s, trial.number, trial.params, tmp_path / "run")
    spec = load([a for a in cmd[3:] if not a.startswith("hydra.")])
    (cb,) = user_callbacks(spec)
    search = cb.record_fields()["search"]
    assert search == {
        "study": s.name,
        "trial": trial.number,
        "grid": "search_quick",
        "params": trial.params,
        "objective": OBJECTIVE,
    }
    assert list(search["params"]) == list(SPACE) + ["train.eval_every"]
    assert spec.train.eval_every == search["params"]["train.eval_every"]  # the values that ran, typed
    assert spec.attn.options["num_features"] == search["params"]["++attn.options.num_features"]


# ----------------------------------------------------------------------------- a real search (slow)
def _trial_states(tmp_path):
    db = tmp_path / "runs" / "quick" / "sweeps" / "search_quick" / "optuna.db"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = f"sqlite:///{db}"
        prefix = "search_quick-quick-listops-skeinformer-"  # + the search's key
        (name,) = [n for n in optuna.get_all_study_names(storage) if n.startswith(prefix)]
        return optuna.load_study(study_name=name, storage=storage).trials


def _trial_states_read_only(tmp_path) -> list[str]:
    """The trials' states while the driver runs, read without ever creating the database or its schema:
    Optuna's own reader would create both, racing the driver that is creating them (one of them fails)."""
    db = tmp_path / "runs" / "quick" / "sweeps" / "search_quick" / "optuna.db"
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
            return [state for (state,) in con.execute("SELECT state FROM trials ORDER BY number")]
    except sqlite3.OperationalError:  # the driver has not created the tables yet
        return []


def test_storage_opens_while_another_reader_creates_it(tmp_path):
    """Our storage and a plain Optuna reader (a dashboard, a user's script) opening one new SQLite study
    database at the same moment: ours always opens, where a bare RDBStorage fails in most rounds because
    both create the schema. Twenty rounds, each released together by a barrier."""
    failures = []
    for r in range(20):
        url = f"sqlite:///{tmp_path / f'optuna{r}.db'}"
        barrier = threading.Barrier(2)

        def ours():
            barrier.wait()
            try:
                storage_for(url).get_all_studies()
            except Exception as e:  # collected for the assertion below
                failures.append(f"round {r}: {type(e).__name__}: {e}"[:300])

        def theirs():
            barrier.wait()
            with contextlib.suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                optuna.storages.RDBStorage(url)  # may fail: not our code

        threads = [threading.Thread(target=f) for f in (ours, theirs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []


@pytest.mark.slow
def test_real_search_killed_then_resumed(tmp_path):
    """make sweep grid=search_quick on tiny ListOps: kill the driver and its trials during trial 1,
    run the same command again: trial 0 is kept, trial 1 is re-queued and resumes in its folder."""
    args = [
        sys.executable,
        "-m",
        "lra.tools.sweep",
        "grid=search_quick",
        "n_trials=2",
        "progress=5",
        *TINY,
        "train.max_steps=30",
        "train.ckpt_every_steps=5",
    ]
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            args, env=sweep_env(tmp_path), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            states = _trial_states_read_only(tmp_path)
            if (
                len(states) == 2
                and states[1] == "RUNNING"
                and list((tmp_path / "runs" / "quick" / "clean" / "listops").rglob("last.ckpt"))
            ):
                break
            assert proc.poll() is None, "the search ended before it could be killed:\n" + log.read_text()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("the search did not reach its second trial in time:\n" + log.read_text()[-3000:])
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have ended by itself (the assertion says why)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = _trial_states(tmp_path)[0]
    assert first.state == TrialState.COMPLETE
    out = subprocess.run(args, env=sweep_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1/2 trials, 1 interrupted trial(s) re-queued ([1])" in out.stdout
    trials = _trial_states(tmp_path)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].value == first.value and trials[2].params == trials[1].params
    (path,) = (tmp_path / "runs" / "quick" / "sweeps" / "search_quick").glob("manifest-listops-skeinformer-*.json")
    m = json.loads(path.read_text())
    row = m["trials"][2]
    rec = json.loads((tmp_path / "runs" / row["run_dir"] / "result.json").read_text())
    assert rec["status"] == "completed" and rec["resumed_from_step"] and rec["best_val_acc"] == trials[2].value
    assert rec["config"]["callbacks"]["optuna_pruning"]["trial_number"] == 2
    assert rec["search"] == {
        "study": m["study"],
        "trial": 2,
        "grid": "search_quick",
        "params": trials[2].params,
        "objective": "best_val_acc",
    }


@pytest.mark.slow
def test_real_search_prunes_through_lra_train(tmp_path):
    """A pruner that prunes every trial at its first report: the trial's run, given OptunaPruning through the
    callbacks config group, stops there; the trial is PRUNED and the record says pruned at that step."""
    args = [
        sys.executable,
        "-m",
        "lra.tools.sweep",
        "grid=search_quick",
        "n_trials=1",
        *TINY,
        "train.max_steps=30",
        "search.pruner.name=threshold",
        "search.pruner.lower=1.1",
        "~search.pruner.n_startup_trials",
        "~search.pruner.n_warmup_steps",
    ]  # a threshold above 1 prunes any accuracy at the first report
    out = subprocess.run(args, env=sweep_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    t = _trial_states(tmp_path)[0]
    assert t.state == TrialState.PRUNED and list(t.intermediate_values) == [5]
    (rec_path,) = (tmp_path / "runs").rglob("result.json")
    rec = json.loads(rec_path.read_text())
    assert rec["stop_reason"] == "pruned" and rec["pruned_at_step"] == 5 and rec["steps"] == 5
    assert rec["config"]["callbacks"]["optuna_pruning"]["trial_number"] == 0
    assert rec["search"]["trial"] == 0 and rec["search"]["params"] == t.params  # pruned: still says its trial


def test_command_line_edits_the_search():
    from lra.tools.sweep import apply_cli, load_grid

    grid = load_grid("search_quick")
    opts, hydra = apply_cli(
        grid,
        [
            "attn=performer",
            "++attn.options.features=choice(64,128)",
            "model.dropout=0.1",
            "~search.params.++attn.options.num_features",
            "search.pruner.name=hyperband",
            "train.lr=interval(1e-4,1e-3)",
            "n_trials=5",
            "progress=0",
        ],
    )
    p = grid.search["params"]
    assert p["++attn.options.features"] == "choice(64,128)" and p["train.lr"] == "interval(1e-4,1e-3)"
    assert "++attn.options.num_features" not in p and "model.dropout" not in p  # a fixed value wins
    assert grid.overrides["model.dropout"] == "model.dropout=0.1" and grid.overrides["attn"] == "attn=performer"
    assert grid.search["pruner"]["name"] == "hyperband" and not grid.axes
    assert opts["n_trials"] == 5 and opts["progress"] == 0.0 and hydra == []


# ----------------------------------------------------------------------------- issue 32: the study's database
def test_a_study_database_another_process_keeps_locked_is_one_line_and_exit_75_in_seconds(tmp_path, monkeypatch):
    """A database browser or a script in a transaction on optuna.db: the search says so at once (exit 75,
    try again later), not after minutes of silent retries and a traceback. The lock is let go after 3 s:
    without the check the study would open then, and no refusal come."""
    import lra.tools.sweep.pruning as pruning
    from lra.tools.sweep.base import Refusal

    monkeypatch.setattr(pruning, "LOCKED_WAIT_S", 0.2, raising=False)
    s = make_search(tmp_path)
    db = tmp_path / "optuna.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()  # a database, not yet a study
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(3.0, other.rollback)
    release.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Refusal) as e:
            open_study(s)
        took = time.monotonic() - t0
    finally:
        release.cancel()
        release.join()
        if other.in_transaction:
            other.rollback()
        other.close()
    assert e.value.code == 75 and took < 3.0
    assert str(e.value).count("\n") == 0 and f"{db} is locked by another process" in str(e.value)


def test_a_study_database_that_is_not_one_is_one_line_and_exit_2(tmp_path):
    from lra.tools.sweep.base import Refusal

    s = make_search(tmp_path)
    (tmp_path / "optuna.db").write_bytes(b"\x00not sqlite at all" * 100)
    with pytest.raises(Refusal) as e:
        open_study(s)
    assert e.value.code == 2 and "\n" not in str(e.value) and "cannot be used (file is not a database)" in str(e.value)
    assert (tmp_path / "optuna.db").read_bytes().startswith(b"\x00not sqlite")  # the user's file, untouched
