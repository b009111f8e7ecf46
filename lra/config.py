"""A run's configuration: compose ``conf/`` with Hydra, then resolve it ONCE into a frozen, typed
:class:`RunSpec` that every consumer takes (the memory fit, the LightningModule, the loop, the record).

    spec = resolve(compose(["task=listops", "attn=skeinformer", "experiment=quick"]))
    spec.model.attn.options     # every option of the backend, preset and command line applied
    spec.train.max_steps        # the preset's protocol for this task
    spec.resume_key(...)        # what must match for a checkpoint to continue this run

Resolving is also where every user value is checked, before any work starts: a bad value raises
:class:`ConfigError` whose message is one line naming the key, the value and what is allowed.

Attention options are structured configs: for every registered backend a config node ``attn/<name>``
is generated from its ``Options`` dataclass (:func:`register_attention_configs`), so
``attn.options.<option>=<value>`` works without ``+`` for every backend and is type-checked when the
config is composed. Every option there starts unset (``???``); the value that runs is, lowest first:
the backend's default < ``attn.base_options`` (a named variant such as ``conf/attn/softmax_nodrop.yaml``)
< the preset's ``attn_options.<backend>`` < ``attn_options.<label>`` < ``protocol.<task>.attn_options.
<backend|label>`` < ``attn.options.<option>`` set on the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

import attention
from lra import CONF_DIR, REPO_ROOT
from lra.data.base import data_root

RESUME_KEY_VERSION = 2  # 2: typed run spec, data fingerprint, precision and devices in the key


class ConfigError(ValueError):
    """A user value that cannot run; the message is one line: key, value, what is allowed."""


# ---------------------------------------------------------------------------------------------
# Resolvers and composition


def _folder_name(text: str) -> str:
    """``text`` as one folder name: unsafe characters replaced, and then (or when long) a hash of the
    exact text added, so two different texts never give one name."""
    name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)
    if name != text or len(name) > 200:  # a file name holds 255 bytes
        name = name[:190] + "-" + hashlib.sha1(text.encode()).hexdigest()[:9]
    return name


def _tag(run_tag: str | None = None, override_dirname: str = "") -> str:
    """The run folder's last level: ``run_tag`` (the canonical one, set by ``lra.train`` and the sweep:
    :func:`run_tag`); without it (a bare Hydra ``-m``) the override text, as Hydra spells it."""
    text = run_tag if run_tag is not None else override_dirname
    return "/" + _folder_name(str(text)) if text else ""


SEMANTICS = ("clean", "paper")
SEED_MAX = 2 ** 32 - 1  # what numpy and Lightning's seed_everything accept


def _quirk(path: str, clean, *, _root_):
    """``${lra.quirk:<path>,<clean value>}``: under ``semantics=paper`` the preset's ``quirks.<path>``
    (the public code's behaviour) where it has one; else the clean value. A command-line value for the
    key itself replaces the interpolation, so it wins over both."""
    if _root_.get("semantics") != "paper":
        return clean
    return OmegaConf.select(_root_, f"quirks.{path}", default=clean)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("lra.repo", lambda: str(REPO_ROOT), replace=True)
    OmegaConf.register_new_resolver("lra.quirk", _quirk, replace=True)
    OmegaConf.register_new_resolver("lra.tag", _tag, replace=True)
    OmegaConf.register_new_resolver("lra.attr", lambda target: str(target).partition(":")[2] or str(target),
                                    replace=True)


def _config_type(tp):
    """The OmegaConf-typable form of an ``Options`` field type (``int | None`` -> ``Optional[int]``)."""
    args = typing.get_args(tp)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return Optional[rest[0]] if len(rest) == 1 and rest[0] in (int, float, str, bool) else Any
    return tp if tp in (int, float, str, bool) else Any


def attention_node(name: str) -> type:
    """The structured config ``attn/<name>``: name, label, a variant's base options, and one typed,
    initially unset field per option of the backend (unknown options are rejected at composition)."""
    opts_cls = attention.options_class(name)
    hints = typing.get_type_hints(opts_cls)
    options = dataclasses.make_dataclass(
        f"{name}_options", [(f.name, _config_type(hints[f.name]), field(default=MISSING))
                            for f in dataclasses.fields(opts_cls)])
    return dataclasses.make_dataclass(f"attn_{name}", [
        ("name", str, field(default=name)),
        ("label", str, field(default=name)),  # the run folder and table name (a variant sets its own)
        ("base_options", Dict[str, Any], field(default_factory=dict)),
        ("options", options, field(default_factory=options)),
    ])


@dataclass
class ExternalAttention:
    """``attn=external attn.target=package.module:ClassName``: a backend from the user's own package,
    imported when the config is resolved; its options (``+attn.options.k=64``: the ``+`` because the
    node cannot know them before the import) are checked against its Options dataclass there. Registered through an entry point or
    $LRA_ATTENTION_MODULES instead, a backend gets its own typed node: ``attn=<name>``."""

    name: str = "external"
    target: str = MISSING
    label: str = "${lra.attr:${.target}}"  # the run folder and table name: the class name by default
    base_options: Dict[str, Any] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)


def register_attention_configs() -> None:
    store = ConfigStore.instance()
    for name in attention.available():
        store.store(group="attn", name=name, node=attention_node(name))
    store.store(group="attn", name="external", node=ExternalAttention)


def attn_configs() -> list[str]:
    """Every name ``attn=`` accepts: the registered backends and the variants in conf/attn/."""
    return sorted(set(attention.available()) | {p.stem for p in (CONF_DIR / "attn").glob("*.yaml")})


register_resolvers()
register_attention_configs()


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The config ``python -m lra.train <overrides>`` sees, for tools that do not train and for tests."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def compose_checked(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """:func:`compose`, with Hydra's and OmegaConf's composition errors turned into one-line
    :class:`ConfigError` s (an unknown attention option lists the backend's valid ones)."""
    try:
        return compose(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_composition_error(e, list(overrides))) from None


def _composition_error(e: Exception, overrides: list[str]) -> str:
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    what = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if key and key.startswith("attn.options."):
        name = compose([o for o in overrides if key not in o]).attn.name  # the backend, without the bad override
        valid = ", ".join(f.name for f in dataclasses.fields(attention.options_class(name))) or "(none)"
        return f"{key}: {what}; attention {name!r} has the options {valid} (attention.describe({name!r}))"
    if key:
        return f"{key}: {what}"
    text = str(e).split("Config search path")[0]  # Hydra's message (e.g. a group's available choices)
    return " ".join(text.split())


def load(overrides: list[str] | tuple[str, ...] = (), run_dir: str | Path | None = None) -> "RunSpec":
    """The run spec of ``overrides``: composed, resolved and checked (raises :class:`ConfigError`)."""
    return resolve(compose_checked(overrides), run_dir)


# ---------------------------------------------------------------------------------------------
# The run folder: named by the resolved configuration, not by how the command line spelled it

# Overrides that name a level of the run folder (runs/<preset>/<semantics>/<task>/<attn>/seed<s>), or
# pick where things live: the configuration they give is the base the tag is measured against.
FOLDER_KEYS = ("experiment", "semantics", "quirks", "task", "attn", "attn.target", "seed", "runs_root",
               "data_root")
# Resolved keys that never enter the tag: folder levels, tables whose effect shows in the keys they feed
# (protocol.* -> train.*, task.*; attn_options -> attn.options), and settings that change how a run
# is executed or logged but not what it computes (the resume key and record still hold them).
UNTAGGED = ("preset", "semantics", "seed", "task.name", "attn.name", "attn.label", "attn.target",
            "attn.base_options", "protocol", "attn_options", "quirks", "runs_root", "data_root", "run_tag",
            "force", "num_threads", "fit", "hardware", "logger", "trainer.progress", "trainer.num_workers",
            "trainer.log_every_n_steps", "train.compile", "train.ckpt_every_steps")


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and node:
        out: dict = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _untagged(key: str) -> bool:
    return any(key == u or key.startswith(u + ".") for u in UNTAGGED)


def _canonical(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=64)  # a sweep names many runs of a few bases
def _base_config(named: tuple[str, ...]) -> dict:
    """The flat resolved config of the folder-naming overrides alone."""
    cfg = compose_checked(list(named))
    try:
        return _flat(resolve(cfg).config)
    except ConfigError:  # the base alone need not be a valid run (the overrides may repair it)
        return _flat(_container(cfg))


def run_tag(overrides: list[str] | tuple[str, ...], spec: "RunSpec | None" = None) -> str:
    """The run folder's last level for ``overrides``: every resolved value that differs from the
    configuration of the folder-naming overrides alone (:data:`FOLDER_KEYS`), as sorted ``key=value``
    with canonical values (``train.lr=1e-3`` and ``train.lr=0.001`` are one folder, and no folder
    when the preset's lr is 1e-3). Empty for the preset's own configuration.

    Example::

        run_tag(["experiment=quick", "train.lr=0.002", "train.max_steps=120"])
        # 'train.lr=0.002,train.max_steps=120'
    """
    spec = spec or load(overrides)
    new, old = _flat(spec.config), _base_config(tuple(o for o in overrides if _override_key(o) in FOLDER_KEYS))
    keys = sorted(k for k in set(new) | set(old) if not _untagged(k) and new.get(k, ...) != old.get(k, ...))
    return _folder_name(",".join(f"{k}={_canonical(new.get(k))}" for k in keys))


def run_folder(spec: "RunSpec", tag: str) -> Path:
    """Where ``python -m lra.train`` writes: ``<runs_root>/<preset>/<semantics>/<task>/<attn>/seed<s>[/<tag>]``
    (the same template as ``hydra.run.dir`` in conf/config.yaml, with ``run_tag=<tag>``)."""
    return Path(spec.config["runs_root"]) / spec.preset / spec.semantics / spec.where / f"seed{spec.seed}{_tag(tag)}"


# ---------------------------------------------------------------------------------------------
# Checks: one line naming the key, the value and what is allowed


def _check(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _int(key: str, value, lo: int | None = None, optional: bool = False, hi: int | None = None) -> None:
    if optional and value is None:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = is_int and (lo is None or value >= lo) and (hi is None or value <= hi)
    span = f" in [{lo}, {hi}]" if hi is not None else ("" if lo is None else f" >= {lo}")
    _check(ok, key, value, f"an integer{span}{' or null' if optional else ''}")


def _num(key: str, value, lo: float, *, open_lo: bool = False, hi: float | None = None, open_hi: bool = False,
         optional: bool = False) -> None:
    if optional and value is None:
        return
    # NaN passes no comparison and so every range: refuse it (and infinity) before comparing
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if open_lo else value >= lo) and (hi is None or (value < hi if open_hi else value <= hi))
    span = (f"{'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}" if hi is not None
            else f"{'>' if open_lo else '>='} {lo}")
    _check(ok, key, value, f"a finite number {'in ' if hi is not None else ''}{span}{' or null' if optional else ''}")


def _choice(key: str, value, choices) -> None:
    _check(value in choices, key, value, f"one of {', '.join(map(str, choices))}")


def _flag(key: str, value) -> bool:
    """A true/false setting: ``force=no`` is a string, and ``bool("no")`` would be True (a finished
    run retrained, its checkpoints deleted), so anything but a boolean is refused."""
    _check(isinstance(value, bool), key, value, "true or false")
    return value


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


# ---------------------------------------------------------------------------------------------
# The spec


@dataclass(frozen=True)
class AttnSpec:
    name: str  # registered backend
    label: str = ""  # folder/table name (a variant such as softmax_nodrop); the name when empty
    options: dict = field(default_factory=dict)  # every option of the backend, as it will be built
    preset_options: dict = field(default_factory=dict)  # what the preset set (the command line not overriding)
    checkpointing: bool = False  # recompute attention in backward (the papers' softmax baseline)

    def __post_init__(self):
        object.__setattr__(self, "label", self.label or self.name)
        try:  # fills in the defaults and checks every value against the backend's Options
            opts = attention.make_options(self.name, **self.options)
        except (attention.InvalidOption, ValueError) as e:
            raise ConfigError(f"attn.options: {e}") from None
        object.__setattr__(self, "options", dataclasses.asdict(opts))


@dataclass(frozen=True)
class ModelSpec:
    """The papers' classifier (LRA_FACTS §2) for one task."""

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
    """The training protocol of the preset for the task (conf/experiment/*.yaml, docs/protocol.md)."""

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

    def __post_init__(self):
        _int("train.batch_size", self.batch_size, 1)
        _num("train.lr", self.lr, 0.0)
        _int("train.warmup", self.warmup, 0)
        _int("train.max_steps", self.max_steps, 1)
        _int("train.eval_every", self.eval_every, 1)
        _int("train.patience", self.patience, 1, optional=True)
        _num("train.select_after", self.select_after, 0.0)  # >= 1: never (the model at stop is tested)
        _choice("train.test_ckpt", self.test_ckpt, ("best", "last"))
        _choice("train.schedule", self.schedule, ("linear", "onecycle"))
        if self.schedule == "onecycle" and not 2 <= self.warmup < self.max_steps:  # OneCycleLR divides by warmup - 1
            raise ConfigError(f"train.warmup={self.warmup} must lie in [2, train.max_steps={self.max_steps}) for the "
                              f"onecycle schedule (pct_start = warmup / max_steps); change train.warmup or "
                              f"train.max_steps")
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
    task: str
    root: Path  # the data root ($LRA_DATA or data_root)
    options: dict  # the task node (conf/task/<task>.yaml with the preset's data keys), for the reader

    def __post_init__(self):
        path = self.options.get("path")
        _check(path is None or Path(str(path)).expanduser().exists(), "task.path", path,
               "an existing file or folder (or null to search the data root)")
        if "tokenizer" in self.options:  # ListOps (lra/data/listops.py)
            _choice("task.tokenizer", self.options["tokenizer"], ("brackets", "alnum"))
        if "mask" in self.options:  # pixel tasks: every pixel real, or pixel 0 as padding (the public code)
            _choice("task.mask", self.options["mask"], ("all", "nonzero"))
        for k in ("generate", "download", "dual"):
            if k in self.options:
                _flag(f"task.{k}", self.options[k])
        for k in ("max_length", "n_images"):
            if k in self.options:
                _int(f"task.{k}", self.options[k], 1, optional=True)
        for k, v in (self.options.get("generator") or {}).items():  # ListOps: counts, lengths, depth, seed
            _int(f"task.generator.{k}", v, 0 if k == "seed" else 1, hi=SEED_MAX if k == "seed" else None)


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
        return int((self.total_bytes - self.cuda_context_gib * 2 ** 30) / (1.0 + self.allocator_margin))

    @property
    def planned_precision(self) -> str:
        """The precision the fitted run trains in: a profile with a budget is a GPU."""
        return resolve_precision(self.precision_setting, self.total_bytes is not None)


@dataclass(frozen=True)
class RunSpec:
    preset: str
    seed: int
    model: ModelSpec
    train: TrainSpec
    data: DataSpec
    hardware: HardwareSpec
    logger: dict = field(default_factory=lambda: {"csv": {}})  # logger name -> its node (conf/logger/)
    run_dir: Path | None = None
    force: bool = False
    num_threads: int | None = None
    progress: bool = True
    log_every_n_steps: int = 50
    search: dict | None = None  # a trial of an Optuna search: storage, study, trial (lra/search.py)
    fit_cache_dir: Path | None = None  # None: decisions are not cached
    config: dict = field(default_factory=dict)  # the resolved config (with the options that run), for the record
    semantics: str = "clean"  # clean: the harness's corrections | paper: the preset's public code (docs/fidelity.md)
    quirks: dict = field(default_factory=dict)  # the public code's quirks this run has on: {"model.pooling": ..}

    def __post_init__(self):
        _choice("semantics", self.semantics, SEMANTICS)
        _int("seed", self.seed, 0, hi=SEED_MAX)
        _int("num_threads", self.num_threads, 1, optional=True)
        _int("trainer.log_every_n_steps", self.log_every_n_steps, 1)
        _check(set(self.logger) <= {"csv", "wandb", "tensorboard"}, "logger", list(self.logger),
               "csv, wandb, tensorboard, or a list of them: logger=[wandb,tensorboard]")
        per_device, rest = divmod(self.train.batch_size, self.hardware.devices)
        _check(rest == 0, "train.batch_size", self.train.batch_size,
               f"a multiple of the {self.hardware.devices} devices (trainer.devices)")
        m = self.hardware.micro_batch
        _check(m is None or per_device % m == 0, "hardware.micro_batch", m,
               f"a divisor of the per-device batch {per_device} (train.batch_size={self.train.batch_size} over "
               f"{self.hardware.devices} devices)")

    @property
    def task(self) -> str:
        return self.data.task

    @property
    def attn(self) -> AttnSpec:
        return self.model.attn

    @property
    def where(self) -> str:
        return f"{self.task}/{self.attn.label}"

    def resume_key(self, micro_batch: int, accum_steps: int, data_fingerprint: str) -> str:
        """What must be equal for a checkpoint to continue this run (not: worker count, checkpoint
        interval, logger, progress bar; the data by the fingerprint of its arrays)."""
        train = dataclasses.asdict(self.train)
        train.pop("ckpt_every_steps")
        train.pop("compile")  # compiled or eager, the same weights continue
        # how the data was obtained (generated, downloaded) is not what it is: the fingerprint says that
        task = {k: v for k, v in self.data.options.items() if k not in ("generate", "download")}
        key = {"version": RESUME_KEY_VERSION, "train": train, "model": self.model.kwargs(),
               "checkpointing": self.attn.checkpointing, "task": task, "data": data_fingerprint,
               "seed": self.seed, "micro_batch": micro_batch, "accum_steps": accum_steps,
               "devices": self.hardware.devices, "precision": self.hardware.precision}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Resolve: composed config -> RunSpec


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def attention_options(cfg: DictConfig) -> tuple[dict, dict]:
    """(options that run, options the preset set), by the precedence in the module docstring; under
    ``semantics=paper`` the preset's ``quirks.attn_options`` come after its other tables."""
    name, label = str(cfg.attn.name), str(cfg.attn.label)
    preset: dict = {}
    task_table = OmegaConf.select(cfg, f"protocol.{cfg.task.name}.attn_options", default=None) or {}
    quirk_table = (OmegaConf.select(cfg, "quirks.attn_options", default=None) or {}) \
        if cfg.get("semantics") == "paper" else {}
    for table in (cfg.get("attn_options") or {}, task_table, quirk_table):
        for key in dict.fromkeys([name, label]):
            if table.get(key) is not None:
                preset.update(_container(table[key]))
    options = cfg.attn.options
    command_line = {k: options[k] for k in options if not OmegaConf.is_missing(options, k)}
    merged = {**_container(cfg.attn.get("base_options") or {}), **preset, **_container(command_line)}
    return merged, {k: v for k, v in preset.items() if k not in command_line}


def quirks_on(cfg: DictConfig, model: ModelSpec, task: dict) -> dict:
    """The preset's public-code quirks (``quirks``) this run has on, whatever turned them on (the
    semantics or a single option): ``{"model.pooling": "padded_mean", "task.tokenizer": "alnum",
    "attn.options.pilot_sampling": "with_replacement", ...}``; a quirk is on where the value that
    runs is the public code's. Each entry of a preset's table differs from the clean default
    (tests/test_fidelity.py), so a clean run lists none."""
    table = _container(cfg.get("quirks") or {})
    attn, on = model.attn, {}
    for k, v in (table.get("model") or {}).items():
        if getattr(model, k) == v:
            on[f"model.{k}"] = v
    for k, v in ((table.get("task") or {}).get(task["name"]) or {}).items():
        if task.get(k) == v:
            on[f"task.{k}"] = v
    for key in dict.fromkeys([attn.name, attn.label]):
        for k, v in ((table.get("attn_options") or {}).get(key) or {}).items():
            if attn.options.get(k) == v:
                on[f"attn.options.{k}"] = v
    return on


def _devices(d) -> int:
    """Devices the effective batch is split over (``trainer.devices``: int, list or "auto")."""
    if isinstance(d, str):
        if d.isdigit():
            return max(1, int(d))
        if d == "auto":
            return max(1, torch.cuda.device_count())
        return max(1, len([x for x in d.split(",") if x.strip()]))
    if isinstance(d, int):
        return max(1, d) if d != -1 else max(1, torch.cuda.device_count())
    return max(1, len(list(d)))


def _workers(setting, on_cuda: bool):
    if setting != "auto":
        return setting  # checked by HardwareSpec
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, cores - 1)) if on_cuda else 0  # the loader is ~10^4x faster than a step: a few suffice


def _compile(setting, on_cuda: bool, backend: str) -> tuple[bool, str | None]:
    wanted = setting is True or (setting == "auto" and on_cuda)
    if wanted and not attention.capabilities(backend).compiles:
        return False, f"attention {backend!r} declares it cannot be compiled (attention.capabilities): eager"
    return wanted, None


def _hardware(cfg: DictConfig) -> HardwareSpec:
    hw, tr = cfg.hardware, cfg.trainer
    total = hw.get("total_gib")
    if total is not None:
        _num("hardware.total_gib", total, 0.0, open_lo=True)
        total = int(float(total) * 2 ** 30)
    elif hw.get("name") == "auto" and torch.cuda.is_available():
        total = int(torch.cuda.get_device_properties(0).total_memory)
    accelerator = str(tr.accelerator)
    on_cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    setting = cfg.train.get("compile", "auto")
    compile_, note = _compile(setting, on_cuda, str(cfg.attn.name))
    return HardwareSpec(
        name=str(hw.name), total_bytes=total, cuda_context_gib=float(hw.get("cuda_context_gib") or 0.0),
        allocator_margin=float(hw.get("allocator_margin") or 0.0), micro_batch=hw.get("micro_batch"),
        accelerator=accelerator, devices=_devices(_container(tr.devices)), devices_arg=_container(tr.devices),
        strategy=str(tr.strategy), precision=resolve_precision(str(tr.precision), on_cuda),
        precision_setting=str(tr.precision), num_workers=_workers(tr.num_workers, on_cuda), pin_memory=on_cuda,
        compile=compile_, compile_note=note, compile_forced=setting is True,
        deterministic=_flag("trainer.deterministic", tr.deterministic))


def _external(cfg: DictConfig) -> None:
    """Import ``attn.target`` and put its registry name (and the label) in place of ``external``."""
    if OmegaConf.is_missing(cfg.attn, "target"):
        raise ConfigError("attn.target is missing: attn=external needs the backend's class, "
                          "attn.target=package.module:ClassName (README, 'Your own attention')")
    try:
        name = attention.load_external(str(cfg.attn.target))
    except attention.InvalidOption as e:
        raise ConfigError(str(e)) from None
    with open_dict(cfg):
        cfg.attn.name = name


def _build(cls, prefix: str, values: dict, **fixed):
    known = {f.name for f in dataclasses.fields(cls)} - set(fixed)
    unknown = sorted(set(values) - known)
    _check(not unknown, f"{prefix}.{unknown[0] if unknown else ''}", values.get(unknown[0]) if unknown else None,
           f"not a key of {prefix}; valid keys: {', '.join(sorted(known))}")
    return cls(**values, **fixed)


def resolve(cfg: DictConfig, run_dir: str | Path | None = None) -> RunSpec:
    """The typed spec of a composed config; raises :class:`ConfigError` (one line) on any bad value.

    ``run_dir``: where the run writes (``python -m lra.train`` passes Hydra's output folder); else
    ``cfg.run_dir`` where a caller set one.
    """
    run_dir = run_dir if run_dir is not None else cfg.get("run_dir")
    if cfg.attn.name == "external":
        _external(cfg)
    options, preset_options = attention_options(cfg)
    attn = AttnSpec(name=str(cfg.attn.name), label=str(cfg.attn.label), options=options,
                    preset_options=preset_options,
                    checkpointing=bool({str(cfg.attn.name), str(cfg.attn.label)} & set(cfg.get("attn_checkpointing") or [])))
    task = _container(cfg.task)
    model = _build(ModelSpec, "model", _container(cfg.model), vocab_size=task["vocab_size"], seq_len=task["seq_len"],
                   num_classes=task["num_classes"], dual=bool(task.get("dual", False)), attn=attn)
    train = _build(TrainSpec, "train", _container(cfg.train), monitor=str(cfg.trainer.monitor))
    config = _container(cfg)
    config["attn"] = {**config["attn"], "options": attn.options}
    fit = cfg.get("fit") or {}
    semantics = cfg.get("semantics", "clean")  # its value is checked by RunSpec
    if semantics == "paper" and not any((cfg.get("quirks") or {}).values()):
        raise ConfigError(f"semantics=paper: preset {cfg.preset!r} reproduces no public code (quirks=none); add "
                          f"quirks=skeinformer|skyformer|nystromformer (whose code), or use semantics=clean")
    return RunSpec(
        preset=str(cfg.preset), seed=cfg.seed, model=model, train=train,
        data=DataSpec(task=str(task["name"]), root=data_root(cfg.data_root), options=task),
        hardware=_hardware(cfg), logger=_container(cfg.get("logger") or {}),  # logger=[]: metrics.csv alone
        run_dir=Path(run_dir) if run_dir else None,
        force=_flag("force", cfg.force), num_threads=cfg.num_threads,
        progress=_flag("trainer.progress", cfg.trainer.progress),
        log_every_n_steps=cfg.trainer.log_every_n_steps, search=_container(cfg.get("search")),
        fit_cache_dir=Path(str(fit.cache_dir)) if _flag("fit.cache", fit.get("cache", True)) and fit.get("cache_dir")
        else None,
        config=config, semantics=str(semantics), quirks=quirks_on(cfg, model, task))
