"""Cache of tokenised arrays, keyed by the preprocessing parameters.

Layout: ``<data_root>/cache/<task>-<key>/`` with ``<split>.{tokens,lengths,labels}.npy`` and
``meta.json``. The key is a hash of the parameters (and of the source files' sizes and mtimes),
so changing any of them builds a new entry. Arrays are memory-mapped numpy: loading is instant,
nothing is copied into RAM until a batch touches it, and DataLoader workers share the pages.
(HF ``datasets`` Arrow files would also work, but for fixed-shape integer matrices a raw ``.npy``
is simpler and as fast.) An entry is built in a temporary folder and renamed into place only when
complete, so an interrupted build never leaves an entry a later run would trust; an entry damaged
later (a truncated ``.npy``, a bad ``meta.json``) fails the checks of :func:`load_entry` and is
rebuilt with one warning. :func:`fingerprint` hashes the arrays a run sees (for resume keys).
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

from lra.data.base import Split

log = logging.getLogger(__name__)
CACHE_VERSION = 1
FIELDS = ("tokens", "lengths", "labels")


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


def cached_splits(root: Path, task: str, params: dict, build: Callable[[], dict[str, Split]]) -> dict[str, Split]:
    """Load the entry for ``params`` or build it with ``build()`` and store it atomically. A damaged entry
    (truncated ``.npy``, bad ``meta.json``: a full disk, a copy cut short) is rebuilt with one warning."""
    key = cache_key(params)
    final = Path(root) / "cache" / f"{task}-{key}"
    if final.exists():
        try:
            return load_entry(final)
        except DamagedEntry as e:
            log.warning("cache entry %s is damaged (%s); rebuilding it", final, e)
    t0 = time.perf_counter()
    splits = build()
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name, s in splits.items():
            for field in FIELDS:
                np.save(tmp / f"{name}.{field}.npy", getattr(s, field))
        meta = {"task": task, "params": params, "splits": {k: len(v) for k, v in splits.items()},
                "arrays": {k: {f: [list(getattr(v, f).shape), getattr(v, f).dtype.str] for f in FIELDS}
                           for k, v in splits.items()},
                "built_in_s": round(time.perf_counter() - t0, 2)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
        if final.exists():  # a damaged entry, or a concurrent builder finished first: the cache is ours
            old = final.with_name(f".old-{final.name}-{os.getpid()}")
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("cached %s in %s (%.1f s)", task, final, time.perf_counter() - t0)
    return load_entry(final)


class DamagedEntry(Exception):
    """A cache entry that cannot be read as written (it is rebuilt)."""


def load_entry(folder: Path) -> dict[str, Split]:
    """The memory-mapped splits of an entry, checked against its ``meta.json`` (lengths, and for entries
    that record them, shapes and dtypes); :class:`DamagedEntry` if anything does not match."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        sizes, arrays = meta["splits"], meta.get("arrays")
        out = {}
        for name, n in sizes.items():
            got = {f: np.load(folder / f"{name}.{f}.npy", mmap_mode="r") for f in FIELDS}
            for f, a in got.items():
                if len(a) != n:
                    raise DamagedEntry(f"{name}.{f}.npy has {len(a)} rows, meta.json says {n}")
                if arrays is not None and [list(a.shape), a.dtype.str] != arrays[name][f]:
                    raise DamagedEntry(f"{name}.{f}.npy is {a.dtype.str}{list(a.shape)}, meta.json says "
                                       f"{arrays[name][f][1]}{arrays[name][f][0]}")
            out[name] = Split(*(got[f] for f in FIELDS))
        return out
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DamagedEntry(f"{type(e).__name__}: {e}") from None


# ------------------------------------------------------------------------------ data fingerprint
def fingerprint(splits: dict[str, Split], chunk_bytes: int = 16 << 20) -> str:
    """A short hash of the data a run sees: each split's size, and the bytes, dtype and shape of its
    tokens, lengths and labels (for resume keys: same fingerprint, same examples in the same order).
    Memory-mapped arrays are hashed in chunks of about ``chunk_bytes``, so nothing large is copied."""
    h = hashlib.sha256()  # with SHA CPU instructions about 2x blake2b (1.3 vs 0.7 GB/s, one core)
    for name in sorted(splits):
        s = splits[name]
        h.update(f"{name}:{len(s)};".encode())
        for f in FIELDS:
            a = getattr(s, f)
            h.update(f"{f}:{a.dtype.str}:{list(a.shape)};".encode())
            step = max(1, chunk_bytes // max(1, a[:1].nbytes)) if a.ndim else 1
            for i in range(0, max(1, len(a) if a.ndim else 1), step):
                h.update(np.ascontiguousarray(a[i:i + step] if a.ndim else a))
    return h.hexdigest()[:16]
