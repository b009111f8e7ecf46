"""Cache of tokenised arrays, keyed by the preprocessing parameters.

Layout: ``<data_root>/cache/<task>-<key>/`` with ``<split>.{tokens,lengths,labels}.npy`` and
``meta.json``. The key is a hash of the parameters (and of the source files' sizes and mtimes),
so changing any of them builds a new entry. Arrays are memory-mapped numpy: loading is instant,
nothing is copied into RAM until a batch touches it, and DataLoader workers share the pages.
(HF ``datasets`` Arrow files would also work, but for fixed-shape integer matrices a raw ``.npy``
is simpler and as fast.) An entry is built in a temporary folder and renamed into place only when
complete, so an interrupted build never leaves an entry a later run would trust; an entry damaged
later (a truncated ``.npy``, a bad ``meta.json``, an array rewritten with other values of the same
shape) fails the checks of :func:`load_entry` and is rebuilt with one warning.

Verification: every load hashes the arrays as read (each split's content fingerprint, lra/data/provenance.py: one
SHA-256 pass, 0.26-0.44 s for the paper ListOps set's 205 MB on 2 loaded cores) and compares them with the
fingerprints ``meta.json`` recorded when the entry was built; on a mismatch the SHA-256 of every array file (also in
``meta.json``) names the edited file, and the entry is rebuilt with one warning. What a run records (the data
id) is these fingerprints as computed, never a field of ``meta.json`` as written. :func:`fingerprint` hashes
the arrays a run sees (for resume keys).

Provenance (the record's ``data``, lra/data/provenance.py): ``meta.json`` also holds the checksums of the source
files the entry was built from (``source``), computed once, when the entry is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np

from lra.data.base import Split, made_parents
from lra.data.provenance import (
    FIELDS,
    Origin,
    content_fingerprint,
    describe_files,
    file_sha256,
    hash_arrays,
)

log = logging.getLogger(__name__)
CACHE_VERSION = 1  # in every key: a new layout of the entries gets new keys


def cache_key(params: dict) -> str:
    blob = json.dumps({"v": CACHE_VERSION, **params}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def source_fingerprint(paths) -> list:
    """Sizes and mtimes of the source files, so an edited source invalidates the cache."""
    out = []
    for p in sorted(Path(p) for p in paths):
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])  # ns: a file rewritten within a second still differs
    return out


def cached_splits(
    root: Path,
    task: str,
    params: dict,
    build: Callable[[], dict[str, Split]],
    origin: Origin | None = None,
    check: Callable[[dict[str, Split]], None] | None = None,
) -> dict[str, Split]:
    """Load the entry for ``params`` or build it with ``build()`` and store it atomically. A damaged entry
    (truncated ``.npy``, bad ``meta.json``, an array or a fingerprint that fails its check: a full disk, a copy
    cut short, an edit) is rebuilt in place with one warning. ``origin``: what the reader read
    (lra/data/provenance.py); its checksums are stored in ``meta.json`` once, and every split returned carries
    its ``origin``. ``check(splits)``: raises :class:`~lra.data.base.DataError` for a set that must not
    be used (a partial official set, lra/data/official.py), on what was built before anything is written, and on
    an entry read from the cache (one built before the check existed)."""
    key = cache_key(params)
    final = Path(root) / "cache" / f"{task}-{key}"
    if final.exists():
        try:
            splits, meta = load_entry(final)
        except DamagedEntry as e:
            log.warning("cache entry %s %s; rebuilding it", final, e)
        else:
            if check is not None:
                check(splits)
            return _with_origin(final, splits, meta, task, origin)
    t0 = time.perf_counter()
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with made_parents(tmp):  # before the build: a root that refuses writes says so before minutes of work
        tmp.mkdir()
        try:
            splits = build()
            if check is not None:
                check(splits)
            source = describe_files(origin.paths, root) if origin is not None else None
            if source is not None:
                origin.check(source, task)  # a generated file edited since: refused before anything is written
            for name, s in splits.items():
                for field in FIELDS:
                    np.save(tmp / f"{name}.{field}.npy", getattr(s, field))
            meta = {
                "task": task,
                "params": params,
                "splits": {k: len(v) for k, v in splits.items()},
                "arrays": {
                    k: {f: [list(getattr(v, f).shape), getattr(v, f).dtype.str] for f in FIELDS}
                    for k, v in splits.items()
                },
                "checksums": {
                    f"{k}.{f}.npy": {"sha256": file_sha256(tmp / f"{k}.{f}.npy")} for k in splits for f in FIELDS
                },
                "content": {k: content_fingerprint(v) for k, v in splits.items()},
                "source": source,
                "built_in_s": round(time.perf_counter() - t0, 2),
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
            if final.exists():  # a damaged entry, or a concurrent builder finished first: the cache is ours
                old = final.with_name(f".old-{final.name}-{os.getpid()}")
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("cached %s in %s (%.1f s)", task, final, time.perf_counter() - t0)
    return _with_origin(final, load_entry(final, verify=False)[0], meta, task, origin)  # just hashed


def _with_origin(
    folder: Path, splits: dict[str, Split], meta: dict, task: str, origin: Origin | None
) -> dict[str, Split]:
    """``splits`` with their ``origin`` (lra/data/provenance.py): ``meta``'s verified content fingerprints and
    its sources' checksums."""
    for name, s in splits.items():
        s.origin = {
            "task": task,
            "entry": folder.name,
            "split": name,
            "content": meta["content"][name],
            "source": origin.fields(meta.get("source")) if origin is not None else None,
        }
    return splits


class DamagedEntry(Exception):
    """A cache entry that cannot be trusted as written (it is rebuilt); the message completes
    "cache entry <folder> ..."."""


def load_entry(folder: Path, verify: bool = True) -> tuple[dict[str, Split], dict]:
    """The memory-mapped splits of an entry and its ``meta.json``, the arrays checked against it (lengths, shapes,
    dtypes; with ``verify`` also their content fingerprints, module docstring). :class:`DamagedEntry` if anything
    does not match."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        sizes, arrays = meta["splits"], meta["arrays"]
        out = {}
        for name, n in sizes.items():
            got = {f: np.load(folder / f"{name}.{f}.npy", mmap_mode="r") for f in FIELDS}
            for f, a in got.items():
                if len(a) != n:
                    raise DamagedEntry(f"is damaged ({name}.{f}.npy has {len(a)} rows, meta.json says {n})")
                if [list(a.shape), a.dtype.str] != arrays[name][f]:
                    raise DamagedEntry(
                        f"is damaged ({name}.{f}.npy is {a.dtype.str}{list(a.shape)}, meta.json says "
                        f"{arrays[name][f][1]}{arrays[name][f][0]})"
                    )
            out[name] = Split(*(got[f] for f in FIELDS))
        if verify and {k: content_fingerprint(v) for k, v in out.items()} != meta["content"]:
            # an array edited, or meta.json: the file checksums say which
            _verify_checksums(folder, meta["checksums"], [f"{k}.{f}.npy" for k in sizes for f in FIELDS])
            raise DamagedEntry("is damaged (its meta.json records other content fingerprints than its arrays')")
        return out, meta
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DamagedEntry(f"is damaged ({type(e).__name__}: {e})") from None


def _verify_checksums(folder: Path, sums: dict, names: list[str]) -> None:
    """Hash each array file; :class:`DamagedEntry` naming the first that differs from its recorded SHA-256."""
    if sorted(sums) != sorted(names):
        raise DamagedEntry("is damaged (meta.json does not list a checksum for each array)")
    for name in names:
        if file_sha256(folder / name) != sums[name]["sha256"]:
            raise DamagedEntry(
                f"is damaged ({name} does not match the checksum recorded when the entry was built: "
                f"edited or corrupted)"
            )


# ------------------------------------------------------------------------------ data fingerprint
def fingerprint(splits: dict[str, Split], chunk_bytes: int = 16 << 20) -> str:
    """A short hash of the data a run sees: each split's size, and the bytes, dtype and shape of its
    tokens, lengths and labels (for resume keys: same fingerprint, same examples in the same order).
    Memory-mapped arrays are hashed in chunks of about ``chunk_bytes``, so nothing large is copied."""
    h = hashlib.sha256()  # with SHA CPU instructions about 2x blake2b (1.3 vs 0.7 GB/s, one core)
    for name in sorted(splits):
        s = splits[name]
        h.update(f"{name}:{len(s)};".encode())
        hash_arrays(h, s, chunk_bytes)
    return h.hexdigest()[:16]
