"""What data a run read: the ``data`` field of its record (docs/protocol.md; where it is kept: docs/data.md).

A reader names what it reads with an :class:`Origin` (kind, the reader's own name for the form, the files and
folders, the generator) and hands it to the cache (:func:`lra.data.cache.cached_splits`). The cache stores, in
the entry's ``meta.json``, the checksums of those sources (:func:`describe_files`, computed when the entry is
built) and hands every split back with its ``origin``, whose ``content`` (:func:`content_fingerprint`) is
computed from the arrays each time they are loaded and checked against the one stored at the build.
:func:`data_record` then makes the record's ``data`` from the splits a run reads: nothing more is read or hashed.

``id``: 12 hex digits of SHA-256 over each split's content fingerprint (the size, bytes, dtypes and shapes of
its tokens, lengths and labels; a ``task.max_examples`` subset: the fingerprint of the split it was drawn
from, its size and the seed). Equal ids mean the same examples in the same splits, tokenised alike, whatever
the path of the data root (a copied data folder, a moved one) and whatever form held them (IMDB from its
folder, its archive or Hugging Face gives equal arrays, so one id); a different generator setting, another
release, another tokenisation or subset gives another id. Source checksums and paths are details: the id
does not depend on them.

``kind`` (one of :data:`KINDS`): ``generated`` (made by the harness's generator, ``GENERATED.json``),
``release`` (the publisher's files, unpacked), ``archive`` (read straight from a tar), ``hf`` (a Hugging
Face copy: parquet, ``save_to_disk``, the ``datasets`` cache, or files ``task.download`` fetched).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lra.data.base import DataError

KINDS = ("generated", "release", "archive", "hf")
SPLIT_ORDER = ("train", "val", "test")
FIELDS = ("tokens", "lengths", "labels")  # a Split's arrays, as the cache stores them
_CHUNK = 16 << 20


@dataclass
class Origin:
    """What a reader read, as it hands it to the cache."""

    kind: str  # one of KINDS
    format: str  # the reader's own name for the form: tsv, folder, tar, parquet, hf_disk, pickles, archive ...
    what: str  # the description's start: "ListOps release listops-1000"
    paths: list  # files and folders read (a folder: every file below it, as one set)
    notes: list = field(default_factory=list)  # in the description's parentheses: "generator v1", "seed 0"
    generator: dict | None = None  # generated data: {"name", "version", "seed", "params"}
    downloaded: dict | None = None  # fetched by task.download: {"repo", "revision"}
    recorded: dict = field(default_factory=dict)  # path -> SHA-256 the generator recorded (GENERATED.json)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"data kind {self.kind!r} is not one of {KINDS}")

    def check(self, source: dict, task: str) -> None:
        """A one-line DataError for a path whose checksum (:func:`describe_files`, hashed when the cache entry is
        built) is not the one its generator recorded: an edited file is never read as the generator's output."""
        for path, entry in zip(self.paths, source["files"]):
            if self.recorded.get(str(path)) not in (None, entry["sha256"]):
                raise DataError(
                    f"{path} differs from what the generator wrote (its SHA-256 is not the one GENERATED.json "
                    f"recorded): it was edited; move it aside (or delete it) and run `make data task={task}` to "
                    f"regenerate it, or point task.path at a folder of your own"
                )

    def fields(self, source: dict | None) -> dict:
        """The origin with the stored checksums of its sources (:func:`describe_files`)."""
        return {
            "kind": self.kind,
            "format": self.format,
            "what": self.what,
            "notes": list(self.notes),
            "generator": self.generator,
            "downloaded": self.downloaded,
            **(source or {}),
        }


def relative_path(path: Path, root: Path) -> str:
    """``path`` relative to the data root (symlinks not followed: data linked in keeps its place); a path
    outside the root stays absolute."""
    p, r = os.path.abspath(path), os.path.abspath(root)
    return os.path.relpath(p, r) if p == r or p.startswith(r.rstrip(os.sep) + os.sep) else p


def file_sha256(path: Path, chunk: int = _CHUNK) -> str:
    """The SHA-256 of a file, read in chunks (the cache's checksums, the sources', the downloads')."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def folder_entry(folder: Path) -> dict:
    """Every file below ``folder`` (dot files and folders skipped), as one SHA-256 over the sorted relative
    names and each file's SHA-256."""
    h, count, size = hashlib.sha256(), 0, 0
    for dirpath, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            p = Path(dirpath) / name
            h.update(f"{p.relative_to(folder).as_posix()}\0{file_sha256(p)}\n".encode())
            count, size = count + 1, size + p.stat().st_size
    return {"files": count, "bytes": size, "sha256": h.hexdigest()}


def describe_files(paths, root: Path) -> dict:
    """Checksums of the sources, stored in the cache entry: ``paths`` (relative to the data root),
    ``files`` (per path: its bytes and SHA-256; a folder: also its file count) and ``sha256``, one SHA-256 over
    the set (each path's last name and checksum, in order: the same files elsewhere give the same value)."""
    entries = []
    for p in map(Path, paths):
        entry = folder_entry(p) if p.is_dir() else {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        entries.append({"path": relative_path(p, root), **entry})
    whole = hashlib.sha256("".join(f"{Path(e['path']).name}\0{e['sha256']}\n" for e in entries).encode())
    return {"paths": [e["path"] for e in entries], "files": entries, "sha256": whole.hexdigest()}


def downloaded_stamp(path: Path, root: Path) -> dict | None:
    """``{"repo", "revision"}`` when ``path`` lies in a folder ``task.download`` wrote (``DOWNLOADED.json``
    in it or above it, up to the data root)."""
    p, r = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    for folder in [p, *p.parents]:
        try:
            stamp = json.loads((folder / "DOWNLOADED.json").read_text())
            return {"repo": stamp.get("repo"), "revision": stamp.get("revision")}
        except (OSError, ValueError, AttributeError):
            pass
        if folder == r or r not in folder.parents:
            return None
    return None


def generator_fields(stamp: dict, default_name: str) -> dict:
    """The record's ``generator`` from a ``GENERATED.json``."""
    params = stamp.get("params") or {}
    return {
        "name": stamp.get("generator", default_name),
        "version": stamp.get("version"),
        "seed": params.get("seed"),
        "params": params,
    }


def subset_origin(origin: dict | None, n: int, of: int, seed: int) -> dict | None:
    """The origin of a seeded subset of ``n`` of a split's ``of`` examples (``task.max_examples``)."""
    if origin is None:
        return None
    content = hashlib.sha256(f"{origin['content']}:subset:{n}:{of}:{seed}".encode()).hexdigest()[:16]
    return {**origin, "content": content, "subset_of": of}


def data_id(content: dict) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


def data_record(splits: dict) -> dict | None:
    """The record's ``data`` for the splits a run reads (module docstring); None without splits. Splits
    without an origin (a reader that bypasses the cache) are fingerprinted here, once per call."""
    if not splits:
        return None
    names = [k for k in SPLIT_ORDER if k in splits] + sorted(set(splits) - set(SPLIT_ORDER))
    origins = {k: splits[k].origin or _unrecorded(splits[k]) for k in names}
    content = {k: o["content"] for k, o in origins.items()}
    src = next((o["source"] for o in origins.values() if o.get("source")), None) or {}
    sizes = {k: len(splits[k]) for k in names}
    subsets = {k: o["subset_of"] for k, o in origins.items() if o.get("subset_of") is not None}
    aliases = {k: o["split"] for k, o in origins.items() if o.get("split") not in (None, k)}
    task = next((o.get("task") for o in origins.values() if o.get("task")), None)
    return {
        "id": data_id(content),
        "kind": src.get("kind", "unknown"),
        "description": _description(task, src, sizes, subsets, aliases),
        "task": task,
        "format": src.get("format"),
        "sizes": sizes,
        "subsets": subsets,
        "aliases": aliases,
        "generator": src.get("generator"),
        "downloaded": src.get("downloaded"),
        "files": src.get("files", []),
        "sha256": src.get("sha256"),
        "content": content,
        "cache": next((o.get("entry") for o in origins.values() if o.get("entry")), None),
    }


def _unrecorded(split) -> dict:
    return {"content": content_fingerprint(split), "source": None}


def content_fingerprint(split, chunk_bytes: int = _CHUNK) -> str:
    """16 hex digits of SHA-256 over one split's size and arrays, as ``lra.data.fingerprint`` hashes them,
    without its name (a split used as another, Text's val = test, has one fingerprint)."""
    h = hashlib.sha256()
    h.update(f"{len(split)};".encode())
    hash_arrays(h, split, chunk_bytes)
    return h.hexdigest()[:16]


def hash_arrays(h, split, chunk_bytes: int = _CHUNK) -> None:
    """Feed ``h`` the dtype, shape and bytes of a split's arrays; memory maps are read in chunks of about
    ``chunk_bytes``, so nothing large is copied."""
    for f in FIELDS:
        a = getattr(split, f)
        h.update(f"{f}:{a.dtype.str}:{list(a.shape)};".encode())
        step = max(1, chunk_bytes // max(1, a[:1].nbytes)) if a.ndim else 1
        for i in range(0, max(1, len(a) if a.ndim else 1), step):
            h.update(np.ascontiguousarray(a[i : i + step] if a.ndim else a))


def _description(task, src: dict, sizes: dict, subsets: dict, aliases: dict) -> str:
    """One line: what, then generator facts or the files and their checksum, then the split sizes read."""
    notes = list(src.get("notes") or [])
    if src.get("kind") != "generated" and src.get("files"):
        paths = src["paths"]
        names = ", ".join(Path(p).name for p in paths) if len(paths) <= 3 else f"{len(paths)} paths"
        notes.append(f"{names}, sha256 {src['sha256'][:8]}…")
    notes.append("/".join(str(n) for n in sizes.values()) + " " + "/".join(sizes))
    notes += [f"{k}: seeded subset of {n}" for k, n in subsets.items()]
    notes += [f"{k} is the {v} split" for k, v in aliases.items()]
    what = src.get("what") or f"{task or 'data'} from a reader that records no origin"
    return f"{what} ({', '.join(notes)})"
