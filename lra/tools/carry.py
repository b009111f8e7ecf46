"""``python -m lra.tools.carry``: carry a GPU window's unfinished runs to the next machine; ship finished ones.

A GPU window (docs/gpu.md) is a bare node for 10-15 minutes that brings back at most 8 files of at most
16 MiB. ``pack`` puts every run that has not finished (whole folders, checkpoints included), the records of
the finished ones (so the next window's sweep skips them; no checkpoints) and the sweep manifests and rates
into ``runs.tar.gz.partNN`` + ``runs.sha256`` + ``pack.json``; ``unpack`` checks the pack before it writes
anything (its parts' number and sizes, the checksum, the archive whole and alone, each member a file or folder
inside the runs root, a file where the pack has a folder, the free space), extracts it as data and puts each run
in place whole (renamed from a temporary name beside it), never over anything already there; the same command
then resumes each run from ``checkpoints/last.ckpt`` (a run whose overrides name code to import gets no resume
line: a pack is data). ``export`` copies the finished runs' small files (record, metrics, log, config) under
``results/<device>/``. A refusal is one line on stderr and exit code 2, before anything is written; a write that
fails (a full disk) is one line and exit code 1, and leaves no pack and no part of a run.
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
import zlib
from pathlib import Path

from lra.cli import Parser
from lra.files import git_commit, write_atomic, write_json, write_text
from lra.record import read_record
from lra.runlock import holder, who
from lra.tools.sweep.base import FINISHED
from lra.tools.sweep.cost import COST_DIR, device_slug
from lra.tools.sweep.jobs import carried

PROG = "python -m lra.tools.carry"
TARBALL, CHECKSUM, INFO = "runs.tar.gz", "runs.sha256", "pack.json"
MAX_FILES, MAX_MIB = 8, 16  # what one window brings back
MAX_PARTS = MAX_FILES - 2  # with runs.sha256 and pack.json (or the window's bundle in its place)
MAX_MEMBERS = 100_000  # files and folders in a pack: a runs root of a thousand runs has some thousands
MAX_TEXT = 2**20  # bytes of a record or overrides.yaml read from a run folder (a record is some 12 KiB)
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
            if os.path.islink(root / f) or not os.path.isfile(root / f):  # a link, a FIFO, a socket: never packed
                self.other.append(f)
            elif _in_sweeps(f) or f.startswith(COST_DIR + "/"):
                self.sweeps.append(f)
            elif owner is not None:
                self.runs[owner].append(f)
            else:
                self.other.append(f)


def _record(run_dir: Path) -> dict:
    """``{"status", "steps", "device", "data_root"}`` of the record in ``run_dir``, read as data: a field of
    another type is None, a status that is no one-line text ``unreadable`` (as a record that is no JSON object or
    larger than a record can be); ``no record`` where there is none."""
    out, path = {"status": "unreadable", "steps": None, "device": None, "data_root": None}, run_dir / "result.json"
    try:
        if path.is_file() and path.stat().st_size > MAX_TEXT:
            return out
        rec = read_record(run_dir)
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python reads
        return out
    if rec is None:
        return {**out, "status": "no record"}
    config = rec.get("config")
    data_root = config.get("data_root") if isinstance(config, dict) else None
    return {
        "status": rec.get("status") if _line(rec.get("status")) else "unreadable",
        "steps": rec.get("steps") if type(rec.get("steps")) is int else None,
        "device": rec.get("device") if _line(rec.get("device")) else None,
        "data_root": data_root if _line(data_root) and os.path.isabs(data_root) else None,
    }


def _line(value) -> bool:
    """Is ``value`` text that prints as itself on one line (no escape sequence, no line break)?"""
    return isinstance(value, str) and value.isprintable() and 0 < len(value) <= 4096


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
        h = holder(tree.root / run)  # from this host or another, or a .lock that does not say: held all the same
        if h is not None:
            stop = f"kill -TERM {h['pid']}" if h.get("host") == socket.gethostname() else "its SIGTERM"
            raise Refusal(
                f"{tree.root / run} is held by {who(h)}, a run still training: wait for it to end, or stop it "
                f"({stop} writes its interrupted record and keeps last.ckpt), then pack again"
            )
        del info["data_root"]
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
    if "." in tree.runs:  # unpack puts each run in place by renaming it: a pack's top folder cannot be one
        raise Refusal(f"{root} is itself a run folder: give the runs root that holds it (<preset>/<semantics>/...)")
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
        with tarfile.open(joined, "w:gz", compresslevel=6, dereference=True) as tar:  # hard links as files
            for rel in (
                [f for run in runs for f in tree.runs[run]] + [f for fs in done.values() for f in fs] + tree.sweeps
            ):
                tar.add(root / rel, arcname=rel, recursive=False)
        size, part = joined.stat().st_size, max(1, int(part_mib * 2**20))
        n_parts = -(-size // part)
        if n_parts > MAX_PARTS:
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
    """The pack's parts in order (or its joined ``runs.tar.gz``): a Refusal, before any is read, for a missing
    part, more parts than a window brings back, or one that is no file or larger than pack writes one."""
    names = sorted(p.name for p in folder.iterdir() if re.fullmatch(rf"{re.escape(TARBALL)}\.part\d+", p.name))
    whole = folder / TARBALL
    if names and os.path.lexists(whole):
        raise Refusal(f"{folder} holds both {TARBALL} and its parts: keep one of them")
    if not names and not os.path.lexists(whole):
        raise Refusal(f"{folder} holds no {TARBALL}.partNN nor {TARBALL}: give the folder pack wrote")
    if len(names) > MAX_PARTS:
        raise Refusal(
            f"{folder} holds {len(names)} parts, and a pack is at most {MAX_PARTS} (with {CHECKSUM} and {INFO}, the "
            f"{MAX_FILES} files a window brings back): give the folder pack wrote"
        )
    want = [f"{TARBALL}.part{i:02d}" for i in range(len(names))]
    if names != want:
        raise Refusal(f"{folder} lacks {next(w for w in want if w not in names)}: fetch every part of the pack")
    parts, limit = [folder / n for n in names] or [whole], MAX_MIB * 2**20 * (1 if names else MAX_PARTS)
    for p in parts:
        size = p.stat().st_size if p.is_file() else None
        if size is None or size > limit:
            raise Refusal(
                f"{p} is {'no file' if size is None else f'{size / 2**20:.1f} MiB'}: a pack's part is a file of at "
                f"most {limit / 2**20:g} MiB; give the folder pack wrote (nothing was read)"
            )
    return parts


def _expected_sum(folder: Path) -> str:
    path = folder / CHECKSUM
    if not path.is_file():
        raise Refusal(
            f"{folder} holds no {CHECKSUM}: a pack is checked before it is unpacked; give the folder pack wrote"
        )
    with open(path, "rb") as f:
        line = f.read(200).decode(errors="replace")  # 78 bytes: what is longer is no checksum, and is not read
    m = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](\S+)\s*", line)
    if not m or Path(m.group(2)).name != TARBALL:
        raise Refusal(f"{path} is not one line '<sha256>  {TARBALL}' (sha256sum's format): fetch it again")
    return m.group(1).lower()


def _member(m: tarfile.TarInfo) -> str:
    """The member's path in the runs root ('' for the root): a Refusal for anything but a plain file or folder
    whose name stays inside the runs root and prints as one line."""
    parts = [p for p in m.name.split("/") if p not in ("", ".")]
    if not (m.isfile() or m.isdir()):
        raise Refusal(f"the pack's member {m.name!r} is no plain file or folder (a link?): nothing unpacked")
    if m.name.startswith("/") or ".." in parts or "\\" in m.name or not m.name.isprintable():
        raise Refusal(
            f"the pack's member {m.name!r} points outside the runs root or is no one-line name: nothing unpacked"
        )
    return "/".join(parts)


def _read_pack(folder: Path, runs_root: Path, free: int) -> tuple[bytes, list[tarfile.TarInfo]]:
    """The pack's bytes and members, checked before anything is written: its parts (:func:`_parts`), the checksum,
    one whole gzip stream and nothing after it, no more than ``free`` bytes once extracted, each member
    (:func:`_member`) once, none both a file and a folder, no run at its top (a run is renamed into place), and
    no file in ``runs_root`` where it has a folder."""
    expected, parts = _expected_sum(folder), _parts(folder)
    data = b"".join(p.read_bytes() for p in parts)  # at most MAX_PARTS x MAX_MIB (checked)
    if hashlib.sha256(data).hexdigest() != expected:
        raise Refusal(f"the pack in {folder} does not match its {CHECKSUM} (a part is damaged): nothing unpacked")
    made_so = f"though it matches its {CHECKSUM} (it was made so): fetch the parts pack wrote; nothing unpacked"
    z, size, step = zlib.decompressobj(wbits=31), 0, 2**14  # read once, its size counted, its output not kept
    try:
        for at in range(0, len(data), step):
            size += len(z.decompress(data[at : at + step]))
            if size > free:
                raise Refusal(
                    f"the pack takes more than the {free / 2**20:.2f} MiB free under {runs_root}: free space there "
                    "or give another --runs; nothing unpacked"
                )
            if z.eof:
                break
    except zlib.error as e:
        raise Refusal(f"the pack in {folder} is corrupt ({e}), {made_so}") from None
    if not z.eof:
        raise Refusal(f"the pack in {folder} ends before its archive does (truncated), {made_so}")
    if trailing := len(z.unused_data) + max(0, len(data) - at - step):
        raise Refusal(f"the pack in {folder} has {trailing} bytes of trailing data after the archive's end, {made_so}")
    files, folders, members = set(), set(), []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for m in tar:
                if len(tar.members) > MAX_MEMBERS:
                    raise Refusal(f"the pack in {folder} holds over {MAX_MEMBERS} members, no pack's: nothing unpacked")
                name = _member(m)
                if m.isfile() and (name in files or not name):
                    raise Refusal(f"the pack holds the file {m.name!r} twice (or as its top): nothing unpacked")
                (files if m.isfile() else folders).add(name)
                folders.update(name.rsplit("/", i)[0] for i in range(1, name.count("/") + 1))
                members += [m] if name else []
    except (tarfile.TarError, OSError, EOFError) as e:
        raise Refusal(f"the pack in {folder} does not read as a tar.gz ({e}): nothing unpacked") from None
    if clash := sorted(files & folders):
        raise Refusal(f"the pack holds {clash[0]!r} both as a file and as a folder: nothing unpacked")
    if top := sorted(n for n in files | folders if n in MARKERS):
        raise Refusal(f"the pack's top folder is itself a run ({top[0]!r} in it): pack a runs root; nothing unpacked")
    there = [d for d in sorted(folders) if os.path.lexists(runs_root / d) and not (runs_root / d).is_dir()]
    if there:
        raise Refusal(f"{runs_root / there[0]} is a file where the pack has a folder: move it away, then unpack again")
    return data, members


def _move(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


def unpack(folder: Path, runs_root: Path) -> int:
    _folder(folder, "the folder that holds the pack (runs.tar.gz.partNN and runs.sha256)")
    above = [runs_root, *runs_root.parents]
    there = next(p for p in above if os.path.lexists(p))
    if not there.is_dir():
        raise Refusal(f"--runs {runs_root}: {there} is no folder: give the runs root to unpack into")
    data, members = _read_pack(folder, runs_root, shutil.disk_usage(there).free)
    made = above[: above.index(there)]  # the folders this command makes, the deepest first
    runs_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=runs_root, prefix=".carry-unpack-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            try:
                tar.extractall(tmp, members=members, filter="data")
            except OSError as e:
                raise Refusal(
                    f"could not write under {runs_root} ({e.strerror or e}): nothing unpacked; free space there (or "
                    "give another --runs), then unpack again",
                    code=1,
                ) from None
        return _place(Tree(tmp), runs_root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in made:  # left as they were where nothing was put in them
            with contextlib.suppress(OSError):
                d.rmdir()


def _place(tree: Tree, runs_root: Path) -> int:
    """Put each run of the extracted ``tree`` in place whole (its files gathered under a temporary name beside its
    folder, then renamed to it: a failure leaves nothing of it), then each manifest; whatever is there is kept."""
    from lra.protocol import FINISHED, resumes_at  # torch: only once there is a pack to place

    placed, kept = [], 0
    for run, files in sorted(tree.runs.items()):  # a run before the runs inside it
        dest, info = runs_root / run, _record(tree.root / run)
        if os.path.lexists(dest):
            there = _record(dest)
            print(
                f"kept the existing {run} (its record: {there['status']}, {there['steps']} steps; "
                f"the pack's: {info['status']}, {info['steps']} steps): not replaced"
            )
            kept += 1
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.carry-"))
        try:
            os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes 0700
            for f in files:
                _move(tree.root / f, stage / f[len(run) + 1 :])
            os.rename(stage, dest)
        except OSError as e:
            shutil.rmtree(stage, ignore_errors=True)
            raise Refusal(
                f"could not put {run} in place ({e.strerror or e}): nothing of it is there, and the {len(placed)} "
                f"runs before it are whole; free space under {runs_root}, then unpack again (they are kept)",
                code=1,
            ) from None
        placed.append(run)
        done = info["status"] in FINISHED  # its record only: a rerun of its command skips it
        print(f"unpacked {run}: {info['status']}, " + ("finished" if done else resumes_at(dest / LAST)))
    for f in tree.sweeps:
        if os.path.lexists(runs_root / f):
            print(f"kept the existing {f}: not replaced")
        else:
            _move(tree.root / f, runs_root / f)
    if tree.other:
        print(f"not unpacked: {len(tree.other)} files outside run folders and sweeps (e.g. {tree.other[0]})")
    print(f"lra.tools.carry unpack: {len(placed)} runs into {runs_root} ({kept} kept as they were)")
    resumable = [run for run in placed if _record(runs_root / run)["status"] not in FINISHED]
    for run in resumable:
        print(_resume_line(runs_root, run))
    if resumable:
        print("(or re-run the same sweep command; each run resumes from its checkpoints/last.ckpt)")
    return 0


def _unsafe(override) -> str | None:
    """Why a pack's override stays out of a printed command (None: a plain ``key=value`` setting): it names code
    to import (a ``_target_`` at any depth, ``attn.target``) or a config to load (a ``hydra`` key such as its
    search path, a flag such as ``--config-dir``, an interpolation)."""
    if not isinstance(override, str) or not override.isprintable():
        return "is no one-line override (an escape sequence, a line break)"
    key = re.fullmatch(r"[+~]{0,2}([A-Za-z]\w*(?:\.\w+)*)", override.partition("=")[0])
    words = key.group(1).split(".") if key else []
    if "_target_" in override or "target" in words:
        return "names code to import and call (a _target_ or attn.target)"
    if not key or words[0] == "hydra" or "${" in override:
        return "is no plain key=value setting (a flag, a hydra key or an interpolation)"
    return None


def _resume_line(runs_root: Path, run: str) -> str:
    """``resume: LRA_RUNS=<root> python -m lra.train <the run's overrides>`` (from .hydra/overrides.yaml, read as
    data), or why it is withheld: the line is there to be pasted, and a pack comes from elsewhere."""
    path, ovs = runs_root / run / ".hydra" / "overrides.yaml", None
    with contextlib.suppress(Exception):  # a damaged file is data: the resume line falls back to words
        text = path.read_text() if path.stat().st_size <= MAX_TEXT else ""
        if not re.search(r"(^|[\s\[{,])[&*]", text):  # no YAML anchor or alias: a few of them name millions of items
            from omegaconf import OmegaConf

            ovs = OmegaConf.to_container(OmegaConf.create(text))
    if not isinstance(ovs, list):
        return f"resume: the command that started {run}, with LRA_RUNS={runs_root}"
    for o in ovs:
        if why := _unsafe(o):
            what = ascii(o[:80]) if isinstance(o, str) else f"a {type(o).__name__}"
            return (
                f"resume withheld for {run}: its overrides.yaml has {what}, which {why}; a pack is data: start the "
                f"run with a command you trust (LRA_RUNS={runs_root} python -m lra.train ...) or re-run the sweep"
            )
    ovs = [o for o in ovs if not o.startswith(("run_tag=", "runs_root="))]
    return "resume: " + shlex.join([f"LRA_RUNS={runs_root}", "python", "-m", "lra.train", *ovs])


# ----------------------------------------------------------------------------- export
def _local_paths(root: Path, data_root: str | None) -> dict[str, str]:
    """This machine's folders a run's files name (its runs root, its record's data root), and what a published copy
    says instead: they mean nothing elsewhere, and the repository names no local path."""
    paths = [(p, "$LRA_DATA") for p in (data_root, os.path.realpath(data_root))] if data_root else []
    paths += [(p, "$LRA_RUNS") for p in (str(root.absolute()), os.path.realpath(root))]
    out = {p.rstrip("/"): name for p, name in paths if p.rstrip("/")}  # "/" is no folder of this machine's own
    return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))  # the longest first: a data root inside runs


NAME = r"[\w.+~@%-]"  # a file name's characters: /x/runs is not /x/runs2, /x/runs.old nor /y/x/runs


def _published(data: bytes, local: dict[str, str]) -> bytes:
    """A run's file as results/ keeps it: each local folder, as a whole path, replaced by the variable naming it."""
    text = data.decode("utf-8", errors="surrogateescape")
    for path, name in local.items():
        text = re.sub(rf"(?<!{NAME}){re.escape(path)}(?!{NAME})", name, text)  # name: $LRA_..., no backslash
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
        local = _local_paths(root, info["data_root"])
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
    except OSError as e:  # a full disk, a permission: what was written is whole (temporary names, then renames)
        where = f": {e.filename}" if e.filename else ""
        print(
            f"lra.tools.carry {args.command}: could not write ({e.strerror or e}{where}): nothing half-written is "
            "left; free space or fix the permission, then run the same command again",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
