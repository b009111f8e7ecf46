"""Several runs per GPU (lra.tools.sweep jobs_per_gpu=k, lra/tools/sweep/share.py), with a fake device list: which GPU
each job slot gets, each run's share of the memory (what lra.fit will budget), the allocator limit the run
sets on CUDA, and the sweep's dry run and end-to-end plumbing on the CPU."""

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from lra import CONF_DIR
from lra.config import ConfigError, load
from lra.devices import MEMORY_LIMIT_ENV, limit_gpu_memory
from lra.tools.sweep import Job, ShareError, check_sharing, gpu_of_slot, job_share, share_plan
from lra.tools.sweep.cli import main
from lra.tools.sweep.jobs import assign_gpus
from lra.tools.sweep.share import budget_gib, limit_gib, share_gib

GPUS = ["0", "1", "2", "3"]


def profile(name):
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hardware" / f"{name}.yaml"))


def hw(name="h100_80gb", **kw):
    p = profile(name)
    return {
        "name": p["name"],
        "total_gib": p.get("total_gib"),
        "cuda_context_gib": p.get("cuda_context_gib"),
        "allocator_margin": p.get("allocator_margin"),
        "devices": 1,
        **kw,
    }


# ----------------------------------------------------------------------------- slot -> GPU
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_full_slots_put_k_jobs_on_each_gpu_in_order(k):
    parallel = k * len(GPUS)
    check_sharing(k, parallel, GPUS, "local")
    placed = [gpu_of_slot(s, k, GPUS) for s in range(parallel)]
    assert placed == [g for g in GPUS for _ in range(k)]  # slot s on GPU s // k
    with pytest.raises(ShareError, match=f"parallel <= jobs_per_gpu x GPUs = {k} x 4 = {4 * k}"):
        check_sharing(k, parallel + 1, GPUS, "local")


def test_parallel_not_a_multiple_of_k_leaves_the_last_gpu_part_full():
    gpus = ["0", "1"]
    check_sharing(2, 3, gpus, "local")
    assert [gpu_of_slot(s, 2, gpus) for s in range(3)] == ["0", "0", "1"]
    # seven jobs in batches of three: slot i % 3; every job gets the same 1/k budget wherever it lands
    jobs = [Job(overrides=[f"seed={i}"], hw=hw()) for i in range(7)]
    plan = share_plan(jobs, 2, 3, gpus)
    assert [g for g, _ in plan] == ["0", "0", "1", "0", "0", "1", "0"]
    assert len({s["budget_gib"] for _, s in plan}) == 1


def test_too_many_slots_and_other_refusals_are_one_line():
    with pytest.raises(ShareError, match="needs GPU #2, but only 2 are visible"):
        gpu_of_slot(4, 2, ["0", "1"])
    with pytest.raises(ShareError, match="no GPU visible"):
        check_sharing(2, 2, [], "local")
    with pytest.raises(ShareError, match="the slurm launcher cannot"):
        check_sharing(2, 2, GPUS, "slurm")
    with pytest.raises(ShareError, match="hardware=cpu: the profile has no GPU memory"):
        job_share(hw("cpu"), 2, "0")
    with pytest.raises(ShareError, match="trainer.devices=2"):
        job_share(hw(devices=2), 2, "0")
    with pytest.raises(ShareError, match="leaves -0.36 GiB per run; lower jobs_per_gpu"):
        job_share(hw("v100_16gb"), 40, "0")  # 15.77 / 40 - 0.75 < 0


# ----------------------------------------------------------------------------- the memory of one of k runs
@pytest.mark.parametrize("name", ["v100_16gb", "a100_40gb", "h100_80gb"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_share_gives_lra_fit_the_budget_T_minus_k_contexts_over_k(name, k):
    p = profile(name)
    T, c, m = p["total_gib"], p["cuda_context_gib"], p["allocator_margin"]
    s = job_share(hw(name), k, "0")
    assert s["total_gib"] == share_gib(T, k) and 0 <= T / k - s["total_gib"] < 1e-6  # rounded down, never up
    assert s["budget_gib"] == pytest.approx((T - k * c) / (k * (1 + m)), abs=1e-5)
    assert s["limit_gib"] == pytest.approx((T - k * c) / k, abs=1e-5) == pytest.approx(limit_gib(T, c, k))
    # k runs with their contexts never promise more than the card
    assert k * (s["limit_gib"] + c) <= T + 1e-9
    # what the child's lra.fit budgets once the sweep passes hardware.total_gib=<share>: the same number
    spec = load([f"hardware={name}", f"hardware.total_gib={s['total_gib']}"])
    assert spec.hardware.budget_bytes / 2**30 == pytest.approx(s["budget_gib"], abs=1e-6)
    assert spec.hardware.cuda_context_gib == c and spec.hardware.allocator_margin == m
    if k == 1:  # one run per GPU: exactly the profile's own budget
        assert load([f"hardware={name}"]).hardware.budget_bytes / 2**30 == pytest.approx(s["budget_gib"], abs=1e-5)


def test_auto_asks_the_gpu_and_says_when_it_cannot():
    asked = []
    s = job_share(hw("auto"), 4, "1", total_of=lambda g: asked.append(g) or 79.19)
    assert asked == ["1"] and s["total_gib"] == share_gib(79.19, 4)
    assert s["budget_gib"] == pytest.approx(budget_gib(79.19, 0.75, 0.10, 4))
    assert job_share(hw("auto"), 4, "1", total_of=lambda g: None) is None
    # a sweep asks each GPU once
    asked.clear()
    share_plan(
        [Job(overrides=[], hw=hw("auto")) for _ in range(6)],
        2,
        4,
        ["0", "1"],
        total_of=lambda g: asked.append(g) or 80.0,
    )
    assert asked == ["0", "1"]


# ----------------------------------------------------------------------------- in the job: env and overrides
def job_cfg(name="h100_80gb"):
    return OmegaConf.create({"hardware": profile(name), "trainer": {"devices": 1}})


def test_job_gets_its_gpu_its_share_and_the_allocator_limit():
    env = {
        "LRA_SWEEP_PARALLEL": "4",
        "LRA_SWEEP_JOBS_PER_GPU": "2",
        "LRA_SWEEP_GPUS": "3,5",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SUBMITIT_EXECUTOR": "local",
    }  # submitit's own mask is not used
    extra = assign_gpus(env, 6, job_cfg())  # job 6 of batches of 4: slot 2 -> the second GPU
    T = profile("h100_80gb")["total_gib"]
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert extra == [f"hardware.total_gib={share_gib(T, 2)}"]
    assert float(env[MEMORY_LIMIT_ENV]) == pytest.approx(T / 2 - 0.75, abs=1e-5)
    env2 = {**env, "CUDA_VISIBLE_DEVICES": "0,1"}
    assert assign_gpus(env2, 1, job_cfg()) and env2["CUDA_VISIBLE_DEVICES"] == "3"


def test_without_jobs_per_gpu_each_parallel_job_keeps_its_own_slice():
    env = {"LRA_SWEEP_PARALLEL": "2", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SUBMITIT_EXECUTOR": "local"}
    assert assign_gpus(env, 3, job_cfg()) == [] and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert MEMORY_LIMIT_ENV not in env


# ----------------------------------------------------------------------------- in lra.train: the limit
class _Props:
    total_memory = 80 * 2**30


def test_limit_gpu_memory_sets_the_fraction_of_the_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: _Props())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    cuda = torch.device("cuda", 0)
    assert limit_gpu_memory(cuda, env={}) is None  # not shared: nothing
    assert limit_gpu_memory(torch.device("cpu"), env={MEMORY_LIMIT_ENV: "10"}) is None  # no GPU: nothing
    assert calls == []
    assert limit_gpu_memory(cuda, env={MEMORY_LIMIT_ENV: "19.0275"}) == pytest.approx(19.0275 / 80)
    assert calls == [(pytest.approx(19.0275 / 80), cuda)]
    assert limit_gpu_memory(cuda, env={MEMORY_LIMIT_ENV: "100"}) == 1.0  # never above the card
    for bad in ("0", "-1", "lots", "nan"):
        with pytest.raises(ConfigError, match=f"{MEMORY_LIMIT_ENV}="):
            limit_gpu_memory(cuda, env={MEMORY_LIMIT_ENV: bad})


# ----------------------------------------------------------------------------- the sweep
def test_dry_run_shows_each_jobs_gpu_and_budget(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the fake device list
    assert (
        main(
            [
                "grid=quick",
                "task=listops",
                "attn=skeinformer,softmax",
                "hardware=h100_80gb",
                "jobs_per_gpu=2",
                "dry_run=true",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    p = profile("h100_80gb")
    budget = (p["total_gib"] - 2 * p["cuda_context_gib"]) / (2 * (1 + p["allocator_margin"]))
    assert "4 at a time, 2 per GPU on GPUs 0,1" in out  # parallel defaults to k x GPUs
    lines = [ln for ln in out.splitlines() if ln.startswith("  run ")]
    assert len(lines) == 4 and all(f"fit budget {budget:.2f} GiB" in ln for ln in lines)
    assert [ln.split("[GPU ")[1][0] for ln in lines] == ["0", "0", "1", "1"]
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit, match=r"^lra.tools.sweep: parallel=5 with jobs_per_gpu=2 needs parallel <= "):
        main(["grid=quick", "task=listops", "hardware=h100_80gb", "jobs_per_gpu=2", "parallel=5", "dry_run=true"])
    with pytest.raises(SystemExit, match="jobs_per_gpu=x: give a whole number >= 1"):
        main(["grid=quick", "jobs_per_gpu=x", "dry_run=true"])


@pytest.mark.slow
def test_shared_gpu_sweep_end_to_end_on_cpu(tmp_path):
    """Two tiny runs as two slots of one (fake) GPU: each run's record shows the halved profile and the
    budget lra.fit used; on a CPU the allocator limit is not applied (no CUDA device)."""
    from tests.test_sweep import TINY, sweep_env

    env = {**sweep_env(tmp_path), "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra.tools.sweep",
            "grid=quick",
            "task=listops",
            "attn=skeinformer",
            "hardware=h100_80gb",
            "jobs_per_gpu=2",
            *TINY,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 at a time, 2 per GPU on GPUs 0" in proc.stdout
    T = profile("h100_80gb")["total_gib"]
    recs = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("result.json")]
    assert len(recs) == 2
    for rec in recs:
        assert rec["status"] == "completed"
        assert rec["config"]["hardware"]["total_gib"] == share_gib(T, 2)
        assert rec["fit_budget_bytes"] / 2**30 == pytest.approx(budget_gib(T, 0.75, 0.10, 2), abs=1e-6)
    (path,) = (tmp_path / "runs" / "quick" / "sweeps" / "quick").glob("manifest-*.json")
    m = json.loads(path.read_text())
    assert m["jobs_per_gpu"] == 2 and m["gpus"] == ["0"]


# ----------------------------------------------------------------------------- the throughput measurement
def test_share_bench_dry_run_and_its_sweeps_place_k_runs_on_one_gpu(tmp_path, capsys, monkeypatch):
    from lra.tools.share_bench import commands
    from lra.tools.share_bench import main as bench

    assert bench(["dry_run=true", f"out={tmp_path}", "train.max_steps=50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and not any(tmp_path.iterdir())
    for k, line in zip((1, 2, 4, 8), lines):
        assert line.startswith(f"LRA_RUNS={tmp_path}/k{k} ") and f"jobs_per_gpu={k} parallel={k}" in line
        assert line.endswith(f"'seed=range(0,{k})' train.max_steps=50")
    with pytest.raises(SystemExit, match="ks=0,2: give whole numbers >= 1"):
        bench(["ks=0,2", "dry_run=true"])
    # the k=8 sweep on a box with two GPUs: eight runs, all on the first GPU, each 1/8 of an H100
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    ((k, env, cmd),) = commands([8], tmp_path, ["hardware=h100_80gb"])
    monkeypatch.setenv("LRA_RUNS", env["LRA_RUNS"])
    assert main(cmd[3:] + ["dry_run=true"]) == 0
    runs = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  run ")]
    assert len(runs) == 8 and all("[GPU 0; hardware.total_gib=9.88875:" in ln for ln in runs)


def test_share_bench_summary_sums_the_rates_of_runs_side_by_side(tmp_path):
    from lra.tools.share_bench import summarise, table

    for k, t1k in ((1, [100.0]), (2, [160.0, 200.0])):
        for i, t in enumerate(t1k):
            d = tmp_path / f"k{k}" / "skeinformer_paper" / "listops" / "skeinformer" / f"seed{i}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(
                json.dumps(
                    {"status": "completed", "time_per_1k_steps_s": t, "micro_batch": 256, "peak_mem_bytes": 2**30}
                )
            )
    rows = [summarise(1, tmp_path / "k1"), summarise(2, tmp_path / "k2")]
    assert rows[0]["steps_per_s"] == pytest.approx(10.0) and rows[1]["steps_per_s"] == pytest.approx(6.25 + 5.0)
    assert rows[1]["per_run_steps_per_s"] == pytest.approx(5.625) and rows[1]["completed"] == 2
    assert "| 2 | 2/2 | 11.25 | 1.12 | 5.62 | 256 | 1.00 | n/a |" in table(rows)


def test_search_dry_run_shows_the_trials_share(tmp_path, capsys, monkeypatch):
    pytest.importorskip("optuna")
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert main(["grid=search_quick", "jobs_per_gpu=2", "hardware=h100_80gb", "dry_run=true"]) == 0
    p = profile("h100_80gb")
    budget = (p["total_gib"] - 2 * p["cuda_context_gib"]) / (2 * (1 + p["allocator_margin"]))
    assert (
        f"2 at a time, 2 per GPU on GPUs 0 (hardware.total_gib=39.555: fit budget {budget:.2f} GiB each)"
        in capsys.readouterr().out
    )
    with pytest.raises(SystemExit, match="^lra.tools.sweep: parallel=3 with jobs_per_gpu=2 needs parallel <= "):
        main(["grid=search_quick", "jobs_per_gpu=2", "parallel=3", "hardware=h100_80gb", "dry_run=true"])


def test_search_trials_take_the_slot_a_finished_trial_freed(tmp_path):
    """Four trial slots on two GPUs, two per GPU; trial 1 (GPU 0) ends first: trial 4 goes to GPU 0,
    not next to trials 2 and 3 on GPU 1."""
    pytest.importorskip("optuna")
    from lra.tools.sweep.search import drive, open_study
    from tests.test_optuna import FakeRunner, make_search

    class PlacingRunner(FakeRunner):
        def __init__(self):
            super().__init__()
            self.placed = []

        def start(self, cmd, env, log_path):
            self.polls = 2 if len(self.started) == 1 else 40
            self.placed.append(
                (
                    env.get("CUDA_VISIBLE_DEVICES"),
                    env.get(MEMORY_LIMIT_ENV),
                    [a for a in cmd if a.startswith("hardware.total_gib=")],
                )
            )
            return super().start(cmd, env, log_path)

    s = make_search(tmp_path, target=5, parallel=4)
    s.jobs_per_gpu, s.gpus, s.hw = 2, ["0", "1"], hw()
    runner = PlacingRunner()
    drive(s, open_study(s), runner=runner, poll_s=0)
    T = profile("h100_80gb")["total_gib"]
    assert [g for g, _, _ in runner.placed] == ["0", "0", "1", "1", "0"]
    assert {(lim, tuple(ov)) for _, lim, ov in runner.placed} == {
        (f"{limit_gib(T, 0.75, 2):.6f}", (f"hardware.total_gib={share_gib(T, 2)}",))
    }
