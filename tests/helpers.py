"""What many tests share: a tiny quick-preset run, the environment of a harness command a test starts, ``lra.train``
run in it, the same run in the test's own process (:func:`train_here`) and a callback that ends it at a step
(:func:`kill_at`). conftest.py turns the environment and the subprocess run into the fixtures ``run_env`` and
``quick_run``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# the quick preset's ListOps on 256 generated examples: the data of every test run (one cache entry for all)
DATA = ["preset=quick", "task.generator.n_train=256", "task.generator.n_val=64", "task.generator.n_test=64"]
# 64 of its examples, of up to 60 tokens padded to 64: runs whose steps cross epochs and checkpoints in seconds
SHORT = [
    "preset=quick",
    "task.generator.n_train=64",
    "task.generator.n_val=16",
    "task.generator.n_test=16",
    "task.max_length=60",
    "task.generator.max_length=60",
    "task.seq_len=64",
]
# a run of DATA small enough for a unit test: 12 steps
TINY = [
    *DATA,
    "train.max_steps=12",
    "train.eval_every=5",
    "num_threads=1",
]


def run_env(tmp_path: Path, runs: str = "runs", *, pythonpath: Path | None = None, **extra: str) -> dict:
    """The environment of a harness command: its runs under ``tmp_path/<runs>`` and data under
    ``tmp_path/data-<runs>`` (runs started together never share a generation), one thread, W&B off,
    unbuffered output; ``pythonpath`` goes first on its PYTHONPATH (a test's own modules); ``extra`` adds or
    replaces variables."""
    path = {"PYTHONPATH": f"{pythonpath}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"} if pythonpath else {}
    return {
        **os.environ,
        "LRA_DATA": str(tmp_path / f"data-{runs}"),
        "LRA_RUNS": str(tmp_path / runs),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
        **path,
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


def start_train(tmp_path: Path, *overrides: str, runs: str = "runs", **popen) -> subprocess.Popen:
    """``python -m lra.train <overrides>`` started in :func:`run_env`, its output (stderr too) in a text pipe;
    ``popen`` adds or replaces arguments of ``subprocess.Popen``."""
    kw = {"env": run_env(tmp_path, runs), "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    return subprocess.Popen([sys.executable, "-m", "lra.train", *overrides], **{**kw, **popen})


def record(folder: Path) -> dict:
    """The record (result.json) of the run under ``folder``."""
    return json.loads(next(Path(folder).rglob("result.json")).read_text())


class Killed(Exception):
    """What :func:`kill_at`'s callback raises: the run ends as a kill ends it (record ``failed``, last.ckpt kept)."""


def kill_at(step: int, sig: int | None = None):
    """A Lightning callback that ends the run once optimizer step ``step`` is done (logged, evaluated and
    checkpointed where due): it raises :class:`Killed`, or with ``sig`` sends this process that signal, as ``kill``
    or a scheduler would. Lightning is imported here, not by every test that imports this module (2 s)."""
    import lightning as L

    class KillAt(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == step:
                if sig is None:
                    raise Killed(step)
                os.kill(os.getpid(), sig)

    return KillAt()


def roots(folder: Path) -> list[str]:
    """The overrides that put a run's data in ``folder/data``, its runs under ``folder/runs`` and its fit cache in
    ``folder/cache``."""
    return [f"data_root={folder / 'data'}", f"runs_root={folder / 'runs'}", f"fit.cache_dir={folder / 'cache'}"]


def spec_here(tmp_path: Path, *overrides: str, run_dir: Path | None = None):
    """The RunSpec of :func:`roots` ``(tmp_path)`` and ``overrides`` (which come after them: they may replace
    them), as lra.train loads it, the run in ``run_dir`` (default ``tmp_path/runs/run``)."""
    from lra.config import load

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("LRA_DATA", raising=False)  # it would win over data_root= (lra.files.data_root)
        return load([*roots(tmp_path), *overrides], run_dir=run_dir or tmp_path / "runs" / "run")


def train_here(where, *overrides: str, callbacks=(), run_dir: Path | None = None):
    """``lra.train.run`` in this process, of the RunSpec ``where`` or of :func:`spec_here` (``where`` a folder,
    with ``overrides`` and ``run_dir``), with ``callbacks`` beside the user's: its record, or None when
    :class:`Killed` ended it. Not sent to W&B (no tiny run logs there; spares W&B's 1 s import)."""
    from lra import train as lra_train
    from lra.loop import user_callbacks

    if isinstance(where, Path):
        where = spec_here(where, *overrides, run_dir=run_dir)
    elif overrides or run_dir:
        raise TypeError("train_here: overrides and run_dir go with a folder, not a RunSpec")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("lra.loop.user_callbacks", lambda spec: [*user_callbacks(spec), *callbacks])
        mp.setattr(lra_train, "log_record", lambda *a: None)
        try:
            return lra_train.run(where)
        except Killed:
            return None
