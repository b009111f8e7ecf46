"""The run record ``result.json`` (docs/design.md): what a run was and how it ended, written atomically.

:class:`Record` has every field a record can hold. A field the run has not reached (a run that failed
before its plan has no ``micro_batch`` source) is :data:`ABSENT` and left out of the file, so a record
says what was known when it was written; an older record read back lacks its newer fields the same way.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lra.files import git_commit, write_json

if TYPE_CHECKING:
    from lra.config import RunSpec

SCHEMA_VERSION = 1  # additions that keep every earlier field are not a new version
# what every finished record has had since schema 1 (the collector needs these of any record it reads)
CORE = (
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
)
REQUIRED = (
    *CORE,
    # the papers' protocol (docs/protocol.md): why it stopped, selection, estimated memory, throughput
    "reason",
    "steps_at_stop",
    "steps_to_best",
    "peak_mem_estimate_bytes",
    "tokens_per_s",
    "attn_options",
)


class _Absent:
    """Not in the file: the run had not got that far, or the record predates the field."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(slots=True)  # a misspelt field (rec.tset_acc = ...) is an error, not an attribute off the record
class Record:
    """One ``result.json``, field for field (docs/protocol.md says what each means)."""

    schema_version: int = ABSENT
    # what ran
    task: str = ABSENT
    attn: str = ABSENT
    attn_backend: str = ABSENT
    seed: int = ABSENT
    name: str | None = ABSENT  # name=: the display name; a finished run keeps the one it ran with
    debug: str = ABSENT  # debug=<name>: a check of the pipeline, never a result (the collector skips it)
    search: dict | None = ABSENT  # a search trial's: {study, trial, grid, params, objective} (lra.tools.sweep.pruning)
    preset: str = ABSENT
    semantics: str = ABSENT
    quirks: dict = ABSENT
    # how it ended
    status: str = ABSENT  # running | completed | stopped_early | stuck | failed | interrupted
    reason: str | None = ABSENT
    stop_reason: str = ABSENT  # max_steps | early_stopping | stopped | stuck | diverged | pruned
    stop_rule: str = ABSENT
    pruned_at_step: int = ABSENT
    tested_ckpt: str | None = ABSENT
    test_acc: float | None = ABSENT
    test_loss: float | None = ABSENT
    best_val_acc: float | None = ABSENT
    best_ckpt: str | None = ABSENT
    majority_acc: float | None = ABSENT
    stuck_at_end: bool = ABSENT
    # how far, how fast
    steps: int = ABSENT
    steps_at_stop: int | None = ABSENT
    steps_to_best: int | None = ABSENT
    resumed_from_step: int | None = ABSENT
    train_time_s: float | None = ABSENT
    eval_time_s: float = ABSENT
    time_per_1k_steps_s: float | None = ABSENT
    tokens_per_s: float | None = ABSENT
    compile_time_s: float | None = ABSENT
    # memory and batch (lra/fit.py)
    peak_mem_bytes: int | None = ABSENT
    peak_mem_estimate_bytes: int | None = ABSENT
    peak_mem_estimate_error: float = ABSENT
    micro_batch: int | None = ABSENT
    accum_steps: int | None = ABSENT
    effective_batch: int = ABSENT
    devices: int = ABSENT
    accum_source: str = ABSENT
    fit_budget_bytes: int | None = ABSENT
    fit_seconds: float | None = ABSENT
    # the model and where it ran
    num_params: int = ABSENT
    hardware: str = ABSENT
    execution: str = ABSENT  # paper | fast: how it ran (docs/protocol.md); absent in older records: paper
    execution_note: str | None = ABSENT  # why it ran otherwise than execution= asked
    attn_options: dict = ABSENT
    attn_impl: str | None = ABSENT
    attn_checkpointing: bool = ABSENT
    precision: str = ABSENT
    compiled: bool = ABSENT
    compile_note: str | None = ABSENT
    device: str | None = ABSENT
    loader_workers: int = ABSENT
    config: dict = ABSENT
    git_commit: str | None = ABSENT  # the commit of the code that wrote this record (its last stretch)
    commits: list = ABSENT  # every commit the run ran on, in order: a resumed run's earlier stretches' too
    torch_version: str = ABSENT
    # what was read (lra/data/provenance.py) and how shared the machine was (lra.devices.LoadMeter)
    data: dict | None = ABSENT
    split_sizes: dict = ABSENT
    machine: dict | None = ABSENT
    # what else the record holds: fields the run's callbacks add (``record_fields``), a newer record's own
    extra: dict = field(default_factory=dict)

    def set(self, **fields) -> None:
        """Set fields by name; a name that is no field is an error (a typo must not reach a record)."""
        for k, v in fields.items():
            if k not in _NAMES:
                raise AttributeError(f"the run record has no field {k!r}")
            setattr(self, k, v)

    def merge(self, fields: dict) -> None:
        """Set fields by name, keeping any other name in :attr:`extra` (a callback's, a newer record's)."""
        for k, v in fields.items():
            if k in _NAMES:
                setattr(self, k, v)
            else:
                self.extra[k] = v

    def to_json(self) -> dict:
        """The record as ``result.json`` holds it: every field that is not :data:`ABSENT`, then :attr:`extra`."""
        out = {f: getattr(self, f) for f in _NAMES if getattr(self, f) is not ABSENT}
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, raw) -> Record:
        """A record as read from a file, of any version: what it lacks stays :data:`ABSENT`, nothing is checked."""
        if not isinstance(raw, dict):
            raise ValueError(f"top level is {type(raw).__name__}, not an object")
        rec = cls()
        rec.merge(raw)
        return rec

    # read by result.json's names, as the sweep and the tests read a record
    def __getitem__(self, key: str):
        out = self.to_json()
        return out[key]

    def __contains__(self, key: str) -> bool:
        return key in self.to_json()

    def get(self, key: str, default=None):
        return self.to_json().get(key, default)


_NAMES = tuple(f.name for f in dataclasses.fields(Record) if f.name != "extra")


def new_record(spec: RunSpec) -> Record:
    """The record of a run that has not trained yet (status ``running``)."""
    import torch  # heavy: the collector reads records without it

    commit = git_commit()
    return Record(
        schema_version=SCHEMA_VERSION,
        task=spec.task,
        attn=spec.attn.label,
        attn_backend=spec.attn.name,
        seed=spec.seed,
        name=spec.name,
        search=None,
        **({"debug": spec.debug.name} if getattr(spec, "debug", None) else {}),
        preset=spec.preset,
        semantics=spec.semantics,
        quirks=dict(spec.quirks),
        status="running",
        reason=None,
        test_acc=None,
        test_loss=None,
        best_val_acc=None,
        majority_acc=None,
        steps=0,
        steps_at_stop=None,
        steps_to_best=None,
        train_time_s=None,
        time_per_1k_steps_s=None,
        tokens_per_s=None,
        peak_mem_bytes=None,
        peak_mem_estimate_bytes=None,
        micro_batch=None,
        accum_steps=None,
        effective_batch=spec.train.batch_size,
        hardware=spec.hardware.name,
        execution=spec.execution,
        execution_note=spec.execution_note,
        attn_options=dict(spec.attn.options),
        attn_impl=spec.attn.options.get("impl"),
        attn_checkpointing=spec.attn.checkpointing,
        precision=spec.hardware.precision,
        config=spec.config,
        git_commit=commit,
        commits=[commit] if commit else [],
        torch_version=str(torch.__version__),
        device=None,
        data=None,
        machine=None,
    )


def carry_over(rec: Record, before: Record) -> None:
    """Start a resumed run's record ``rec`` from its earlier stretches' record ``before``: the steps and training
    time they reached (what a failure or an interruption before this stretch trains says, not 0) and every commit
    they ran on, this one last. ``before`` empty (a fresh run): ``rec`` is left as it is."""
    if before.get("steps"):
        rec.set(steps=before["steps"], train_time_s=before.get("train_time_s"))
    earlier = before.get("commits") or ([before["git_commit"]] if before.get("git_commit") else [])
    if earlier:
        rec.commits = [*earlier, *[c for c in rec.commits if c not in earlier]]


def write_record(run_dir: Path, record: Record) -> Path:
    out = record.to_json()
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise ValueError(f"run record lacks {missing}")
    return write_json(Path(run_dir) / "result.json", {"schema_version": SCHEMA_VERSION, **out})


def read_record(run_dir: Path) -> Record | None:
    """The record in ``run_dir`` (None: none there); ValueError when it is not a JSON object (or nests deeper
    than Python reads)."""
    p = Path(run_dir) / "result.json"
    if not p.exists():
        return None
    try:
        return Record.from_json(json.loads(p.read_text()))
    except RecursionError:
        raise ValueError("nested deeper than a record is") from None
