"""Find and read every run record (``result.json``) under a runs root into one pandas table.

Bad input is reported, never fatal and never averaged silently:

* a record that is not valid JSON or not an object, a ``result.json`` that is a folder, a pipe or too large,
  or a record whose fields the collector cannot use: skipped, and listed as ``unreadable`` with why (the
  other records are collected);
* a record from an older schema (no ``schema_version``, or fields missing): fields that the resolved
  ``config`` or the run folder's path can tell (task, attention, seed, preset, effective batch, time per
  1k steps) are filled from there, the rest stay missing; listed as ``old_schema`` with what was done;
* a run folder (``.hydra/``, ``metrics.csv``, ``train.log`` ...) without ``result.json``: ``no_record``
  (still running, killed, or crashed before it could write one);
* two records for the same preset, task, attention, variant and seed: the newest finished one is kept
  (finished beats failed, then the newer ``result.json`` modification time, then the path), the
  others are listed as ``duplicate`` with the path of the one kept;
* a metric that is NaN, infinite, null, not a number, or impossible (an accuracy outside [0, 1], a
  negative step count, time or memory, a time per step or throughput that is not positive) in a
  finished run: set to missing and listed as ``nan_metric``; means count only valid values, and
  every table cell shows how many seeds it averages;
* a seed that is not an integer (record field or ``seed<N>`` folder, e.g. ``seed1.5``): the run is not
  counted (``unusable``), since it is no seed of the plain row;
* a record of a ``debug=<name>`` run (``debug`` field; conf/debug/): never read into the tables, listed as
  ``skipped`` with the debug run's name (a check of the pipeline, not a problem: the reports list it apart).

Accuracies and losses are the run's float32 values: they are read at the digits a float32 holds (0.52, not
0.5199999809265137), so every output rounds the same number once. A run's ``overrides`` are read from its
record's resolved ``config`` (:func:`lra.tools.collect.rows.overrides`), never from its folder's tag, which
is cut and hashed past 200 characters.

Runs whose status is not ``completed``, ``stopped_early`` or ``stuck`` (failed, interrupted, still
``running`` ...) never enter a mean; they are listed with their reason in the failed-runs table.
``stuck`` runs (trained, but at chance level) are a real outcome: they are counted, and listed.

Semantics (docs/fidelity.md): a run's ``preset`` column is its preset where it ran the preset's own
semantics (paper for the ``*_paper`` presets, clean for the others) and ``<preset>+<semantics>``
where it did not, so tables never average paper and clean runs; records from before the switch
(no ``semantics``) ran the harness's corrections and count as clean.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lra.record import CORE, SCHEMA_VERSION, Record  # the newest run-record schema this reader knows
from lra.tags import flat, spelled
from lra.tools.collect.rows import overrides

# Finished runs (= lra.train.FINISHED). "stuck" (training ran, but stayed at chance level) is a real
# outcome the papers count too (YOSO Table 3: Performer 18.80 on ListOps): it enters the means and is
# listed among the issues so that nobody mistakes it for a working run.
OK_STATUSES = ("completed", "stopped_early", "stuck")
UNFINISHED_REASON = {"running": "status 'running': still training, or killed before it wrote its final record"}
RUN_MARKERS = (".hydra", "metrics.csv", "train.log", "hparams.yaml", "checkpoints", ".sweep_job.json")
# a run's own sub-folders, never a run of their own: the loggers' (lra/loggers.py), Hydra's, checkpoints
SKIP_DIRS = (".hydra", "checkpoints", "wandb", "tensorboard", "lightning_logs", "__pycache__")
# the record's field groups (lra/record.py GROUPS) this reader checks and converts
NUMERIC = ("seed", *Record.fields_in("measured"), "test_loss")  # in runs.csv's order
TEXT = Record.fields_in("text")
EXPECTED = Record.fields_in("expected")
FLOAT32 = Record.fields_in("float32")
FRACTION = Record.fields_in("fraction")
NON_NEGATIVE = Record.fields_in("non_negative")
POSITIVE = Record.fields_in("positive")
# what identifies a row beyond task and attention (lra/tools/collect/rows.py), and what the tables say about it
CONTEXT = (
    "tag",
    "overrides",
    "name",
    "data_id",
    "data_kind",
    "data_desc",
    "study",
    "grid",
    "search_params",
    "objective",
    "load_note",
)
CONTEXT_NUMERIC = ("trial", "max_length", "max_steps")
COLUMNS = (
    "path",
    "preset",
    "semantics",
    "task",
    "attn",
    "variant",
    "seed",
    "status",
    "reason",
    "usable",
    "kept",
    "schema_version",
    *[c for c in NUMERIC if c != "seed"],
    "attn_backend",
    "hardware",
    "device",
    "git_commit",
    "execution",
    *CONTEXT,
    *CONTEXT_NUMERIC,
    "loaded",
    "stuck",
)

_SEED_DIR = re.compile(r"^seed(-?\d+)$")
# seed1.5, seed1e3 ...: a seed folder whose seed is a number but no integer
_BAD_SEED_DIR = re.compile(r"^seed([-+]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+))$")


@dataclass(frozen=True)
class Issue:
    path: str  # run folder relative to the runs root
    # skipped (a debug run) | unreadable | old_schema | newer_schema | no_record | duplicate | nan_metric | unusable |
    # stuck | plot
    kind: str
    detail: str


def discover(root: Path, exclude: tuple[Path, ...] = ()) -> tuple[list[Path], list[Path]]:
    """(record files, run folders without a record) under ``root``, both sorted."""
    root = Path(root)
    excluded = {Path(e).resolve() for e in exclude}
    records, orphans = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here.resolve() in excluded:
            dirnames[:] = []
            continue
        if "result.json" in filenames or "result.json" in dirnames:  # a folder of that name: listed as unreadable
            records.append(here / "result.json")
        elif any(m in filenames or m in dirnames for m in RUN_MARKERS):
            orphans.append(here)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and d != "result.json" and not d.startswith("."))
    return sorted(records), sorted(orphans)


def _rel(path: Path, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix() or "."
    except ValueError:
        return Path(path).as_posix()


def _from_path(rel: str) -> dict:
    """preset/<semantics>/task/attn/seed<N>[/variant...] (the layout lra.train writes; before the
    semantics level: preset/task/attn/seed<N>), or {} for another layout."""
    parts = rel.split("/")
    for i in range(3, len(parts)):
        m = _SEED_DIR.match(parts[i])
        if m:
            out = dict(
                preset=parts[i - 3],
                task=parts[i - 2],
                attn=parts[i - 1],
                seed=int(m.group(1)),
                variant="/".join(parts[i + 1 :]),
            )
            if i >= 4 and parts[i - 3] in SEMANTICS:
                out.update(preset=parts[i - 4], semantics=parts[i - 3])
            return out
    return {}


SEMANTICS = ("clean", "paper")


def table_set(preset: str, semantics: str) -> str:
    """The name a run's tables go under: the preset, with ``+<semantics>`` where the run did not have
    the preset's own semantics (paper for the ``*_paper`` presets, clean otherwise), so the two are
    never averaged: ``skeinformer_paper`` (their code's semantics), ``skeinformer_paper+clean``."""
    own = "paper" if preset.endswith("_paper") else "clean"
    return preset if semantics == own else f"{preset}+{semantics}"


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _number(x) -> tuple[float, str | None]:
    """(value, problem): NaN with a reason when x is not a finite number."""
    if x is None:
        return math.nan, "null"
    if isinstance(x, bool):
        return math.nan, f"boolean {x!r}"
    if isinstance(x, (int, float)):
        v = float(x)
    else:
        try:
            v = float(str(x).strip())
        except ValueError:
            return math.nan, f"not a number ({str(x)[:30]!r})"
    if not math.isfinite(v):
        return math.nan, repr(v)
    return v, None


def _impossible(key: str, v: float) -> str | None:
    """Why a finite value of field ``key`` cannot be, or None."""
    if key in FRACTION and not 0.0 <= v <= 1.0:
        return f"{v!r} outside [0, 1]"
    if key in NON_NEGATIVE and v < 0:
        return f"{v!r} negative"
    if key in POSITIVE and v <= 0:
        return f"{v!r} not positive"
    return None


def _seed_problem(raw_seed, rel: str) -> str | None:
    """Why this run's seed is no integer seed (record field or a ``seed1.5`` folder), or None."""
    for part in rel.split("/"):
        if _BAD_SEED_DIR.match(part):
            return f"run folder {part!r} names a seed that is not an integer"
    if isinstance(raw_seed, bool):
        return f"seed {raw_seed!r} is not an integer"
    if isinstance(raw_seed, (int, float, str)):
        v, problem = _number(raw_seed)
        if problem is None and v != int(v):
            return f"seed {raw_seed!r} is not an integer"
    return None


def normalise(record: Record, rel: str) -> tuple[dict, list[Issue]]:
    """One record in the current schema's field names and units (accuracies as fractions); what an older
    record lacks is derived where its config or folder tells, and reported."""
    issues: list[Issue] = []
    raw = record.to_json()  # the fields the file holds, no more
    rec = dict(raw)
    version = rec.get("schema_version")
    version = int(version) if isinstance(version, (int, float)) and not isinstance(version, bool) else 0
    cfg = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    from_path = _from_path(rel)
    filled, missing = [], []
    derive = {
        "task": lambda: _get(cfg, "task", "name") or from_path.get("task"),
        "attn": lambda: _get(cfg, "attn", "label") or _get(cfg, "attn", "name") or from_path.get("attn"),
        "seed": lambda: _get(cfg, "seed") if _get(cfg, "seed") is not None else from_path.get("seed"),
        "preset": lambda: _get(cfg, "preset") or from_path.get("preset"),
        "effective_batch": lambda: (
            rec["micro_batch"] * rec["accum_steps"]
            if isinstance(rec.get("micro_batch"), (int, float)) and isinstance(rec.get("accum_steps"), (int, float))
            else _get(cfg, "train", "batch_size")
        ),
        "time_per_1k_steps_s": lambda: (
            rec["train_time_s"] / rec["steps"] * 1000
            if isinstance(rec.get("train_time_s"), (int, float))
            and isinstance(rec.get("steps"), (int, float))
            and rec["steps"]
            else None
        ),
    }
    for key, fn in derive.items():
        if key not in rec:
            value = fn()
            if value is not None:
                rec[key] = value
                filled.append(key)
    required = (*CORE, "preset")
    missing = [k for k in required if k not in rec]
    if "status" not in rec:
        acc, _ = _number(rec.get("test_acc"))
        rec["status"] = "completed" if math.isfinite(acc) else "unknown"
        filled.append(f"status={rec['status']!r} (from test_acc)")
    if version < SCHEMA_VERSION or missing or filled:
        parts = [f"schema_version {version if 'schema_version' in raw else 'absent'}"]
        if filled:
            parts.append("derived " + ", ".join(filled))
        if missing:
            parts.append("missing " + ", ".join(missing))
        issues.append(Issue(rel, "old_schema", "; ".join(parts)))
    elif version > SCHEMA_VERSION:
        issues.append(
            Issue(
                rel,
                "newer_schema",
                f"schema_version {version} > {SCHEMA_VERSION}: read the fields " f"this collector knows",
            )
        )

    out = {"path": rel, "schema_version": version, "variant": from_path.get("variant", "")}
    for key in TEXT:
        v = rec.get(key)
        out[key] = None if v is None else str(v)
    status = (out["status"] or "unknown").strip()
    out["status"] = status
    usable = status in OK_STATUSES
    if status in UNFINISHED_REASON and not out["reason"]:
        out["reason"] = UNFINISHED_REASON[status]
    if status == "stuck":
        issues.append(Issue(rel, "stuck", f"counted in the means at its test accuracy: {out['reason'] or 'stuck'}"))
    bad = []
    for key in NUMERIC:
        v, problem = _number(rec.get(key))
        if problem is None:
            problem = _impossible(key, v)
            v = v if problem is None else math.nan
        if key in FLOAT32 and problem is None and v == float(np.float32(v)):
            v = float(str(np.float32(v)))  # the digits the float32 holds: 0.5199999809265137 -> 0.52
        out[key] = v
        if not usable or problem is None or key not in rec:
            continue
        if key in EXPECTED or key == "seed":
            if key == "peak_mem_bytes" and problem == "null" and str(rec.get("device", "")).startswith("cpu"):
                continue  # the contract: no measured peak memory on a CPU
            bad.append(f"{key} {problem}")
        elif problem != "null":  # optional fields (throughput, memory estimate) may be null, never wrong
            bad.append(f"{key} {problem}")
    if bad:
        issues.append(
            Issue(
                rel,
                "nan_metric",
                "finished run with " + ", ".join(bad) + ": left out of those means (cells show the seeds they average)",
            )
        )
    if not out["task"] or not out["attn"]:
        usable = False
        why = "cannot tell the task or the attention (no field, config or run-folder layout says)"
        out["reason"] = out["reason"] or why
        issues.append(Issue(rel, "unusable", why))
    elif usable and not math.isfinite(out["seed"]):
        usable = False
        why = "finished run without a seed: cannot be told apart from other seeds"
        out["reason"] = out["reason"] or why
        issues.append(Issue(rel, "unusable", why))
    elif usable and (seed_problem := _seed_problem(rec.get("seed"), rel)):
        # seeds are integers (lra.train rejects others): a seed1.5 run is no seed of the plain row
        usable = False
        why = f"{seed_problem}: not counted (seeds are integers)"
        out["reason"] = out["reason"] or why
        issues.append(Issue(rel, "unusable", why))
    # records from before the semantics switch ran the harness's corrections: clean
    semantics = rec.get("semantics") or _get(cfg, "semantics") or from_path.get("semantics") or "clean"
    out["semantics"] = str(semantics)
    out["preset"] = table_set(out["preset"] or "unknown", out["semantics"])
    out["usable"] = usable
    out["stuck"] = status == "stuck" or rec.get("stuck_at_end") is True  # ended at the majority-class rate
    out.update(context(rec, cfg, out["variant"]))
    out["_cfg"] = _flat(cfg)
    q = rec.get("quirks")  # what the preset's quirks set for this backend: its own values, no override
    out["_quirks"] = _flat(q) if isinstance(q, dict) and q else {}
    return out, issues


def _flat(node) -> dict:
    """A resolved config as {dotted key: value as its run tag spells it} (lra.tags)."""
    return {k: spelled(v) for k, v in flat(node).items()}


def _text(x) -> str:
    return "" if x is None else str(x)


def loaded(machine) -> tuple[object, str]:
    """(True / False / None for unknown, why) from a record's ``machine`` field: its ``loaded``, which the run
    decided when it wrote the record (the one rule: lra.devices.machine_loaded), and what made it so."""
    if not isinstance(machine, dict) or not isinstance(machine.get("loaded"), bool):
        return None, ""
    why = []
    if isinstance(machine.get("cpu_others"), (int, float)):
        why.append(f"other processes used {100 * machine['cpu_others']:.0f}% of the CPU while it trained")
    share = machine.get("gpu_share")
    if isinstance(share, (int, float)) and 0 < share < 1:
        why.append(f"GPU shared ({share:.2g} of it)")
    if isinstance(machine.get("devices"), list) and len(machine["devices"]) > 1:
        why.append(
            f"its stretches trained on {len(machine['devices'])} devices: {', '.join(map(str, machine['devices']))}"
        )
    return machine["loaded"], "; ".join(why) if machine["loaded"] else ""


def context(rec: dict, cfg: dict, variant: str) -> dict:
    """The fields that place a run in a row and describe its cell: overrides, name, data, search, load."""
    tag = _get(cfg, "run_tag")
    data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
    search = rec.get("search") if isinstance(rec.get("search"), dict) else {}
    is_loaded, note = loaded(rec.get("machine"))
    params = search.get("params")
    trial, _ = _number(search.get("trial")) if search else (math.nan, None)
    out = {
        "tag": tag if isinstance(tag, str) else variant,
        "overrides": "",  # from every record's config at once: load_runs
        "name": _text(rec.get("name")),
        "data_id": _text(data.get("id")),
        "data_kind": _text(data.get("kind")),
        "data_desc": _text(data.get("description")),
        "study": _text(search.get("study")),
        "grid": _text(search.get("grid")),
        "search_params": json.dumps(params, sort_keys=True) if isinstance(params, dict) else "",
        "objective": _text(search.get("objective")),
        "load_note": note,
        "trial": trial,
        "loaded": is_loaded,
    }
    task = _get(cfg, "task") or {}
    length = task.get("max_length") if isinstance(task, dict) else None
    out["max_length"] = _number(length if length is not None else _get(cfg, "task", "seq_len"))[0]
    out["max_steps"] = _number(_get(cfg, "train", "max_steps"))[0]
    return out


MAX_RECORD_BYTES = 16 * 2**20  # a record is a few kB; more is no record (and would fill the memory)


class _Unusable(Exception):
    """Why a ``result.json`` cannot be read as a record (its message follows "result.json")."""


def _read(f: Path) -> Record:
    """The record in ``f``, any schema version (what it lacks stays absent); :class:`_Unusable` if it is no
    record: a folder, not a regular file (a pipe would never end), too large, not JSON, not an object."""
    if f.is_dir():
        raise _Unusable("is a folder, not a file")
    try:
        st = f.stat()
    except OSError as e:
        raise _Unusable(f"cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    if not f.is_file():
        raise _Unusable("is not a regular file")
    if st.st_size > MAX_RECORD_BYTES:
        raise _Unusable(f"is {st.st_size / 2**20:.0f} MiB, no run record (a record is a few kB)")
    try:
        return Record.from_json(json.loads(f.read_bytes().decode("utf-8")))
    except OSError as e:
        raise _Unusable(f"cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep, not an object
        raise _Unusable(f"is no valid record ({type(e).__name__}: {str(e)[:120]})") from None


def load_runs(root: Path, exclude: tuple[Path, ...] = ()) -> tuple[pd.DataFrame, list[Issue]]:
    """Every record under ``root`` (one row each, ``kept`` False for superseded duplicates) and the issues."""
    root = Path(root)
    records, orphans = discover(root, exclude)
    rows, issues, mtimes, cfgs = [], [], [], []
    for f in records:
        rel = _rel(f.parent, root)
        try:
            raw = _read(f)
            if raw.get("debug"):  # debug=<name> (conf/debug/): a check of the pipeline, never a result
                issues.append(
                    Issue(
                        rel,
                        "skipped",
                        f"debug run (debug={raw.get('debug')}): a check, not a result; not in the tables",
                    )
                )
                continue
            row, found = normalise(raw, rel)
        except _Unusable as e:
            issues.append(Issue(rel, "unreadable", f"result.json {e}: skipped"))
            continue
        except Exception as e:  # one record the collector cannot use never stops the others
            issues.append(Issue(rel, "unreadable", f"result.json: {type(e).__name__}: {str(e)[:120]}: skipped"))
            continue
        issues += found
        cfgs.append((row.pop("_cfg"), row.pop("_quirks")))
        rows.append(row)
        try:
            mtimes.append(f.stat().st_mtime_ns)
        except OSError:
            mtimes.append(0)
    for d in orphans:
        issues.append(
            Issue(
                _rel(d, root),
                "no_record",
                "run folder without result.json (still running, killed, " "or crashed before writing it)",
            )
        )
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "kept"])
    df["kept"] = True
    df["usable"] = df["usable"].astype(bool)  # also with no rows, so masks stay masks
    for c in ("schema_version", *NUMERIC, *CONTEXT_NUMERIC):
        df[c] = df[c].astype(float)
    for c in ("path", "variant", *TEXT, *CONTEXT, "loaded"):
        df[c] = df[c].astype(object)
    df["stuck"] = df["stuck"].astype(bool)
    if len(df):
        df["_mtime"] = mtimes
        issues += _resolve_duplicates(df)
        df = df.drop(columns="_mtime")
        df["overrides"] = overrides(df, cfgs)
    df = df[list(COLUMNS)].sort_values("path", kind="stable").reset_index(drop=True)
    issues.sort(key=lambda i: (i.path, i.kind, i.detail))
    return df, issues


def _resolve_duplicates(df: pd.DataFrame) -> list[Issue]:
    """Mark all but one record per (preset, task, attn, variant, data, name, seed) as not kept; report them."""
    issues = []
    key = ["preset", "task", "attn", "variant", "data_id", "name", "seed"]
    valid = df["task"].notna() & df["attn"].notna() & df["seed"].notna()
    for _, g in df[valid].groupby(key, sort=True, dropna=False):
        if len(g) < 2:
            continue
        order = g.assign(_u=~g["usable"], _m=-g["_mtime"]).sort_values(["_u", "_m", "path"], kind="stable")
        keep = order.index[0]
        for i in order.index[1:]:
            df.loc[i, "kept"] = False
            issues.append(
                Issue(
                    df.loc[i, "path"],
                    "duplicate",
                    f"same preset/task/attn/seed as {df.loc[keep, 'path']}, which is kept "
                    f"(finished before failed, then newest result.json)",
                )
            )
    return issues


def issues_frame(issues: list[Issue]) -> pd.DataFrame:
    return pd.DataFrame([(i.path, i.kind, i.detail) for i in issues], columns=["path", "kind", "detail"])


def failed_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs that did not finish (failed, interrupted, running ...), with why."""
    bad = runs[~runs["usable"]].copy()
    bad["reason"] = bad["reason"].fillna("(no reason recorded)")
    bad["note"] = ""
    bad.loc[~bad["kept"], "note"] = "superseded by a duplicate"
    cols = ["preset", "task", "attn", "seed", "status", "reason", "note", "path"]
    return bad[cols].sort_values(["preset", "task", "attn", "seed", "path"], kind="stable").reset_index(drop=True)
