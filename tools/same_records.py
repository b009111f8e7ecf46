"""Do a fixed set of quick runs give the same records as before a refactor? (issue 28's check)

    python tools/same_records.py run  <folder>   # the runs below into <folder>/runs, tables into <folder>/tables
    python tools/same_records.py diff <before> <after>

``run`` trains a few short runs (ListOps x softmax, skeinformer, seed 0 under the quick preset; one with
an override; one paper-preset run of a few steps), collects them, and writes <folder>/normalised.json:
each record without what differs from run to run (times, load, commit, the folder's absolute path),
each metrics.csv without its time and throughput columns, and the tables' CSV without timing columns.
``diff`` compares two such files key by key and exits 1 on any difference. RENAMED maps keys that a
refactor renamed on purpose (old -> new), so those compare as equal; DROPPED the keys of ``before`` it removed
on purpose.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the runs: (label, overrides); the preset is named by PRESET_KEY so a renamed group needs one edit here
PRESET_KEY = "preset"
RUNS = [
    ("softmax", ["task=listops", "attn=softmax", f"{PRESET_KEY}=quick", "train.max_steps=24", "train.eval_every=12"]),
    (
        "skeinformer",
        ["task=listops", "attn=skeinformer", f"{PRESET_KEY}=quick", "train.max_steps=24", "train.eval_every=12"],
    ),
    (
        "override",
        [
            "task=listops",
            "attn=skeinformer",
            f"{PRESET_KEY}=quick",
            "train.max_steps=24",
            "train.eval_every=12",
            "train.lr=0.002",
        ],
    ),
    (
        "paper",
        [
            "task=listops",
            "attn=skeinformer",
            f"{PRESET_KEY}=skeinformer_paper",
            "train.max_steps=4",
            "train.warmup=2",
            "train.eval_every=2",
            "train.batch_size=8",
            "train.eval_batch_size=100",
            "task.generator.n_train=512",
            "task.generator.n_val=100",
            "task.generator.n_test=100",
        ],
    ),
]
VOLATILE = {
    "train_time_s",
    "time_per_1k_steps_s",
    "tokens_per_s",
    "git_commit",
    "machine",
    "fit_seconds",
    "torch_version",
    "started",
    "finished",
    "wall_s",
    "host",
}
# keys that hold a time, in the records and in the tables' columns: compared by neither run nor diff
TIMED = ("eval_time_s", "min_per_1k", "train_min", ":hours")
# the tables' columns of the machine a run had, not of the code: the commit (-dirty in a worktree) and the load
ENVIRONMENT = (".git_commit", ".load_note")
# old key path -> new key path, for keys a refactor renamed on purpose
RENAMED: dict[str, str] = {}
# key paths a refactor removed on purpose: the `protocol` relay node (issue 41: a protocol file writes the run's
# own train.* and task.* keys, which hold the same values)
DROPPED = (".config.protocol.",)


def _clean(x, root: str):
    if isinstance(x, dict):
        return {k: _clean(v, root) for k, v in sorted(x.items()) if k not in VOLATILE}
    if isinstance(x, list):
        return [_clean(v, root) for v in x]
    if isinstance(x, str):
        return x.replace(root, "<ROOT>")
    return x


def _csv(path: Path, drop) -> list[dict]:
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    return [{k: v for k, v in r.items() if not drop(k)} for r in rows]


def run(folder: Path) -> None:
    runs = folder / "runs"
    env = {**os.environ, "LRA_RUNS": str(runs), "PYTHONPATH": str(ROOT)}
    for label, ovs in RUNS:
        cmd = [sys.executable, "-m", "lra.train", *ovs, "num_threads=1", "trainer.progress=false"]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lra.tools.collect",
            "--runs",
            str(runs),
            "--out",
            str(folder / "tables"),
            "--no-plots",
            "--no-html",
            "--format",
            "csv",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    out: dict = {}
    for rec in sorted(runs.rglob("result.json")):
        rel = str(rec.parent.relative_to(runs))
        out[f"record {rel}"] = _clean(json.loads(rec.read_text()), str(runs))
        out[f"metrics {rel}"] = _csv(rec.parent / "metrics.csv", lambda k: k.startswith(("time/", "throughput/")))
    timing = ("time", "memory", "speed", "peak", "tokens", "throughput", "loaded")
    for table in sorted((folder / "tables").rglob("*.csv")):
        out[f"table {table.relative_to(folder / 'tables')}"] = _csv(table, lambda k: any(t in k for t in timing))
    (folder / "normalised.json").write_text(json.dumps(out, indent=1, sort_keys=True))
    print(f"{len(out)} items -> {folder / 'normalised.json'}")


def _flat(x, prefix=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _flat(v, f"{prefix}[{i}]")
    else:
        yield prefix, x


def diff(before: Path, after: Path) -> int:
    a = dict(_flat(json.loads((before / "normalised.json").read_text())))
    b = dict(_flat(json.loads((after / "normalised.json").read_text())))
    a = {k: v for k, v in a.items() if not any(d in k for d in DROPPED)}
    for old, new in RENAMED.items():
        a = {k.replace(old, new): v for k, v in a.items()}
    a, b = ({k: v for k, v in d.items() if not any(t in k for t in TIMED + ENVIRONMENT)} for d in (a, b))
    bad = 0
    for k in sorted(set(a) | set(b)):
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            bad += 1
            print(f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
    print(f"{len(set(a) | set(b))} values compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve())
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
