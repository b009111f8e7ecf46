"""Check 5: a tiny run killed with SIGKILL and resumed on this device ends as an uninterrupted one.

Two ``python -m lra.train`` processes of the same tiny ListOps run (micro-batch 16 x accumulation 2, an
evaluation every 8 optimizer steps, a resume checkpoint every 3) start together in a scratch folder: the
reference runs through; the other is killed with SIGKILL once it has a checkpoint at step >= 9, then
started again with the same command. On a CPU the two records and validation curves must be equal; on
CUDA, kernels with atomic adds (backward of index and scatter ops) make two runs differ in the last
bits, so there the figure is the largest difference and it passes under ``CUDA_TOLERANCE``.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from lra.tools.doctor.base import Budget, Options, Result

TINY = [
    "task=listops",
    "attn=softmax",
    "preset=quick",
    "task.generator.n_train=256",
    "task.generator.n_val=64",
    "task.generator.n_test=64",
    "train.max_steps=30",
    "train.eval_every=8",
    "hardware.micro_batch=16",
    "train.ckpt_every_steps=3",
    "trainer.progress=false",
    "num_threads=1",
]
SAME = ("status", "steps", "steps_to_best", "stop_reason", "micro_batch", "accum_steps", "tested_ckpt")
CLOSE = ("test_acc", "test_loss", "best_val_acc")
KILL_AT = 9  # a checkpoint past the first evaluation, mid-way between two
CUDA_TOLERANCE = 1e-4  # on losses and accuracies: last-bit differences of atomics, not a resume error


def _env(scratch: Path, name: str) -> dict:
    return {
        **os.environ,
        "LRA_DATA": str(scratch / f"data-{name}"),
        "LRA_RUNS": str(scratch / name),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    }


def _start(scratch: Path, name: str, extra: list[str], procs: list) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lra.train", *TINY, *extra],
        env=_env(scratch, name),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    procs.append(proc)
    return proc


class NotData(Exception):
    """A checkpoint that ``torch.load(weights_only=True)`` refuses: it holds more than tensors and plain
    values, and a runs folder from elsewhere is data, never code, so it is not unpickled another way."""


def read_step(path: Path) -> int | None:
    """The ``global_step`` a checkpoint holds, read as data (``weights_only=True``); None while it is being
    written (truncated); :class:`NotData`, in one line naming the file, where it cannot be read as data."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NotData(f"{path}: refused, it cannot be read as data (torch.load weights_only=True: {first})") from None
    except Exception:  # being replaced right now
        return None


def _checkpoint_step(runs: Path) -> int | None:
    last = next(runs.rglob("last.ckpt"), None) if runs.exists() else None
    return None if last is None else read_step(last)


def _kill_after_checkpoint(proc: subprocess.Popen, runs: Path, deadline: float) -> int | None:
    """SIGKILL once a resume checkpoint at step >= KILL_AT exists; the step it had (None: never)."""
    while time.time() < deadline and proc.poll() is None:
        step = _checkpoint_step(runs)
        if step is not None and step >= KILL_AT:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return step
        time.sleep(0.05)
    return None


def _finish(proc: subprocess.Popen, deadline: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=max(0.2, deadline - time.time()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, out + "\n(timed out)"
    return proc.returncode, out


def _record(runs: Path) -> dict:
    return json.loads(next(runs.rglob("result.json")).read_text())


def _val_curve(runs: Path) -> list[tuple[int, float, float]]:
    with open(next(runs.rglob("metrics.csv")), newline="") as f:
        return [
            (int(float(r["step"])), float(r["val/loss"]), float(r["val/acc"]))
            for r in csv.DictReader(f)
            if r.get("val/loss")
        ]


def compare(ref: dict, resumed: dict, ref_curve: list, curve: list) -> tuple[list[str], float]:
    """What differs beyond numbers (list of ``key: a != b``), and the largest numeric difference."""
    diffs = [f"{k}: {resumed.get(k)!r} != {ref.get(k)!r}" for k in SAME if resumed.get(k) != ref.get(k)]
    if [c[0] for c in curve] != [c[0] for c in ref_curve]:
        diffs.append(f"evaluation steps {[c[0] for c in curve]} != {[c[0] for c in ref_curve]}")
    nums = [
        abs(float(resumed[k]) - float(ref[k])) for k in CLOSE if resumed.get(k) is not None and ref.get(k) is not None
    ]
    nums += [abs(a - b) for x, y in zip(curve, ref_curve) for a, b in zip(x[1:], y[1:])]
    return diffs, max(nums, default=0.0)


def _past(item: str, budget: Budget) -> Result:
    return Result(
        "resume", item, "skip", detail=f"its runs were stopped at the check's time budget of {budget.seconds:g} s"
    )


def check(opts: Options, budget: Budget) -> Iterator[Result]:
    item = "listops/softmax tiny run, SIGKILL at a checkpoint, resumed"
    extra = opts.run_overrides
    scratch = Path(tempfile.mkdtemp(prefix="lra-doctor-resume-", dir=opts.out))
    deadline = time.time() + budget.remaining()  # every wait below ends there; the watchdog backs it
    procs: list[subprocess.Popen] = []
    try:
        ref_proc = _start(scratch, "ref", extra, procs)
        killed = _start(scratch, "killed", extra, procs)
        try:
            step = _kill_after_checkpoint(killed, scratch / "killed", deadline)
        except NotData as e:
            yield Result("resume", item, "fail", detail=str(e)[:300])
            return
        rc, out = _finish(ref_proc, deadline)
        if time.time() >= deadline:
            yield _past(item, budget)
            return
        if rc != 0:
            yield Result("resume", item, "fail", detail=f"the uninterrupted run exited {rc}: {out.strip()[-300:]}")
            return
        if step is None:
            _finish(killed, deadline)
            if time.time() >= deadline:
                yield _past(item, budget)
                return
            yield Result("resume", item, "fail", detail=f"no checkpoint at step >= {KILL_AT} to kill the run at")
            return
        rc, out = _finish(_start(scratch, "killed", extra, procs), deadline)
        if time.time() >= deadline:
            yield _past(item, budget)
            return
        if rc != 0 or "resuming from" not in out:
            yield Result(
                "resume",
                item,
                "fail",
                detail=f"the restarted run exited {rc}"
                + ("" if "resuming from" in out else " without resuming")
                + f": {out.strip()[-300:]}",
            )
            return
        ref, resumed = _record(scratch / "ref"), _record(scratch / "killed")
        diffs, largest = compare(ref, resumed, _val_curve(scratch / "ref"), _val_curve(scratch / "killed"))
    finally:
        for proc in procs:  # an interrupted doctor leaves no run behind (they run in their own sessions)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)  # the doctor's own scratch runs
    cuda = opts.device.startswith("cuda")
    tolerance = CUDA_TOLERANCE if cuda else 0.0
    status = "pass" if not diffs and largest <= tolerance else "fail"
    figure = f"killed at step {step}, resumed to step {resumed['steps']}: " + (
        "identical to the uninterrupted run"
        if largest == 0 and not diffs
        else f"largest difference {largest:.2e} in losses and accuracies"
    )
    detail = "; ".join(diffs) if diffs else ("" if status == "pass" else f"above the tolerance {tolerance:g}")
    if cuda and status == "pass":
        detail = f"tolerance on CUDA {tolerance:g}"
    yield Result(
        "resume",
        item,
        status,
        figure,
        detail,
        data={
            "killed_at": step,
            "largest_difference": largest,
            "differences": diffs,
            "test_acc": [ref.get("test_acc"), resumed.get("test_acc")],
        },
    )
