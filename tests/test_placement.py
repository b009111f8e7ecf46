"""Several runs per GPU (lra.tools.sweep jobs_per_gpu=k, lra/tools/sweep/share.py), with a fake device list and a
fake card memory (``total_of``, or ``$LRA_SWEEP_GPU_TOTAL_GIB`` across processes): which GPU each job slot gets,
each run's share of the memory (what lra.fit will budget: the profile's fit kept on a larger card, the card
divided by k otherwise), the allocator limit the run sets on CUDA, and the sweep's dry run and end-to-end
plumbing on the CPU."""

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
from lra.tools.sweep.share import GPU_TOTAL_ENV, budget_gib, device_total_gib, limit_gib, share_gib

GPUS = ["0", "1", "2", "3"]
H100_CARD = 79.2  # torch's total_memory of an 80 GB H100, in GiB (about: boards differ a little)


def card(gib):
    """A fake total_of: every GPU has ``gib`` GiB."""
    return lambda gpu: gib


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
    plan = share_plan(jobs, 2, 3, gpus, total_of=card(H100_CARD))
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
        job_share(hw("v100_16gb"), 40, "0", total_of=card(15.77))  # on a V100: 15.77 / 40 - 0.75 < 0


# ----------------------------------------------------------------------------- the memory of one of k runs
@pytest.mark.parametrize("name", ["v100_16gb", "a100_40gb", "h100_80gb"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_share_gives_lra_fit_the_budget_T_minus_k_contexts_over_k(name, k):
    """The profile is the card (divided mode): each of the k runs gets T/k."""
    p = profile(name)
    T, c, m = p["total_gib"], p["cuda_context_gib"], p["allocator_margin"]
    s = job_share(hw(name), k, "0", total_of=card(T))
    assert s["mode"] == "divided"
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


def test_a_v100_profile_on_an_80gb_card_keeps_the_v100_fit_for_each_of_k_runs():
    """Bug caught: jobs_per_gpu=5 hardware=v100_16gb on an H100 gave each run total_gib = 15.77 / 5: another
    micro-batch and accumulation than the papers' V100 fit. Each run keeps the profile (the V100's budget,
    exactly) and caps its allocator at what a V100 leaves it, T - c (tools/gpu_window.sh's 15.02 GiB)."""
    p = profile("v100_16gb")
    T, c, m = p["total_gib"], p["cuda_context_gib"], p["allocator_margin"]
    plan = share_plan([Job(overrides=[], hw=hw("v100_16gb")) for _ in range(5)], 5, 5, ["0"], total_of=card(H100_CARD))
    assert [g for g, _ in plan] == ["0"] * 5
    for _, s in plan:
        assert s["mode"] == "profile" and s["total_gib"] == T == 15.77
        assert s["limit_gib"] == pytest.approx(T - c) == pytest.approx(15.02)
        assert s["budget_gib"] == pytest.approx((T - c) / (1 + m))
        assert s["card_gib"] == H100_CARD and s["profile_total_gib"] == T
    # the run's lra.fit budget is the unshared V100's
    spec = load(["hardware=v100_16gb", f"hardware.total_gib={plan[0][1]['total_gib']}"])
    assert spec.hardware.budget_bytes == load(["hardware=v100_16gb"]).hardware.budget_bytes
    assert spec.hardware.budget_bytes / 2**30 == pytest.approx(plan[0][1]["budget_gib"], abs=1e-6)
    # five runs with their contexts fit the card
    assert 5 * (plan[0][1]["limit_gib"] + c) <= H100_CARD
    # any k up to 5, one run too
    assert job_share(hw("v100_16gb"), 1, "0", total_of=card(H100_CARD))["total_gib"] == T


def test_more_profile_runs_than_the_card_holds_is_one_line_naming_how_many_fit():
    with pytest.raises(ShareError) as e:
        job_share(hw("v100_16gb"), 6, "3", total_of=card(H100_CARD))  # 6 x 15.77 = 94.62 > 79.2
    assert str(e.value) == (
        "jobs_per_gpu=6 runs of the v100_16gb fit need 6 x 15.77 = 94.62 GiB; GPU 3 has 79.20 GiB: at most 5 fit; "
        "lower jobs_per_gpu"
    )
    with pytest.raises(ShareError, match="at most 2 fit"):  # two V100 runs on an A100 40 GB
        job_share(hw("v100_16gb"), 3, "0", total_of=card(39.39))


@pytest.mark.parametrize("k", [1, 2, 5, 8])
@pytest.mark.parametrize("name, gib", [("h100_80gb", H100_CARD), ("h100_80gb", 79.11), ("a100_40gb", 39.59)])
def test_a_profile_that_is_the_card_is_divided_by_k(name, gib, k):
    """hardware=h100_80gb on an H100 (its board reports a little more than the profile's 79.11 GiB, or the
    same), an A100 40GB profile (PCIe) on an SXM4 board: the card is shared, T/k each, as before."""
    T, c = profile(name)["total_gib"], profile(name)["cuda_context_gib"]
    s = job_share(hw(name), k, "0", total_of=card(gib))
    assert s["mode"] == "divided" and s["total_gib"] == share_gib(T, k)
    assert s["limit_gib"] == pytest.approx(limit_gib(T, c, k), abs=1e-6)
    # a profile larger than the card: divided too (what the profile says, as before)
    assert job_share(hw(name), k, "0", total_of=card(gib / 2))["total_gib"] == share_gib(T, k)


def test_a_gpu_profile_needs_the_cards_memory_and_says_when_it_cannot_tell(monkeypatch, tmp_path):
    """The GPU does not report its memory: None (cannot tell) for the dry run; a real run refuses in one line."""
    asked = []
    assert job_share(hw("v100_16gb"), 5, "0", total_of=lambda g: asked.append(g)) is None and asked == ["0"]
    plan = share_plan([Job(overrides=[], hw=hw("h100_80gb")) for _ in range(3)], 2, 3, ["0", "1"], lambda g: None)
    assert plan == [("0", None), ("0", None), ("1", None)]
    # in the job
    env = {"LRA_SWEEP_PARALLEL": "2", "LRA_SWEEP_JOBS_PER_GPU": "2", "LRA_SWEEP_GPUS": "7"}
    monkeypatch.setattr("lra.tools.sweep.jobs.device_total_gib", lambda g, env=None: None)
    with pytest.raises(ShareError) as e:
        assign_gpus(env, 0, job_cfg("v100_16gb"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        "jobs_per_gpu=2 with hardware=v100_16gb: GPU 7 did not report its memory to torch.cuda"
    )
    assert msg.endswith(f"check that torch.cuda sees it, or set {GPU_TOTAL_ENV}=<its total GiB>")
    assert MEMORY_LIMIT_ENV not in env and "CUDA_VISIBLE_DEVICES" not in env
    # in the driver: the dry run shows the plan, a real run refuses before anything runs
    monkeypatch.setattr("lra.tools.sweep.share.device_total_gib", lambda g, env=None: None)
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    args = ["grid=quick", "task=listops", "attn=softmax", "hardware=v100_16gb", "jobs_per_gpu=2"]
    assert main(args + ["dry_run=true"]) == 0
    with pytest.raises(SystemExit, match="did not report its memory to torch.cuda"):
        main(args)
    assert not (tmp_path / "runs").exists()


def test_the_cards_memory_can_be_given(monkeypatch):
    assert device_total_gib("0", env={GPU_TOTAL_ENV: "79.2"}) == 79.2
    for bad in ("0", "lots", "-3"):
        with pytest.raises(ShareError, match=f"{GPU_TOTAL_ENV}="):
            device_total_gib("0", env={GPU_TOTAL_ENV: bad})


# ----------------------------------------------------------------------------- in the job: env and overrides
def job_cfg(name="h100_80gb"):
    return OmegaConf.create({"hardware": profile(name), "trainer": {"devices": 1}})


def test_job_gets_its_gpu_its_share_and_the_allocator_limit():
    env = {
        GPU_TOTAL_ENV: str(H100_CARD),  # the card (an H100) is asked in the job
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


def test_job_of_a_v100_profile_on_an_h100_keeps_the_v100_fit_and_says_so(caplog):
    """What tools/gpu_window.sh sets by hand (LRA_MEMORY_LIMIT_GIB=15.02, the profile unchanged)."""
    env = {
        GPU_TOTAL_ENV: str(H100_CARD),
        "LRA_SWEEP_PARALLEL": "5",
        "LRA_SWEEP_JOBS_PER_GPU": "5",
        "LRA_SWEEP_GPUS": "0",
    }
    with caplog.at_level("INFO", logger="lra.tools.sweep"):
        extra = assign_gpus(env, 4, job_cfg("v100_16gb"))
    assert extra == ["hardware.total_gib=15.77"] and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env[MEMORY_LIMIT_ENV] == "15.020000"
    assert "profile mode (each run keeps the v100_16gb fit: 15.77 of the card's 79.20 GiB)" in caplog.text
    env = {
        GPU_TOTAL_ENV: str(H100_CARD),
        "LRA_SWEEP_PARALLEL": "2",
        "LRA_SWEEP_JOBS_PER_GPU": "2",
        "LRA_SWEEP_GPUS": "0",
    }
    caplog.clear()
    with caplog.at_level("INFO", logger="lra.tools.sweep"):
        assign_gpus(env, 0, job_cfg("h100_80gb"))
    assert "divided mode (the 79.11 GiB of hardware=h100_80gb divided by 2)" in caplog.text


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
    monkeypatch.setenv(GPU_TOTAL_ENV, str(H100_CARD))  # and their memory
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
@pytest.mark.parametrize("name", ["h100_80gb", "v100_16gb"])
def test_shared_gpu_sweep_end_to_end_on_cpu(tmp_path, name):
    """Two tiny runs as two slots of one (fake) 80 GB GPU: each run's record shows what it was given and
    the budget lra.fit used: the halved H100 profile, or the V100 profile unchanged (the papers' fit); on a
    CPU the allocator limit is not applied (no CUDA device)."""
    from tests.test_sweep import TINY, sweep_env

    env = {**sweep_env(tmp_path), "CUDA_VISIBLE_DEVICES": "0", GPU_TOTAL_ENV: str(H100_CARD)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra.tools.sweep",
            "grid=quick",
            "task=listops",
            "attn=skeinformer",
            f"hardware={name}",
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
    T = profile(name)["total_gib"]
    total, budget = (share_gib(T, 2), budget_gib(T, 0.75, 0.10, 2)) if name == "h100_80gb" else (T, (T - 0.75) / 1.1)
    recs = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("result.json")]
    assert len(recs) == 2
    for rec in recs:
        assert rec["status"] == "completed"
        assert rec["config"]["hardware"]["total_gib"] == total
        assert rec["fit_budget_bytes"] / 2**30 == pytest.approx(budget, abs=1e-6)
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
    monkeypatch.setenv(GPU_TOTAL_ENV, str(H100_CARD))
    ((k, env, cmd),) = commands([8], tmp_path, ["hardware=h100_80gb"])
    monkeypatch.setenv("LRA_RUNS", env["LRA_RUNS"])
    assert main(cmd[3:] + ["dry_run=true"]) == 0
    runs = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  run ")]
    assert len(runs) == 8 and all(
        "[GPU 0; the 79.11 GiB of hardware=h100_80gb divided by 8: hardware.total_gib=9.88875," in ln for ln in runs
    )


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
    assert "2 at a time, 2 per GPU on GPUs 0 (" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^lra.tools.sweep: parallel=3 with jobs_per_gpu=2 needs parallel <= "):
        main(["grid=search_quick", "jobs_per_gpu=2", "parallel=3", "hardware=h100_80gb", "dry_run=true"])


def test_search_dry_run_shows_a_gpu_profiles_budget(tmp_path, capsys, monkeypatch):
    pytest.importorskip("optuna")
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv(GPU_TOTAL_ENV, str(H100_CARD))
    assert main(["grid=search_quick", "jobs_per_gpu=2", "hardware=h100_80gb", "dry_run=true"]) == 0
    p = profile("h100_80gb")
    budget = (p["total_gib"] - 2 * p["cuda_context_gib"]) / (2 * (1 + p["allocator_margin"]))
    assert (
        f"2 at a time, 2 per GPU on GPUs 0 (the 79.11 GiB of hardware=h100_80gb divided by 2: "
        f"hardware.total_gib=39.555, fit budget {budget:.2f} GiB each)" in capsys.readouterr().out
    )


def test_search_trials_take_the_slot_a_finished_trial_freed(tmp_path, monkeypatch):
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

    monkeypatch.setenv(GPU_TOTAL_ENV, str(H100_CARD))  # each trial asks its card
    s = make_search(tmp_path, target=5, parallel=4)
    s.jobs_per_gpu, s.gpus, s.hw = 2, ["0", "1"], hw()
    runner = PlacingRunner()
    drive(s, open_study(s), runner=runner, poll_s=0)
    T = profile("h100_80gb")["total_gib"]
    assert [g for g, _, _ in runner.placed] == ["0", "0", "1", "1", "0"]
    assert {(lim, tuple(ov)) for _, lim, ov in runner.placed} == {
        (f"{limit_gib(T, 0.75, 2):.6f}", (f"hardware.total_gib={share_gib(T, 2)}",))
    }


# ----------------------------------------------------------------------------- jobs_per_gpu=auto
H100 = "NVIDIA H100 80GB HBM3"


def _share_bench(root, rows):
    (root / "share_bench").mkdir(parents=True)
    (root / "share_bench" / "share_bench.json").write_text(json.dumps(rows))


def _row(k, steps_per_s, device=H100):
    return {"k": k, "device": device, "runs": k, "completed": k, "steps_per_s": steps_per_s}


def test_jobs_per_gpu_auto_takes_the_k_share_bench_measured_best_on_this_device(tmp_path, capsys, monkeypatch):
    """k = 8 gives 3 % over k = 4: it does not pay; another device's figures are not this one's."""
    from lra.tools.sweep import cost

    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv(GPU_TOTAL_ENV, str(H100_CARD))
    monkeypatch.setattr(cost, "device_name", lambda gpus: H100)
    _share_bench(tmp_path / "runs", [_row(1, 1.0), _row(2, 1.9), _row(4, 3.1), _row(8, 3.2), _row(16, 9.0, "A100")])
    args = ["grid=skeinformer_table1", "task=listops", "seed=0", "attn=softmax,skeinformer", "jobs_per_gpu=auto"]
    assert main([*args, "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert f"jobs_per_gpu=auto: 4 (share-bench on {H100}, aggregate steps/s k=1: 1.00, k=2: 1.90, k=4: 3.10" in out
    assert "4 at a time, 4 per GPU on GPUs 0" in out


def test_jobs_per_gpu_auto_never_places_more_runs_than_the_card_holds():
    k, why = share_auto([_row(1, 1.0), _row(8, 4.0)], hw("v100_16gb"))
    assert k == 5 and why.endswith("the card holds 5 of these jobs)")  # 5 x 15.77 GiB of a 79.2 GiB card


def test_jobs_per_gpu_auto_without_a_measurement_here_is_refused_in_one_line():
    with pytest.raises(ShareError, match="no share-bench measurement on NVIDIA H100 80GB HBM3 .*make share-bench"):
        share_auto([_row(4, 3.0, "A100")], hw("v100_16gb"))


def share_auto(rows, profile_hw):
    from lra.tools.sweep.share import auto_jobs_per_gpu

    return auto_jobs_per_gpu(rows, H100, profile_hw, "0", total_of=lambda g: H100_CARD)
