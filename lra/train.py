"""One LRA run: ``python -m lra.train task=<task> attn=<name> [overrides]`` (``make lra``).

Composes the config (conf/) once, with the ``hydra`` node ``@hydra.main`` would give it, and resolves
it once into a typed spec (lra/config.py; a bad value is one line and exit code 2, before any folder
exists), prepares the data (generating ListOps if absent) and hands spec and data to the run, which
decides the micro-batch and accumulation (lra/fit.py; a run that does not fit even at micro-batch 1
stops here, exit code 3), trains with Lightning under the preset's protocol
(lra/protocol.py), tests the selected checkpoint and writes ``<run dir>/result.json``.

The run folder is named by preset, task, attention, seed and any other overrides, so re-running
the same command finds the same folder: a finished run is reported and skipped (``force=true`` runs
it again from scratch), an unfinished one (killed, interrupted) RESUMES from
``checkpoints/last.ckpt`` (weights, optimizer, scheduler, RNG, data position, callback states) and
ends with the record an uninterrupted run would have written. docs/protocol.md describes the
protocol and the record. The run goes into its folder as a Hydra job (lra/hydra_glue.py: ``.hydra/``,
``train.log``) without composing the config again; Hydra's own flags (``--help``, ``--cfg job``, ``-m``)
go to ``@hydra.main``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import shutil
import sys
import warnings
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, open_dict

from lra import CONF_DIR
from lra.checks import check_roots, check_run_folder
from lra.cli import HARNESS_OVERRIDES, hand_to_hydra, hydra_args, wants_hydra_itself
from lra.config import ConfigError, RunSpec, compose_checked, renamed_overrides, resolve, without_hydra
from lra.data import Split, data_record, fingerprint, load_task
from lra.devices import LoadMeter, check_devices, limit_gpu_memory
from lra.ending import ending, owned, progress_record, recorded, write_rank_zero
from lra.execution import as_execution
from lra.fit import Plan, plan
from lra.hydra_glue import run_dir_of, run_in_folder
from lra.interrupts import sigterm_raises
from lra.loggers import check_loggers
from lra.loop import Wired, check_callbacks, wire
from lra.module import CompileError, count_params
from lra.naming import run_tag
from lra.protocol import (
    FINISHED,
    STATUSES,
    BestCheckpoint,
    Callbacks,
    RunError,
    measured,
    moved,
    outcome,
    read_checkpoint,
)
from lra.record import Record, carry_over, new_record, read_record
from lra.runlock import check_lockable
from lra.wandb_extras import log_record

log = logging.getLogger("lra.train")
# an hour at 1e4 tokens/s, several times the pace of the papers' model on one CPU core (1.5e3 under debug=fast)
CPU_TOKENS_PER_HOUR = 3600 * 10**4


def run(spec: RunSpec, splits: dict[str, Split] | None = None) -> Record:
    """Train (or resume), test, record. ``splits``: the task's data, as :func:`check_before_run` loaded it
    (None: loaded here). Returns the record; a failure is recorded, then raised."""
    run_dir, ckpt_dir = spec.run_dir, spec.run_dir / "checkpoints"
    with owned(run_dir):
        old = _finished_record(spec)
        if old is not None:
            return old
        _prepare(spec, ckpt_dir)
        spec = _started_execution(spec, ckpt_dir / "last.ckpt")
        if spec.execution_note:
            log.warning("%s", spec.execution_note)
        rec = new_record(spec)
        trainer = _train_and_test(spec, splits, rec, ckpt_dir)
        _finish(spec, rec, trainer)
    return rec


def _train_and_test(spec: RunSpec, splits: dict[str, Split] | None, rec: Record, ckpt_dir: Path) -> L.Trainer:
    """The run's named steps, under the failure policy; fills ``rec`` in as it goes."""
    trainer = None
    with recorded(spec.run_dir, rec):
        before = _unfinished_record(spec.run_dir, ckpt_dir / "last.ckpt")
        rec.machine = before.get("machine")  # the stretches trained so far; this one is folded in
        carry_over(rec, before)  # their steps, training time and commits, until this stretch trains
        splits = _load_data(spec, rec, splits)
        p = plan(spec)  # raises FitError (micro-batch 1 does not fit) before any training
        rec.set(**_plan_fields(p))
        on_cpu = spec.hardware.accelerator == "cpu" or not torch.cuda.is_available()
        sized = f"{p.describe()}, for hardware={spec.hardware.name}"
        log.info("%s%s", sized, " (trained on this machine's CPU)" if on_cpu and spec.hardware.name != "cpu" else "")
        key = spec.resume_key(p.micro_batch, p.accum_steps, fingerprint(splits))
        start = _resume(ckpt_dir / "last.ckpt", key, rec, before)
        rec.resumed_from_step = start
        write_rank_zero(spec.run_dir, rec)  # status "running": the decision is visible before training starts

        w = wire(spec, p, splits, key, start, progress=lambda fields: progress_record(spec.run_dir, rec, fields))
        lit, cb, trainer, dm = w.lit, w.cb, w.trainer, w.dm
        rec.num_params = count_params(lit)
        rec.set(**_device_fields(spec, trainer, p))
        _fit(spec, w, p, rec, ckpt_dir / "last.ckpt" if start is not None else None)
        rec.set(compiled=lit.compiled, compile_note=lit.compile_note or rec.compile_note)  # a fallback ran eager
        rec.set(**_peak_memory(trainer, p), compile_time_s=lit.compile_time_s)
        out = outcome(spec, trainer, cb)
        rec.set(**out.fields)
        rec.merge(_callback_fields(cb))
        _warn_about(rec, cb)  # before the test, whose checkpoint restores the callbacks' states of its step
        if out.status != "failed":
            test = trainer.test(lit, datamodule=dm, ckpt_path=out.test_ckpt, verbose=False, weights_only=True)[0]
            rec.set(test_acc=test["test/acc"], test_loss=test["test/loss"])
            if not torch.isfinite(torch.tensor(rec.test_loss)):
                rec.set(status="failed", reason="non-finite test loss")
    return trainer


def _fit(spec: RunSpec, w: Wired, p: Plan, rec: Record, resume_from: Path | None) -> None:
    """``trainer.fit``, measured into ``rec`` however it ends: a fit cut short (a signal, an error) leaves a
    record of the steps done and the best validation so far, as a finished one says them."""
    meter = LoadMeter(w.trainer.strategy.root_device, spec.hardware.num_workers, rec.machine)
    rec.machine = meter.fields
    try:
        with warnings.catch_warnings():
            if resume_from is not None:  # the checkpoint folder is this run's own: best.ckpt is what it resumes
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            w.trainer.fit(  # read as data again (weights_only): the file may have changed since it was checked
                w.lit,
                datamodule=w.dm,
                ckpt_path=str(resume_from) if resume_from is not None else None,
                weights_only=True,
            )
    except BaseException as e:
        if isinstance(e, CompileError):  # train.compile=true: the failed record says what did not compile
            rec.set(compiled=False, compile_note=str(e))
        with contextlib.suppress(Exception):  # measuring must not hide why the fit ended
            got = measured(spec, w.trainer, w.cb, p.effective_batch)
            if got["steps"] >= (rec.resumed_from_step or 0):  # not a resume ended before its checkpoint was read
                rec.set(**got)
        raise
    finally:
        rec.machine = meter.end()
    rec.set(**measured(spec, w.trainer, w.cb, p.effective_batch))


# ---------------------------------------------------------------------------------------------
# The steps of a run


def _old_record(spec: RunSpec) -> Record | None:
    """The record already in the run's folder, checked: a record this version cannot read (damaged, a status it
    does not write, another run's) is a RunError unless ``force=true``, never trained over (None: none there,
    or force)."""
    path = spec.run_dir / "result.json"
    try:
        old = read_record(spec.run_dir)
    except ValueError as e:  # UnicodeDecodeError included
        old, why = None, f"is not a readable run record ({e})"
    else:
        ours = {"task": spec.task, "attn": spec.attn.label, "seed": spec.seed}
        theirs = {k: old[k] for k in ours if k in old} if old else {}
        why = (
            f"holds another run's record ({theirs}, this run is {ours})"
            if any(v != ours[k] for k, v in theirs.items())
            else f"has status {old.get('status')!r}, which this version does not write"
            if old and old.get("status") not in STATUSES
            else None
        )
    if why and not spec.force:
        raise RunError(f"{path} {why}: move it aside, or pass force=true to run again and replace it")
    return None if spec.force else old


def _finished_record(spec: RunSpec) -> Record | None:
    """The record of a finished run in this folder (None: nothing to skip)."""
    old = _old_record(spec)
    if old and old.get("status") in FINISHED:
        renamed = ""
        if spec.name is not None and old.get("name") != spec.name:  # a label: the record alone changes
            was, old.name = old.get("name"), spec.name
            try:
                write_rank_zero(spec.run_dir, old)
                renamed = f"; relabelled name={spec.name!r} (was {was!r}), its training untouched"
            except (OSError, ValueError) as e:  # a record of an older schema, a read-only folder
                renamed = f"; name={spec.name!r} could not be applied ({e})"
        if old.get("execution", "paper") != spec.execution:  # the same function: its result stands
            renamed += f"; it ran under execution={old.get('execution', 'paper')}"
        log.info(
            "%s already holds a finished run (%s, test_acc %s)%s; pass force=true to run it again",
            spec.run_dir,
            old.get("status"),
            _fmt(old.get("test_acc")),
            renamed,
        )
        return old
    return None


def _prepare(spec: RunSpec, ckpt_dir: Path) -> None:
    _single_log_stream()
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    if spec.force and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)  # the checkpoints this harness wrote for the run being redone
    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    L.seed_everything(spec.seed, workers=True, verbose=False)


def checked_splits(spec: RunSpec, splits: dict[str, Split] | None = None) -> dict[str, Split]:
    """The task's splits (``splits``, or generated or tokenised on first use); raises a one-line ConfigError
    when the effective batch is larger than the training split."""
    splits = splits or load_task(spec.data.spec, spec.data.root)
    n = len(splits["train"])
    if spec.train.batch_size > n:  # every step would be the whole split, recorded as a batch it never was
        raise ConfigError(
            f"train.batch_size={spec.train.batch_size} is larger than the {n} training examples of "
            f"{spec.task}: set train.batch_size to at most {n}"
        )
    return splits


def _load_data(spec: RunSpec, rec: Record, splits: dict[str, Split] | None) -> dict[str, Split]:
    splits = checked_splits(spec, splits)
    rec.majority_acc = splits["test"].majority_rate()
    rec.split_sizes = {k: len(v) for k, v in splits.items()}
    rec.data = data_record(splits)  # what was read: id, kind, description (lra/data/provenance.py)
    return splits


def resume_step(last: Path, key: str) -> int | None:
    """The optimizer step ``last.ckpt`` continues from (None: no checkpoint, start afresh). Both it and the best
    checkpoint it names are read as data first (:func:`read_checkpoint`), so Lightning's restore gets only a
    checkpoint checked here, and a damaged ``best.ckpt`` is found now, not when the run tests it at its end."""
    if not last.exists():
        return None
    saved = read_checkpoint(last)
    if saved.get("resume_key") != key:
        raise RunError(
            f"{last} belongs to a run with another configuration, data or micro-batch (or an older "
            f"harness version); pass force=true to discard it and start again"
        )
    best = _best_of(saved, last.parent)
    if best is not None:
        if not best.exists():
            raise RunError(
                f"{best} is missing: it holds the run's best evaluation so far, which the run tests at its end. "
                f"Put it back, or pass force=true to discard the run's checkpoints and start again"
            )
        read_checkpoint(best)
    log.info("resuming from %s (optimizer step %d)", last, int(saved.get("global_step", 0)))
    return int(saved.get("global_step", 0))


def _best_of(saved: dict, ckpt_dir: Path) -> Path | None:
    """The best checkpoint that ``last.ckpt`` (``saved``) remembers, in the run's checkpoint folder as it is now
    (a runs root moved or copied: :func:`lra.protocol.moved`); None: no best evaluation yet."""
    for name, state in (saved.get("callbacks") or {}).items():
        if str(name).startswith(BestCheckpoint.__name__) and isinstance(state, dict) and state.get("best_model_path"):
            old = state.get("dirpath")
            here = moved(state, str(old), str(ckpt_dir)) if old else state
            return Path(here["best_model_path"])
    return None


def _started_execution(spec: RunSpec, last: Path) -> RunSpec:
    """An unfinished run continues under the execution it started with (its record's; a record from before
    ``execution=`` existed: paper): asked to run fast, a paper run continues as paper with a note saying so; a
    fast one asked for paper is refused in one line. ``force=true`` starts it over under the one asked for. No
    record: the resume key alone decides (a fast key never matches a paper one)."""
    before = _unfinished_record(spec.run_dir, last)
    started = before.get("execution", "paper")
    if "status" not in before or started == spec.execution:
        return spec
    note = (
        f"execution={spec.execution}: {last} continues under execution={started}, the execution it started with "
        f"(force=true starts it over under execution={spec.execution})"
    )
    switched = as_execution(spec, started, note)
    if switched.execution != started:
        raise RunError(
            f"{last} was trained under execution={started}, which this command does not run: add execution={started} "
            f"to resume it, or pass force=true to start it over under execution={spec.execution}"
        )
    return switched


def _unfinished_record(run_dir: Path, last: Path) -> Record:
    """The record of the run ``last.ckpt`` would continue (an empty one: none, or unreadable)."""
    try:
        return (read_record(run_dir) or Record()) if last.exists() else Record()
    except ValueError:
        return Record()


def _resume(last: Path, key: str, rec: Record, before: Record) -> int | None:
    """:func:`resume_step`; a checkpoint of a run on other data (another data id) says which data both are."""
    try:
        return resume_step(last, key)
    except RunError:
        old, new = before.get("data") or {}, rec.data or {}
        if old.get("id") and new.get("id") and old["id"] != new["id"]:
            raise RunError(
                f"{last} was trained on other data: {old.get('description')} (id {old['id']}); "
                f"this command reads {new.get('description')} (id {new['id']}). Restore that "
                f"data to resume, or pass force=true to start again on this data"
            ) from None
        raise


def _callback_fields(cb: Callbacks) -> dict:
    """What the run's callbacks add to its record: any callback may offer ``record_fields() -> dict`` (a
    search trial's pruning says ``stop_reason: pruned``; the collector treats it as an early stop)."""
    out: dict = {}
    for c in cb.all:
        if callable(getattr(c, "record_fields", None)):
            out.update(c.record_fields())
    return out


def _plan_fields(p: Plan) -> dict:
    return dict(
        micro_batch=p.micro_batch,
        accum_steps=p.accum_steps,
        effective_batch=p.effective_batch,
        devices=p.devices,
        accum_source=p.source,
        peak_mem_estimate_bytes=p.estimate_bytes,
        fit_budget_bytes=p.budget_bytes,
        fit_seconds=p.seconds,
    )


def _device_fields(spec: RunSpec, trainer: L.Trainer, p: Plan) -> dict:
    device = trainer.strategy.root_device
    tokens = spec.train.max_steps * p.effective_batch * spec.model.seq_len
    if device.type == "cpu" and tokens > CPU_TOKENS_PER_HOUR:
        log.warning(
            "Training %d steps of batch %d x %d tokens on a CPU takes hours (the progress lines give the ETA). "
            "For a run of a few minutes: make lra task=%s attn=%s ARGS='preset=quick'",
            spec.train.max_steps,
            p.effective_batch,
            spec.model.seq_len,
            spec.task,
            spec.attn.label,
        )
    if device.type == "cuda":
        limit_gpu_memory(device)  # lra.tools.sweep jobs_per_gpu=k: cap this run at its share of a shared GPU
        torch.cuda.reset_peak_memory_stats(device)
    if spec.hardware.compile_note:
        log.warning("%s", spec.hardware.compile_note)
    if spec.hardware.precision_setting == "16-mixed" and spec.hardware.precision != "16-mixed":
        log.warning(
            "trainer.precision=16-mixed runs as %s on a CPU (fp16 autocast is a GPU feature); the record " "says %s",
            spec.hardware.precision,
            spec.hardware.precision,
        )
    return {
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "loader_workers": spec.hardware.num_workers,
        "compiled": spec.hardware.compile,
        "compile_note": spec.hardware.compile_note,
    }


def _peak_memory(trainer: L.Trainer, p: Plan) -> dict:
    device = trainer.strategy.root_device
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device)
    return {
        "peak_mem_bytes": peak,
        **({"peak_mem_estimate_error": peak / p.estimate_bytes - 1.0} if p.estimate_bytes else {}),
    }


def _warn_about(rec: Record, cb: Callbacks) -> None:
    if rec.status in ("failed", "stuck"):
        (log.error if rec.status == "failed" else log.warning)("%s", rec.reason)
    if cb.guard.at_chance and rec.status != "stuck":
        log.warning(
            "the last validation was at chance level (loss %.4f, accuracy %.4f, majority %.4f): the run "
            "may be stuck (train.stuck_after_steps stops such runs)",
            *cb.guard.last_val,
            cb.guard.majority_acc,
        )


def _finish(spec: RunSpec, rec: Record, trainer: L.Trainer | None) -> None:
    write_rank_zero(spec.run_dir, rec)
    if trainer is not None and trainer.is_global_zero:
        log_record(trainer.loggers, rec.to_json(), spec.run_dir)  # to W&B, if among the loggers
    if getattr(rank_zero_only, "rank", 0) != 0:
        return
    last = spec.run_dir / "checkpoints" / "last.ckpt"
    if rec.status in FINISHED and last.exists():
        last.unlink()  # the run is over; best.ckpt stays
    log.info(
        "%s seed %d: %s, test acc %s (majority %.4f), %d steps, %.1f s training -> %s",
        spec.where,
        spec.seed,
        rec.status,
        _fmt(rec.test_acc),
        rec.majority_acc,
        rec.steps,
        rec.train_time_s or 0.0,
        spec.run_dir / "result.json",
    )


def _single_log_stream() -> None:
    """Lightning adds its own console handler; under Hydra the root logger already prints (and writes
    the run's log file), so drop Lightning's handler and every message appears once, in both places."""
    if logging.getLogger().handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            lg = logging.getLogger(name)
            for h in list(lg.handlers):
                lg.removeHandler(h)
            lg.propagate = True


def _fmt(x):
    return f"{x:.4f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a" if x is None else repr(x)


# ---------------------------------------------------------------------------------------------
# Entry


def run_task(cfg: DictConfig, spec: RunSpec | None = None, splits: dict[str, Split] | None = None) -> float | None:
    """The run of one composed config in its folder (Hydra's job folder), under the exit policy (:func:`ending`):
    a clear line and exit code for everything the user can act on. ``spec`` and ``splits``: the run and its
    data as :func:`check_before_run` resolved and loaded them from this very config (None: done here, as
    under ``python -m lra.train -m``)."""
    try:
        rec = run(spec or resolve(cfg, HydraConfig.get().runtime.output_dir), splits)
    except BaseException as e:
        end = ending(e, _command(), Path(HydraConfig.get().runtime.output_dir) / "checkpoints" / "last.ckpt")
        if end.code is None:
            raise
        _exit(end.code, "%s", end.line)
    if rec.get("status") == "failed":  # exit 1, as the README says: a script must not take it for done
        _exit(
            1,
            "the run failed: %s (record: %s)",
            rec.get("reason"),
            Path(HydraConfig.get().runtime.output_dir) / "result.json",
        )
    return rec.get("best_val_acc")  # the objective for Hydra sweepers (a record may predate the field)


# Hydra's own command line (--help, --cfg job, -m): the same task under @hydra.main.
_hydra_main = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(run_task)


def _command() -> str:
    """The command line that started this run (what resumes it), without the harness's own run_tag."""
    args = [a for a in HydraConfig.get().overrides.task if not a.startswith(HARNESS_OVERRIDES)]
    return shlex.join(["python", "-m", "lra.train", *args])


def _exit(code: int, fmt: str, *args) -> None:
    log.error(fmt, *args)
    sys.exit(code)


def check_writable(folder: Path) -> None:
    """Hydra writes the run folder before any of our code runs: refuse a runs root we cannot write."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        ok = os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        ok = False
    if not ok:
        raise ConfigError(
            f"runs_root={str(folder)!r} cannot be written: set LRA_RUNS (or runs_root=) to a folder " f"you can write"
        )


def check_before_run(args: list[str]) -> tuple[DictConfig, RunSpec, dict[str, Split] | None]:
    """Everything the user can get wrong, checked before the run folder exists: every value, the loggers,
    the callbacks, the runs root, the data (prepared here if absent) against the batch. Returns the run's
    config, composed once (with its ``hydra`` node, as ``@hydra.main`` would) and given its folder's tag
    (:func:`lra.naming.run_tag`), the spec resolved once from it, which is what the run trains, and the
    splits it trains on (None: the folder holds a finished run, which needs no data to be skipped)."""
    cfg = compose_checked(args, job="train")
    spec = resolve(without_hydra(cfg))
    check_loggers(spec.logger)  # logger=tensorboard without its package: one line, nothing written
    check_callbacks(spec)  # callbacks.<name>._target_ that is not an importable Lightning callback: one line
    check_devices(spec.hardware.accelerator, spec.hardware.devices_arg)  # what this machine has, not a traceback
    check_roots(spec.data.root, spec.config["runs_root"])  # a file, a path too long: one line
    check_writable(Path(spec.config["runs_root"]))
    tag = run_tag(args, spec)  # the folder named by the resolved config (tag: [A-Za-z0-9_.,=+-])
    with open_dict(cfg):
        cfg.run_tag = tag
    # hydra.run.dir: the named folder, or the one a sweep's job gives; the spec resolving cfg again would give
    spec = dataclasses.replace(spec, run_dir=run_dir_of(cfg), config={**spec.config, "run_tag": tag})
    root = Path(spec.config["runs_root"]).resolve()
    if not spec.run_dir.resolve().is_relative_to(root):  # what force=true deletes is the harness's, in its root
        raise ConfigError(
            f"the run folder {spec.run_dir} is outside runs_root={str(root)!r}: set runs_root= to hold it"
        )
    check_run_folder(spec.run_dir)  # its checkpoints a file, its result.json a folder: one line, before any work
    old = _old_record(spec)  # a record it cannot read: one line before any work
    if old and old.get("status") in FINISHED:
        return cfg, spec, None
    return cfg, spec, checked_splits(spec)


def main() -> None:
    try:
        args = hydra_args()
        renamed_overrides(args)  # experiment=, semantics=: one line naming the new spelling, under -m too
        if wants_hydra_itself(args):  # Hydra's own flags (--help, -m, --cfg) go to Hydra
            hand_to_hydra(args)
            _hydra_main()
            return
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
        with sigterm_raises():  # as Ctrl-C: the data's temporary folders go
            cfg, spec, splits = check_before_run(args)
            check_lockable(spec.run_dir)  # a file system without flock: one line before Hydra makes the folder
        run_in_folder(cfg, lambda task_cfg: run_task(task_cfg, spec, splits), job_name="train")  # composed once
    except BaseException as e:  # before the run started (its own exits are run_task's)
        end = ending(e)
        if end.code is None:
            raise
        print(end.line, file=sys.stderr)
        sys.exit(end.code)


if __name__ == "__main__":
    main()
