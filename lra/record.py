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
# Named subsets of the fields, declared on the fields themselves (``_in``); every reader asks Record.fields_in
GROUPS = {
    "core": "every finished record has had it since schema 1 (the collector needs it of any record it reads)",
    "protocol": "required since the papers' protocol (docs/protocol.md): why it stopped, selection, cost",
    "measured": "a number the collector averages over seeds per table cell (summary.csv)",
    "expected": "a finished run's metric: the collector reports it missing (peak memory only off the CPU)",
    "text": "the collector reads it as text",
    "fraction": "an accuracy: in [0, 1]",
    "float32": "computed in float32 (torch metrics): read at the digits a float32 holds",
    "non_negative": "a count, time, memory or loss: never negative",
    "positive": "a rate or batch: never zero either (it would put a run at infinite speed)",
    "summary": "in the run's W&B summary (lra/wandb_extras.py)",
    "artifact": "in the metadata of the run's W&B record artifact",
}


class _Absent:
    """Not in the file: the run had not got that far, or the record predates the field."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


def _known(groups: tuple) -> tuple:
    if not set(groups) <= GROUPS.keys():  # a misspelt group would leave its field out silently
        raise KeyError(f"no field group {sorted(set(groups) - GROUPS.keys())}")
    return groups


def _in(*groups: str) -> Any:
    """A field that is :data:`ABSENT` until set, in ``groups`` (keys of :data:`GROUPS`)."""
    return field(default=ABSENT, metadata={"groups": _known(groups)})


@dataclass(slots=True)  # a misspelt field (rec.tset_acc = ...) is an error, not an attribute off the record
class Record:
    """One ``result.json``, field for field (docs/protocol.md says what each means)."""

    schema_version: int = ABSENT
    # what ran
    task: str = _in("core", "text", "artifact")
    attn: str = _in("core", "text", "artifact")
    attn_backend: str = _in("text")
    seed: int = _in("core", "artifact")
    name: str | None = ABSENT  # name=: the display name; a finished run keeps the one it ran with
    debug: str = ABSENT  # debug=<name>: a check of the pipeline, never a result (the collector skips it)
    search: dict | None = ABSENT  # a search trial's: {study, trial, grid, params, objective} (lra.tools.sweep.pruning)
    preset: str = _in("text", "artifact")
    semantics: str = ABSENT
    quirks: dict = ABSENT
    # how it ended
    # status: running | completed | stopped_early | stuck | failed | interrupted
    status: str = _in("core", "text", "summary", "artifact")
    reason: str | None = _in("protocol", "text", "summary")
    stop_reason: str = ABSENT  # max_steps | early_stopping | stopped | stuck | diverged | pruned
    stop_rule: str = ABSENT
    pruned_at_step: int = ABSENT
    tested_ckpt: str | None = ABSENT
    test_acc: float | None = _in("core", "measured", "expected", "fraction", "float32", "summary")
    test_loss: float | None = _in("float32", "non_negative", "summary")
    best_val_acc: float | None = _in("core", "measured", "expected", "fraction", "float32", "summary")
    best_ckpt: str | None = ABSENT
    majority_acc: float | None = _in("measured", "fraction", "float32", "summary")
    stuck_at_end: bool = ABSENT
    # how far, how fast
    steps: int = _in("core", "measured", "expected", "non_negative", "summary")
    steps_at_stop: int | None = _in("protocol")
    steps_to_best: int | None = _in("protocol")
    resumed_from_step: int | None = ABSENT
    train_time_s: float | None = _in("core", "measured", "expected", "non_negative", "summary")
    eval_time_s: float = _in("measured", "non_negative", "summary")
    time_per_1k_steps_s: float | None = _in("core", "measured", "expected", "positive", "summary")
    tokens_per_s: float | None = _in("protocol", "measured", "positive")
    compile_time_s: float | None = ABSENT
    # memory and batch (lra/fit.py)
    peak_mem_bytes: int | None = _in("core", "measured", "expected", "non_negative", "summary")
    peak_mem_estimate_bytes: int | None = _in("protocol", "measured", "non_negative")
    peak_mem_estimate_error: float = ABSENT
    micro_batch: int | None = _in("core", "measured", "expected", "positive", "summary")
    accum_steps: int | None = _in("core", "measured", "expected", "positive", "summary")
    effective_batch: int = _in("core", "measured", "positive", "summary")
    devices: int = ABSENT
    accum_source: str = ABSENT
    fit_budget_bytes: int | None = ABSENT
    fit_seconds: float | None = ABSENT
    # the model and where it ran
    num_params: int = _in("summary")
    hardware: str = _in("core", "text", "summary")
    execution: str = _in("text")  # paper | fast: how it ran (docs/protocol.md); absent in older records: paper
    execution_note: str | None = ABSENT  # why it ran otherwise than execution= asked
    attn_options: dict = _in("protocol")
    attn_impl: str | None = ABSENT
    attn_checkpointing: bool = ABSENT
    precision: str = ABSENT
    compiled: bool = ABSENT
    compile_note: str | None = ABSENT
    device: str | None = _in("text", "summary")
    loader_workers: int = ABSENT
    config: dict = _in("core")
    # the commit of the code that wrote this record (its last stretch)
    git_commit: str | None = _in("core", "text", "summary")
    commits: list = ABSENT  # every commit the run ran on, in order: a resumed run's earlier stretches' too
    torch_version: str = ABSENT
    # what was read (lra/data/provenance.py) and how shared the machine was (lra.devices.LoadMeter)
    data: dict | None = ABSENT
    split_sizes: dict = ABSENT
    machine: dict | None = ABSENT
    # what else the record holds: fields the run's callbacks add (``record_fields``), a newer record's own
    extra: dict = field(default_factory=dict)

    @classmethod
    def fields_in(cls, group: str) -> tuple[str, ...]:
        """The names of the fields in ``group`` (a key of :data:`GROUPS`), in the record's order."""
        _known((group,))
        return tuple(f.name for f in dataclasses.fields(cls) if group in f.metadata.get("groups", ()))

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
CORE = Record.fields_in("core")
REQUIRED = (*CORE, *Record.fields_in("protocol"))  # what write_record refuses a record without


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
