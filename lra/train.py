"""One LRA run: ``python -m lra.train task=<task> attn=<name> [overrides]`` (``make lra``).

Composes the config (conf/), applies the preset's attention options, prepares the data
(generating ListOps if absent), decides the micro-batch and accumulation (lra/fit.py; a run that
does not fit even at micro-batch 1 stops here, before training), trains with Lightning under the
preset's stopping rule, tests the selected checkpoint and writes ``<run dir>/result.json``.

The run folder is named by preset, task, attention, seed and any other overrides, so re-running
the same command finds the same folder: a finished run is reported and skipped (``force=true`` runs
it again from scratch), an unfinished one (killed, interrupted) RESUMES from
``checkpoints/last.ckpt`` (weights, optimizer, scheduler, RNG, data position, callback states) and
ends with the record an uninterrupted run would have written. docs/protocol.md describes the
protocol and the record.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from lra import CONF_DIR
from lra.config import register_resolvers
from lra.record import git_commit, read_record, write_record

log = logging.getLogger("lra.train")
register_resolvers()

FINISHED = ("completed", "stopped_early", "stuck")


def resolve_precision(precision: str, accelerator: str) -> str:
    if precision != "auto":
        return precision
    return "16-mixed" if accelerator == "cuda" or (accelerator == "auto" and torch.cuda.is_available()) else "32-true"


# ---------------------------------------------------------------------------------------------
# Config: the preset's attention options


def _cli_option_keys(overrides) -> set[str]:
    keys = set()
    for o in overrides or ():
        m = re.match(r"^[+~]*attn\.options\.([^=]+)", str(o))
        if m:
            keys.add(m.group(1))
    return keys


def finalize(cfg: DictConfig, overrides=None) -> DictConfig:
    """Merge the preset's per-backend attention options into ``attn.options`` (in place; idempotent).

    Precedence: conf/attn/<name>.yaml < ``attn_options.<backend name>`` < ``attn_options.<label>``
    < ``protocol.<task>.attn_options.<name|label>`` < ``attn.options.*`` given on the command line
    (``overrides``; under ``python -m lra.train`` Hydra's own list). What the preset added is kept
    in ``attn.preset_options``, whose presence marks the config as finalized.
    """
    if "preset_options" in cfg.attn:
        return cfg
    if overrides is None and HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    name, label = str(cfg.attn.name), str(cfg.attn.get("label", cfg.attn.name))
    task_opts = OmegaConf.select(cfg, f"protocol.{cfg.task.name}.attn_options", default=None) or {}
    tables = [cfg.get("attn_options") or {}, task_opts]
    preset: dict = {}
    for table in tables:
        for key in dict.fromkeys([name, label]):
            if key in table and table[key] is not None:
                preset.update(OmegaConf.to_container(table[key], resolve=True))
    cli = _cli_option_keys(overrides)
    current = OmegaConf.to_container(cfg.attn.options, resolve=True) if cfg.attn.get("options") else {}
    merged = {**current, **{k: v for k, v in preset.items() if k not in cli}}
    with open_dict(cfg):
        cfg.attn.options = merged
        cfg.attn.preset_options = {k: v for k, v in preset.items() if k not in cli}
    return cfg


def uses_attn_checkpointing(cfg: DictConfig) -> bool:
    names = set(cfg.get("attn_checkpointing") or [])
    return str(cfg.attn.name) in names or str(cfg.attn.get("label", "")) in names


def model_kwargs(cfg: DictConfig) -> dict:
    m, t = cfg.model, cfg.task
    return dict(vocab_size=int(t.vocab_size), seq_len=int(t.seq_len), num_classes=int(t.num_classes),
                attn_name=cfg.attn.name, attn_options=OmegaConf.to_container(cfg.attn.options, resolve=True),
                dim=m.dim, hidden=m.hidden, num_layers=m.num_layers, num_heads=m.num_heads, head_dim=m.head_dim,
                dropout=m.dropout, head_hidden=m.head_hidden, pooling=m.pooling, dual=bool(t.dual),
                interaction=m.interaction)


def resume_key(cfg: DictConfig, micro_batch: int, accum_steps: int) -> str:
    """What must be equal for a checkpoint to continue this run."""
    train = OmegaConf.to_container(cfg.train, resolve=True)
    train.pop("ckpt_every_steps", None)
    key = {"train": train, "model": model_kwargs(cfg), "task": OmegaConf.to_container(cfg.task, resolve=True),
           "seed": int(cfg.seed), "micro_batch": micro_batch, "accum_steps": accum_steps,
           "attn_checkpointing": uses_attn_checkpointing(cfg)}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def base_record(cfg: DictConfig) -> dict:
    return {
        "task": cfg.task.name, "attn": cfg.attn.label, "attn_backend": cfg.attn.name, "seed": int(cfg.seed),
        "preset": cfg.preset, "status": "running", "reason": None, "test_acc": None, "test_loss": None,
        "best_val_acc": None, "majority_acc": None, "steps": 0, "steps_at_stop": None, "steps_to_best": None,
        "train_time_s": None, "time_per_1k_steps_s": None, "tokens_per_s": None,
        "peak_mem_bytes": None, "peak_mem_estimate_bytes": None, "micro_batch": None, "accum_steps": None,
        "effective_batch": int(cfg.train.batch_size), "hardware": cfg.hardware.name,
        "attn_options": OmegaConf.to_container(cfg.attn.options, resolve=True),
        "attn_impl": cfg.attn.options.get("impl"), "attn_checkpointing": uses_attn_checkpointing(cfg),
        "config": OmegaConf.to_container(cfg, resolve=True), "git_commit": git_commit(),
        "torch_version": torch.__version__, "device": None,
    }


def label_entropy(labels) -> float:
    p = np.bincount(np.asarray(labels)).astype(np.float64)
    p = p[p > 0] / p.sum()
    return float(-(p * np.log(p)).sum())


# ---------------------------------------------------------------------------------------------
# The run


def _single_log_stream() -> None:
    """Lightning adds its own console handler; under Hydra the root logger already prints (and writes
    the run's log file), so drop Lightning's handler and every message appears once, in both places."""
    if logging.getLogger().handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            lg = logging.getLogger(name)
            for h in list(lg.handlers):
                lg.removeHandler(h)
            lg.propagate = True


def run(cfg: DictConfig) -> dict:
    """Train (or resume), test, record. Returns the record (also on failure, with status "failed")."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping

    from lra.callbacks import BestCheckpoint, ResumeCheckpoint, RunGuard, StepProgress, TrainTimer
    from lra.data import data_root, load_task
    from lra.data.module import LRADataModule
    from lra.fit import device_count, plan
    from lra.module import LitLRA, ResumableDataModule, count_params

    _single_log_stream()
    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = run_dir / "checkpoints"
    old = read_record(run_dir)
    if old and old.get("status") in FINISHED and not cfg.force:
        log.info("%s already holds a finished run (%s, test_acc %.4f); pass force=true to run it again",
                 run_dir, old.get("status"), old.get("test_acc") or float("nan"))
        return old
    if cfg.force and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    cfg = finalize(cfg)
    rec = base_record(cfg)
    trainer = None
    tr = cfg.train
    try:
        L.seed_everything(int(cfg.seed), workers=True, verbose=False)
        splits = load_task(OmegaConf.to_container(cfg.task, resolve=True), data_root(cfg.data_root))
        rec["majority_acc"] = splits["test"].majority_rate()
        rec["split_sizes"] = {k: len(v) for k, v in splits.items()}

        p = plan(cfg)  # raises FitError (micro-batch 1 does not fit) before any training
        rec.update(micro_batch=p.micro_batch, accum_steps=p.accum_steps, effective_batch=p.effective_batch,
                   devices=p.devices, accum_source=p.source, peak_mem_estimate_bytes=p.estimate_bytes,
                   fit_budget_bytes=p.budget_bytes, fit_seconds=p.seconds)
        log.info("%s", p.describe())
        key = resume_key(cfg, p.micro_batch, p.accum_steps)
        last = ckpt_dir / "last.ckpt"
        resume_from = None
        if last.exists():
            saved = torch.load(last, map_location="cpu", weights_only=False)
            if saved.get("resume_key") != key:
                raise RuntimeError(f"{last} belongs to a run with another configuration (or micro-batch); "
                                   f"pass force=true to discard it and start again")
            resume_from = int(saved.get("global_step", 0))
            del saved
            log.info("resuming from %s (optimizer step %d)", last, resume_from)
        rec["resumed_from_step"] = resume_from
        _write(run_dir, rec)  # status "running": the decision is visible before training starts

        eval_bs = tr.eval_batch_size or p.micro_batch
        dm_cls = ResumableDataModule if p.devices == 1 else LRADataModule
        dm = dm_cls(splits, batch_size=p.micro_batch, eval_batch_size=eval_bs, seed=int(cfg.seed),
                    num_workers=int(cfg.trainer.num_workers))
        lit = LitLRA(model_kwargs(cfg), lr=tr.lr, warmup=tr.warmup, max_steps=tr.max_steps,
                     weight_decay=tr.weight_decay, eps=tr.eps, grad_clip_value=tr.grad_clip_value,
                     schedule=tr.schedule, attn_checkpointing=uses_attn_checkpointing(cfg), resume_key=key)
        rec["num_params"] = count_params(lit)

        monitor = str(cfg.trainer.monitor)
        select_after = int(math.ceil(float(tr.select_after or 0.0) * int(tr.max_steps)))
        best = BestCheckpoint(dirpath=ckpt_dir, filename="best", monitor=monitor,
                              mode="max" if monitor.endswith("acc") else "min", save_top_k=1, save_last=False,
                              auto_insert_metric_name=False, enable_version_counter=False, select_after=select_after)
        resume = ResumeCheckpoint(last, eval_every=int(tr.eval_every), every_n_steps=tr.ckpt_every_steps)
        timer = TrainTimer()
        guard = RunGuard(baseline_loss=label_entropy(splits["val"].labels), majority_acc=splits["val"].majority_rate(),
                         stuck_after=tr.stuck_after_steps, loss_tol=tr.stuck_loss_tol, acc_tol=tr.stuck_acc_tol)
        callbacks = [timer, guard, best, resume]
        if cfg.logger.name == "wandb":
            from lra.wandb_extras import WandbTables

            callbacks.append(WandbTables())
        if cfg.trainer.progress:
            callbacks.append(StepProgress(int(tr.max_steps)))
        stopper = None
        if tr.patience:
            stopper = EarlyStopping(monitor="val/loss", mode="min", patience=int(tr.patience),
                                    check_on_train_epoch_end=False, check_finite=False)
            callbacks.append(stopper)
        precision = resolve_precision(str(cfg.trainer.precision), str(cfg.trainer.accelerator))
        trainer = L.Trainer(
            default_root_dir=run_dir, max_steps=int(tr.max_steps), max_epochs=-1,
            val_check_interval=int(tr.eval_every) * p.accum_steps, check_val_every_n_epoch=None,
            accumulate_grad_batches=p.accum_steps, accelerator=cfg.trainer.accelerator,
            devices=cfg.trainer.devices, strategy=cfg.trainer.strategy, precision=precision,
            logger=make_logger(cfg, run_dir, resume_from), callbacks=callbacks, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=int(cfg.trainer.log_every_n_steps),
            deterministic=bool(cfg.trainer.deterministic),
        )
        if p.devices != device_count(cfg):
            log.warning("planned for %d devices, the trainer has %d", p.devices, trainer.world_size)
        device = trainer.strategy.root_device
        rec["device"] = str(device) if device.type == "cpu" else torch.cuda.get_device_name(device)
        rec["precision"] = precision
        if device.type == "cpu" and cfg.preset != "quick":
            log.warning(
                "Training the full %s protocol on a CPU: %d steps of batch %d x %d tokens will take many hours "
                "(the progress bar shows the ETA). For a run of a few minutes: make lra task=%s attn=%s "
                "ARGS='experiment=quick'", cfg.preset, tr.max_steps, p.effective_batch, cfg.task.seq_len,
                cfg.task.name, cfg.attn.label)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer.fit(lit, datamodule=dm, ckpt_path=str(last) if resume_from is not None else None)

        steps = int(trainer.global_step)
        rec.update(steps=steps, steps_at_stop=steps, train_time_s=timer.train_time_s, eval_time_s=timer.eval_time_s,
                   time_per_1k_steps_s=timer.train_time_s / steps * 1000 if steps else None,
                   best_val_acc=_num(best.best_model_score), best_ckpt=best.best_model_path or None,
                   steps_to_best=best.best_step, stuck_at_end=guard.at_chance)
        tokens = steps * p.effective_batch * int(cfg.task.seq_len) * (2 if cfg.task.dual else 1)
        rec["tokens_per_s"] = tokens / timer.train_time_s if timer.train_time_s else None
        if device.type == "cuda":
            rec["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device)
            if p.estimate_bytes:
                rec["peak_mem_estimate_error"] = rec["peak_mem_bytes"] / p.estimate_bytes - 1.0
        early = stopper is not None and stopper.stopped_epoch > 0 or (steps < tr.max_steps and trainer.should_stop)
        rec["stop_rule"] = f"early stopping on val/loss, patience {tr.patience}" if tr.patience else "fixed steps"
        rec["stop_reason"] = "max_steps" if steps >= tr.max_steps else ("early_stopping" if early else "stopped")

        if guard.status == "failed":  # diverged: nothing worth testing
            rec.update(status="failed", reason=guard.reason, stop_reason="diverged")
            log.error("%s", guard.reason)
        else:
            use_best = str(tr.test_ckpt) == "best"
            if str(tr.test_ckpt) not in ("best", "last"):
                raise ValueError(f"train.test_ckpt must be 'best' or 'last', got {tr.test_ckpt!r}")
            ckpt_path = best.best_model_path if use_best and best.best_model_path else None
            rec["tested_ckpt"] = "best" if ckpt_path else ("last" if not use_best else
                                                           "last (no best checkpoint after select_after)")
            test = trainer.test(lit, datamodule=dm, ckpt_path=ckpt_path, verbose=False)
            rec.update(test_acc=test[0]["test/acc"], test_loss=test[0]["test/loss"])
            if guard.status == "stuck":
                rec.update(status="stuck", reason=guard.reason, stop_reason="stuck")
                log.warning("%s", guard.reason)
            else:
                rec["status"] = "stopped_early" if early else "completed"
            if not math.isfinite(rec["test_loss"]):
                rec.update(status="failed", reason="non-finite test loss")
        if guard.at_chance and rec["status"] != "stuck":
            log.warning("the last validation was at chance level (loss %.4f, accuracy %.4f, majority %.4f): "
                        "the run may be stuck (train.stuck_after_steps stops such runs)", *guard.last_val,
                        guard.majority_acc)
    except KeyboardInterrupt:
        rec.update(status="interrupted", reason="KeyboardInterrupt")
        _write(run_dir, rec)
        raise
    except SystemExit as e:  # Lightning turns SIGTERM into SIGTERMException, a SystemExit with code None
        rec.update(status="interrupted", reason=f"{type(e).__name__}: restart the same command to resume from "
                                                f"the last checkpoint")
        _write(run_dir, rec)
        if type(e).__name__ == "SIGTERMException":
            raise SystemExit(128 + signal.SIGTERM) from e
        raise
    except Exception as e:  # noqa: BLE001 - any failure must leave a record saying why
        rec.update(status="failed", reason=f"{type(e).__name__}: {e}")
        _write(run_dir, rec)
        raise
    _write(run_dir, rec)
    if trainer is not None and cfg.logger.name == "wandb" and trainer.is_global_zero:
        from lra.wandb_extras import log_record

        log_record(trainer.logger, rec, run_dir)
    if not _rank_zero():
        return rec
    if rec["status"] in FINISHED and last.exists():
        last.unlink()  # the run is over; best.ckpt stays
    log.info("%s/%s seed %d: %s, test acc %s (majority %.4f), %d steps, %.1f s training -> %s",
             rec["task"], rec["attn"], rec["seed"], rec["status"], _fmt(rec["test_acc"]), rec["majority_acc"],
             rec["steps"], rec["train_time_s"] or 0.0, run_dir / "result.json")
    return rec


def _rank_zero() -> bool:
    from lightning.pytorch.utilities import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def _write(run_dir: Path, rec: dict) -> None:
    """Only global rank zero writes the record (DDP runs one process per device)."""
    if _rank_zero():
        write_record(run_dir, rec)


def _num(x):
    return None if x is None else float(x)


def _fmt(x):
    return "n/a" if x is None else f"{x:.4f}"


def csv_logger(run_dir: Path, resume_from: int | None):
    """Lightning's CSVLogger, keeping the history of a resumed run.

    Its writer deletes an existing metrics.csv when it starts; a resumed run keeps the rows up to the
    step it resumes from (later rows are logged again) so curves cover the whole run.
    """
    import csv
    import warnings

    from lightning.pytorch.loggers import CSVLogger

    path = run_dir / "metrics.csv"
    old = []
    if resume_from is not None and path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            old = [r for r in reader if r.get("step", "") == "" or int(float(r["step"])) <= resume_from]
    # flush at every logging call: a killed run keeps its history up to its last checkpoint
    logger = CSVLogger(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=1)
    with warnings.catch_warnings():  # the run folder already holds result.json: nothing of ours is deleted
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        writer = logger.experiment
    if old:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(old)
        writer.metrics_keys = keys
    return logger


def make_logger(cfg: DictConfig, run_dir: Path, resume_from: int | None = None):
    if cfg.logger.name == "csv":
        return csv_logger(run_dir, resume_from)
    if cfg.logger.name == "wandb":
        os.environ.setdefault("WANDB_MODE", str(cfg.logger.mode))
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project=cfg.logger.project, save_dir=str(run_dir), group=cfg.logger.group,
                           tags=list(cfg.logger.tags), name=f"{cfg.task.name}-{cfg.attn.label}-s{cfg.seed}",
                           config=OmegaConf.to_container(cfg, resolve=True), mode=str(cfg.logger.mode))
    raise ValueError(f"logger must be csv or wandb, got {cfg.logger.name!r}")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from lra.data import DataError
    from lra.fit import FitError

    try:
        rec = run(cfg)
    except DataError as e:
        log.error("%s", e)
        sys.exit(2)
    except FitError as e:
        log.error("does not fit, not training: %s", e)
        sys.exit(3)
    return rec.get("best_val_acc")  # the objective for Hydra sweepers


if __name__ == "__main__":
    main()
