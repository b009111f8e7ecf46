"""Shared test setup: one CPU thread (machines are shared and noisy), repo root on sys.path."""

import functools
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(1)

# The files with the longest tests (whole lra.train and sweep processes), scheduled first: `make test` hands
# whole files to its two workers in collection order (--dist loadfile), so a long file collected last would
# leave one worker alone at the end. The rest keep their order.
LONG_FIRST = (
    "test_failures.py",
    "test_resume.py",
    "test_sweep.py",
    "test_loggers.py",
    "test_packaging.py",
    "test_batch_logs.py",
    "test_debug.py",
    "test_evaluate.py",
    "test_external_attention.py",
    "test_train.py",
    "test_sweep_budget.py",
    "test_fidelity.py",
    "test_record_labels.py",
    "test_ddp.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: files stay whole


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def run_env(tmp_path):
    """``run_env(runs="runs", pythonpath=None, **extra)``: the environment of a harness command under this test's
    tmp_path (tests/helpers.py)."""
    from tests.helpers import run_env

    return functools.partial(run_env, tmp_path)


@pytest.fixture
def quick_run(tmp_path):
    """``quick_run(*overrides, runs="runs", check=True, env=None)``: lra.train of the tiny quick run (tests/helpers.py
    TINY) plus ``overrides``, under this test's tmp_path. In this process: tests/helpers.py ``train_here``."""
    from tests.helpers import TINY, run_train

    return lambda *overrides, **kw: run_train(tmp_path, *TINY, *overrides, **kw)
