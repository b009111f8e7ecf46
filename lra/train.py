"""One LRA run: ``python -m lra.train task=<task> attn=<name> [overrides]`` (``make lra``).

Composes the config (conf/), prepares the data (generating ListOps if absent), decides the
micro-batch and accumulation (lra/fit.py), trains with Lightning, tests the best-validation
checkpoint and writes ``<run dir>/result.json``. The run folder is named by preset, task,
attention, seed and any other overrides, so re-running the same command finds the same folder: a
completed run is reported and skipped (``force=true`` runs it again).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lra import CONF_DIR
from lra.config import register_resolvers
from lra.record import git_commit, read_record, write_record

log = logging.getLogger("lra.train")
register_resolvers()


def resolve_precision(precision: str, accelerator: str) -> str:
    if precision != "auto":
        return precision
    return "16-mixed" if accelerator == "cuda" or (accelerator == "auto" and torch.cuda.is_available()) else "32-true"


def model_kwargs(cfg: DictConfig) -> dict:
    m, t = cfg.model, cfg.task
    return dict(vocab_size=int(t.vocab_size), seq_len=int(t.seq_len), num_classes=int(t.num_classes),
                attn_name=cfg.attn.name, attn_options=OmegaConf.to_container(cfg.attn.options, resolve=True),
                dim=m.dim, hidden=m.hidden, num_layers=m.num_layers, num_heads=m.num_heads, head_dim=m.head_dim,
                dropout=m.dropout, head_hidden=m.head_hidden, pooling=m.pooling, dual=bool(t.dual),
                interaction=m.interaction)


def base_record(cfg: DictConfig) -> dict:
    return {
        "task": cfg.task.name, "attn": cfg.attn.label, "attn_backend": cfg.attn.name, "seed": int(cfg.seed),
        "preset": cfg.preset, "status": "running", "reason": None, "test_acc": None, "test_loss": None,
        "best_val_acc": None, "majority_acc": None, "steps": 0, "train_time_s": None, "time_per_1k_steps_s": None,
        "peak_mem_bytes": None, "micro_batch": None, "accum_steps": None,
        "effective_batch": int(cfg.train.batch_size), "hardware": cfg.hardware.name,
        "config": OmegaConf.to_container(cfg, resolve=True), "git_commit": git_commit(),
        "torch_version": torch.__version__, "device": None,
    }


def run(cfg: DictConfig) -> dict:
    """Train, test, record. Returns the record (also on failure, with status "failed")."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from lra.callbacks import StepProgress, TrainTimer
    from lra.data import data_root, load_task
    from lra.data.module import LRADataModule
    from lra.fit import plan
    from lra.module import LitLRA, count_params

    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    old = read_record(run_dir)
    if old and old.get("status") in ("completed", "stopped_early") and not cfg.force:
        log.info("%s already holds a finished run (test_acc %.4f); pass force=true to run it again",
                 run_dir, old.get("test_acc") or float("nan"))
        return old
    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    rec = base_record(cfg)
    try:
        L.seed_everything(int(cfg.seed), workers=True, verbose=False)
        splits = load_task(OmegaConf.to_container(cfg.task, resolve=True), data_root(cfg.data_root))
        rec["majority_acc"] = splits["test"].majority_rate()
        rec["split_sizes"] = {k: len(v) for k, v in splits.items()}

        p = plan(cfg)
        rec.update(micro_batch=p.micro_batch, accum_steps=p.accum_steps, effective_batch=p.effective_batch,
                   accum_source=p.source, peak_mem_estimate_bytes=p.estimate_bytes)
        log.info("batch %d = micro-batch %d x accumulation %d (%s)", p.effective_batch, p.micro_batch,
                 p.accum_steps, p.source)
        tr = cfg.train
        dm = LRADataModule(splits, batch_size=p.micro_batch, eval_batch_size=tr.eval_batch_size or p.micro_batch,
                           seed=int(cfg.seed), num_workers=int(cfg.trainer.num_workers))
        lit = LitLRA(model_kwargs(cfg), lr=tr.lr, warmup=tr.warmup, max_steps=tr.max_steps,
                     weight_decay=tr.weight_decay, eps=tr.eps, grad_clip_value=tr.grad_clip_value)
        rec["num_params"] = count_params(lit)

        ckpt = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best", monitor=cfg.trainer.monitor,
                               mode="max" if cfg.trainer.monitor.endswith("acc") else "min", save_top_k=1,
                               save_last=True, auto_insert_metric_name=False)
        timer = TrainTimer()
        callbacks = [ckpt, timer]
        if cfg.trainer.progress:
            callbacks.append(StepProgress(int(tr.max_steps)))
        stopper = None
        if tr.patience:
            stopper = EarlyStopping(monitor="val/loss", mode="min", patience=int(tr.patience),
                                    check_on_train_epoch_end=False)
            callbacks.append(stopper)
        trainer = L.Trainer(
            default_root_dir=run_dir, max_steps=int(tr.max_steps), max_epochs=-1,
            val_check_interval=int(tr.eval_every) * p.accum_steps, check_val_every_n_epoch=None,
            accumulate_grad_batches=p.accum_steps, accelerator=cfg.trainer.accelerator,
            devices=cfg.trainer.devices, strategy=cfg.trainer.strategy,
            precision=resolve_precision(str(cfg.trainer.precision), str(cfg.trainer.accelerator)),
            logger=make_logger(cfg, run_dir), callbacks=callbacks, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=int(cfg.trainer.log_every_n_steps),
            deterministic=bool(cfg.trainer.deterministic),
        )
        device = trainer.strategy.root_device
        rec["device"] = str(device) if device.type == "cpu" else torch.cuda.get_device_name(device)
        if device.type == "cpu" and cfg.preset != "quick":
            log.warning(
                "Training the full %s protocol on a CPU: %d steps of batch %d x %d tokens will take many hours "
                "(the progress bar shows the ETA). For a run of a few minutes: make lra task=%s attn=%s "
                "ARGS='experiment=quick'", cfg.preset, tr.max_steps, p.effective_batch, cfg.task.seq_len,
                cfg.task.name, cfg.attn.label)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer.fit(lit, datamodule=dm)
        steps = int(trainer.global_step)
        rec.update(steps=steps, train_time_s=timer.train_time_s, eval_time_s=timer.eval_time_s,
                   time_per_1k_steps_s=timer.train_time_s / steps * 1000 if steps else None,
                   best_val_acc=_num(ckpt.best_model_score), best_ckpt=ckpt.best_model_path or None)
        if device.type == "cuda":
            rec["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device)
        test = trainer.test(lit, datamodule=dm, ckpt_path="best" if ckpt.best_model_path else None, verbose=False)
        rec.update(test_acc=test[0]["test/acc"], test_loss=test[0]["test/loss"])
        early = stopper is not None and stopper.stopped_epoch > 0 or (steps < tr.max_steps and trainer.should_stop)
        rec["status"] = "stopped_early" if early else "completed"
        if not math.isfinite(rec["test_loss"]):
            rec.update(status="failed", reason="non-finite test loss")
    except KeyboardInterrupt:
        rec.update(status="interrupted", reason="KeyboardInterrupt")
        write_record(run_dir, rec)
        raise
    except Exception as e:  # noqa: BLE001 - any failure must leave a record saying why
        rec.update(status="failed", reason=f"{type(e).__name__}: {e}")
        write_record(run_dir, rec)
        raise
    write_record(run_dir, rec)
    log.info("%s/%s seed %d: test acc %.4f (majority %.4f), %d steps, %.1f s training -> %s",
             rec["task"], rec["attn"], rec["seed"], rec["test_acc"], rec["majority_acc"], rec["steps"],
             rec["train_time_s"], run_dir / "result.json")
    return rec


def _num(x):
    return None if x is None else float(x)


def make_logger(cfg: DictConfig, run_dir: Path):
    from lightning.pytorch.loggers import CSVLogger

    if cfg.logger.name == "csv":
        return CSVLogger(save_dir=str(run_dir), name="", version="")
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

    try:
        rec = run(cfg)
    except DataError as e:
        log.error("%s", e)
        sys.exit(2)
    return rec.get("best_val_acc")  # the objective for Hydra sweepers


if __name__ == "__main__":
    main()
