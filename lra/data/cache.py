"""Cache of tokenised arrays, keyed by the preprocessing parameters.

Layout: ``<data_root>/cache/<task>-<key>/`` with ``<split>.{tokens,lengths,labels}.npy`` and
``meta.json``. The key is a hash of the parameters (and of the source files' sizes and mtimes),
so changing any of them builds a new entry. Arrays are memory-mapped numpy: loading is instant,
nothing is copied into RAM until a batch touches it, and DataLoader workers share the pages.
(HF ``datasets`` Arrow files would also work, but for fixed-shape integer matrices a raw ``.npy``
is simpler and as fast.) An entry is built in a temporary folder and renamed into place only when
complete, so an interrupted build never leaves an entry a later run would trust.
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
    """Load the entry for ``params`` or build it with ``build()`` and store it atomically."""
    key = cache_key(params)
    final = Path(root) / "cache" / f"{task}-{key}"
    if (final / "meta.json").exists():
        return load_entry(final)
    t0 = time.perf_counter()
    splits = build()
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name, s in splits.items():
            for field in ("tokens", "lengths", "labels"):
                np.save(tmp / f"{name}.{field}.npy", getattr(s, field))
        meta = {"task": task, "params": params, "splits": {k: len(v) for k, v in splits.items()},
                "built_in_s": round(time.perf_counter() - t0, 2)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
        if final.exists():  # a concurrent builder finished first, or a stale partial entry
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("cached %s in %s (%.1f s)", task, final, time.perf_counter() - t0)
    return load_entry(final)


def load_entry(folder: Path) -> dict[str, Split]:
    meta = json.loads((folder / "meta.json").read_text())
    return {
        name: Split(*(np.load(folder / f"{name}.{f}.npy", mmap_mode="r") for f in ("tokens", "lengths", "labels")))
        for name in meta["splits"]
    }
