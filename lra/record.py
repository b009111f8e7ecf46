"""The run record ``result.json`` (docs/design.md): what a run was and how it ended, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lra.config import RunSpec
from lra.files import git_commit, write_json

SCHEMA_VERSION = 1  # additions that keep every earlier field are not a new version
REQUIRED = (
    "task",
    "attn",
    "seed",
    "status",
    "test_acc",
    "best_val_acc",
    "steps",
    "train_time_s",
    "time_per_1k_steps_s",
    "peak_mem_bytes",
    "micro_batch",
    "accum_steps",
    "effective_batch",
    "hardware",
    "config",
    "git_commit",
    # the papers' protocol (docs/protocol.md): why it stopped, selection, estimated memory, throughput
    "reason",
    "steps_at_stop",
    "steps_to_best",
    "peak_mem_estimate_bytes",
    "tokens_per_s",
    "attn_options",
)


def new_record(spec: RunSpec) -> dict:
    """The record of a run that has not trained yet (status ``running``)."""
    return {
        "task": spec.task,
        "attn": spec.attn.label,
        "attn_backend": spec.attn.name,
        "seed": spec.seed,
        "name": spec.name,  # name=: the display name; a finished run keeps the one it ran with
        "search": None,  # a search trial's: {study, trial, grid, params, objective} (lra.sweep.pruning)
        "preset": spec.preset,
        "semantics": spec.semantics,
        "quirks": dict(spec.quirks),
        "status": "running",
        "reason": None,
        "test_acc": None,
        "test_loss": None,
        "best_val_acc": None,
        "majority_acc": None,
        "steps": 0,
        "steps_at_stop": None,
        "steps_to_best": None,
        "train_time_s": None,
        "time_per_1k_steps_s": None,
        "tokens_per_s": None,
        "peak_mem_bytes": None,
        "peak_mem_estimate_bytes": None,
        "micro_batch": None,
        "accum_steps": None,
        "effective_batch": spec.train.batch_size,
        "hardware": spec.hardware.name,
        "attn_options": dict(spec.attn.options),
        "attn_impl": spec.attn.options.get("impl"),
        "attn_checkpointing": spec.attn.checkpointing,
        "precision": spec.hardware.precision,
        "config": spec.config,
        "git_commit": git_commit(),
        "torch_version": str(torch.__version__),
        "device": None,
        # what was read (lra/data/provenance.py) and how shared the machine was (lra.devices.LoadMeter)
        "data": None,
        "machine": None,
    }


def write_record(run_dir: Path, record: dict) -> Path:
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"run record lacks {missing}")
    return write_json(Path(run_dir) / "result.json", {"schema_version": SCHEMA_VERSION, **record})


def read_record(run_dir: Path) -> dict | None:
    p = Path(run_dir) / "result.json"
    return json.loads(p.read_text()) if p.exists() else None
