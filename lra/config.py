"""A run's configuration: compose ``conf/`` with Hydra (lra/compose.py), then resolve it ONCE into the frozen,
typed :class:`RunSpec` (lra/specs.py) that every consumer takes (the memory fit, the module, the loop, the record).

    spec = resolve(compose(["task=listops", "attn=skeinformer", "preset=quick"]))
    spec.model.attn.options     # every option of the backend, preset and command line applied
    spec.train.max_steps        # the preset's protocol for this task
    spec.resume_key(...)        # what must match for a checkpoint to continue this run

Resolving is also where every user value is checked, before any work starts: a bad value raises
:class:`ConfigError` whose message is one line naming the key, the value and what is allowed.

Attention options are structured configs: for every registered backend a config node ``attn/<name>``
is generated from its ``Options`` dataclass (:func:`register_attention_configs`), so
``attn.options.<option>=<value>`` works without ``+`` for every backend and is type-checked when the
config is composed. Every option there starts unset (``???``); which value runs is decided by
:func:`attention_options`, whose docstring is the one place the precedence is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

import attention
from lra.checks import (  # re-exported: ``from lra.config import ConfigError``
    ConfigError,
    build,
    container,
)
from lra.checks import check as _check
from lra.checks import choice as _choice
from lra.checks import flag as _flag
from lra.checks import number as _num
from lra.compose import (  # noqa: F401  (re-exported: ``from lra.config import compose``)
    DEFAULT_PRESET,
    SEMANTICS,
    attn_configs,
    compose,
    compose_checked,
    renamed_overrides,
    without_hydra,
)
from lra.devices import GIB, device_count, loader_workers, trains_on_cuda
from lra.execution import EXECUTIONS, fast, fast_profile
from lra.files import data_root
from lra.quirks import code_quirks, paper_chunks, preset_code, quirks_on  # noqa: F401  (re-exported)
from lra.specs import (  # noqa: F401  (re-exported: the spec's types are what lra.config resolves to)
    LABEL,
    AttnSpec,
    DataSpec,
    DebugSpec,
    HardwareSpec,
    ModelSpec,
    RunSpec,
    TrainSpec,
    resolve_precision,
)


def load(overrides: list[str] | tuple[str, ...] = (), run_dir: str | Path | None = None) -> "RunSpec":
    """The run spec of ``overrides``: composed, resolved and checked, what ``python -m lra.train <overrides>``
    would train (nothing is read or written).

    Args:
        overrides: Hydra overrides, as on the command line (``["task=text", "attn=skeinformer", "seed=1"]``).
        run_dir: where the run would write (default: none; :func:`lra.naming.run_folder` names it).

    Returns:
        The frozen :class:`RunSpec`; a bad value raises :class:`ConfigError`, one line naming the key, the
        value and what is allowed.

    Example::

        spec = load(["task=listops", "attn=skeinformer", "preset=quick"])
        spec.train.lr, spec.model.attn.options, spec.data.spec.generator.n_train
    """
    return resolve(compose_checked(overrides), run_dir)


# ---------------------------------------------------------------------------------------------
# Resolve: composed config -> RunSpec


def attention_options(cfg: DictConfig) -> tuple[dict, dict]:
    """(options that run, options the preset set): the attention options of a run, and the one place
    their precedence is written (conf/config.yaml, README and docs point here). Lowest first:

    1. the backend's default (its ``Options`` dataclass; ``attn.options.*`` start unset, ``???``);
    2. ``attn.base_options``: a named variant's (conf/attn/<variant>.yaml, e.g. softmax_nodrop);
    3. ``attn_options.<backend>``, then ``attn_options.<label>``: the preset's (conf/preset/<preset>.yaml),
       merged with its protocol's for the task (conf/protocol/<preset>/<task>.yaml), which wins per option;
    4. the chosen public code's ``quirks.attn_options.<backend>``, then ``<label>`` (conf/quirks/<code>.yaml;
       none under ``quirks=none``);
    5. ``attn.options.<option>`` set on the command line (or by a sweep), which wins over all.

    Within each table the label's entry comes after the backend name's, so a labelled variant of a backend
    refines it. Options outside these tables that a run also gets: ``attn_checkpointing`` (whether the
    attention call is recomputed in backward, :class:`AttnSpec`) and the task's padded length (the model's
    ``seq_len``). The second value is what 3-4 set and the command line did not override (the record's
    ``preset_options``)."""
    name, label = str(cfg.attn.name), str(cfg.attn.label)
    preset: dict = {}
    quirk_table = OmegaConf.select(cfg, "quirks.attn_options", default=None) or {}
    for table in (cfg.get("attn_options") or {}, quirk_table):
        for key in dict.fromkeys([name, label]):
            if table.get(key) is not None:
                preset.update(container(table[key]))
    options = cfg.attn.options
    command_line = {k: options[k] for k in options if not OmegaConf.is_missing(options, k)}
    merged = {**container(cfg.attn.get("base_options") or {}), **preset, **container(command_line)}
    return merged, {k: v for k, v in preset.items() if k not in command_line}


def _compile(setting, on_cuda: bool, backend: str) -> tuple[bool, str | None]:
    wanted = setting is True or (setting == "auto" and on_cuda)
    if wanted and not attention.capabilities(backend).compiles:
        return False, f"attention {backend!r} declares it cannot be compiled (attention.capabilities): eager"
    return wanted, None


def _hardware(cfg: DictConfig, hw: DictConfig | None = None) -> HardwareSpec:
    """The run's hardware: the memory profile ``hw`` (default: ``cfg.hardware``) and the Trainer's settings."""
    hw, tr = cfg.hardware if hw is None else hw, cfg.trainer
    total = hw.get("total_gib")
    if total is not None:
        _num("hardware.total_gib", total, 0.0, open_lo=True)
        total = int(float(total) * GIB)
    elif hw.get("name") == "auto" and torch.cuda.is_available():
        total = int(torch.cuda.get_device_properties(0).total_memory)
    accelerator, on_cuda = str(tr.accelerator), trains_on_cuda(str(tr.accelerator))
    setting = cfg.train.get("compile", "auto")
    compile_, note = _compile(setting, on_cuda, str(cfg.attn.name))
    return HardwareSpec(
        name=str(hw.name),
        total_bytes=total,
        cuda_context_gib=float(hw.get("cuda_context_gib") or 0.0),
        allocator_margin=float(hw.get("allocator_margin") or 0.0),
        micro_batch=hw.get("micro_batch"),
        accelerator=accelerator,
        devices=device_count(container(tr.devices)),
        devices_arg=container(tr.devices),
        strategy=str(tr.strategy),
        precision=resolve_precision(str(tr.precision), on_cuda),
        precision_setting=str(tr.precision),
        num_workers=loader_workers(tr.num_workers, on_cuda),
        pin_memory=on_cuda,
        compile=compile_,
        compile_note=note,
        compile_forced=setting is True,
        deterministic=_flag("trainer.deterministic", tr.deterministic),
    )


def _external(cfg: DictConfig) -> None:
    """Import ``attn.target`` and put its registry name in place of ``external``; the label (the record's
    ``attn``, the table row) becomes that name too unless ``attn.label=`` was given, so one class is one row
    whatever route loaded it (attention.load_external names it). The run folder is named before the import
    (a sweep names its jobs' folders without importing the class) by the same snake_case spelling (lra.compose's
    resolver ``lra.attr``), so folder and record agree unless the class is registered under another name."""
    if OmegaConf.is_missing(cfg.attn, "target"):
        raise ConfigError(
            "attn.target is missing: attn=external needs the backend's class, "
            "attn.target=package.module:ClassName (README, 'Your own attention')"
        )
    try:
        name = attention.load_external(str(cfg.attn.target))
    except attention.InvalidOption as e:
        raise ConfigError(str(e)) from None
    with open_dict(cfg):
        cfg.attn.name = name
        if OmegaConf.is_interpolation(cfg.attn, "label"):  # the composed default: the class name
            cfg.attn.label = name


def _callbacks(cfg: DictConfig) -> dict:
    """``callbacks.<name>``: a Lightning callback the user adds (``_target_`` and its arguments; conf/callbacks/).
    Their classes are checked by :func:`lra.loop.check_callbacks` (the layer that knows Lightning)."""
    nodes = container(cfg.get("callbacks") or {})
    _check(isinstance(nodes, dict), "callbacks", nodes, "a mapping name -> {_target_: <module>.<Class>, ...arguments}")
    for name, node in nodes.items():
        _check(
            isinstance(node, dict) and isinstance(node.get("_target_"), str) and "." in node["_target_"],
            f"callbacks.{name}",
            node,
            "a node with _target_: <module>.<Class> of a Lightning callback and the "
            "class's arguments (conf/callbacks/lr_monitor.yaml is an example)",
        )
    return nodes


def resolve(cfg: DictConfig, run_dir: str | Path | None = None) -> RunSpec:
    """The typed spec of a composed config, every value checked.

    Args:
        cfg: a config from :func:`compose` (without its ``hydra`` node: :func:`without_hydra`).
        run_dir: where the run writes (``python -m lra.train`` passes its folder); else ``cfg.run_dir``
            where a caller set one.

    Returns:
        The frozen :class:`RunSpec` (model, train, data with its typed task spec, hardware, callbacks, and
        the resolved config for the record); a bad value raises :class:`ConfigError`, one line.

    Example::

        spec = resolve(compose(["task=text", "attn=performer"]))
    """
    run_dir = run_dir if run_dir is not None else cfg.get("run_dir")
    if cfg.attn.name == "external":
        _external(cfg)
    options, preset_options = attention_options(cfg)
    attn = AttnSpec(
        name=str(cfg.attn.name),
        label=str(cfg.attn.label),
        options=options,
        preset_options=preset_options,
        checkpointing=bool({str(cfg.attn.name), str(cfg.attn.label)} & set(cfg.get("attn_checkpointing") or [])),
    )
    task = container(cfg.task)
    model = build(
        ModelSpec,
        "model",
        container(cfg.model),
        vocab_size=task["vocab_size"],
        seq_len=task["seq_len"],
        num_classes=task["num_classes"],
        dual=bool(task.get("dual", False)),
        attn=attn,
    )
    train_node = container(cfg.train)
    if train_node.get("chunks") is None:  # unset: the chosen public code's (1 under quirks=none)
        train_node["chunks"] = paper_chunks(cfg, attn)
    debug = build(DebugSpec, "debug", container(cfg.debug)) if cfg.get("debug") is not None else None
    if (
        debug and debug.cpu_batch and not trains_on_cuda(str(cfg.trainer.accelerator))
    ):  # a check on a CPU: seconds, not minutes
        chunks = train_node["chunks"]
        train_node["batch_size"] = min(train_node["batch_size"], max(1, debug.cpu_batch // chunks) * chunks)
    train = build(TrainSpec, "train", train_node, monitor=str(cfg.trainer.monitor))
    config = container(cfg)
    config.pop("execution", None)  # how the run executes, not what it computes: no folder level (the record says it)
    config["train"] = {**config["train"], "chunks": train.chunks, "batch_size": train.batch_size}
    config["attn"] = {**config["attn"], "options": attn.options}
    if not config.get("callbacks"):  # no user callbacks: the record reads as it did before the group existed
        config.pop("callbacks", None)
    fit = cfg.get("fit") or {}
    semantics = cfg.get("semantics", "clean")  # derived from quirks (conf/config.yaml); checked by RunSpec
    asked = cfg.get("execution", "paper")  # a record's config has none: it is the record's own field
    _choice("execution", asked, EXECUTIONS)
    spec = RunSpec(
        preset=str(cfg.preset),
        seed=cfg.seed,
        model=model,
        train=train,
        data=DataSpec.of(task, data_root(cfg.data_root)),
        hardware=_hardware(cfg),
        logger=container(cfg.get("logger") or {}),  # logger=[]: metrics.csv alone
        run_dir=Path(run_dir) if run_dir else None,
        force=_flag("force", cfg.force),
        num_threads=cfg.num_threads,
        progress=cfg.trainer.progress,  # true, false or auto: checked by RunSpec
        log_every_n_steps=cfg.trainer.log_every_n_steps,
        callbacks=_callbacks(cfg),
        fit_cache_dir=Path(str(fit.cache_dir))
        if _flag("fit.cache", fit.get("cache", True)) and fit.get("cache_dir")
        else None,
        config=config,
        semantics=str(semantics),
        quirks=quirks_on(cfg, model, task, train),
        name=cfg.get("name"),
        debug=debug,
    )
    if asked == "paper":  # resolved alone: fast's profile reads the card (CUDA), which a paper run must not
        return spec
    return dataclasses.replace(fast(spec, _hardware(cfg, fast_profile(cfg))), other=spec)  # lra/execution.py
