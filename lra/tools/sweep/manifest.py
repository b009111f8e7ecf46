"""The sweep's manifest: its jobs, their statuses and run folders, written atomically; and the lock that keeps one
driver per sweep."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lra.files import write_json
from lra.runlock import LockUnsupported, RunLocked, hold
from lra.tools.sweep.base import MANIFEST_VERSION, MARKER, Refusal
from lra.tools.sweep.jobs import now_iso, read_json, run_status

log = logging.getLogger("lra.tools.sweep")


# ----------------------------------------------------------------------------- manifest
@dataclass
class Job:
    overrides: list[str]
    run_dir: Path | None = None
    task: str | None = None
    attn: str | None = None
    seed: int | None = None
    preset: str | None = None
    error: str | None = None
    status: str = "pending"
    record: dict = field(default_factory=dict)
    data: tuple | None = None  # (task config, data root): what lra.data prepares for it
    hw: dict | None = None  # its hardware profile and trainer.devices (jobs_per_gpu shares)
    train: dict | None = None  # max_steps, eval_every, patience: the work it has (lra.tools.sweep.cost)
    rel: str = ""  # its run folder under the runs root, for messages
    cfg: object = None  # its composed configuration (a probe places itself as the job would)

    def refresh(self) -> None:
        if self.run_dir is not None:
            self.status, self.record = run_status(self.run_dir)

    def row(self, root: Path) -> dict:
        r = self.record
        marker = read_json(self.run_dir / MARKER) if self.run_dir else None
        return {
            "run_dir": rel_path(self.run_dir, root) if self.run_dir else None,
            "overrides": self.overrides,
            "task": self.task,
            "attn": self.attn,
            "seed": self.seed,
            "status": self.status,
            "error": self.error,
            "reason": r.get("reason"),
            "test_acc": r.get("test_acc"),
            "best_val_acc": r.get("best_val_acc"),
            "steps": r.get("steps"),
            "train_time_s": r.get("train_time_s"),
            "attempts": (marker or {}).get("attempts", 0),
        }


def rel_path(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def counts(jobs: list[Job]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        key = "invalid" if j.error else j.status
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def find_manifest(folder: Path, key: str, keep_aside: bool = True) -> tuple[Path, dict]:
    """(the sweep's manifest ``manifest-<key>.json``, what an earlier invocation left in it; damaged: kept aside,
    see :func:`read_manifest`)."""
    path = folder / f"manifest-{key}.json"
    return path, read_manifest(path, keep_aside=keep_aside)


def read_manifest(path: Path, keep_aside: bool = True) -> dict:
    """The manifest at ``path`` ({} when there is none). One that cannot be read (cut short, not JSON, not
    an object) is never written over: it is renamed to ``<name>.damaged-<UTC time>`` beside it (its
    invocation history stays there for the user), one line says so, and a new manifest starts.
    ``keep_aside=False`` (dry_run): nothing is renamed, {} is returned. Call it holding :func:`sweep_lock`."""
    path = Path(path)
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except OSError as e:  # unreadable, not damaged: the user's to fix, nothing renamed
        raise Refusal(
            f"lra.tools.sweep: cannot read the sweep's manifest {path} ({e.strerror or e}): make it a readable "
            "file again, then run the same command again"
        )
    except ValueError:
        why = "not JSON"
    else:
        if isinstance(body, dict):
            return body
        why = f"a JSON {type(body).__name__}, not an object"
    if keep_aside:
        aside = path.with_name(f"{path.name}.damaged-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S.%fZ}")
        os.replace(path, aside)  # the same folder: a rename, never a copy that could fail half-way
        print(
            f"lra.tools.sweep: manifest {path} is damaged ({why}): kept as {aside}; starting a new one",
            file=sys.stderr,
            flush=True,
        )
    return {}


def write_manifest(path: Path, head: dict, jobs: list[Job], root: Path, previous: dict | None = None) -> None:
    """Every job's row as its folder says now; ``previous``: what to carry over when ``path`` is new."""
    old = read_manifest(path) or previous or {}
    body = {
        "schema_version": MANIFEST_VERSION,
        "created": old.get("created") or now_iso(),
        "updated": now_iso(),
        "runs_root": str(root),
        **head,
        "invocations": old.get("invocations", []),
        "counts": counts(jobs),
        "jobs": [j.row(root) for j in jobs],
    }
    if head.get("invocation"):
        body["invocations"] = body["invocations"] + [head["invocation"]]
        del body["invocation"]
    write_json(path, body)


@contextlib.contextmanager
def sweep_lock(folder: Path):
    """One driver per sweep: the run folders' own lock (:func:`lra.runlock.hold`, a kernel ``flock`` that is
    released however its holder ends) on the sweep's folder. A second driver of the same sweep stops at
    once with one line (exit 75) instead of waiting."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(hold(folder))
        except RunLocked as e:
            raise Refusal(f"lra.tools.sweep: this sweep is already being driven: {e}", code=75) from None
        except LockUnsupported as e:
            raise Refusal(f"lra.tools.sweep: {e}") from None
        yield
