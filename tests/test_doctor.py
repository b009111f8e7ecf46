"""lra-doctor: the checks report what they measured, a broken backend is named while the rest go on,
the overhead check really interleaves the harness with a bare loop, and the whole ``--quick`` doctor
passes on a CPU in bounded time (slow test: CI runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch

from attention import AttentionBackend, Capabilities
from lra.tools.doctor import Options, checks, overhead, resume
from lra.tools.doctor.__main__ import main
from lra.tools.doctor.base import Budget


@dataclass(frozen=True)
class _NoOptions:
    pass


class Exploding(AttentionBackend):
    """An external backend whose forward raises: the doctor must name it and go on."""

    Options = _NoOptions
    capabilities = Capabilities()

    def forward(self, q, k, v, mask=None):
        raise RuntimeError("kernel exploded")


def _report(folder) -> dict:
    return json.loads((folder / "report.json").read_text())


def test_a_failing_backend_is_named_and_the_other_backends_and_checks_complete(tmp_path, capsys):
    code = main(
        [
            "--quick",
            "--device",
            "cpu",
            "--checks",
            "backends",
            "fit",
            "--tasks",
            "listops",
            "--backends",
            "softmax",
            "tests.test_doctor:Exploding",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    rep = _report(tmp_path)
    by = {(r["check"], r["item"].split(" ")[0]): r for r in rep["results"]}
    assert code == 1, out  # an item failed
    bad = by[("backends", "listops/tests.test_doctor:Exploding")]
    assert bad["status"] == "fail" and "kernel exploded" in bad["detail"], bad
    assert "[FAIL] backends listops/tests.test_doctor:Exploding eager" in out and "kernel exploded" in out
    good = by[("backends", "listops/softmax")]
    assert good["status"] == "pass" and good["data"]["time_ms"] > 0 and good["data"]["peak_mem_bytes"] > 0
    # the fit check ran after the failure, on the backends it knows, estimate against a real peak
    fit = by[("fit", "listops/softmax")]
    assert fit["status"] == "pass", fit
    assert fit["data"]["measured_bytes"] > 0 and abs(fit["data"]["error"]) <= checks.FIT_TOLERANCE
    md = (tmp_path / "report.md").read_text()
    assert "## backends" in md and "## fit" in md and "kernel exploded" in md
    assert rep["environment"]["torch"] == torch.__version__ and "extras" in rep["environment"]


@pytest.mark.parametrize(
    "args,says",
    [
        (["--backends", "nosuch"], "available"),
        (["--preset", "nosuch"], "--preset nosuch"),
        (["--hardware", "nosuch"], "--hardware nosuch"),
        (["--budget-s", "nan"], "nan"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as stop:
        main([*args, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "r").exists()


def test_a_check_past_its_budget_skips_its_remaining_items():
    opts = Options(checks=("backends",), quick=True, tasks=("listops",), backends=("none", "vmean"))
    spent = Budget(0.0)
    results = list(checks.backends(opts, spent))
    assert [r.status for r in results] == ["skip", "skip"] and "budget" in results[0].detail


def test_ctrl_c_writes_the_partial_report_and_exits_130(tmp_path, monkeypatch, capsys):
    def first_then_ctrl_c(opts, budget):
        yield checks.Result("cost", "listops/softmax (quick)", "pass", "1 ms per optimizer step")
        raise KeyboardInterrupt

    monkeypatch.setitem(checks.CHECK_FUNCTIONS, "cost", first_then_ctrl_c)
    code = main(["--quick", "--device", "cpu", "--checks", "cost", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and len(err) == 1 and "interrupted after 1 results" in err[0]
    assert [r["item"] for r in _report(tmp_path)["results"]] == ["listops/softmax (quick)"]


# ----------------------------------------------------------------------------- check 3
def test_overhead_interleaves_bare_blocks_between_harness_blocks_at_optimizer_steps(monkeypatch):
    """Accumulation 2: the harness's blocks must be counted in optimizer steps, each followed by a bare
    block of as many optimizer steps (each of 2 micro-batches); the first bare block warms the bare loop."""
    calls = []
    real = overhead.BareLoop.__call__

    def counted(self):
        calls.append(self.step.accum)
        real(self)

    monkeypatch.setattr(overhead.BareLoop, "__call__", counted)
    seen = {}
    real_measure = overhead.Interleave.on_train_batch_end

    def spy(self, trainer, *a):
        real_measure(self, trainer, *a)
        seen["steps"] = trainer.global_step
        seen["harness"], seen["bare"] = len(self.harness_s), len(self.bare_s)

    monkeypatch.setattr(overhead.Interleave, "on_train_batch_end", spy)
    o = overhead.measure(
        [
            "task=listops",
            "attn=none",
            "preset=quick",
            "hardware.micro_batch=16",
            "trainer.progress=false",
            "trainer.accelerator=cpu",
        ],
        blocks=3,
        block=2,
        warmup=1,
    )
    assert seen == {"steps": 1 + 3 * 2, "harness": 3, "bare": 4}
    assert calls == [2] * (2 * 4)  # 4 bare blocks of 2 optimizer steps, each of accumulation 2
    assert (o.blocks, o.block, o.micro_batch, o.accum_steps) == (3, 2, 16, 2)
    assert o.ratio > 0 and o.harness_ms > 0 and o.bare_ms > 0


# ----------------------------------------------------------------------------- check 5
def test_resume_comparison_names_what_differs():
    ref = {
        "status": "completed",
        "steps": 30,
        "steps_to_best": 24,
        "stop_reason": "max_steps",
        "micro_batch": 16,
        "accum_steps": 2,
        "tested_ckpt": "best",
        "test_acc": 0.25,
        "test_loss": 2.1,
        "best_val_acc": 0.3,
    }
    curve = [(8, 2.3, 0.2), (16, 2.2, 0.3)]
    assert resume.compare(ref, dict(ref), curve, list(curve)) == ([], 0.0)
    diffs, largest = resume.compare(ref, {**ref, "test_loss": 2.1 + 1e-6}, curve, curve)
    assert diffs == [] and largest == pytest.approx(1e-6)
    diffs, _ = resume.compare(ref, {**ref, "steps_to_best": 16}, curve, [(8, 2.3, 0.2), (17, 2.2, 0.3)])
    assert diffs[0] == "steps_to_best: 16 != 24" and diffs[1].startswith("evaluation steps")


# ----------------------------------------------------------------------------- check 6
def test_cost_is_the_optimizer_step_time_times_the_presets_steps(monkeypatch):
    """A step of micro-batch 2 at 5 ms on the quick preset's ListOps (batch 32: 16 micro-batches, 600 steps)."""
    row = {
        "task": "listops",
        "backend": "softmax",
        "mode": "eager",
        "status": "ok",
        "time_ms": 5.0,
        "micro_batch": 2,
        "accum_steps": 1,
        "peak_mem_bytes": "",
    }
    monkeypatch.setattr(checks, "_measure", lambda cfg, task, backend: [dict(row, backend=backend)])
    opts = Options(checks=("cost",), quick=True, tasks=("listops",), backends=("softmax",))
    (r,) = checks.cost(opts, Budget(60))
    assert r.status == "pass"
    assert r.data["step_s"] == pytest.approx(0.005 * 16) and r.data["total_s"] == pytest.approx(0.08 * 600)
    assert "80 ms per optimizer step" in r.figure and "0.8 min for its 600 steps" in r.figure


# ----------------------------------------------------------------------------- the whole doctor
@pytest.mark.slow
def test_quick_doctor_passes_on_the_cpu_within_five_minutes(tmp_path):
    """What CI runs on its CPU (on a GPU machine too: the CPU is what is checked here)."""
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.doctor", "--quick", "--device", "cpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"LRA_RUNS": str(tmp_path / "runs"), **_env()},
    )
    took = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = _report(tmp_path)
    statuses = {r["status"] for r in rep["results"]}
    assert "fail" not in statuses, [r for r in rep["results"] if r["status"] == "fail"]
    assert {r["check"] for r in rep["results"]} == set(checks.CHECK_FUNCTIONS)
    backends = {r["item"].split(" ")[0].split("/")[1] for r in rep["results"] if r["check"] == "backends"}
    assert len(backends) == len(checks.all_backends(Options())), backends
    assert took < 300 * 1.5, f"{took:.0f} s"  # 5 minutes on a calm 2-core machine; CI shares its cores


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "LRA_RUNS"}


def test_the_extras_the_doctor_checks_are_pyprojects():
    """The doctor's "extras installed" line reads the installed metadata, so it cannot drift from pyproject."""
    import tomllib
    from packaging.requirements import Requirement

    from lra import REPO_ROOT
    from lra.tools.doctor.env import APART, extras

    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    expected = {k: tuple(Requirement(r).name for r in v) + APART.get(k, ()) for k, v in declared.items() if k != "dev"}
    assert extras() == expected
