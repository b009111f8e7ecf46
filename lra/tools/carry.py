"""``python -m lra.tools.carry``: carry a GPU window's unfinished runs to the next machine; ship finished ones.

A GPU window (docs/gpu.md) is a bare node for 10-15 minutes that brings back at most 8 files of at most
16 MiB. ``pack`` puts every run that has not finished (whole folders, checkpoints included), the records of
the finished ones (so the next window's sweep skips them; no checkpoints) and the sweep manifests and rates
into ``runs.tar.gz.partNN`` + ``runs.sha256`` + ``pack.json``; ``unpack`` checks the checksum, extracts them
as data (files and folders only, nothing outside the runs root) and never replaces a run folder that is
already there; the same command then resumes each run from ``checkpoints/last.ckpt``. ``export`` copies the
finished runs' small files (record, metrics, log, config) under ``results/<device>/``. A refusal is one line
on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import io
import os
import re
import shlex
import shutil
import socket
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

from lra.cli import Parser
from lra.files import git_commit, write_atomic, write_json, write_text
from lra.record import read_record
from lra.runlock import holder_pid
from lra.tools.sweep.base import FINISHED
from lra.tools.sweep.cost import COST_DIR, device_slug
from lra.tools.sweep.jobs import carried

PROG = "python -m lra.tools.carry"
TARBALL, CHECKSUM, INFO = "runs.tar.gz", "runs.sha256", "pack.json"
MAX_FILES, MAX_MIB = 8, 16  # what one window brings back
SMALL = ("result.json", "metrics.csv", "train.log", ".hydra/config.yaml", ".hydra/overrides.yaml")  # export
MARKERS = ("result.json", "metrics.csv", "train.log", ".hydra", "checkpoints", ".sweep_job.json")  # a run folder
LAST = "checkpoints/last.ckpt"
EXAMPLES = f"""examples:
  {PROG} pack runs --out window-out                  # unfinished runs, finished records, manifests: <= 8 files
  {PROG} unpack carry/listops-seed0 --runs runs      # on the next machine, then run the same command again
  {PROG} export runs --to results                    # finished runs' record, metrics, log and config"""


class Refusal(Exception):
    """The command's one line of refusal (exit 2 unless told)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- the runs root
class Tree:
    """What a runs root holds: run folders with their own files (not those of a run nested in them), the files
    under ``<preset>/sweeps/`` (no ``.submitit``) and the sweeps' measured rates (``.cost/``, read by the next
    window's estimates) in ``sweeps``, and the other files. Hidden folders other than ``.hydra`` and the root's
    ``.cost`` (``.fit-cache``, ``.submitit``, a carry's temporary folder) and ``.lock`` files are never read."""

    def __init__(self, root: Path):
        self.root = root
        self.runs: dict[str, list[str]] = {}  # run folder -> its own files, paths relative to the root
        self.sweeps: list[str] = []
        self.other: list[str] = []
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            rel = here.relative_to(root).as_posix()
            keep = (".hydra", COST_DIR) if rel == "." else (".hydra",)  # the sweep's rates travel with its runs
            dirnames[:] = sorted(d for d in dirnames if d in keep or not d.startswith("."))
            if any((here / m).exists() for m in MARKERS) and not _in_sweeps(rel):
                self.runs[rel] = []
            files += [f"{rel}/{f}".removeprefix("./") for f in sorted(filenames) if f != ".lock"]
        for f in files:
            owner = max((r for r in self.runs if r == "." or f.startswith(r + "/")), key=len, default=None)
            if os.path.islink(root / f):
                self.other.append(f)
            elif _in_sweeps(f) or f.startswith(COST_DIR + "/"):
                self.sweeps.append(f)
            elif owner is not None:
                self.runs[owner].append(f)
            else:
                self.other.append(f)


def _record(run_dir: Path) -> dict:
    """``{"status", "steps", "device"}`` of the record in ``run_dir`` (status ``no record`` / ``unreadable``)."""
    try:
        rec = read_record(run_dir)
    except (OSError, ValueError):
        return {"status": "unreadable", "steps": None, "device": None}
    if rec is None:
        return {"status": "no record", "steps": None, "device": None}
    return {"status": rec.get("status"), "steps": rec.get("steps"), "device": rec.get("device")}


def _is_record_file(run: str, rel: str) -> bool:
    """What a finished run travels with: its record, metrics, log, config and sweep marker, not its checkpoints."""
    own = rel[len(run) + 1 :] if run != "." else rel
    return own in (*SMALL, ".hydra/hydra.yaml", ".sweep_job.json")


def _in_sweeps(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) > 1 and parts[1] == "sweeps"


def _umask() -> int:
    mask = os.umask(0)  # os.umask can only be read by setting it
    os.umask(mask)
    return mask


def _folder(path: Path, what: str) -> None:
    if not path.is_dir():
        raise Refusal(f"{path} is no folder: give {what}")


def _unfinished(tree: Tree) -> dict[str, dict]:
    """The runs to carry (:func:`lra.tools.sweep.jobs.carried`, what a budgeted sweep reports it carries)."""
    out = {}
    for run in tree.runs:
        if not carried(tree.root / run):
            continue
        info = _record(tree.root / run)
        pid = holder_pid(tree.root / run)
        if pid is not None:
            raise Refusal(
                f"{run} is still in use by pid {pid}: stop it first (kill -TERM {pid} writes its interrupted "
                "record and keeps last.ckpt), then pack"
            )
        out[run] = {"path": run, **info, "last_ckpt": (tree.root / run / LAST).is_file()}
    return out


# ----------------------------------------------------------------------------- pack
def pack(root: Path, out: Path, part_mib: float) -> int:
    _folder(root, "the runs root to pack (the folder holding <preset>/<semantics>/...)")
    if not 0 < part_mib <= MAX_MIB:
        raise Refusal(f"--part-mib {part_mib:g}: give a size above 0 and at most {MAX_MIB} (MiB a window brings back)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Refusal(f"--out {out} exists and is not an empty folder: give a new or empty folder")
    tree = Tree(root)
    runs = _unfinished(tree)
    if not runs:
        print(f"lra.tools.carry pack: nothing unfinished under {root}: no pack written")
        return 0
    # the finished runs' records (never their checkpoints), so that the next window's sweep skips them
    done = {run: [f for f in files if _is_record_file(run, f)] for run, files in tree.runs.items() if run not in runs}
    done = {run: files for run, files in done.items() if _record(tree.root / run)["status"] in FINISHED}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the pack is shared like any output
    try:
        joined = tmp / TARBALL
        with tarfile.open(joined, "w:gz", compresslevel=6) as tar:
            for rel in (
                [f for run in runs for f in tree.runs[run]] + [f for fs in done.values() for f in fs] + tree.sweeps
            ):
                tar.add(root / rel, arcname=rel, recursive=False)
        size, part = joined.stat().st_size, max(1, int(part_mib * 2**20))
        n_parts = -(-size // part)
        if n_parts + 2 > MAX_FILES:
            raise Refusal(
                f"the pack is {size / 2**20:.1f} MiB: {n_parts} parts of {part_mib:g} MiB + {CHECKSUM} + {INFO} "
                f"= {n_parts + 2} files, and a window brings back at most {MAX_FILES} files of {MAX_MIB} MiB: "
                f"pack fewer runs (another runs root) or raise --part-mib (at most {MAX_MIB})"
            )
        digest, names = hashlib.sha256(), []
        with open(joined, "rb") as f:
            while chunk := f.read(part):
                digest.update(chunk)
                names.append(f"{TARBALL}.part{len(names):02d}")
                (tmp / names[-1]).write_bytes(chunk)
        joined.unlink()
        write_text(tmp / CHECKSUM, f"{digest.hexdigest()}  {TARBALL}\n")
        info = {
            "runs": list(runs.values()),
            "finished": sorted(done),  # their records only: the next window's sweep skips them
            "manifests": tree.sweeps,
            "git_commit": git_commit(),
            "host": socket.gethostname(),
            "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "tarball": {"name": TARBALL, "bytes": size, "sha256": digest.hexdigest(), "parts": names},
        }
        write_json(tmp / INFO, info)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in runs.values():
        print(f"packed {r['path']}: {r['status']}, {r['steps']} steps, last.ckpt {'yes' if r['last_ckpt'] else 'no'}")
    print(
        f"lra.tools.carry pack: {len(runs)} runs to resume, the records of {len(done)} finished ones (no checkpoints: "
        f"the next window skips them) and {len(tree.sweeps)} sweep files, {size / 2**20:.2f} MiB in {len(names)} "
        f"parts -> {out}"
    )
    return 0


# ----------------------------------------------------------------------------- unpack
def _parts(folder: Path) -> list[Path]:
    found = {p: re.fullmatch(rf"{re.escape(TARBALL)}\.part(\d+)", p.name) for p in folder.iterdir()}
    parts = sorted((int(m.group(1)), p) for p, m in found.items() if m)
    whole = folder / TARBALL
    if parts and whole.exists():
        raise Refusal(f"{folder} holds both {TARBALL} and its parts: keep one of them")
    if not parts:
        if not whole.is_file():
            raise Refusal(f"{folder} holds no {TARBALL}.partNN nor {TARBALL}: give the folder pack wrote")
        return [whole]
    missing = sorted(set(range(parts[-1][0] + 1)) - {i for i, _ in parts})
    if missing:
        raise Refusal(f"{folder} lacks {TARBALL}.part{missing[0]:02d}: fetch every part of the pack")
    return [p for _, p in parts]


def _expected_sum(folder: Path) -> str:
    path = folder / CHECKSUM
    if not path.is_file():
        raise Refusal(
            f"{folder} holds no {CHECKSUM}: a pack is checked before it is unpacked; give the folder pack wrote"
        )
    m = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](\S+)\s*", path.read_text(errors="replace"))
    if not m or Path(m.group(2)).name != TARBALL:
        raise Refusal(f"{path} is not one line '<sha256>  {TARBALL}' (sha256sum's format): fetch it again")
    return m.group(1).lower()


def _check_member(m: tarfile.TarInfo) -> str | None:
    """The member's path, None to skip it (``.``); a Refusal when it is anything but a plain file or folder
    inside the runs root."""
    name = m.name.removeprefix("./").rstrip("/")
    if not (m.isfile() or m.isdir()):
        raise Refusal(f"the pack's member {m.name!r} is no plain file or folder (a link?): nothing unpacked")
    if m.name.startswith("/") or ".." in Path(name).parts or "\\" in name:
        raise Refusal(f"the pack's member {m.name!r} points outside the runs root: nothing unpacked")
    return name if name not in ("", ".") else None


def _move(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


def unpack(folder: Path, runs_root: Path) -> int:
    _folder(folder, "the folder that holds the pack (runs.tar.gz.partNN and runs.sha256)")
    expected, parts = _expected_sum(folder), _parts(folder)
    if runs_root.exists() and not runs_root.is_dir():
        raise Refusal(f"--runs {runs_root} is no folder: give the runs root to unpack into")
    data = b"".join(p.read_bytes() for p in parts)  # a pack is at most 8 files of 16 MiB
    if hashlib.sha256(data).hexdigest() != expected:
        raise Refusal(f"the pack in {folder} does not match its {CHECKSUM} (a part is damaged): nothing unpacked")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = [m for m in tar.getmembers() if _check_member(m)]  # every member, before anything is written
    except (tarfile.TarError, OSError, EOFError) as e:
        raise Refusal(f"the pack in {folder} does not read as a tar.gz ({e}): nothing unpacked") from None
    runs_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=runs_root, prefix=".carry-unpack-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, members=members, filter="data")
        return _place(Tree(tmp), runs_root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _place(tree: Tree, runs_root: Path) -> int:
    """Move each run and manifest of the extracted ``tree`` into ``runs_root``, keeping what is already there."""
    placed, kept = [], 0
    for run, files in sorted(tree.runs.items()):
        dest, info = runs_root / run, _record(tree.root / run)
        if any((dest / m).exists() for m in MARKERS):
            there = _record(dest)
            print(
                f"kept the existing {run} (its record: {there['status']}, {there['steps']} steps; "
                f"the pack's: {info['status']}, {info['steps']} steps): not replaced"
            )
            kept += 1
            continue
        for f in files:
            _move(tree.root / f, runs_root / f)
        placed.append(run)
        print(f"unpacked {run}: {info['status']}, {_resumes_at(dest / LAST)}")
    for f in tree.sweeps:
        if (runs_root / f).exists():
            print(f"kept the existing {f}: not replaced")
        else:
            _move(tree.root / f, runs_root / f)
    if tree.other:
        print(f"not unpacked: {len(tree.other)} files outside run folders and sweeps (e.g. {tree.other[0]})")
    print(f"lra.tools.carry unpack: {len(placed)} runs into {runs_root} ({kept} kept as they were)")
    resumable = [run for run in placed if _record(runs_root / run)["status"] not in FINISHED]
    for run in resumable:
        print(f"resume: {_resume_command(runs_root, run)}")
    if resumable:
        print("(or re-run the same sweep command; each run resumes from its checkpoints/last.ckpt)")
    return 0


def _resumes_at(last: Path) -> str:
    """Where the run continues: its ``last.ckpt``'s optimizer step, read as data (a record written before the
    record counted an interrupted run's steps says 0, so the checkpoint is the one to ask)."""
    if not last.is_file():
        return "no last.ckpt: starts over"
    from lra.protocol import RunError, read_checkpoint  # torch and lightning: only when a checkpoint is there

    try:
        return f"last.ckpt at step {int(read_checkpoint(last).get('global_step', 0))}"
    except RunError as e:
        return f"last.ckpt unreadable ({e})"


def _resume_command(runs_root: Path, run: str) -> str:
    """``LRA_RUNS=<root> python -m lra.train <the run's overrides>`` (from .hydra/overrides.yaml)."""
    try:
        from omegaconf import OmegaConf

        ovs = OmegaConf.to_container(OmegaConf.load(runs_root / run / ".hydra" / "overrides.yaml")) or []
    except Exception:  # noqa: BLE001 - a damaged file is data: the resume line falls back to words
        return f"the command that started {run}, with LRA_RUNS={runs_root}"
    ovs = [str(o) for o in ovs if not str(o).startswith(("run_tag=", "runs_root="))]
    return shlex.join([f"LRA_RUNS={runs_root}", "python", "-m", "lra.train", *ovs])


# ----------------------------------------------------------------------------- export
def _local_paths(root: Path, run_dir: Path) -> dict[str, str]:
    """This machine's folders a run's files name (its runs root, its data root), and what a published copy says
    instead: they mean nothing elsewhere, and the repository names no local path."""
    out = {}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data_root = ((read_record(run_dir) or {}).get("config") or {}).get("data_root")
        if data_root and os.path.isabs(str(data_root)):
            out[str(data_root).rstrip("/")] = "$LRA_DATA"
            out[os.path.realpath(str(data_root))] = "$LRA_DATA"
    for r in {str(root.absolute()), os.path.realpath(root)}:
        out[r.rstrip("/")] = "$LRA_RUNS"
    return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))  # the longest first: a data root inside runs


def _published(data: bytes, local: dict[str, str]) -> bytes:
    """A run's file as results/ keeps it: each local folder replaced by the variable that names it."""
    text = data.decode("utf-8", errors="surrogateescape")
    for path, name in local.items():
        text = text.replace(path, name)
    return text.encode("utf-8", errors="surrogateescape")


def export(root: Path, to: Path) -> int:
    _folder(root, "the runs root whose finished runs to export")
    if to.exists() and not to.is_dir():
        raise Refusal(f"--to {to} is no folder: give the results folder (e.g. results)")
    tree, done, same, refused = Tree(root), 0, 0, 0
    for run in tree.runs:
        info = _record(tree.root / run)
        if info["status"] not in FINISHED:
            continue
        dest = to / device_slug(info["device"]) / run
        local = _local_paths(root, root / run)
        copy, clash = [], None
        for name in SMALL:
            src, dst = root / run / name, dest / name
            if not src.is_file():
                continue
            data = _published(src.read_bytes(), local)
            if not dst.exists():
                copy.append((data, dst))
            elif dst.read_bytes() != data:
                clash = dst
                break
        if clash is not None:
            print(
                f"refused {run}: {clash} exists with other content (move it away, then export again)", file=sys.stderr
            )
            refused += 1
            continue
        if not copy:
            same += 1
            continue
        for data, dst in copy:
            write_atomic(dst, lambda tmp, data=data: tmp.write_bytes(data))
        done += 1
        print(f"exported {run}: {info['status']}, {info['steps']} steps -> {dest} ({len(copy)} files)")
    print(f"lra.tools.carry export: {done} runs exported, {same} already there, {refused} refused -> {to}")
    return 1 if refused else 0


# ----------------------------------------------------------------------------- command line
COMMANDS = {
    "pack": (
        "every run under RUNS_ROOT that has not finished (its whole folder, checkpoints included, no .lock), the "
        "finished runs' records (so the next window skips them) and every sweep manifest -> runs.tar.gz.partNN, "
        "runs.sha256, pack.json; never a finished run's checkpoint, .fit-cache, data",
        [("runs_root", "the runs root to pack"), ("--out", "a new or empty folder for the pack")],
    ),
    "unpack": (
        "check runs.sha256, extract files and folders only, move each run folder and manifest into --runs unless "
        "one is there already (kept as it is)",
        [("folder", "holds runs.tar.gz.partNN (or runs.tar.gz) and runs.sha256"), ("--runs", "the runs root")],
    ),
    "export": (
        "copy result.json, metrics.csv, train.log, .hydra/config.yaml and overrides.yaml of every finished run to "
        "<to>/<device>/<run path> (never a checkpoint); a file there with other content refuses that run (exit 1)",
        [("runs_root", "the runs root to export from"), ("--to", "the results folder (e.g. results)")],
    ),
}


def parser() -> Parser:
    fmt = argparse.RawDescriptionHelpFormatter
    usage = f"{PROG} {{pack,unpack,export}} ..."
    p = Parser(prog=PROG, usage=usage, description=__doc__.split("\n\n")[1], epilog=EXAMPLES, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", prog=PROG, metavar="{pack,unpack,export}")
    for name, (about, args) in COMMANDS.items():
        s = sub.add_parser(
            name, help=about.split(";")[0], description=textwrap.fill(about, 100), epilog=EXAMPLES, formatter_class=fmt
        )
        for arg, helps in args:
            s.add_argument(arg, type=Path, help=helps, **({"required": True} if arg.startswith("--") else {}))
        if name == "pack":
            s.add_argument("--part-mib", type=float, default=15.0, help="MiB per part, at most 16 (default 15)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)  # --help and bad flags exit here: nothing read or written
    if args.command is None:
        p.error("give a command: pack, unpack or export")
    try:
        if args.command == "pack":
            return pack(args.runs_root, args.out, args.part_mib)
        if args.command == "unpack":
            return unpack(args.folder, args.runs)
        return export(args.runs_root, args.to)
    except Refusal as e:
        print(f"lra.tools.carry {args.command}: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
