"""What many tests share: a tiny quick-preset run, the environment of a harness command a test starts, and
``lra.train`` run in it. conftest.py turns the last two into the fixtures ``run_env`` and ``quick_run``."""

import os
import subprocess
import sys
from pathlib import Path

# a ListOps run of the quick preset small enough for a unit test: 12 steps on 256 examples
TINY = [
    "preset=quick",
    "protocol.data.n_train=256",
    "protocol.data.n_val=64",
    "protocol.data.n_test=64",
    "train.max_steps=12",
    "train.eval_every=5",
    "num_threads=1",
]


def run_env(tmp_path: Path, runs: str = "runs", **extra: str) -> dict:
    """The environment of a harness command: its runs under ``tmp_path/<runs>`` and data under
    ``tmp_path/data-<runs>`` (runs started together never share a generation), one thread, W&B off,
    unbuffered output; ``extra`` adds or replaces variables."""
    return {
        **os.environ,
        "LRA_DATA": str(tmp_path / f"data-{runs}"),
        "LRA_RUNS": str(tmp_path / runs),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def run_train(tmp_path: Path, *overrides: str, runs: str = "runs", check: bool = True, env: dict | None = None):
    """``python -m lra.train <overrides>`` in :func:`run_env` (or ``env``); with ``check``, a failure is an
    AssertionError that shows the end of its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "lra.train", *overrides],
        env=env or run_env(tmp_path, runs),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"lra.train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc
