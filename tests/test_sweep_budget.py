"""A sweep against the clock (lra/tools/sweep/cost.py, budget.py): the grid's order, what a job has left, its
estimate from the runs and probes of this device, which jobs a budget starts, and a budget that stops a run
which the next window finishes to the record an uninterrupted run writes."""

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import lra.runlock as runlock
import lra.tools.sweep.grid as grid_mod
from lra.files import write_json
from lra.tools.sweep import budget, cli, cost, driver, load_grid
from lra.tools.sweep.base import BUDGET_SLACK_S, MARKER
from lra.tools.sweep.cost import Estimator, Rate, Work, kind_of, plan_budget, seconds, work_of
from lra.tools.sweep.grid import parse_budget
from lra.tools.sweep.manifest import Job
from tests.helpers import run_env

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


# ----------------------------------------------------------------------------- the order of the jobs
def test_the_grid_file_orders_the_jobs_seed_then_task_then_row():
    """skeinformer_table1 runs seed 0 of every ListOps row first (the headline rows first), then Text, ...,
    and seed 1 only after seed 0 of every task: a window that ends early has filled whole cells."""
    grid = load_grid("skeinformer_table1")
    jobs = [dict(o.split("=", 1) for o in j if o.split("=", 1)[0] in ("seed", "task", "attn")) for j in grid.jobs()]
    assert len(jobs) == 16 * 5 * 3
    assert [j["seed"] for j in jobs[:80]] == ["0"] * 80 and jobs[80]["seed"] == "1"
    assert [j["task"] for j in jobs[:16]] == ["listops"] * 16 and jobs[16]["task"] != "listops"
    assert jobs[0]["attn"] == "softmax" and jobs[1]["attn"] == grid.axes["attn"][1].split("=", 1)[1]


def test_an_order_naming_no_axis_is_refused(tmp_path, monkeypatch):
    from lra.tools.sweep import grid as grid_mod

    (tmp_path / "g.yaml").write_text("overrides: [preset=quick]\ngrid:\n  seed: [0, 1]\norder: [sed]\n")
    monkeypatch.setattr(grid_mod, "GRID_DIR", tmp_path)
    with pytest.raises(SystemExit, match="order must list axes of its grid"):
        load_grid("g")


# ----------------------------------------------------------------------------- what a job has left
def _job(tmp_path, status="pending", steps=None, seed=0, max_steps=600, eval_every=150, patience=None, ckpt=False):
    d = tmp_path / f"run-{seed}-{status}"
    (d / "checkpoints").mkdir(parents=True, exist_ok=True)
    if ckpt:
        (d / "checkpoints" / "last.ckpt").write_bytes(b"x")
    j = Job(overrides=["preset=quick", "task=listops", "attn=softmax", f"seed={seed}"], run_dir=d, status=status)
    j.train = {"max_steps": max_steps, "eval_every": eval_every, "patience": patience}
    j.record = {"steps": steps} if steps is not None else {}
    j.rel = d.name
    return j


def test_a_stopped_job_has_the_steps_after_its_checkpoint_left(tmp_path):
    fresh = work_of(_job(tmp_path))
    assert (fresh.steps_left, fresh.evals_left) == (600, 4)
    resumed = work_of(_job(tmp_path, "interrupted", steps=300, seed=1, ckpt=True))
    assert (resumed.steps_left, resumed.evals_left) == (300, 2)
    # steps in the record but no checkpoint: it starts over
    assert work_of(_job(tmp_path, "interrupted", steps=300, seed=2)).steps_left == 600
    assert work_of(_job(tmp_path, "completed", steps=600, seed=3)).steps_left == 0
    rate = Rate(fixed_s=10.0, step_s=0.1, eval_s=2.0, source="probe")
    assert seconds(resumed, rate) == pytest.approx(10 + 300 * 0.1 + 2 * 2.0)
    assert seconds(Work(600, 150, False, done=600), rate) == 0.0


def test_seeds_are_one_kind_of_job_and_other_overrides_are_not():
    a = ["preset=quick", "task=listops", "attn=softmax", "seed=0", "run_tag=''"]
    assert kind_of(a) == kind_of(["seed=3", "attn=softmax", "preset=quick", "task=listops"])
    assert kind_of(a) != kind_of([*a, "train.lr=0.002"])


def test_a_finished_sweep_run_measures_its_kind_and_a_stopped_job_its_own_pace(tmp_path):
    done = _job(tmp_path, "completed", steps=600)
    done.record = {"steps": 600, "train_time_s": 60.0, "eval_time_s": 8.0, "device": "cpu"}
    (done.run_dir / ".sweep_job.json").write_text(json.dumps({"t_start": 1000.0, "t_end": 1080.0}))
    est = Estimator(tmp_path / "runs", "cpu", parallel=2)
    est.learn_from([done])
    pending = _job(tmp_path, seed=1)
    secs, rate, _ = est.estimate(pending)
    assert rate.source.startswith("run ") and rate.fixed_s == pytest.approx(12.0)
    assert secs == pytest.approx(12 + 600 * 0.1 + 4 * 2.0)
    # kept for the next invocation on this device, not for another device or another parallel
    assert Estimator(tmp_path / "runs", "cpu", parallel=2).estimate(pending)[0] == pytest.approx(secs)
    assert Estimator(tmp_path / "runs", "NVIDIA H100 80GB HBM3", parallel=2).estimate(pending)[0] is None
    assert Estimator(tmp_path / "runs", "cpu", parallel=1).estimate(pending)[0] is None
    # a job an earlier window stopped runs at its own measured pace from its checkpoint
    stopped = _job(tmp_path, "interrupted", steps=300, seed=2, ckpt=True)
    stopped.record = {"steps": 300, "train_time_s": 90.0, "eval_time_s": 6.0, "device": "cpu"}
    secs, rate, _ = est.estimate(stopped)
    assert rate.source == "own record" and secs == pytest.approx(12 + 300 * 0.3 + 2 * 3.0)


def test_a_carried_run_no_sweep_started_is_estimated_from_its_own_pace(tmp_path):
    """A run an earlier window started by hand (no .sweep_job.json: its start-up unknown) and nothing else measured:
    its steps left at its own pace, with the start-up counted as none and said so."""
    stopped = _job(tmp_path, "interrupted", steps=2300, ckpt=True, max_steps=20000, eval_every=500, patience=10)
    stopped.record = {"steps": 2300, "train_time_s": 380.0, "eval_time_s": 40.0, "device": "NVIDIA H100 80GB HBM3"}
    est = Estimator(tmp_path / "runs", "NVIDIA H100 80GB HBM3", parallel=5)
    secs, rate, work = est.estimate(stopped)
    assert rate.source == "own record, start-up not measured" and work.early_stop
    assert secs == pytest.approx((20000 - 2300) * 380 / 2300 + (40 - 4) * 40 / 4)


# ----------------------------------------------------------------------------- what comes from elsewhere is data
def test_a_damaged_rate_in_the_cache_is_one_warning_naming_it_and_no_estimate(tmp_path, caplog):
    """The rates' cache travels in carry packs: a rate that is not a finite number of the right type (per step: above
    zero) started every job ('about -286 s of job time'), never ran one (NaN) or ended in a traceback (a string)."""
    job = _job(tmp_path)
    cached = tmp_path / "runs" / cost.COST_DIR / "cpu" / f"{kind_of(job.overrides)}.json"
    cached.parent.mkdir(parents=True)
    good = {"fixed_s": 10.0, "step_s": 0.1, "eval_s": 2.0, "source": "probe", "device": "cpu", "parallel": 1}
    bad = [("step_s", -0.5), ("step_s", 0), ("step_s", float("nan")), ("step_s", "0.1"), ("step_s", True)]
    bad += [("fixed_s", -160.0), ("eval_s", float("inf")), ("parallel", "1"), ("source", None)]
    for text in [json.dumps({**good, k: v}) for k, v in bad] + ["[1, 2]", "{not json", '{"step_s": 0.1}']:
        cached.write_text(text)
        caplog.clear()
        assert Estimator(tmp_path / "runs", "cpu", parallel=1).estimate(job)[0] is None, text
        (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warning.startswith(f"{cached}: ") and "ignored" in warning, warning
    cached.write_text(json.dumps(good))
    assert Estimator(tmp_path / "runs", "cpu", parallel=1).estimate(job)[0] == pytest.approx(10 + 600 * 0.1 + 4 * 2.0)


def test_steps_and_times_a_record_marker_checkpoint_or_metrics_file_gives_are_checked(tmp_path, monkeypatch):
    """A step count or a time that is not a number of the right kind and sign (a damaged or hand-edited record,
    marker, checkpoint or metrics.csv from another window) is no figure: never a traceback or a negative time."""

    def checkpoint(step):  # lra.protocol as cost._checkpoint_step reads it (without importing lightning: seconds)
        monkeypatch.setitem(
            sys.modules, "lra.protocol", SimpleNamespace(RunError=OSError, read_checkpoint=lambda _: step)
        )

    for steps in ("300", -300, 2.5, True, float("nan"), [300]):  # the record's: the checkpoint's step instead
        checkpoint({"global_step": 250})
        assert work_of(_job(tmp_path, "interrupted", steps=steps, ckpt=True)).done == 250, steps
    for step in (-5, "250", 2.5):  # the checkpoint's: it starts over
        checkpoint({"global_step": step})
        assert work_of(_job(tmp_path, "interrupted", steps=0, ckpt=True)).done == 0, step
    rec = {"steps": 300, "train_time_s": 30.0, "eval_time_s": 4.0, "device": "cpu"}
    assert cost.rate_of_record(rec, 150, 40.0, "r", 1).step_s == pytest.approx(0.1)
    for k, v in [("steps", "300"), ("steps", -300), ("train_time_s", -30.0), ("train_time_s", float("nan"))]:
        assert cost.rate_of_record({**rec, k: v}, 150, 40.0, "r", 1) is None, (k, v)
    for k, v in [("train_time_s", "30"), ("eval_time_s", -4.0), ("eval_time_s", float("inf"))]:
        assert cost.rate_of_record({**rec, k: v}, 150, 40.0, "r", 1) is None, (k, v)
    done = _job(tmp_path, "completed", steps=600, seed=5)
    done.record = {"steps": 600, "train_time_s": 60.0, "eval_time_s": 8.0, "device": "cpu", "machine": ["x"]}
    for marker in ({"t_start": "then", "t_end": 1080.0}, {"t_start": 1080.0, "t_end": 1000.0}, [1000.0, 1080.0]):
        (done.run_dir / MARKER).write_text(json.dumps(marker))
        est = Estimator(tmp_path / "runs", "cpu", parallel=1)
        est.learn_from([done])
        assert est.rates == {}, marker  # no wall time: no start-up, no rate to keep
    metrics = done.run_dir / "metrics.csv"  # a diverged validation (NaN) is no best; an infinite time no pace
    metrics.write_text("step,time/train_s,val/loss\n100,10.0,nan\n200,inf,1.5\n")  # steps as taken
    assert cost.rate_of_metrics(metrics, 1) is None and cost._best_val_step(metrics) == 200


def test_a_probe_whose_first_steps_ran_faster_than_its_last_keeps_no_negative_start_up(tmp_path, monkeypatch, caplog):
    """The probe moves the first steps' extra time into ``fixed``; steps that sped up instead (the probes beside it
    ending) must not leave a negative start-up in the cache, which the next sweep would refuse."""
    popen, started = subprocess.Popen, []

    def probe(cmd, **kw):  # 40 steps in 4 s, the last ones at 0.5 s a step (32 samples at 64 a second)
        started.append(kw)
        d = Path(next(c for c in cmd if c.startswith("hydra.run.dir=")).split("=", 1)[1].strip("'"))
        write_json(d / "result.json", {"steps": 40, "train_time_s": 4.0, "eval_time_s": 1.0, "effective_batch": 32})
        (d / "metrics.csv").write_text("throughput/samples_per_s\n" + "64\n" * 4)
        return popen(["true"], **kw)

    monkeypatch.setattr(cost.subprocess, "Popen", probe)
    job = _job(tmp_path)
    Estimator(tmp_path / "runs", "cpu", parallel=1).probe([job])
    rate = Estimator(tmp_path / "runs", "cpu", parallel=1).rates.get(kind_of(job.overrides))
    assert rate is not None and rate.step_s == pytest.approx(0.5) and rate.fixed_s == 0.0, rate
    assert "WARNING" not in caplog.text
    assert (started[0].get("preexec_fn") is not None) == sys.platform.startswith("linux")  # it ends with the driver


def _window1_run(tmp_path, attn, ckpt_step, ms_per_step, best_step, val_every=500):
    """A run as the first GPU window left it: a record written before records counted an interrupted run's
    steps (steps 0, no times), its pace only in metrics.csv (training seconds so far at each validation, rows
    at the steps taken, as the pack holds them) and its step only in last.ckpt."""
    j = _job(
        tmp_path,
        "interrupted",
        steps=0,
        seed=attn,  # one folder each (hash(attn) % 1000 could collide: a flaky test)
        max_steps=20000,
        eval_every=val_every,
        patience=10,
        ckpt=True,
    )
    j.record = {"steps": 0, "device": "NVIDIA H100 80GB HBM3"}
    j.rel = attn
    rows = ["step,time/train_s,val/loss"]
    for s in range(val_every, ckpt_step + 1, val_every):
        rows.append(f"{s},{s * ms_per_step / 1000},{2.0 - (s if s <= best_step else best_step) / 10000}")
    (j.run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    return j


def test_a_window_starts_the_carried_runs_that_can_finish_soonest_first(tmp_path, monkeypatch):
    """The first window's five ListOps runs (steps, best validations and paces as it left them): each is
    estimated from its own metrics, its least work is to its early stop (best validation + 10 x 500 steps),
    and the budget starts them soonest to finish first, whatever the grid's order."""
    monkeypatch.setattr(cost, "_checkpoint_step", lambda last: steps[last.parent.parent.name])
    spec = {  # attn: (last.ckpt step, ms per step with five on the GPU, best validation step)
        "softmax": (700, 537, 500),
        "skeinformer": (2300, 165, 2000),
        "performer": (3600, 122, 3500),
        "nystrom": (2300, 161, 2000),
        "linformer": (5200, 93, 5000),
    }
    jobs = [_window1_run(tmp_path, a, *v) for a, v in spec.items()]
    steps = {j.run_dir.name: spec[j.rel][0] for j in jobs}
    est = Estimator(tmp_path / "runs", "NVIDIA H100 80GB HBM3", parallel=1)
    for j in jobs:
        secs, rate, work = est.estimate(j)
        done, ms, best = spec[j.rel]
        assert work.done == done and work.least_left == best + 10 * 500 - done, j.rel
        assert rate.step_s == pytest.approx(ms / 1000) and rate.source.startswith("own metrics"), j.rel
        assert secs == pytest.approx((20000 - done) * ms / 1000), j.rel  # the upper bound: max_steps
    order = sorted(jobs, key=lambda j: budget.soonest(est, j))
    assert [j.rel for j in order] == ["linformer", "performer", "nystrom", "skeinformer", "softmax"]
    started = []
    budget.run_on_budget(jobs, jobs, est, 1, time.time() + 3600, True, lambda nxt: None, started, {"estimates_s": {}})
    assert [j.rel for j in started][:2] == ["linformer", "performer"]
    # on another card (an H200 window) their paces there still order them: not the grid's order
    elsewhere = Estimator(tmp_path / "runs", "NVIDIA H200", parallel=1)
    assert all(elsewhere.estimate(j)[0] is None for j in jobs)
    assert [j.rel for j in sorted(jobs, key=lambda j: budget.soonest(elsewhere, j))] == [j.rel for j in order]


# ----------------------------------------------------------------------------- which jobs a budget starts
def _plan(estimates, batch, budget, carry=False):
    jobs = [f"j{i}" for i in range(len(estimates))]
    by_id = {id(j): e for j, e in zip(jobs, estimates)}
    slots, left = plan_budget(jobs, by_id, batch, budget, carry)
    return [(s.job, s.start_s, s.finishes) for s in slots], left


def test_a_budget_starts_only_the_jobs_expected_to_finish_in_it():
    # batches of two, each as long as its longest job: j0, j1 end at 50; j2 (200 s) cannot finish, j3 can
    started, left = _plan([50, 50, 200, 30, 60], batch=2, budget=100)
    assert started == [("j0", 0.0, True), ("j1", 0.0, True), ("j3", 50.0, True)]
    assert left == ["j2", "j4"]  # j4 would share j3's batch but end at 110
    # one at a time: the order decides
    started, left = _plan([40, 40, 40], batch=1, budget=100)
    assert [s[0] for s in started] == ["j0", "j1"] and left == ["j2"]
    # a job with no estimate starts in the grid's order (it may finish); its batch may last to the budget
    started, left = _plan([None, 10], batch=1, budget=100)
    assert started == [("j0", 0.0, None)] and left == ["j1"]
    started, left = _plan([30, None, 10], batch=1, budget=100)
    assert started == [("j0", 0.0, True), ("j1", 30.0, None)] and left == ["j2"]


def test_carry_fills_the_slots_that_can_still_start_with_jobs_to_carry():
    started, left = _plan([50, 50, 200, 30, 60], batch=2, budget=100, carry=True)
    assert started[-1] == ("j2", 50.0, False) and left == ["j4"]
    # nothing can finish: the first batch starts anyway, to be carried to the next window
    started, left = _plan([900, 900, 900], batch=2, budget=100, carry=True)
    assert started == [("j0", 0.0, False), ("j1", 0.0, False)] and left == ["j2"]


def test_a_budgeted_job_checkpoints_every_half_minute_of_its_training_unless_it_says(tmp_path):
    """A run the budget stops resumes from its last checkpoint; evaluations alone are minutes apart."""
    from lra.tools.sweep.budget import with_checkpoints

    fast, own, unknown = _job(tmp_path), _job(tmp_path, seed=1), _job(tmp_path, seed=2)
    own.overrides.append("train.ckpt_every_steps=100")
    with_checkpoints(fast, Rate(fixed_s=5.0, step_s=0.1, eval_s=1.0, source="probe"))
    with_checkpoints(own, Rate(fixed_s=5.0, step_s=0.1, eval_s=1.0, source="probe"))
    with_checkpoints(unknown, None)
    assert fast.overrides[-1] == "train.ckpt_every_steps=300" and kind_of(fast.overrides) == kind_of(own.overrides)
    assert own.overrides[-1] == "train.ckpt_every_steps=100" and own.overrides.count("train.ckpt_every_steps=100") == 1
    assert unknown.overrides[-1] == "train.ckpt_every_steps=50"


def test_a_budget_is_a_time():
    assert parse_budget("10m") == 600 and parse_budget("90s") == 90 and parse_budget("1.5h") == 5400
    assert parse_budget("45") == 45
    for bad in ("ten", "0", "-5m", "5d", ""):
        with pytest.raises(SystemExit, match="give a time such as 600, 90s, 10m or 1.5h"):
            parse_budget(bad)
    with pytest.raises(SystemExit, match="budget=8s: too short to do anything"):
        parse_budget("8s")


# ----------------------------------------------------------------------------- two windows, end to end
# One ListOps job long enough that a 30 s budget stops it mid-way; a resume checkpoint every 10 steps.
WINDOW_JOB = [
    "grid=quick",
    "task=listops",
    "attn=softmax",
    "seed=0",
    "hydra/launcher=basic",
    "task.generator.n_train=256",
    "task.generator.n_val=64",
    "task.generator.n_test=64",
    "train.max_steps=600",  # more than 30 s of training even on an idle 2-core machine (150 steps finished in it)
    "train.eval_every=50",
    "train.ckpt_every_steps=10",
    "trainer.progress=false",
]


def _command(tmp_path, root, *args):
    env = run_env(tmp_path, runs=root)
    env["LRA_DATA"] = str(tmp_path / "data")  # one generation for the three runs roots
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _record(root: Path) -> dict:
    (path,) = root.rglob("result.json")
    return json.loads(path.read_text())


def _carried(out: str) -> set[str]:
    """The runs a budgeted sweep's report says it carries."""
    return {line.split()[1] for line in out.splitlines() if line.startswith("  carry ")}


def _packed(tmp_path, root: str) -> set[str]:
    """The runs ``python -m lra.tools.carry pack`` puts in a pack of ``tmp_path/root`` (none: no pack written)."""
    out = tmp_path / f"pack-{root}"
    _command(tmp_path, root, "-m", "lra.tools.carry", "pack", str(tmp_path / root), "--out", str(out))
    return {r["path"] for r in json.loads((out / "pack.json").read_text())["runs"]} if out.exists() else set()


@pytest.mark.slow  # 40 s: a real run, started and stopped by a real budget
def test_the_budget_stops_the_runs_still_training_and_the_manifest_says_so(tmp_path):
    """budget=30s carry=true: the job starts though it cannot finish, gets SIGTERM at the budget, writes an
    interrupted record (resumable), and the sweep ends within its slack with exit 0, carrying what the pack holds."""
    job = [*WINDOW_JOB, "train.max_steps=5000"]  # far more than 30 s of training anywhere
    t = time.time()
    out = _command(tmp_path, "w1", "-m", "lra.tools.sweep", *job, "budget=30s", "carry=true", "probe=false")
    assert time.time() - t <= 30 + BUDGET_SLACK_S
    assert "1 without an estimate" in out and "budget reached" in out
    assert _carried(out) == _packed(tmp_path, "w1")  # one or none: a loaded machine may still be starting it
    records = list((tmp_path / "w1").rglob("result.json"))
    assert all(json.loads(r.read_text())["status"] == "interrupted" for r in records)
    (manifest,) = (tmp_path / "w1" / "quick" / "sweeps" / "quick").glob("manifest-*.json")
    inv = json.loads(manifest.read_text())["invocations"][-1]
    assert inv["budget_reached"] is True and inv["budget_s"] == 30 and inv["launched"] == 1
    assert not [p for p in (tmp_path / "w1").rglob(".lock") if runlock.holder_pid(p.parent)]  # nothing left running


# ----------------------------------------------------------------------------- a budget that holds
def test_probes_keep_to_their_share_of_the_budget_and_are_cut_at_its_end(tmp_path, monkeypatch, capsys):
    """A 60 s budget leaves 15 s for probes, less than one takes: none starts, the jobs go without an estimate.
    Probes that may start are killed at their deadline, and no batch starts that would not end before it."""
    probes = []
    popen = subprocess.Popen

    def slow_probe(cmd, **kw):  # a probe that would take far longer than its deadline
        probes.append(cmd)
        return popen([sys.executable, "-c", "import time; time.sleep(30)"], **kw)

    monkeypatch.setattr(cost.subprocess, "Popen", slow_probe)
    jobs = [_job(tmp_path), _job(tmp_path, seed=1)]
    jobs[1].overrides.append("train.lr=0.002")  # another kind: two probes, one at a time
    _, by_job = budget.estimates(jobs, tmp_path / "runs", [], 1, 1, None, True, jobs, end=time.time() + 60)
    assert probes == [] and set(by_job.values()) == {None} and "no probe" in capsys.readouterr().out
    monkeypatch.setattr(cost, "MIN_PROBE_S", 0.5)
    t = time.time()
    Estimator(tmp_path / "runs", "cpu", parallel=1).probe(jobs, until=t + 2.0)
    assert time.time() - t < 4.0 and len(probes) == 1  # the first cut at 2 s; the second would not have ended
    assert Estimator(tmp_path / "runs", "cpu", parallel=1).rates == {}  # a cut probe measures nothing


def test_a_budgeted_sweep_ends_within_its_slack_with_the_data_counted_and_a_stuck_run_killed(
    tmp_path, monkeypatch, capsys
):
    """Preparing the data counts against the budget; a run that ignores SIGTERM is killed after STOP_WAIT_S, so the
    sweep ends by budget + slack and leaves nothing running; stopped before its first record, it is not carried."""
    from tests.test_sweep_reliability import JOB, _holder

    runs = []

    def launch(composer, primary, grid, todo, *a, **k):  # the runs start and the launcher waits for them
        runs.extend(_holder(j.run_dir, on_sigterm_status=None) for j in todo)
        for p in runs:
            p.wait()

    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("LRA_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(driver, "launch", launch)
    monkeypatch.setattr(driver, "prepare_data", lambda todo: time.sleep(4))
    monkeypatch.setattr(driver, "STOP_WAIT_S", 1.0)
    monkeypatch.setattr(cli, "process_start", time.time)  # the budget from main(), not from pytest's start
    for module in (budget, grid_mod):  # a budget this short is refused, and would start nothing
        monkeypatch.setattr(module, "MIN_START_S", 0.5)
    t = time.time()
    try:
        rc = cli.main([*JOB, "seed=0", "budget=8s", "probe=false"])
        wall, running = time.time() - t, [p.pid for p in runs if p.poll() is None]
    finally:
        for p in runs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc == 0 and len(runs) == 1 and running == []
    assert wall < 8 + driver.STOP_WAIT_S + 2.0, wall  # the budget, the stop, the summary (seconds)
    out = capsys.readouterr().out
    assert "0 to carry" in out and "1 stopped before their first record" in out and _carried(out) == set()


def test_what_a_budgeted_sweep_says_it_carries_is_what_the_pack_holds(tmp_path):
    """Stopped after its record (with or without last.ckpt), killed with its record saying running, or carried in
    from an earlier window with a checkpoint only: carried and packed. Stopped before its record: neither."""
    root = tmp_path / "w1"

    def job(attn, record=None, ckpt=False, marker=True):
        j = Job(overrides=[f"attn={attn}"], run_dir=root / "quick" / "clean" / "listops" / attn / "seed0")
        j.rel = j.run_dir.relative_to(root).as_posix()
        j.run_dir.mkdir(parents=True)
        if marker:  # its job ran on another host and ended: nothing here is alive
            write_json(j.run_dir / MARKER, {"host": "elsewhere", "pid": 1, "finished": "then"})
        if record:
            write_json(j.run_dir / "result.json", {"status": record, "steps": 30})
        if ckpt:
            (j.run_dir / "checkpoints").mkdir()
            (j.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")
        j.refresh()
        return j

    started = [job("a", "interrupted", ckpt=True), job("b"), job("c", "running"), job("d", "completed")]
    earlier = job("e", ckpt=True, marker=False)
    pending = Job(overrides=["attn=f"], run_dir=root / "f", rel="f")
    out = "\n".join(budget.report([*started, earlier, pending], started, [pending], True, "again", root))
    assert _carried(out) == _packed(tmp_path, "w1") == {started[0].rel, started[2].rel, earlier.rel}
    assert "3 to carry" in out and "1 stopped before their first record" in out and "1 not started" in out


def test_a_run_another_process_still_holds_is_reported_running_not_carried(tmp_path):
    """A run that trains on after its driver was killed: the pack refuses its held folder, so the next sweep's report
    says it still runs (the pack takes it once it ends), never that it is carried."""
    d = tmp_path / "runs" / "a"
    d.mkdir(parents=True)
    write_json(d / "result.json", {"status": "running", "steps": 30})
    j = Job(overrides=["attn=a"], run_dir=d, rel="a")
    with runlock.hold(d):
        j.refresh()
        out = "\n".join(budget.report([j], [], [], False, "again", tmp_path / "runs"))
    assert j.status == "running" and _carried(out) == set(), out
    assert "0 to carry" in out and "1 still running" in out and "0 not started" in out, out
    assert "  running  a " in out and "next window: python -m lra.tools.carry pack" in out, out


@pytest.mark.slow  # a minute: two windows and an uninterrupted reference (test_carry resumes from a pack in-process)
def test_a_run_the_budget_stops_is_carried_to_another_machine_and_ends_as_if_never_stopped(tmp_path):
    """Window 1 (budget 30 s, carry=true): the job cannot finish, starts anyway and gets SIGTERM at the budget;
    its runs root is packed. Window 2, another runs root (another machine): the pack unpacked, the same sweep
    command with a budget it fits in resumes it from last.ckpt. Its record equals an uninterrupted run's."""
    out = _command(tmp_path, "w1", "-m", "lra.tools.sweep", *WINDOW_JOB, "budget=30s", "carry=true", "probe=false")
    assert "1 without an estimate" in out and "budget reached" in out
    records = list((tmp_path / "w1").rglob("result.json"))  # none if a loaded machine was still starting it
    stopped = json.loads(records[0].read_text()) if records else {}
    assert stopped.get("status", "interrupted") == "interrupted" and (stopped.get("steps") or 0) < 600
    _command(tmp_path, "w1", "-m", "lra.tools.carry", "pack", str(tmp_path / "w1"), "--out", str(tmp_path / "pack"))
    if (tmp_path / "pack").exists():  # else stopped before its first checkpoint: nothing to carry, it starts over
        assert not list((tmp_path / "pack").glob("*.ckpt"))  # the parts, not loose checkpoints
        _command(
            tmp_path, "w2", "-m", "lra.tools.carry", "unpack", str(tmp_path / "pack"), "--runs", str(tmp_path / "w2")
        )

    out = _command(tmp_path, "w2", "-m", "lra.tools.sweep", *WINDOW_JOB, "budget=10m")
    assert "1 expected to finish" in out and "measuring" not in out  # its own record's pace: no probe
    assert "budget not reached; 1 finished this time" in out
    resumed = _record(tmp_path / "w2")
    reference_args = [o for o in WINDOW_JOB if not o.startswith(("grid=", "hydra/launcher="))]
    _command(tmp_path, "ref", "-m", "lra.train", "preset=quick", "num_threads=1", *reference_args)
    reference = _record(tmp_path / "ref")
    assert resumed["status"] == reference["status"] == "completed"
    if (stopped.get("steps") or 0) >= 10:  # a checkpoint existed: the second window resumed, not restarted
        assert resumed["resumed_from_step"] is not None
    for k in ("steps", "steps_to_best", "steps_at_stop"):
        assert resumed[k] == reference[k], k
    for k in ("test_acc", "best_val_acc", "test_loss"):
        assert resumed[k] == pytest.approx(reference[k], abs=1e-6), k
