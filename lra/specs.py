"""The typed run spec: what one run is, frozen and checked (:class:`RunSpec` and its parts: attention, model,
training protocol, data, hardware, debug). :func:`lra.config.resolve` builds it from a composed config once;
every consumer takes it (the memory fit, the LightningModule, the loop, the record). A bad value raises
:class:`ConfigError` when it is built: one line naming the key, the value and what is allowed (lra/checks.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attention
from lra.checks import SEED_MAX, ConfigError, place
from lra.checks import check as _check
from lra.checks import choice as _choice
from lra.checks import integer as _int
from lra.checks import number as _num
from lra.compose import SEMANTICS
from lra.devices import GIB
from lra.execution import EXECUTIONS
from lra.tasks import TaskSpec, task_spec

RESUME_KEY_VERSION = 2  # 2: typed run spec, data fingerprint, precision and devices in the key
NAME = re.compile(r"[A-Za-z0-9_.+-](?:[A-Za-z0-9 _.+-]{0,38}[A-Za-z0-9_.+-])?")  # name=: a table row's label
LABEL = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,63}")  # attn.label: a folder level, never a path (no / nor ..)


PRECISIONS = ("auto", "32-true", "16-mixed", "bf16-mixed", "64-true")


def resolve_precision(setting: str, cuda: bool) -> str:
    """``auto`` is fp16 mixed precision on a GPU (as in the papers) and fp32 elsewhere; the attention
    kernel itself is always fp32 (lra/model.py). ``cuda`` says whether the device is a GPU: the one
    trained on (the Trainer) or the one planned for (a ``hardware=`` profile with a memory budget).
    On a CPU, ``16-mixed`` is what Lightning runs there: bf16 autocast, so the spec (and the record)
    says ``bf16-mixed``."""
    if setting == "auto":
        return "16-mixed" if cuda else "32-true"
    return "bf16-mixed" if setting == "16-mixed" and not cuda else setting


@dataclass(frozen=True)
class AttnSpec:
    name: str  # registered backend
    label: str = ""  # folder/table name (a variant such as softmax_nodrop); the name when empty
    options: dict = field(default_factory=dict)  # every option of the backend, as it will be built
    preset_options: dict = field(default_factory=dict)  # what the preset set (the command line not overriding)
    checkpointing: bool = False  # recompute attention in backward (the papers' softmax baseline)

    def __post_init__(self):
        object.__setattr__(self, "label", self.label or self.name)
        _check(
            isinstance(self.label, str) and LABEL.fullmatch(self.label) is not None,
            "attn.label",
            self.label,
            "1-64 letters, digits and -_.+, not starting with a dot (it names the run's folder)",
        )
        try:  # fills in the defaults and checks every value against the backend's Options
            opts = attention.make_options(self.name, **self.options)
        except (attention.InvalidOption, ValueError) as e:
            raise ConfigError(f"attn.options: {e}") from None
        object.__setattr__(self, "options", dataclasses.asdict(opts))


@dataclass(frozen=True)
class ModelSpec:
    """The papers' classifier (docs/facts.md §2) for one task."""

    vocab_size: int
    seq_len: int
    num_classes: int
    attn: AttnSpec
    dual: bool = False
    dim: int = 64
    hidden: int = 128
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 32
    dropout: float = 0.1
    head_hidden: int = 128
    pooling: str = "mean"
    interaction: str = "nli"

    def __post_init__(self):
        for k in ("dim", "hidden", "num_layers", "num_heads", "head_dim", "head_hidden"):
            _int(f"model.{k}", getattr(self, k), 1)
        for k in ("vocab_size", "seq_len", "num_classes"):
            _int(f"task.{k}", getattr(self, k), 1)
        _num("model.dropout", self.dropout, 0.0, hi=1.0, open_hi=True)
        _choice("model.pooling", self.pooling, ("mean", "padded_mean"))
        _choice("model.interaction", self.interaction, ("nli", "concat"))

    def kwargs(self) -> dict:
        """Keyword arguments of ``lra.model.LRAClassifier``."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "attn"}
        return {**d, "attn_name": self.attn.name, "attn_options": dict(self.attn.options)}


@dataclass(frozen=True)
class TrainSpec:
    """The training protocol of the preset for the task (conf/protocol/<preset>/<task>.yaml, docs/protocol.md)."""

    batch_size: int = 32  # effective batch: micro-batch x accumulation x devices
    lr: float = 1e-3
    warmup: int = 0
    max_steps: int = 100
    eval_every: int = 50  # optimizer steps between full validations
    patience: int | None = None  # evaluations without val-loss improvement; None: no early stopping
    select_after: float = 0.0  # the best-val checkpoint only after this fraction of max_steps
    test_ckpt: str = "best"  # best-val checkpoint or the model at stop
    schedule: str = "linear"  # linear warmup/decay | onecycle (the papers' code)
    grad_clip_value: float | None = None
    eval_batch_size: int | None = None  # None: the micro-batch
    weight_decay: float = 0.0
    eps: float = 1e-6
    ckpt_every_steps: int | None = None  # extra resume checkpoints (always at every evaluation)
    stuck_after_steps: int | None = None
    stuck_loss_tol: float = 0.02
    stuck_acc_tol: float = 0.01
    monitor: str = "val/acc"  # what the best checkpoint maximises (acc) or minimises (loss)
    compile: Any = "auto"  # torch.compile the classifier: auto (on CUDA) | True | False
    chunks: int = 1  # the public code's accumulation chunks: micro-batch <= batch_size / chunks (lra/fit.py)

    def __post_init__(self):
        _int("train.batch_size", self.batch_size, 1)
        _int("train.chunks", self.chunks, 1)
        _check(
            self.batch_size % self.chunks == 0,
            "train.chunks",
            self.chunks,
            f"a divisor of train.batch_size={self.batch_size}",
        )
        _num("train.lr", self.lr, 0.0)
        _int("train.warmup", self.warmup, 0)
        _int("train.max_steps", self.max_steps, 1)
        _int("train.eval_every", self.eval_every, 1)
        _int("train.patience", self.patience, 1, optional=True)
        _num("train.select_after", self.select_after, 0.0)  # >= 1: never (the model at stop is tested)
        _choice("train.test_ckpt", self.test_ckpt, ("best", "last"))
        _choice("train.schedule", self.schedule, ("linear", "onecycle"))
        if self.schedule == "onecycle" and not 2 <= self.warmup < self.max_steps:  # OneCycleLR divides by warmup - 1
            raise ConfigError(
                f"train.warmup={self.warmup} must lie in [2, train.max_steps={self.max_steps}) for the "
                f"onecycle schedule (pct_start = warmup / max_steps); change train.warmup or "
                f"train.max_steps"
            )
        _num("train.grad_clip_value", self.grad_clip_value, 0.0, open_lo=True, optional=True)
        _int("train.eval_batch_size", self.eval_batch_size, 1, optional=True)
        _num("train.weight_decay", self.weight_decay, 0.0)
        _num("train.eps", self.eps, 0.0, open_lo=True)
        _int("train.ckpt_every_steps", self.ckpt_every_steps, 1, optional=True)
        _int("train.stuck_after_steps", self.stuck_after_steps, 1, optional=True)
        _num("train.stuck_loss_tol", self.stuck_loss_tol, 0.0)
        _num("train.stuck_acc_tol", self.stuck_acc_tol, 0.0)
        _choice("trainer.monitor", self.monitor, ("val/acc", "val/loss"))
        _choice("train.compile", self.compile, ("auto", True, False))


@dataclass(frozen=True)
class DataSpec:
    """The task's data: which reader, the data root, and the task node typed (lra/tasks.py)."""

    task: str
    root: Path  # the data root ($LRA_DATA or data_root)
    spec: TaskSpec  # the task node, typed and checked: what the reader takes (lra.data.load_task)
    node: dict | None = None  # the task node as composed, verbatim; None: the spec's fields (a spec built in code)

    @classmethod
    def of(cls, node: dict, root: Path) -> "DataSpec":
        """The spec of a resolved task node (conf/task/<task>.yaml with the preset's data keys)."""
        spec = task_spec(node)
        return cls(task=spec.name, root=root, spec=spec, node=node)

    def __post_init__(self):
        _check(self.task == self.spec.name, "task", self.task, f"{self.spec.name!r}, the task of its spec")
        if self.node is None:
            object.__setattr__(self, "node", dataclasses.asdict(self.spec))
        path = self.spec.path
        if path is not None:  # a name the system cannot take: one line, not "OSError: File name too long"
            place("task.path", Path(str(path)).expanduser(), "point it at the data, or unset it", folder=None)
        _check(
            path is None or Path(str(path)).expanduser().exists(),
            "task.path",
            path,
            "an existing file or folder (or null to search the data root)",
        )

    @property
    def options(self) -> dict:
        """The task node as composed: what the resume key and the loaded-data key hash (unchanged by typing)."""
        return self.node


@dataclass(frozen=True)
class HardwareSpec:
    """The memory budget the micro-batch is fitted to, and how the Trainer runs."""

    name: str = "cpu"
    total_bytes: int | None = None  # device memory of the profile; None: no budget (whole batch per step)
    cuda_context_gib: float = 0.0
    allocator_margin: float = 0.0
    micro_batch: int | None = None  # forced micro-batch
    accelerator: str = "auto"
    devices: int = 1  # how many the effective batch is split over
    devices_arg: Any = 1  # ``trainer.devices`` as given, for the Trainer
    strategy: str = "auto"
    precision: str = "32-true"  # resolved for the device trained on
    precision_setting: str = "auto"
    num_workers: int = 0  # resolved: trainer.num_workers=auto is min(4, cores - 1) on CUDA, 0 on a CPU
    pin_memory: bool = False  # on CUDA: page-locked batches, copied without blocking
    compile: bool = False  # resolved train.compile (and what the backend declares it can)
    compile_note: str | None = None  # why a requested compile runs eager
    compile_forced: bool = False  # train.compile=true: a failed compilation stops the run (auto: runs eager)
    deterministic: bool = False

    def __post_init__(self):
        _int("hardware.micro_batch", self.micro_batch, 1, optional=True)
        _int("trainer.num_workers", self.num_workers, 0)
        _choice("trainer.precision", self.precision_setting, PRECISIONS)
        _choice("trainer.accelerator", self.accelerator, ("auto", "cpu", "cuda", "gpu", "mps"))
        _num("hardware.cuda_context_gib", self.cuda_context_gib, 0.0)
        _num("hardware.allocator_margin", self.allocator_margin, 0.0)

    @property
    def budget_bytes(self) -> int | None:
        """Largest estimated peak that fits: (total - CUDA context) / (1 + allocator margin)."""
        if self.total_bytes is None:
            return None
        return int((self.total_bytes - self.cuda_context_gib * GIB) / (1.0 + self.allocator_margin))

    @property
    def planned_precision(self) -> str:
        """The precision the fitted run trains in: a profile with a budget is a GPU."""
        return resolve_precision(self.precision_setting, self.total_bytes is not None)


DEBUG_PROFILERS = ("simple", "advanced", "pytorch")  # Lightning's profilers by name (debug.profiler)
DEBUG_NAME = re.compile(r"[a-z0-9_]{1,40}")


@dataclass(frozen=True)
class DebugSpec:
    """``debug=<name>`` (conf/debug/): a short check of the pipeline, never a result. It runs in
    ``<runs root>/debug/<name>/...`` (the group's ``hydra.run.dir``), every time (``force``), and its
    record says ``debug: <name>``, which the collector skips. The steps, evaluation interval and logging
    are the group's ``train.*`` and ``trainer.*`` keys; what the Trainer needs beyond them is here."""

    name: str
    limit_batches: int | None = None  # validation and test batches per evaluation; None: all of them
    overfit_batches: int = 0  # train on the first N effective batches of the training split, every step; 0: off
    profiler: str | None = None  # simple | advanced | pytorch: its report in the run folder; None: none
    cpu_batch: int | None = None  # the effective batch at most, on a CPU (a check in seconds); None: the preset's

    def __post_init__(self):
        _check(
            isinstance(self.name, str) and DEBUG_NAME.fullmatch(self.name) is not None,
            "debug.name",
            self.name,
            "1-40 lowercase letters, digits and _ (the folder <runs root>/debug/<name>)",
        )
        _int("debug.limit_batches", self.limit_batches, 1, optional=True)
        _int("debug.overfit_batches", self.overfit_batches, 0)
        _int("debug.cpu_batch", self.cpu_batch, 1, optional=True)
        _check(
            self.profiler is None or self.profiler in DEBUG_PROFILERS,
            "debug.profiler",
            self.profiler,
            f"one of {', '.join(DEBUG_PROFILERS)} or null",
        )

    @property
    def profile_files(self) -> tuple[str, ...]:
        """The profiler's reports in the run folder (Lightning names them by stage); () without a profiler."""
        return ("fit-profile.txt", "test-profile.txt") if self.profiler else ()


@dataclass(frozen=True)
class RunSpec:
    preset: str
    seed: int
    model: ModelSpec
    train: TrainSpec
    data: DataSpec
    hardware: HardwareSpec
    logger: dict = field(default_factory=lambda: {"csv": {}})  # name -> {_target_, args} (conf/logger/); {}: none
    run_dir: Path | None = None
    force: bool = False
    num_threads: int | None = None
    progress: bool | str = "auto"  # trainer.progress: true (a bar), false (nothing), auto (PROGRESS)
    log_every_n_steps: int | None = None  # None: scaled to the run (log_every)
    callbacks: dict = field(default_factory=dict)  # callbacks.<name>: {_target_, args}: the user's (conf/callbacks/)
    fit_cache_dir: Path | None = None  # None: decisions are not cached
    config: dict = field(default_factory=dict)  # the resolved config (with the options that run), for the record
    semantics: str = (
        "clean"  # clean: quirks=none, the harness's corrections | paper: a public code's (docs/fidelity.md)
    )
    quirks: dict = field(default_factory=dict)  # the public code's quirks this run has on: {"model.pooling": ..}
    name: str | None = None  # name=: the display name in tables; a label, not in the folder or resume key
    debug: DebugSpec | None = None  # debug=<name>: a short check in its own folder, never in a table
    execution: str = "paper"  # what runs: paper (the preset's memory plan) | fast (docs/protocol.md)
    execution_note: str | None = None  # why this run executes otherwise than execution= asked
    other: RunSpec | None = field(default=None, repr=False, compare=False)  # a fast run's paper execution

    def __post_init__(self):
        _choice("semantics", self.semantics, SEMANTICS)
        _choice("execution", self.execution, EXECUTIONS)
        _check(
            self.name is None or (isinstance(self.name, str) and NAME.fullmatch(self.name) is not None),
            "name",
            self.name,
            "1-40 letters, digits, spaces and -_.+, not starting or ending with a space, "
            "or null (quote a number: name=\"'2'\")",
        )
        _int("seed", self.seed, 0, hi=SEED_MAX)
        _int("num_threads", self.num_threads, 1, optional=True)
        _int("trainer.log_every_n_steps", self.log_every_n_steps, 1, optional=True)
        _check(
            self.progress is True or self.progress is False or self.progress == "auto",
            "trainer.progress",
            self.progress,
            "true, false or auto (auto: a bar on a terminal, plain log lines otherwise)",
        )
        _check(
            isinstance(self.logger, dict)
            and all(not n or isinstance(n, dict) and isinstance(n.get("_target_"), str) for n in self.logger.values()),
            "logger",
            self.logger,
            "nodes <name>: {_target_: <module>.<Class>, ...arguments} of Lightning loggers (conf/logger/), or a "
            "list of them: logger=[wandb,tensorboard]",
        )  # their classes are checked by lra.loggers.check_loggers (the layer that knows Lightning)
        per_device, rest = divmod(self.train.batch_size, self.hardware.devices)
        _check(
            rest == 0,
            "train.batch_size",
            self.train.batch_size,
            f"a multiple of the {self.hardware.devices} devices (trainer.devices)",
        )
        m = self.hardware.micro_batch
        _check(
            m is None or per_device % m == 0,
            "hardware.micro_batch",
            m,
            f"a divisor of the per-device batch {per_device} (train.batch_size={self.train.batch_size} over "
            f"{self.hardware.devices} devices)",
        )

    @property
    def task(self) -> str:
        return self.data.task

    @property
    def attn(self) -> AttnSpec:
        return self.model.attn

    @property
    def where(self) -> str:
        return f"{self.task}/{self.attn.label}"

    @property
    def log_every(self) -> int:
        """Optimizer steps between the training rows every logger gets: ``trainer.log_every_n_steps`` when
        set, else a tenth of the run, at most 50 (a 40-step run logs every 4 steps, a long one every 50)."""
        if self.log_every_n_steps is not None:
            return self.log_every_n_steps
        return min(50, max(1, self.train.max_steps // 10))

    def resume_key(self, micro_batch: int, accum_steps: int, data_fingerprint: str) -> str:
        """What must be equal for a checkpoint to continue this run (not: worker count, checkpoint
        interval, logger, progress bar, the display name; the data by the fingerprint of its arrays)."""
        train = dataclasses.asdict(self.train)
        train.pop("ckpt_every_steps")
        train.pop("compile")  # compiled or eager, the same weights continue
        train.pop("chunks")  # what it changes is the micro-batch, in the key
        # how the data was obtained (generated, downloaded) is not what it is: the fingerprint says that
        task = {k: v for k, v in self.data.options.items() if k not in ("generate", "download")}
        key = {
            "version": RESUME_KEY_VERSION,
            "train": train,
            "model": self.model.kwargs(),
            "checkpointing": self.attn.checkpointing,
            "task": task,
            "data": data_fingerprint,
            "seed": self.seed,
            "micro_batch": micro_batch,
            "accum_steps": accum_steps,
            "devices": self.hardware.devices,
            "precision": self.hardware.precision,
            # a fast checkpoint never continues as paper, even without its record; paper keys stay as they were
            **({"execution": "fast"} if self.execution == "fast" else {}),
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
