"""Evaluate a saved run: ``python -m lra.evaluate <run folder | checkpoint> [split=test|val] [ckpt=best|last]``
(``lra-evaluate``, ``make eval run=<folder>``).

The run's configuration is the one its record holds (``result.json``'s ``config``, resolved as it ran; a run
folder without a record falls back to ``.hydra/overrides.yaml``, composed against today's conf/), resolved by
:func:`lra.config.resolve` into the same model and data split the run trained. The checkpoint's weights are read
as data (``torch.load(weights_only=True)``: a runs folder from elsewhere is never unpickled as code), checked
against the model the configuration builds, and evaluated with the run's own metric code (``LitLRA``'s
``test/acc``, ``val/acc``, via ``Trainer.test`` / ``Trainer.validate``). The result goes to
``<run folder>/evals/<split>-<ckpt>.json`` (atomically); the run's own files are not touched. The data root is
the run's where it still exists, else ``$LRA_DATA``. docs/evaluate.md.

Bad input (no such folder, no checkpoint, a split that is not test or val, ...) is one line and exit code 2,
before any model or data is built.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from lra.cli import Parser

SPLITS = ("test", "val")
CKPTS = ("best", "last")
EXIT_USAGE = 2
log = logging.getLogger("lra.evaluate")


class EvalError(ValueError):
    """Input this command cannot evaluate: the message is the one line to print (exit 2)."""


@dataclass(frozen=True)
class Target:
    """What to evaluate, checked: the run folder, its checkpoint file, the split, and the run's record."""

    run_dir: Path
    ckpt: Path
    split: str
    record: dict | None  # result.json (None: the folder has none, its .hydra/overrides.yaml says the config)

    @property
    def name(self) -> str:
        return self.ckpt.stem  # best | last | another file's name in checkpoints/


# ---------------------------------------------------------------------------------------------
# The command line, checked before any work


def parse(argv: list[str] | None = None) -> tuple[str, dict]:
    p = Parser(
        prog="python -m lra.evaluate",
        usage="python -m lra.evaluate RUN_FOLDER|CHECKPOINT [split=test|val] [ckpt=best|last]",
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
        help="a run folder, or a checkpoint file inside "
        "<run folder>/checkpoints/; then split=test|val (test), ckpt=best|last (best)",
    )
    a = p.parse_intermixed_args(argv)
    opts = dict(o.split("=", 1) for o in a.args if o.startswith(("split=", "ckpt=")))
    targets = [o for o in a.args if not o.startswith(("split=", "ckpt="))]
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
        if path.resolve().parent.name != "checkpoints" or not _is_run_folder(run_dir):
            raise EvalError(
                f"{target}: its run folder cannot be found (a checkpoint lives in <run folder>/checkpoints/, "
                f"beside result.json or .hydra/)"
            )
    else:
        run_dir = path.resolve()
        if not _is_run_folder(run_dir):
            raise EvalError(f"{target}: not a run folder (no result.json nor .hydra/overrides.yaml in it)")
        ckpt = run_dir / "checkpoints" / f"{ckpt_name or 'best'}.ckpt"
        if not ckpt.is_file():
            have = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
            raise EvalError(
                f"{target}: no checkpoint {ckpt.name} in it "
                + (f"(it has {', '.join(have)})" if have else "(it has no checkpoint)")
                + ("; a finished run keeps best.ckpt only" if ckpt.name == "last.ckpt" else "")
            )
    try:
        record = _read_json(run_dir / "result.json") if (run_dir / "result.json").exists() else None
    except ValueError as e:
        raise EvalError(f"{run_dir / 'result.json'} is not a readable run record ({e})") from None
    if record is not None and not isinstance(record.get("config"), dict):
        raise EvalError(f"{run_dir / 'result.json'} holds no config: the run's configuration is unknown")
    return Target(run_dir, ckpt, split, record)


def _is_run_folder(folder: Path) -> bool:
    return (folder / "result.json").is_file() or (folder / ".hydra" / "overrides.yaml").is_file()


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if not isinstance(raw, dict):
        raise ValueError(f"top level is {type(raw).__name__}, not an object")
    return raw


# ---------------------------------------------------------------------------------------------
# The run, rebuilt


def run_spec(t: Target):
    """The run's :class:`lra.config.RunSpec`: its record's resolved config (or its overrides, composed), in its
    folder; the data root is the one the run read where it still exists, else ``$LRA_DATA`` (or the default)."""
    import dataclasses

    from omegaconf import OmegaConf

    from lra.config import DataSpec, compose_checked, container, resolve
    from lra.files import data_root

    if t.record is not None:
        cfg = OmegaConf.create(t.record["config"])
    else:
        overrides = OmegaConf.to_container(OmegaConf.load(t.run_dir / ".hydra" / "overrides.yaml"))
        cfg = compose_checked([str(o) for o in overrides or []])
    spec = resolve(cfg, t.run_dir)
    run_root = (t.record or {}).get("config", {}).get("data_root")
    root = Path(run_root) if run_root and Path(run_root).is_dir() else data_root()
    return dataclasses.replace(spec, data=DataSpec.of(container(cfg.task), root))


def load_weights(ckpt: Path) -> dict:
    """The checkpoint, read as data only (tensors, numbers, strings): nothing in it is run."""
    import torch

    try:
        saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - damaged, or not a checkpoint of this harness: one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise EvalError(f"{ckpt} cannot be read as a checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("state_dict"), dict):
        raise EvalError(f"{ckpt} holds no model weights (no state_dict)")
    return saved


def evaluate(t: Target) -> dict:
    """Evaluate ``t`` and write its record; returns it."""
    import lightning as L
    import torch

    from lra.config import ConfigError, resolve_precision
    from lra.data import DataError, data_record, load_task
    from lra.data.module import LRADataModule
    from lra.files import git_commit, write_json
    from lra.module import LitLRA

    try:
        spec = run_spec(t)
    except ConfigError as e:
        raise EvalError(f"{t.run_dir}: the run's configuration does not resolve here ({e})") from None
    saved = load_weights(t.ckpt)
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
    except DataError as e:
        raise EvalError(f"the run's data cannot be read: {e}") from None
    data = data_record(splits)
    run_data = (t.record or {}).get("data") or {}
    same_data = bool(data and run_data.get("id") and data.get("id") == run_data.get("id"))
    if run_data.get("id") and not same_data:
        log.warning(
            "the data read now (%s) is not the data the run read (%s): the accuracy may differ from the record's",
            (data or {}).get("id"),
            run_data.get("id"),
        )

    hw = spec.hardware
    cuda = torch.cuda.is_available()
    accelerator = hw.accelerator if cuda or hw.accelerator in ("auto", "cpu") else "cpu"
    precision = hw.precision if accelerator == hw.accelerator else resolve_precision(hw.precision_setting, False)
    batch = spec.train.eval_batch_size or (t.record or {}).get("micro_batch") or hw.micro_batch or 32
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
    result = {
        "split": t.split,
        "ckpt": t.ckpt.relative_to(t.run_dir).as_posix(),
        "ckpt_name": t.name,
        "step": int(saved.get("global_step", 0)),
        "acc": float(out[f"{t.split}/acc"]),
        "loss": float(out[f"{t.split}/loss"]),
        "count": int(out[f"{t.split}/count"]),
        "record_acc": recorded_acc(t),
        "data": data,
        "data_matches_run": same_data if run_data.get("id") else None,
        "data_root": str(spec.data.root),
        "task": spec.task,
        "attn": spec.attn.label,
        "seed": spec.seed,
        "precision": precision,
        "eval_batch_size": batch,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch_version": str(torch.__version__),
        "git_commit": git_commit(),
        "config_from": "result.json" if t.record is not None else ".hydra/overrides.yaml",
        "eval_time_s": seconds,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(t.run_dir / "evals" / f"{t.split}-{t.name}.json", result)
    return result


def _mismatch(lit, state: dict) -> tuple[list[str], list[str]]:
    own = lit.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(own[k].shape) != tuple(getattr(state[k], "shape", ()))]
    return missing + wrong, unexpected


def recorded_acc(t: Target) -> float | None:
    """What the run's record says for this split and checkpoint: ``test_acc`` for the checkpoint it tested
    (``tested_ckpt``), ``best_val_acc`` for best.ckpt (the validation that made it best); None otherwise."""
    rec = t.record or {}
    if t.split == "test" and rec.get("tested_ckpt") == t.name:
        return rec.get("test_acc")
    if t.split == "val" and t.name == "best":
        return rec.get("best_val_acc")
    return None


def line(t: Target, r: dict) -> str:
    said = r["record_acc"]
    says = f"the run's record says {said:.4f}" if said is not None else f"the run's record has no {t.split} acc of it"
    return (
        f"{t.run_dir}: {t.split} acc {r['acc']:.4f} (loss {r['loss']:.4f}, {r['count']} examples) from "
        f"{t.ckpt.name} at step {r['step']}; {says}"
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
    print(line(t, result))


if __name__ == "__main__":
    main()
