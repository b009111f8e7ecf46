"""Sweeps (lra/tools/sweep/): grid files, the quick grid as a local multirun, a killed sweep that resumes,
and the W&B extras. Runs use tiny generated ListOps (a few seconds of training each)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lra import CONF_DIR
from lra.config import attn_configs
from lra.tools.sweep import FINISHED, MARKER, apply_cli, load_grid
from lra.tools.sweep.cli import main

TINY = [
    "task.generator.n_train=256",
    "task.generator.n_val=64",
    "task.generator.n_test=64",
    "train.max_steps=12",
    "train.eval_every=5",
    "trainer.progress=false",
]
TABLE1_ROWS = [
    "softmax",
    "softmax_nodrop",
    "vmean",
    "bigbird",
    "performer",
    "nystrom",
    "reformer",
    "linformer",
    "linformer_jlt",
    "informer",
    "informer_mask",
    "skeinformer",
    "skeinformer_uniform",
    "skeinformer_no_rownorm",
    "skeinformer_simple_rownorm",
    "skeinformer_no_pilot",
]


def sweep_env(tmp_path):
    return {
        **os.environ,
        "LRA_DATA": str(tmp_path / "data"),
        "LRA_RUNS": str(tmp_path / "runs"),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    }


def run_sweep(tmp_path, *args, check=True, timeout=900):
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.sweep", *args],
        env=sweep_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"lra.tools.sweep failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def manifest(tmp_path, grid="quick", preset="quick"):
    """The manifest of the one sweep of ``grid`` under the test's runs root (manifest-<key>.json)."""
    (path,) = (tmp_path / "runs" / preset / "sweeps" / grid).glob("manifest-*.json")
    return json.loads(path.read_text())


def run_dirs(tmp_path):
    return {p.parent for p in (tmp_path / "runs").rglob("result.json")}


# ----------------------------------------------------------------------------- grid files
def test_every_grid_file_loads():
    for path in sorted((CONF_DIR / "sweep").glob("*.yaml")):
        grid = load_grid(path.stem)
        assert grid.jobs(), path


def test_quick_grid_is_two_tasks_three_backends_two_seeds():
    grid = load_grid("quick")
    jobs = grid.jobs()
    assert len(jobs) == 12 and all("preset=quick" in j for j in jobs)
    assert [len(v) for v in grid.axes.values()] == [2, 3, 2]
    assert grid.axes["task"] == ["task=listops", "task=pathfinder"] and grid.launcher == "local"
    assert grid.parallel == 2


def test_skeinformer_table1_grid_covers_every_row_task_and_seed():
    grid = load_grid("skeinformer_table1")
    jobs = grid.jobs()
    assert len(jobs) == 16 * 5 * 3 == len({tuple(j) for j in jobs})
    assert sorted(a.split("=")[1] for a in grid.axes["attn"]) == sorted(TABLE1_ROWS)
    assert {t.split("=")[1] for t in grid.axes["task"]} == {"text", "listops", "retrieval", "pathfinder", "image"}
    assert grid.axes["seed"] == ["seed=0", "seed=1", "seed=2"]
    assert all("preset=skeinformer_paper" in j for j in jobs)
    assert set(TABLE1_ROWS) <= set(attn_configs())


def test_command_line_folds_into_the_grid():
    grid = load_grid("quick")
    opts, hydra = apply_cli(
        grid,
        [
            "task=listops",
            "seed=0,1,2",
            "train.lr=1e-3",
            "parallel=3",
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "dry_run=true",
        ],
    )
    assert opts == {
        "parallel": 3,
        "jobs_per_gpu": None,
        "dry_run": True,
        "n_trials": None,
        "progress": None,
        "budget": None,
        "carry": False,
        "probe": None,
    }
    assert hydra == ["hydra/launcher=slurm", "hydra.launcher.partition=gpu"]
    jobs = grid.jobs()
    assert len(jobs) == 3 * 3 and all("task=listops" in j and "train.lr=1e-3" in j for j in jobs)
    assert {o for j in jobs for o in j if o.startswith("seed=")} == {"seed=0", "seed=1", "seed=2"}


def test_finished_statuses_match_lra_train():
    train = pytest.importorskip("lra.train")
    if hasattr(train, "FINISHED"):
        assert set(FINISHED) == set(train.FINISHED)


def test_dry_run_lists_jobs_and_refuses_colliding_folders(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    assert main(["grid=quick", "task=listops", "attn=softmax", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "2 jobs" in out and "quick/clean/listops/softmax/seed0" in out and "quick/clean/listops/softmax/seed1" in out
    assert "python -m lra.train -m" in out and not (tmp_path / "runs").exists()
    # num_threads is left out of the folder name: two jobs would write into one folder
    with pytest.raises(SystemExit, match="name one run folder"):
        main(["grid=quick", "task=listops", "attn=softmax", "seed=0", "num_threads=1,2", "dry_run=true"])


def test_sweep_jobs_are_named_by_the_resolved_config_as_lra_train_names_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    assert main(["grid=quick", "task=listops", "attn=softmax", "seed=0", "train.lr=2e-3", "dry_run=true"]) == 0
    assert "quick/clean/listops/softmax/seed0/train.lr=0.002" in capsys.readouterr().out
    # the quick preset's lr is 1e-3: both spellings are the preset's run, one folder
    with pytest.raises(SystemExit, match="name one run folder"):
        main(["grid=quick", "task=listops", "attn=softmax", "seed=0", "train.lr=1e-3,0.001", "dry_run=true"])


def test_unknown_grid_lists_available():
    with pytest.raises(SystemExit, match="quick"):
        main(["grid=not_a_grid"])


# ----------------------------------------------------------------------------- runs
@pytest.mark.slow  # 30-50 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_quick_grid_local_multirun_two_jobs_in_parallel(tmp_path):
    """grid=quick on tiny ListOps (two of its backends, one seed) with its own launcher (submitit_local), two jobs at
    a time."""
    t0 = time.time()
    proc = run_sweep(tmp_path, "grid=quick", "task=listops", "attn=softmax,skeinformer", "seed=0", *TINY)
    wall = time.time() - t0
    m = manifest(tmp_path)
    assert m["counts"] == {"completed": 2} and m["launcher"] == "local" and m["parallel"] == 2
    assert "2 jobs, 2 to run, 0 skipped" in proc.stdout
    # progress while the launcher blocks: the first line before any job ends, the last one after all
    assert "[lra.tools.sweep quick] 0 done, " in proc.stdout and "ETA after the first job" in proc.stdout
    assert "[lra.tools.sweep quick] 2 done, 0 running, 0 failed, 0 pending; mean " in proc.stdout
    dirs = run_dirs(tmp_path)
    assert len(dirs) == 2
    names = {tuple(Path(j["run_dir"]).parts[:5]) for j in m["jobs"]}
    assert names == {("quick", "clean", "listops", a, "seed0") for a in ("softmax", "skeinformer")}
    for d in dirs:
        rec = json.loads((d / "result.json").read_text())
        assert rec["status"] == "completed" and rec["steps"] == 12 and rec["preset"] == "quick"
    # jobs ran two at a time: within each batch the two jobs' lifetimes overlap
    marks = sorted((json.loads((d / MARKER).read_text()) for d in dirs), key=lambda x: x["t_start"])
    assert all(mk["attempts"] == 1 and mk["returncode"] == 0 for mk in marks)
    overlaps = sum(b["t_start"] < a["t_end"] for a, b in zip(marks[0::2], marks[1::2]))
    assert overlaps == 1, marks
    assert (tmp_path / "runs" / "quick" / "sweeps" / "quick" / ".submitit").is_dir()
    print(f"grid=quick (tiny, listops, two backends, one seed) wall time {wall:.0f} s")

    # the same command again: nothing to run
    again = run_sweep(tmp_path, "grid=quick", "task=listops", "attn=softmax,skeinformer", "seed=0", *TINY)
    assert "2 jobs, 0 to run, 2 skipped" in again.stdout
    assert manifest(tmp_path)["invocations"][-1]["launched"] == 0


@pytest.mark.slow  # the main suite keeps a real local multirun and the interrupted-sweep manifest tests
def test_killed_sweep_restarts_without_rerunning_finished_jobs(tmp_path):
    args = ["grid=quick", "task=listops", "attn=softmax,skeinformer,performer", "seed=0", "hydra/launcher=basic", *TINY]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lra.tools.sweep", *args],
        env=sweep_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs = tmp_path / "runs" / "quick" / "clean" / "listops"

    def folder(attn):
        found = list((runs / attn / "seed0").glob("*"))
        return found[0] if found else None

    try:
        deadline = time.time() + 600
        while time.time() < deadline:  # first job finished and the second one started: kill everything
            first, second = folder("softmax"), folder("skeinformer")
            done = (
                first is not None
                and (first / "result.json").exists()
                and json.loads((first / "result.json").read_text()).get("status") in FINISHED
            )
            if done and second is not None and (second / MARKER).exists():
                break
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.5)
        else:
            pytest.fail("the sweep did not get to its second job in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the driver and every job it started
        proc.wait()
    first, second = folder("softmax"), folder("skeinformer")
    rec_first = (first / "result.json").read_text()
    mtime_first = (first / "result.json").stat().st_mtime

    plan = run_sweep(tmp_path, *args, "dry_run=true").stdout
    assert "completed" in plan and "interrupted" in plan and "pending" in plan

    out = run_sweep(tmp_path, *args).stdout
    assert "3 jobs, 2 to run, 1 skipped" in out
    m = manifest(tmp_path)
    assert m["counts"] == {"completed": 3}
    assert (first / "result.json").read_text() == rec_first and (first / "result.json").stat().st_mtime == mtime_first
    attempts = {j["attn"]: j["attempts"] for j in m["jobs"]}
    assert attempts == {"softmax": 1, "skeinformer": 2, "performer": 1}
    rec = json.loads((second / "result.json").read_text())
    assert rec["status"] == "completed" and rec["steps"] == 12


# ----------------------------------------------------------------------------- W&B
def test_wandb_extras_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from lra.tools.sweep.wandb_table import log_sweep_table
    from lra.wandb_extras import log_record

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rec = {
        "task": "listops",
        "attn": "softmax",
        "seed": 0,
        "preset": "quick",
        "status": "completed",
        "test_acc": 0.5,
        "best_val_acc": 0.6,
        "steps": 12,
        "config": {"seed": 0},
    }
    (tmp_path / "result.json").write_text(json.dumps(rec))
    run = wandb.init(project="lra-test", dir=str(tmp_path), mode="offline")
    log_record(run, rec, tmp_path)
    assert run.summary["record/test_acc"] == 0.5
    run.finish()
    log_sweep_table(
        {
            "grid": "quick",
            "counts": {"completed": 1},
            "jobs": [{"task": "listops", "attn": "softmax", "seed": 0, "status": "completed", "test_acc": 0.5}],
        },
        tmp_path,
    )
    offline = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(list(d.glob("*.wandb")) for d in offline)
