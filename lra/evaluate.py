"""Evaluate a saved run: ``python -m lra.evaluate <run folder | checkpoint> [split=test|val] [ckpt=best|last]``
(``lra-evaluate``, ``make eval run=<folder>``).

The run's record (``result.json``: its ``config`` resolved as it ran) is data: :func:`lra.config.resolve` rebuilds
the run from it, importing code it names (``attn.target``, a ``_target_``) only when this command line names it
too; the data root is the user's. The checkpoint (:func:`lra.protocol.read_checkpoint`, read as data) must carry
the run's resume key; ``LitLRA``'s own metric code evaluates it. The accuracy is printed, then written to
``<run folder>/evals/<split>-<ckpt>.json``; the run's own files are not touched. docs/evaluate.md.

Bad input is one line and exit code 2, before the run is evaluated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from lra import checks
from lra.cli import Parser

SPLITS = ("test", "val")
CKPTS = ("best", "last")
OPTION = re.compile(r"(split|ckpt|attn\.target|[\w.]+\._target_)=")  # the rest is the run folder (its name may hold =)
EXIT_USAGE = 2
FINISHED_LAST = "; a finished run keeps best.ckpt only (its model at stop is not kept): evaluate best.ckpt instead"


class EvalError(ValueError):
    """Input this command cannot evaluate: the message is the one line to print (exit 2)."""


@dataclass(frozen=True)
class Target:
    """What to evaluate, checked: the run folder, its checkpoint file, the split, and the run's record."""

    run_dir: Path
    ckpt: Path
    split: str
    record: dict  # result.json
    config: dict  # its config, less the nodes evaluating never builds (loggers, callbacks)

    @property
    def name(self) -> str:
        return self.ckpt.stem  # best | last | another file's name in checkpoints/


# ---------------------------------------------------------------------------------------------
# The command line, checked before any work


def parse(argv: list[str] | None = None) -> tuple[str, dict]:
    p = Parser(
        prog="python -m lra.evaluate",
        usage="python -m lra.evaluate RUN_FOLDER|CHECKPOINT [split=test|val] [ckpt=best|last] [attn.target=M:C]",
        description="Evaluate a run folder's checkpoint (or a checkpoint file) on its test or validation split, "
        "with the run's own configuration, data and metric code; writes <run folder>/evals/<split>-<ckpt>.json.",
        epilog="examples (also lra-evaluate, make eval run=<folder>):\n"
        "  python -m lra.evaluate runs/quick/clean/listops/softmax/seed0\n"
        "  python -m lra.evaluate runs/quick/clean/listops/softmax/seed0 split=val\n"
        "  python -m lra.evaluate runs/quick/clean/listops/softmax/seed0/checkpoints/last.ckpt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "args",
        nargs="*",  # a missing folder is this command's one line, after argparse has refused unknown flags
        metavar="ARG",
        help="a run folder, or a checkpoint file inside <run folder>/checkpoints/; then split=test|val (test), "
        "ckpt=best|last (best), and the code the run's record names (attn.target=<module>:<Class>), to import it",
    )
    a = p.parse_intermixed_args(argv)
    opts = dict(o.split("=", 1) for o in a.args if OPTION.match(o))
    targets = [o for o in a.args if not OPTION.match(o)]
    if len(targets) != 1:
        raise EvalError(
            f"give one run folder or checkpoint file, then split=test|val and ckpt=best|last (got {targets})"
            if targets
            else "give a run folder or a checkpoint file"
        )
    return targets[0], opts


def check(target: str, opts: dict) -> Target:
    """The run folder, checkpoint and split the command line names, each checked (:class:`EvalError`)."""
    split = opts.get("split", "test")
    if split not in SPLITS:
        raise EvalError(f"split={split!r}: a split is test or val")
    ckpt_name = opts.get("ckpt")
    if ckpt_name is not None and ckpt_name not in CKPTS:
        raise EvalError(f"ckpt={ckpt_name!r}: a checkpoint is best or last")
    path = Path(target).expanduser()
    if not path.exists():
        raise EvalError(f"{target}: no such run folder or checkpoint file")
    if path.is_file():
        if path.suffix != ".ckpt":
            raise EvalError(f"{target}: not a checkpoint (.ckpt) file nor a run folder")
        if ckpt_name is not None and ckpt_name != path.stem:
            raise EvalError(f"ckpt={ckpt_name} names another checkpoint than the file {path.name}: give one of them")
        run_dir, ckpt = path.resolve().parent.parent, path.resolve()
        if path.resolve().parent.name != "checkpoints" or not (run_dir / "result.json").is_file():
            raise EvalError(
                f"{target}: its run folder cannot be found (a checkpoint lives in <run folder>/checkpoints/, "
                f"beside result.json)"
            )
    else:
        run_dir = path.resolve()
        if not (run_dir / "result.json").is_file():  # a run writes it before its first checkpoint
            raise EvalError(f"{target}: not a run folder (no result.json, the run's record, in it)")
        ckpt = run_dir / "checkpoints" / f"{ckpt_name or 'best'}.ckpt"
        if not ckpt.is_file():
            have = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
            raise EvalError(
                f"{target}: no checkpoint {ckpt.name} in it "
                + (f"(it has {', '.join(have)})" if have else "(it has no checkpoint)")
                + (FINISHED_LAST if ckpt.name == "last.ckpt" else "")
            )
    if (run_dir / "evals").is_symlink():
        raise EvalError(f"{run_dir / 'evals'}: evals is a link; evaluating writes inside the run folder only")
    return Target(run_dir, ckpt, split, *_record(run_dir / "result.json", opts))


def _record(path: Path, opts: dict) -> tuple[dict, dict]:
    """The run's record and the config evaluating resolves, checked (:class:`EvalError`): the fields the resume
    key takes, no code the command line does not name (``opts``), no interpolation."""
    try:
        record = _read_json(path)
        config = record.get("config")
        checks.check(isinstance(config, dict), "config", config, "the run's configuration")
        checks.integer("micro_batch", record.get("micro_batch"), 1)
        checks.integer("accum_steps", record.get("accum_steps"), 1)
        checks.integer("devices", record.get("devices"), 1)
        checks.text("precision", record.get("precision"))
        checks.check(isinstance(record.get("data") or {}, dict), "data", record.get("data"), "the data record")
    except ValueError as e:  # ConfigError included
        raise EvalError(f"{path} is not a readable run record ({e})") from None
    config = {k: v for k, v in config.items() if k not in ("callbacks", "logger")}  # evaluating builds neither
    leaves = _leaves(config)
    code = {
        k: str(v) for k, v in leaves.items() if v is not None and (k == "attn.target" or "_target_" in k.split("."))
    }
    named = {k: v for k, v in opts.items() if k not in ("split", "ckpt")}
    for key, value in code.items():
        if named.get(key) != value:
            raise EvalError(
                f"{path}: the run's record names code to import ({key}={value}), which evaluating the run would "
                f"run: add {key}={value} to this command line to allow it"
            )
    if extra := sorted(set(named) - set(code)):
        raise EvalError(
            f"{extra[0]}={named[extra[0]]}: the run's record names no such code (it names {code or 'none'})"
        )
    for key, value in leaves.items():  # a record's config is resolved: ${...} would read this machine's settings
        if "${" in str(value):  # (a data folder outside the data root: lra.tasks refuses it when resolved)
            raise EvalError(f"{path}: {key}={value!r} is not what a run records (an interpolation)")
    return record, config


def _leaves(config: dict) -> dict:
    """Every value of a nested config by its dotted key (``attn.target``, ``logger.wandb._target_``)."""
    out, todo = {}, [("", config)]
    while todo:  # a loop, not recursion: a record from elsewhere may nest deeply
        key, node = todo.pop()
        if isinstance(node, (dict, list)):
            pairs = node.items() if isinstance(node, dict) else enumerate(node)
            todo += [(f"{key}.{k}".lstrip("."), v) for k, v in pairs]
        else:
            out[key] = node
    return out


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if not isinstance(raw, dict):
        raise ValueError(f"top level is {type(raw).__name__}, not an object")
    return raw


# ---------------------------------------------------------------------------------------------
# The run, rebuilt


def run_spec(t: Target):
    """The run's :class:`lra.config.RunSpec`: its record's config, under the execution it ran, in its folder; the
    data root is the user's (``$LRA_DATA``, else the default) and the loader workers this machine's."""
    from omegaconf import OmegaConf

    import attention
    from lra.config import resolve

    target = (t.config.get("attn") or {}).get("target")
    if target is not None:  # named on this command line too (check): the user's choice
        attention.load_external(str(target))
    trainer = {**t.config["trainer"], "num_workers": "auto"}
    cfg = {**t.config, "data_root": None, "execution": t.record.get("execution", "paper"), "trainer": trainer}
    return resolve(OmegaConf.create(cfg), t.run_dir)


def evaluate(t: Target) -> dict:
    """Evaluate ``t``; returns its record (not written: :func:`main` prints, then writes it)."""
    import lightning as L
    import torch

    from lra.config import resolve_precision
    from lra.data import DataError, data_record, fingerprint, load_task
    from lra.data.module import LRADataModule
    from lra.files import git_commit
    from lra.module import LitLRA
    from lra.protocol import RunError, read_checkpoint

    try:
        spec = run_spec(t)
        trained_on = dataclasses.replace(spec.hardware, precision=t.record["precision"], devices=t.record["devices"])
        as_run = dataclasses.replace(spec, hardware=trained_on)  # as its key was computed, on the machine it ran
    except Exception as e:  # a record from elsewhere, whatever it holds: one line
        said = (str(e).strip().splitlines() or [""])[0]
        raise EvalError(
            f"{t.run_dir}: the run's configuration does not resolve here ({said or type(e).__name__})"
        ) from None
    try:
        saved = read_checkpoint(t.ckpt)
    except RunError as e:
        raise EvalError(str(e).split("; pass force=true")[0]) from None
    step = saved.get("global_step")
    if not isinstance(saved.get("state_dict"), dict) or type(step) is not int:
        raise EvalError(f"{t.ckpt} holds no model weights of a run (its state_dict or global_step is missing or odd)")
    lit = LitLRA(spec.model, spec.train)
    missing, unexpected = _mismatch(lit, saved["state_dict"])
    if missing or unexpected:
        raise EvalError(
            f"{t.ckpt} does not fit the model of the run's configuration (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    lit.load_state_dict(saved["state_dict"], strict=True)
    try:
        splits = load_task(spec.data.spec, spec.data.root)
    except (DataError, OSError, ValueError) as e:
        raise EvalError(f"the run's data cannot be read from {spec.data.root} ($LRA_DATA): {e}") from None
    data, rec = data_record(splits), t.record
    if saved.get("resume_key") != as_run.resume_key(rec["micro_batch"], rec["accum_steps"], fingerprint(splits)):
        read = (rec.get("data") or {}).get("id")
        why = (
            f"the run read other data, id {read}, than {spec.data.root} holds, id {data['id']}: set LRA_DATA to a "
            f"root with the run's data"
            if read not in (None, data["id"])
            else "another run's checkpoint, or one of another harness version: evaluate it in its own run folder"
        )
        raise EvalError(f"{t.ckpt} is not the checkpoint of this run: its resume key is not the run's ({why})")

    hw = spec.hardware
    cuda = torch.cuda.is_available()
    accelerator = hw.accelerator if cuda or hw.accelerator in ("auto", "cpu") else "cpu"
    precision = hw.precision if accelerator == hw.accelerator else resolve_precision(hw.precision_setting, False)
    batch = spec.train.eval_batch_size or rec["micro_batch"]
    dm = LRADataModule(splits, batch_size=batch, eval_batch_size=batch, seed=spec.seed, num_workers=hw.num_workers)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=t.run_dir / "evals",
    )
    start = time.perf_counter()
    run = trainer.test if t.split == "test" else trainer.validate
    out = run(lit, datamodule=dm, verbose=False)[0]
    seconds = time.perf_counter() - start
    device = trainer.strategy.root_device
    return {
        "split": t.split,
        "ckpt": t.ckpt.relative_to(t.run_dir).as_posix(),
        "ckpt_name": t.name,
        "step": step,
        "acc": float(out[f"{t.split}/acc"]),
        "loss": float(out[f"{t.split}/loss"]),
        "count": int(out[f"{t.split}/count"]),
        "record_acc": recorded_acc(t, step)[0],
        "data": data,
        "data_root": str(spec.data.root),
        "task": spec.task,
        "attn": spec.attn.label,
        "seed": spec.seed,
        "precision": precision,
        "eval_batch_size": batch,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch_version": str(torch.__version__),
        "git_commit": git_commit(),
        "execution": spec.execution,
        "eval_time_s": seconds,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _mismatch(lit, state: dict) -> tuple[list[str], list[str]]:
    own = lit.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(own[k].shape) != tuple(getattr(state[k], "shape", ()))]
    return missing + wrong, unexpected


def recorded_acc(t: Target, step: int) -> tuple[float | None, str]:
    """What the run's record says of this split and checkpoint, and the words for it: ``test_acc`` where its test
    measured best.ckpt (``tested_ckpt: best``), ``best_val_acc`` on val, both of best.ckpt at ``steps_to_best``;
    nothing to compare with otherwise (``tested_ckpt: last`` is the model at stop, which no kept file holds)."""
    rec, key = t.record, "test_acc" if t.split == "test" else "best_val_acc"
    if t.name != "best" or step != rec.get("steps_to_best") or (t.split == "test" and rec.get("tested_ckpt") != "best"):
        return None, f"the run's record has no {t.split} acc of {t.ckpt.name} at step {step}: nothing to compare with"
    said = rec.get(key)
    if isinstance(said, bool) or not isinstance(said, (int, float)) or not math.isfinite(said):
        return None, f"the run's record's {key} {said!r} is not a number: not compared"
    return float(said), f"the run's record says {said:.4f}"


def line(t: Target, r: dict) -> str:
    return (
        f"{t.run_dir}: {t.split} acc {r['acc']:.4f} (loss {r['loss']:.4f}, {r['count']} examples) from "
        f"{t.ckpt.name} at step {r['step']}; {recorded_acc(t, r['step'])[1]}"
    )


def main(argv: list[str] | None = None) -> None:
    try:
        t = check(*parse(argv))
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
        quiet = ("lightning", "lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero")
        for name in quiet:  # Lightning's banner lines (GPU available, tips) are not the answer
            logging.getLogger(name).setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # Lightning's own deprecation, not the user's
        result = evaluate(t)
    except EvalError as e:
        print(f"lra.evaluate: error: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    print(line(t, result), flush=True)  # the answer first: a folder that cannot be written loses only the file
    from lra.files import write_json

    out = t.run_dir / "evals" / f"{t.split}-{t.name}.json"
    try:
        write_json(out, result)
    except OSError as e:
        print(f"lra.evaluate: error: the accuracy above was not saved: {out} cannot be written ({e})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
