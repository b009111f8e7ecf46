"""Issue 19's sweep cases: sweeps of one grid keep their own manifests, an interrupted sweep says so in
one line and leaves its manifest true, every sweep command answers --help without side effects, and
share-bench writes under the runs root. In-process with the launcher faked (what a job leaves in its
folder is written by the test), except one slow end-to-end Ctrl-C on a real local-launcher sweep."""

import contextlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_sweep import TINY, sweep_env

import lra.tools.sweep.driver as driver
import lra.tools.sweep.jobs as jobs
from lra.files import write_json
from lra.runlock import hold, holder_pid
from lra.tools.sweep import (
    MARKER,
    Grid,
    Interrupted,
    apply_cli,
    definition,
    load_grid,
    sweep_key,
)
from lra.tools.sweep.base import STOP_WAIT_S, BudgetReached
from lra.tools.sweep.cli import main
from lra.tools.sweep.jobs import stop_jobs
from lra.tools.sweep.manifest import find_manifest, read_manifest, sweep_lock, write_manifest

JOB = ["grid=quick", "task=listops", "attn=softmax", "hydra/launcher=basic", "progress=0"]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("LRA_DATA", str(tmp_path / "data"))
    return tmp_path / "runs"


def finished(run_dir: Path, status: str = "completed") -> None:
    """What a job leaves: its marker (ended) and its record."""
    write_json(
        run_dir / MARKER,
        {
            "attempts": 1,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "t_start": time.time(),
            "t_end": time.time(),
            "finished": "now",
            "returncode": 0,
        },
    )
    write_json(run_dir / "result.json", {"status": status, "best_val_acc": 0.5, "test_acc": 0.5, "steps": 12})


def fake_launch(status="completed", then=None):
    """lra.tools.sweep.driver.launch that 'runs' each job (writes what lra.train would), then calls ``then``."""

    def launch(composer, primary, grid, todo, *args, **kwargs):
        for j in todo:
            finished(j.run_dir, status)
            if then is not None:
                then()

    return launch


def manifests(runs: Path, grid="quick") -> dict[str, dict]:
    folder = runs / "quick" / "sweeps" / grid
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("manifest*.json"))}


# ----------------------------------------------------------------------------- case: two sweeps, one grid
def test_two_sweeps_with_one_grid_name_keep_both_manifests(runs, monkeypatch, capsys):
    monkeypatch.setattr(driver, "launch", fake_launch())
    first, second = JOB + ["seed=0", "train.max_steps=12"], JOB + ["seed=0", "train.max_steps=24"]
    assert main(first) == 0
    (name_a,) = manifests(runs)
    before = (runs / "quick" / "sweeps" / "quick" / name_a).read_text()
    assert main(second) == 0
    found = manifests(runs)
    assert len(found) == 2 and (runs / "quick" / "sweeps" / "quick" / name_a).read_text() == before
    (name_b,) = set(found) - {name_a}
    assert found[name_a]["definition"]["fixed"]["train.max_steps"] == "12"
    assert found[name_b]["definition"]["fixed"]["train.max_steps"] == "24"
    assert found[name_b]["command"].endswith("seed=0 train.max_steps=24")
    assert found[name_a]["jobs"][0]["run_dir"] != found[name_b]["jobs"][0]["run_dir"]
    assert [m["jobs"][0]["status"] for m in found.values()] == ["completed", "completed"]
    # the first command again (another launcher, another order): its own manifest, one more invocation
    capsys.readouterr()
    text_b = (runs / "quick" / "sweeps" / "quick" / name_b).read_text()
    again = ["grid=quick", "train.max_steps=12", "hydra/launcher=local", "seed=0", "attn=softmax", "task=listops"]
    assert main(again) == 0
    assert "1 jobs, 0 to run, 1 skipped" in capsys.readouterr().out
    found = manifests(runs)
    assert set(found) == {name_a, name_b} and len(found[name_a]["invocations"]) == 2
    assert (runs / "quick" / "sweeps" / "quick" / name_b).read_text() == text_b
    assert main(second + ["dry_run=true"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"{name_b} (exists)")


def test_sweep_key_follows_the_jobs_not_the_spelling():
    def key(*args):
        grid = load_grid("quick")
        _, hydra = apply_cli(grid, list(args))
        return sweep_key(definition(grid, hydra))

    base = key("task=listops", "train.lr=1e-3", "seed=0,1")
    assert base == key("seed=1,0", "train.lr=0.001", "task=listops", "parallel=4", "hydra/launcher=basic")
    assert base == key("task=listops", "train.lr=1e-3", "seed=0,1", "force=true")  # the same jobs again
    assert base != key("task=listops", "train.lr=2e-3", "seed=0,1")
    assert base != key("task=listops", "train.lr=1e-3", "seed=0,1,2")
    one_value_axis = Grid(name="g", overrides={}, axes={"seed": ["seed=0"]})
    fixed = Grid(name="g", overrides={"seed": "seed=0"}, axes={})
    assert sweep_key(definition(one_value_axis, [])) == sweep_key(definition(fixed, []))


def test_a_damaged_manifest_is_kept_aside_with_one_line_never_dropped(tmp_path, capsys):
    """A manifest cut short (a full disk, an editor): its invocation history is the user's. A dry run
    (keep_aside=False) touches nothing; the sweep, holding the sweep's lock, renames it beside the new one
    and says both names in one line on stderr. The driver's own calls, in the driver's order."""
    root, folder = tmp_path / "runs", tmp_path / "runs" / "quick" / "sweeps" / "quick"
    folder.mkdir(parents=True)
    path, previous = find_manifest(folder, "k")
    write_manifest(path, {"grid": "quick", "invocation": {"started": "2025-01-01"}}, [], root, previous)
    cut = path.read_text()[:40]
    path.write_text(cut)
    assert find_manifest(folder, "k", keep_aside=False) == (path, {}) and path.read_text() == cut
    assert capsys.readouterr().err == ""
    with sweep_lock(folder):
        path, previous = find_manifest(folder, "k")
        write_manifest(path, {"grid": "quick", "invocation": {"started": "2026-01-01"}}, [], root, previous)
    (aside,) = folder.glob("manifest-k.json.damaged-*")
    assert aside.read_text() == cut
    (line,) = capsys.readouterr().err.splitlines()
    assert str(path) in line and str(aside) in line and "damaged" in line
    assert json.loads(path.read_text())["invocations"] == [{"started": "2026-01-01"}]
    path.write_text("[1, 2]")  # JSON, but not a manifest (the search's manifest is read the same way)
    assert read_manifest(path) == {} and not path.exists()
    assert len(list(folder.glob("manifest-k.json.damaged-*"))) == 2


def test_a_killed_job_whose_record_says_running_is_resumed_not_taken_for_running(tmp_path):
    """A job killed with its run (SIGKILL, a lost node) leaves ``running`` in its record: nobody holds the
    folder, so it is interrupted (the sweep resumes it), even where the pid its marker names is alive
    again (reused: here this test's own pid). A run holding its folder, or a new attempt still starting
    (its marker newer than the record), is running."""
    d = tmp_path / "run"
    d.mkdir()
    marker = {"attempts": 1, "host": socket.gethostname(), "t_start": time.time() - 60, "finished": None}
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_json(d / "result.json", {"status": "running", "steps": 40})
    for pid in (dead.pid, os.getpid()):
        write_json(d / MARKER, {**marker, "pid": pid})
        assert jobs.run_status(d)[0] == "interrupted"
        with hold(d):  # the run is alive: it holds its folder, whatever became of its job
            assert jobs.run_status(d)[0] == "running"
    write_json(d / MARKER, {**marker, "pid": os.getpid(), "t_start": time.time() + 5})  # attempt 2 starting
    assert jobs.run_status(d)[0] == "running"


# ----------------------------------------------------------------------------- case: interrupted sweeps
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_sweep_prints_one_line_and_leaves_its_manifest_true(runs, monkeypatch, capsys, sig):
    """SIGINT or SIGTERM while the first of two jobs ends as `interrupted`: exit 130/143, one line with the
    counts and the command that resumes, and the manifest says `interrupted` for it (not `pending`)."""

    def signal_the_driver():  # what Ctrl-C / a scheduler does; a missing handler is caught here, not fatal
        os.kill(os.getpid(), sig)
        time.sleep(5)

    monkeypatch.setattr(driver, "launch", fake_launch(status="interrupted", then=signal_the_driver))
    monkeypatch.setattr(jobs, "STOP_GRACE_S", 0.0)
    unhandled = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: unhandled.append(s))
    try:
        rc = main(JOB + ["seed=0,1", "train.max_steps=12"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not unhandled, "SIGTERM reached the test's handler: the sweep does not handle it"
    assert rc == 128 + sig
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(
        f"lra.tools.sweep quick: interrupted by {signal.Signals(sig).name}: 1 interrupted, 1 pending; "
        "resume with: python -m lra.tools.sweep grid=quick task=listops attn=softmax"
    )
    assert err[0].endswith("seed=0,1 train.max_steps=12")
    (m,) = manifests(runs).values()
    assert [j["status"] for j in m["jobs"]] == ["interrupted", "pending"]
    assert m["counts"] == {"interrupted": 1, "pending": 1}
    assert m["invocations"][-1]["interrupted"] == signal.Signals(sig).name


def _holder(run_dir: Path, on_sigterm_status: str | None = "interrupted") -> subprocess.Popen:
    """A stand-in for lra.train holding its run folder (lra/runlock.py's flock on .lock with its pid); with
    ``on_sigterm_status`` None, one that ignores SIGTERM (a run stuck where no signal reaches it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return _ready(run_dir, subprocess.Popen([sys.executable, "-c", _holder_code(run_dir, on_sigterm_status)]))


def _ready(run_dir: Path, proc: subprocess.Popen) -> subprocess.Popen:
    deadline = time.time() + 30
    while not (run_dir / "ready").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    return proc


def _holder_code(run_dir: Path, on_sigterm_status: str | None = "interrupted") -> str:
    return f"""
import fcntl, json, os, signal, socket, sys, time
d = {str(run_dir)!r}
fd = os.open(os.path.join(d, ".lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, json.dumps({{"pid": os.getpid(), "host": socket.gethostname()}}).encode(), 0)
def stop(s, f):
    open(os.path.join(d, "result.json"), "w").write(json.dumps({{"status": {on_sigterm_status!r}}}))
    sys.exit(128 + s)
signal.signal(signal.SIGTERM, stop if {on_sigterm_status!r} else signal.SIG_IGN)
open(os.path.join(d, "ready"), "w").close()
time.sleep(60)
"""


def test_interrupted_sweep_stops_the_runs_still_holding_their_folders_and_only_those(tmp_path):
    """The driver alone was signalled: a run still holding its folder after the grace gets the signal
    (and writes its record); a pid named in an unlocked .lock (a run long gone, the pid reused) is never
    signalled."""
    held, stale = tmp_path / "held", tmp_path / "stale"
    run = _holder(held)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale.mkdir()
        write_json(stale / ".lock", {"pid": bystander.pid, "host": socket.gethostname()})
        assert holder_pid(held) == run.pid and holder_pid(stale) is None
        assert stop_jobs([held, stale, None], signal.SIGTERM, grace_s=0.3, wait_s=20) == [run.pid]
        assert run.wait(timeout=20) == 128 + signal.SIGTERM
        assert json.loads((held / "result.json").read_text())["status"] == "interrupted"
        assert bystander.poll() is None and holder_pid(held) is None
    finally:
        for p in (run, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


# ----------------------------------------------------------------------------- case: a budget outlives its driver
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_gets_sigterm_when_the_process_that_started_it_is_killed(tmp_path):
    """A budgeted sweep's driver SIGKILLed (the basic launcher runs its jobs in it): its run gets SIGTERM from the
    kernel and writes its interrupted record, as at the budget, instead of training on with no budget."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_code = _holder_code(run_dir)
    code = "import sys, time\nfrom lra.tools.sweep.jobs import start_run\n"
    code += f"start_run([sys.executable, '-c', {run_code!r}])\ntime.sleep(60)"
    parent = _ready(run_dir, subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True))
    run = holder_pid(run_dir)
    try:
        assert run is not None, parent.stderr.read() if parent.poll() is not None else "no run started"
        parent.kill()
        parent.wait()
        deadline = time.time() + 10
        while holder_pid(run_dir) is not None and time.time() < deadline:
            time.sleep(0.05)
        assert json.loads((run_dir / "result.json").read_text())["status"] == "interrupted"
    finally:
        if parent.poll() is None:
            parent.kill()
        with contextlib.suppress(OSError, TypeError):
            os.kill(holder_pid(run_dir), signal.SIGKILL)


def test_a_job_stops_its_run_at_the_budget_it_carries_when_its_driver_is_gone(tmp_path, monkeypatch):
    """The local launcher's job processes outlive a killed driver (submitit's controller is made to): the driver gives
    each the budget's end, and the job stops its run there itself with SIGTERM (its interrupted record)."""
    seen = []

    class Composer:  # what launch() gives the jobs is all this asks
        def primary(self, overrides, logging=False):
            seen.extend(overrides)
            raise InterruptedError

    primary = OmegaConf.create({"hydra": {"overrides": {"hydra": [], "task": []}}})
    with pytest.raises(InterruptedError):
        driver.launch(
            Composer(),
            primary,
            None,
            [],
            kind="basic",
            parallel=1,
            folder=tmp_path,
            hydra_ovs=[],
            manifest=None,
            head={},
            jobs=[],
            root=tmp_path,
            end=1000.0,
        )
    (end,) = [o.split("=", 1)[1] for o in seen if o.startswith(f"++hydra.job.env_set.{jobs.END_ENV}=")]
    assert float(end) == 1000.0 + STOP_WAIT_S  # after the driver's own stop, when it is alive
    run = _holder(tmp_path / "run")
    try:
        t = time.time()
        monkeypatch.setenv(jobs.END_ENV, str(t + 0.5))
        with pytest.raises(BudgetReached):
            jobs.wait_run(run)
        assert run.returncode == 128 + signal.SIGTERM and time.time() - t >= 0.5
        assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "interrupted"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_a_pid_a_damaged_marker_names_is_never_signalled_or_taken_for_a_live_job(tmp_path, monkeypatch):
    """.sweep_job.json comes with the run folder (a carry pack): pid -1 or 0 is no process (os.kill(-1, SIGTERM)
    signals every process of the user, 0 the sweep's own group), nor is a string or a bool."""
    sent = []
    monkeypatch.setattr(jobs.os, "kill", lambda pid, sig: sent.append((pid, sig)))  # every pid alive, none signalled
    d, here = tmp_path / "run", socket.gethostname()
    d.mkdir()
    for bad in (-1, 0, True, "123", 2.5):
        write_json(d / MARKER, {"host": here, "pid": bad, "t_start": time.time()})
        assert jobs.run_status(d)[0] == "interrupted", bad
        write_json(d / MARKER, {"host": here, "pid": os.getpid(), "run_pid": bad, "t_start": time.time()})
        assert stop_jobs([d], signal.SIGTERM, grace_s=0.0, wait_s=0.0) == [], bad
    assert [s for s in sent if s[1] != 0] == []


def test_a_damaged_share_bench_row_is_no_measurement_never_a_traceback(tmp_path):
    """jobs_per_gpu=auto reads <runs root>/share_bench/share_bench.json: a row that is no object, or whose k or
    steps/s is not a number above zero, is no measurement (one line, exit 2 as with none), never a traceback."""
    (tmp_path / "share_bench").mkdir()
    rows = [[1], {"device": "cuda", "k": "2", "steps_per_s": 5.0, "completed": "2"}]
    rows += [
        {"device": "cuda", "k": -3, "steps_per_s": 5.0, "completed": -3},
        {"device": "cuda", "k": 2, "steps_per_s": "5"},
    ]
    (tmp_path / "share_bench" / "share_bench.json").write_text(json.dumps(rows))
    with pytest.raises(SystemExit, match="no share-bench measurement on "):
        driver._auto_k(tmp_path, ["0"], [])


def test_local_launcher_jobs_leave_ctrl_c_to_the_run_not_to_submitit(monkeypatch):
    """The controllers the local launcher starts inherit a blocked SIGINT (no KeyboardInterrupt
    traceback from them on a Ctrl-C); the job process gives lra.train an unblocked, default SIGINT."""
    probe = (
        "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ()), "
        "signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")  # what the controller sets for its jobs
    try:
        with jobs.ctrl_c_to_the_driver(True):  # as launch() starts the submitit controllers
            controller = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split()
            assert controller[0] == "True"
            jobs.ctrl_c_for_the_run()  # what run_job does in such a process before starting lra.train
            assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
            assert signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, signal.SIG_IGN)
            run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split()
            assert run == ["False", "True"]
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.slow
def test_ctrl_c_on_a_local_launcher_sweep_is_one_line_and_the_manifest_says_interrupted(tmp_path):
    """The reported case end to end: Ctrl-C (SIGINT to the process group) once the first job has a
    checkpoint. Before: a KeyboardInterrupt traceback from submitit's controller, the manifest `pending`."""
    args = [
        "grid=quick",
        "task=listops",
        "attn=softmax",
        "seed=0,1",
        "hydra/launcher=local",
        "parallel=1",
        *TINY,
        "train.max_steps=400",
        "train.eval_every=10",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lra.tools.sweep", *args],
        env=sweep_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 600
        while not list((tmp_path / "runs").rglob("seed0/**/checkpoints/*.ckpt")):
            assert proc.poll() is None and time.time() < deadline, "the sweep ended before its first checkpoint"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("lra.tools.sweep")]
    assert len(lines) == 1 and "interrupted by SIGINT: 1 interrupted, 1 pending; resume with: " in lines[0]
    (path,) = (tmp_path / "runs" / "quick" / "sweeps" / "quick").glob("manifest-*.json")
    jobs = json.loads(path.read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["interrupted", "pending"]
    assert json.loads((tmp_path / "runs" / jobs[0]["run_dir"] / "result.json").read_text())["status"] == "interrupted"


# ----------------------------------------------------------------------------- searches: keyed, interrupted
def test_two_searches_with_one_grid_name_keep_their_own_studies(runs, monkeypatch, capsys):
    pytest.importorskip("optuna")
    from lra.tools.sweep import Composer
    from lra.tools.sweep.search import prepare

    def search(*args):
        grid = load_grid("search_quick")
        opts, hydra = apply_cli(grid, list(args))
        with Composer() as composer:
            return prepare(grid, opts, hydra, composer)

    a, b = search("train.max_steps=30"), search("train.max_steps=60")
    assert a.name != b.name and a.manifest != b.manifest and a.storage == b.storage
    assert a.name.startswith("search_quick-quick-listops-skeinformer-")
    assert search("n_trials=50", "train.max_steps=30", "parallel=2").name == a.name  # the same search, grown


def test_interrupted_search_requeues_its_trial_and_prints_one_line(runs, monkeypatch, capsys):
    """SIGTERM while a trial runs: the trial ends (interrupted), the study marks it so and queues it
    again, the manifest is written, one line, exit 143."""
    pytest.importorskip("optuna")
    import lra.tools.sweep.search as search

    class Proc:  # a trial that the group's SIGTERM ends: its record says interrupted
        pid = 4242

        def __init__(self, run_dir):
            self.run_dir, self.rc = run_dir, None

        def poll(self):
            if self.rc is None:
                self.rc = 128 + signal.SIGTERM
                write_json(self.run_dir / "result.json", {"status": "interrupted"})
                raise Interrupted(signal.SIGTERM)
            return self.rc

        def send_signal(self, sig):
            raise AssertionError("a trial that ended on its own signal was signalled again")

        def wait(self, timeout=None):
            return self.rc

    class Runner:
        def start(self, cmd, env, log_path):
            return Proc(Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1].strip("'")))

    monkeypatch.setattr(search, "ProcessRunner", Runner)
    rc = main(["grid=search_quick", "n_trials=3", "progress=0", "train.max_steps=30"])
    assert rc == 128 + signal.SIGTERM
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(
        "lra.tools.sweep search_quick: interrupted by SIGTERM: 2 trials "
        "(1 FAIL, 1 WAITING), 3 of 3 to go; resume with: python -m lra.tools.sweep"
    )
    (path,) = (runs / "quick" / "sweeps" / "search_quick").glob("manifest-listops-skeinformer-*.json")
    m = json.loads(path.read_text())
    first, queued = m["trials"]
    assert first["state"] == "FAIL" and first["interrupted"] is True and first["status"] == "interrupted"
    assert queued["state"] == "WAITING" and queued["requeued_from"] == 0 and queued["params"] == first["params"]
    assert queued["run_dir"] == first["run_dir"]  # it will resume there
    assert m["invocations"][-1]["interrupted"] == "SIGTERM" and m["invocations"][-1]["launched"] == 1


def test_interrupted_search_tells_a_trial_that_finished_anyway_and_requeues_the_rest(tmp_path):
    optuna = pytest.importorskip("optuna")
    from test_optuna import make_search

    from lra.tools.sweep.study import open_study, settle

    s = make_search(tmp_path)
    study = open_study(s)
    done, stopped, waiting = (study.ask(s.space) for _ in range(3))
    write_json(tmp_path / "done" / "result.json", {"status": "completed", "best_val_acc": 0.75})
    write_json(tmp_path / "stopped" / "result.json", {"status": "interrupted"})
    settle(study, {done.number: (tmp_path / "done", 0), stopped.number: (tmp_path / "stopped", 130)}, [waiting.number])
    trials = study.get_trials()
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value == 0.75
    for t in trials[1:3]:
        assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["interrupted"] is True
    assert trials[1].user_attrs["status"] == "interrupted"
    assert [t.user_attrs["requeued_from"] for t in trials[3:]] == [stopped.number, waiting.number]


# ----------------------------------------------------------------------------- case: --help everywhere
@pytest.mark.parametrize("module", ["lra.tools.sweep", "lra.tools.share_bench"])
def test_every_sweep_command_answers_help_without_side_effects(module, tmp_path, monkeypatch, capsys):
    """`python -m <module> --help`: usage, options and examples, exit 0, nothing run or written (share_bench
    used to pass --help into four sweeps; a search printed nothing); an unknown flag: one line, exit 2."""
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)

    def no_process(*a, **k):
        raise AssertionError(f"{module} --help started a process: {a}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(subprocess, "run", no_process)

    def run(*args):
        monkeypatch.setattr(sys, "argv", [module, *args])
        with warnings.catch_warnings(), pytest.raises(SystemExit) as e:
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        return e.value.code

    assert run("--help") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {module}") and "examples:" in out and "=" in out
    assert not any(tmp_path.iterdir())
    assert run("--bogus") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--bogus" in err[0] and not any(tmp_path.iterdir())


def test_bad_sweep_input_is_one_line_and_exit_code_2(runs, monkeypatch, capsys):
    """Refused before anything runs (n_trials=0 used to start the file's 20 trials; dry_run=ture ran the
    sweep for real); a Hydra parse error was a traceback; every refusal was exit code 1."""

    def no_run(*a, **k):
        raise AssertionError("bad input started jobs")

    monkeypatch.setattr(driver, "launch", no_run)
    with contextlib.suppress(ImportError):  # without optuna a search is refused in one line anyway
        import lra.tools.sweep.search

        monkeypatch.setattr(lra.tools.sweep.search, "ProcessRunner", no_run)
    for args in (
        ["grid=not_a_grid"],
        ["grid=quick", "train.lr=(", "dry_run=true"],
        ["grid=quick", "parallel=0"],
        ["grid=quick", "task=listops", "dry_run=ture"],
        ["grid=quick", "progress=nan"],
        ["grid=quick", "task=listops", "budget=5s"],  # too short for any run to start
        ["grid=search_quick", "n_trials=0"],
    ):
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2, args
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("lra.tools.sweep: "), err
    assert not runs.exists()


# ----------------------------------------------------------------------------- case: share-bench and LRA_RUNS
class FakeSweep:
    """subprocess.Popen for share_bench's sweeps: writes what a gpu_share sweep leaves under its LRA_RUNS."""

    calls: list = []
    interrupt_at: int | None = None

    def __init__(self, cmd, env, cwd):
        self.cmd, self.root, self.signals = cmd, Path(env["LRA_RUNS"]), []
        FakeSweep.calls.append(self)

    def wait(self):
        if FakeSweep.interrupt_at == len(FakeSweep.calls) and not self.signals:
            raise KeyboardInterrupt
        if self.signals:
            return 128 + self.signals[0]
        k = int(next(a for a in self.cmd if a.startswith("jobs_per_gpu=")).split("=")[1])
        for seed in range(k):
            write_json(
                self.root / "quick" / f"seed{seed}" / "result.json",
                {"status": "completed", "time_per_1k_steps_s": 100.0, "micro_batch": 32},
            )
        write_json(
            self.root / "skeinformer_paper" / "sweeps" / "gpu_share" / "manifest-0123456789.json",
            {"updated": "x", "invocations": [{"wall_s": 10.0 * k}]},
        )
        return 0

    def send_signal(self, sig):
        self.signals.append(sig)


@pytest.mark.parametrize("how", ["env", "option"])
def test_share_bench_honours_LRA_RUNS_and_runs_root(how, tmp_path, monkeypatch, capsys):
    import lra.tools.share_bench as share_bench

    monkeypatch.setattr(FakeSweep, "calls", [])
    monkeypatch.setattr(share_bench.subprocess, "Popen", FakeSweep)
    root = (tmp_path / "elsewhere").resolve()
    monkeypatch.setenv("LRA_RUNS", str(root if how == "env" else tmp_path / "not_this"))
    args = ["ks=1,2", "train.max_steps=50"] + ([f"runs_root={root}"] if how == "option" else [])
    assert share_bench.main(args) == 0
    assert [c.root for c in FakeSweep.calls] == [root / "share_bench" / "k1", root / "share_bench" / "k2"]
    assert all(not any(a.startswith("runs_root=") for a in c.cmd) for c in FakeSweep.calls)
    rows = json.loads((root / "share_bench" / "share_bench.json").read_text())
    assert [(r["k"], r["completed"], r["steps_per_s"], r["wall_s"]) for r in rows] == [
        (1, 1, 10.0, 10.0),
        (2, 2, 20.0, 20.0),
    ]
    assert not (tmp_path / "not_this").exists()


def test_interrupted_share_bench_waits_for_its_sweep_and_stops(tmp_path, monkeypatch, capsys):
    import lra.tools.share_bench as share_bench

    monkeypatch.setattr(FakeSweep, "calls", [])
    monkeypatch.setattr(FakeSweep, "interrupt_at", 1)
    monkeypatch.setattr(share_bench.subprocess, "Popen", FakeSweep)
    assert share_bench.main(["ks=1,2", f"out={tmp_path / 'sb'}"]) == 130
    (call,) = FakeSweep.calls  # no sweep for k=2; the interrupted one was told and waited for, not killed
    assert call.signals == [signal.SIGINT]
    assert "interrupted at k=1" in capsys.readouterr().err and not (tmp_path / "sb" / "share_bench.json").exists()
