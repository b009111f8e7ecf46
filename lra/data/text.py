"""Text (IMDB sentiment at byte level): readers for every form the reviews come in, and the tokenizer.

Sources, searched under ``task.path`` if set, else under the data root (first found wins):

1. ``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt``: the Stanford release, unpacked.
2. ``aclImdb_v1.tar.gz``: the same release packed; reviews are read from the archive, nothing is unpacked.
3. HF ``stanfordnlp/imdb`` parquet: ``train-*.parquet`` and ``test-*.parquet`` (columns ``text``,
   ``label``) in one folder, e.g. ``hf download stanfordnlp/imdb --repo-type dataset --local-dir imdb``.
4. A cached HF dataset: a ``DatasetDict.save_to_disk`` folder (read with ``datasets.load_from_disk``),
   or the ``datasets`` cache folder holding ``imdb-train.arrow`` and ``imdb-test.arrow``.

Formats 3 and 4 are recognised by name only in folders whose path mentions ``imdb`` (``task.path``
lifts that rule). IMDB is not in ``lra_release.gz`` and cannot be generated. With ``task.download=true`` a
missing IMDB is fetched from the Hub as format 4 (``lra/data/download.py``).

Tokens (docs/facts.md §3.1, the LRA ``ByteTextEncoder``): the UTF-8 bytes of the raw review (``<br />``
tags kept, no lower-casing), id = byte + 1, 0 = padding; the first ``max_length`` bytes (4000, or
1000 in the Nyströmformer protocol) padded with 0 to ``seq_len`` (4096 / 1024). Each split is put in
a canonical order, sorted by (label, review bytes), so every source gives identical arrays.

Splits: the 25,000 train and 25,000 test reviews. Validation (``dev_split``): ``carve`` (default)
holds out a seeded ``val_fraction`` of train; ``test`` reproduces the papers' protocol, where the
validation set IS the test set (model selection then sees the test data: say so when reporting).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from lra.data import download
from lra.data.base import DataError, Split, hf_datasets, progress_bar
from lra.data.cache import cached_splits, source_fingerprint
from lra.data.official import check_whole, class_sizes
from lra.data.provenance import Origin, downloaded_stamp, relative_path
from lra.data.registry import register_task
from lra.data.release import explicit_path, is_archive, iter_tar, walk
from lra.tasks import TextSpec

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
CLASSES = ("neg", "pos")  # label 0, 1 (as HF stanfordnlp/imdb and TFDS imdb_reviews)
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
_TAR_MEMBER = re.compile(r"(?:^|/)aclImdb/(train|test)/(pos|neg)/[^/]+\.txt$")


# ------------------------------------------------------------------------------ byte tokenizer
def encode_bytes(docs: Sequence[bytes], max_length: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Token matrix (N, seq_len) int16 with id = byte + 1 (0 = pad) and the lengths (N,) int32."""
    if seq_len < max_length:
        raise ValueError(f"seq_len ({seq_len}) must be >= max_length ({max_length})")
    tokens = np.zeros((len(docs), seq_len), dtype=np.int16)
    lengths = np.zeros(len(docs), dtype=np.int32)
    for i, d in enumerate(docs):
        a = np.frombuffer(d[:max_length], dtype=np.uint8)
        tokens[i, : len(a)] = a.astype(np.int16) + 1
        lengths[i] = len(a)
    return tokens, lengths


def decode_bytes(ids) -> bytes:
    """Inverse of :func:`encode_bytes` for one row (padding dropped)."""
    ids = np.asarray(ids)
    return bytes((ids[ids > 0] - 1).astype(np.uint8).tolist())


# ------------------------------------------------------------------------------ locating a source
@dataclass
class Source:
    kind: str  # folder | tar | parquet | hf_disk | hf_arrow
    path: Path
    files: list = field(default_factory=list)  # what the cache key fingerprints

    def __str__(self):
        return f"{self.kind} {self.path}"


def _acl_missing(folder: Path) -> list[str]:
    return [f"{s}/{c}" for s in SPLITS for c in CLASSES if not (folder / s / c).is_dir()]


def _split_files(files: list[str], split: str, ext: str) -> list[str]:
    """Shards of one split: ``train-00000-of-00001.parquet``, ``train.parquet``, ``imdb-train.arrow``."""
    pat = re.compile(rf"(?:^|[-_.]){split}(?:[-_.][-_.0-9of]*)?\.{ext}$")
    return sorted(f for f in files if pat.search(f) and "unsup" not in f)


def locate(root: Path, explicit: Path | None) -> tuple[Source | None, list[str]]:
    """The first usable source and notes on incomplete ones (for the error message)."""
    base = explicit or root
    notes: list[str] = []
    if explicit is not None and explicit.is_file():
        if is_archive(explicit):
            return Source("tar", explicit, [explicit]), notes
        if explicit.suffix == ".parquet":
            base = explicit.parent
        else:
            raise DataError(
                f"task.path={explicit}: expected an aclImdb folder, aclImdb_v1.tar.gz, a folder of "
                f"train/test parquet files or a saved HF dataset"
            )
    found: dict[str, list[Source]] = {}
    for folder, dirs, files in walk(base):
        named = explicit is not None or "imdb" in str(folder.relative_to(base.parent)).lower()
        if "train" in dirs and "test" in dirs and (folder.name == "aclImdb" or folder == explicit):
            missing = _acl_missing(folder)
            if missing:
                notes.append(f"{folder} is incomplete (no {', '.join(missing)}): unpack aclImdb_v1.tar.gz again")
            else:
                found.setdefault("folder", []).append(
                    Source("folder", folder, [folder / s / c for s in SPLITS for c in CLASSES])
                )
        for f in files:
            if f.startswith("aclImdb") and f.endswith((".tar.gz", ".tgz", ".tar")):
                found.setdefault("tar", []).append(Source("tar", folder / f, [folder / f]))
        if named:
            pq = {s: _split_files(files, s, "parquet") for s in SPLITS}
            if all(pq.values()):
                found.setdefault("parquet", []).append(
                    Source("parquet", folder, [folder / f for s in SPLITS for f in pq[s]])
                )
            elif any(pq.values()):
                notes.append(
                    f"{folder} has parquet files for {[s for s in SPLITS if pq[s]]} only: "
                    f"train-*.parquet and test-*.parquet are both needed"
                )
            if "dataset_dict.json" in files:
                found.setdefault("hf_disk", []).append(
                    Source("hf_disk", folder, [folder / "dataset_dict.json"] + [folder / s for s in SPLITS])
                )
            ar = {s: _split_files(files, s, "arrow") for s in SPLITS}
            if all(ar.values()):
                found.setdefault("hf_arrow", []).append(
                    Source("hf_arrow", folder, [folder / f for s in SPLITS for f in ar[s]])
                )
    for kind in ("folder", "tar", "parquet", "hf_disk", "hf_arrow"):
        if found.get(kind):
            others = [str(s) for k in found for s in found[k] if s is not found[kind][0]]
            if others:
                log.info("IMDB: using %s (also found: %s)", found[kind][0], "; ".join(others))
            return found[kind][0], notes
    return None, notes


def missing_error(root: Path, explicit: Path | None, notes: list[str]) -> DataError:
    where = f"task.path={explicit}" if explicit else f"the data root {root}"
    extra = "".join(f"\n  - {n}" for n in notes)
    return DataError(
        f"IMDB reviews (task=text) not found under {where}.{extra}\n"
        f"Looked for: an aclImdb/ folder with train/ and test/ (pos/, neg/), aclImdb_v1.tar.gz, HF "
        f"stanfordnlp/imdb parquet (train-*.parquet + test-*.parquet) or a saved HF dataset "
        f"(dataset_dict.json) in a folder whose path contains 'imdb'.\n"
        f"IMDB cannot be generated and is not inside lra_release.gz. Get it in one of these ways:\n"
        f"  - download {IMDB_URL} and put the file at {root}/aclImdb_v1.tar.gz (no need to unpack it; "
        f"unpacked, it goes to {root}/aclImdb/)\n"
        f"  - hf download stanfordnlp/imdb --repo-type dataset --local-dir {root}/imdb\n"
        f"  - python -c \"import datasets; datasets.load_dataset('stanfordnlp/imdb').save_to_disk('{root}/imdb')\"\n"
        f"{download.hint('text', root)}\n"
        f"then run `make data task=text` (or set LRA_DATA to the folder holding them)."
    )


# ------------------------------------------------------------------------------ readers
Rows = dict[str, list[tuple[int, bytes]]]


def _check_label(label, where) -> int:
    try:
        lab = int(label)
    except (TypeError, ValueError):
        lab = -1
    if lab not in (0, 1):
        raise DataError(f"{where}: label must be 0 (neg) or 1 (pos), got {label!r}")
    return lab


FIXES = {
    "folder": f"unpack aclImdb_v1.tar.gz again (or delete the folder and put the archive, {IMDB_URL}, in the "
    f"data root: it is read without unpacking)",
    "tar": f"download it again ({IMDB_URL})",
}
HF_FIX = "delete the folder and download it again (task.download=true, or as docs/data.md says)"


def folder_counts(folder: Path) -> dict[str, int]:
    """Reviews (``*.txt``) per ``<split>/<class>`` folder of an unpacked release."""
    return {f"{s}/{c}": sum(n.endswith(".txt") for n in os.listdir(folder / s / c)) for s in SPLITS for c in CLASSES}


def check_source(src: Source, splits: dict[str, Split]) -> None:
    """The reviews per split and class of the official IMDB (lra/data/official.py), counted on the splits
    before the carve's validation is taken back into train; ``val`` aliasing ``test`` is not built yet."""
    merged = {"train": ("train", "val"), "test": ("test",)}
    check_whole("text", class_sizes(splits, merged, CLASSES), src.path, "reviews", FIXES.get(src.kind, HF_FIX))


def read_folder(folder: Path, progress: bool = True) -> Rows:
    jobs = []
    for s in SPLITS:
        for lab, c in enumerate(CLASSES):
            d = folder / s / c
            names = sorted(n for n in os.listdir(d) if n.endswith(".txt"))
            if not names:
                raise DataError(f"{d}: no reviews (*.txt) in this folder; unpack aclImdb_v1.tar.gz again")
            jobs += [(s, lab, d / n) for n in names]
    bar = _bar(progress, len(jobs), f"reading {folder}")
    out: Rows = {s: [] for s in SPLITS}
    for s, lab, p in jobs:
        out[s].append((lab, p.read_bytes()))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return out


def read_tar(path: Path, progress: bool = True) -> Rows:
    out: Rows = {s: [] for s in SPLITS}
    for name, f in iter_tar(path, lambda n: _TAR_MEMBER.search(n) is not None, progress=progress):
        m = _TAR_MEMBER.search(name)
        out[m.group(1)].append((CLASSES.index(m.group(2)), f.read()))
    empty = [f"{s}/{c}" for s in SPLITS for lab, c in enumerate(CLASSES) if not any(x == lab for x, _ in out[s])]
    if empty:
        raise DataError(
            f"{path}: no aclImdb/{empty[0]}/*.txt members; this is not (or not all of) " f"the IMDB release {IMDB_URL}"
        )
    return out


def read_parquet(files: list[Path]) -> Rows:
    import pandas as pd

    out: Rows = {s: [] for s in SPLITS}
    for f in files:
        split = "train" if _split_files([f.name], "train", "parquet") else "test"
        try:
            df = pd.read_parquet(f, columns=["text", "label"])
        except Exception as e:  # pyarrow raises several types for bad files
            raise DataError(
                f"{f}: cannot read the columns 'text' and 'label' ({type(e).__name__}: {e}); "
                f"expected the HF stanfordnlp/imdb parquet files"
            ) from None
        for i, (t, lab) in enumerate(zip(df["text"].tolist(), df["label"].tolist())):
            if not isinstance(t, str):
                raise DataError(f"{f}: row {i}: 'text' is {type(t).__name__}, expected a string")
            out[split].append((_check_label(lab, f"{f}: row {i}"), t.encode("utf-8")))
    return out


def _rows_from_dataset(ds, where) -> list[tuple[int, bytes]]:
    cols = set(ds.column_names)
    if not {"text", "label"} <= cols:
        raise DataError(f"{where}: columns {sorted(cols)}, expected 'text' and 'label' (HF stanfordnlp/imdb)")
    return [(_check_label(lab, where), t.encode("utf-8")) for t, lab in zip(ds["text"], ds["label"])]


def read_hf_disk(folder: Path) -> Rows:
    datasets = hf_datasets(f"reading {folder}")

    try:
        dd = datasets.load_from_disk(str(folder))
    except Exception as e:
        raise DataError(
            f"{folder}: datasets.load_from_disk failed ({type(e).__name__}: {e}); expected a folder "
            f"written by DatasetDict.save_to_disk"
        ) from None
    missing = [s for s in SPLITS if s not in dd]
    if missing:
        raise DataError(f"{folder}: the saved dataset has splits {list(dd)}, needs {list(SPLITS)}")
    return {s: _rows_from_dataset(dd[s], folder / s) for s in SPLITS}


def read_hf_arrow(files: list[Path]) -> Rows:
    datasets = hf_datasets(f"reading {files[0].parent}")

    out: Rows = {s: [] for s in SPLITS}
    for f in files:
        split = "train" if _split_files([f.name], "train", "arrow") else "test"
        try:
            ds = datasets.Dataset.from_file(str(f))
        except Exception as e:
            raise DataError(f"{f}: not a readable HF datasets arrow file ({type(e).__name__}: {e})") from None
        out[split] += _rows_from_dataset(ds, f)
    return out


def read_source(src: Source, progress: bool = True) -> Rows:
    if src.kind == "folder":
        return read_folder(src.path, progress)
    if src.kind == "tar":
        return read_tar(src.path, progress)
    if src.kind == "parquet":
        return read_parquet(src.files)
    if src.kind == "hf_disk":
        return read_hf_disk(src.path)
    if src.kind == "hf_arrow":
        return read_hf_arrow(src.files)
    raise ValueError(src.kind)


def _bar(progress, total, desc):
    if not progress:
        return None
    return progress_bar(total, desc, "file")


# ------------------------------------------------------------------------------ splits
def carve(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train, val) index sets of ``range(n)``, each sorted; val has ``round(fraction * n)``."""
    if not 0 < fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_val = max(1, int(round(fraction * n)))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def build_splits(
    rows: Rows, max_length: int, seq_len: int, dev_split: str, val_fraction: float, split_seed: int
) -> dict[str, Split]:
    out = {}
    for s in SPLITS:
        ordered = sorted(rows[s])  # canonical: by label, then bytes
        tokens, lengths = encode_bytes([b for _, b in ordered], max_length, seq_len)
        out[s] = Split(tokens, lengths, np.array([lab for lab, _ in ordered], dtype=np.int64))
    if dev_split == "carve":
        tr, va = carve(len(out["train"]), val_fraction, split_seed)
        full = out["train"]
        out["train"] = Split(full.tokens[tr], full.lengths[tr], full.labels[tr])
        out["val"] = Split(full.tokens[va], full.lengths[va], full.labels[va])
    return out


KINDS = {"folder": "release", "tar": "archive", "parquet": "hf", "hf_disk": "hf", "hf_arrow": "hf"}


def origin(src: Source, root: Path) -> Origin:
    return Origin(
        KINDS[src.kind],
        src.kind,
        f"IMDB reviews, {src.kind} {relative_path(src.path, root)}",
        src.files,
        downloaded=downloaded_stamp(src.path, root),
    )


@register_task("text", spec=TextSpec)
def load(spec: TextSpec, root: Path, progress: bool = True) -> dict[str, Split]:
    dev_split = spec.dev_split
    explicit = explicit_path(spec.path)
    src, notes = locate(root, explicit)
    if src is None and spec.download:
        download.fetch("text", root, explicit, progress, by_hand=f"download {IMDB_URL} to {root}/aclImdb_v1.tar.gz")
        src, notes = locate(root, explicit)
    if src is None:
        raise missing_error(root, explicit, notes)
    if src.kind == "folder":  # counted before anything is read: an interrupted unpacking is the common case
        check_whole("text", folder_counts(src.path), src.path, "reviews", FIXES["folder"])
    max_length, seq_len = spec.max_length, spec.seq_len
    key = {
        "task": "text",
        "max_length": max_length,
        "seq_len": seq_len,
        "dev_split": dev_split,
        "val_fraction": float(spec.val_fraction) if dev_split == "carve" else None,
        "split_seed": spec.split_seed,
        "source": src.kind,
        "sources": source_fingerprint(src.files),
    }

    def build():
        log.info("IMDB: reading %s", src)
        rows = read_source(src, progress)
        log.info("IMDB: %s", ", ".join(f"{s} {len(rows[s])} reviews" for s in SPLITS))
        return build_splits(rows, max_length, seq_len, dev_split, key["val_fraction"] or 0.0, key["split_seed"])

    splits = cached_splits(root, "text", key, build, origin(src, root), check=lambda sp: check_source(src, sp))
    if dev_split == "test":
        splits["val"] = splits["test"]
    return {s: splits[s] for s in ("train", "val", "test")}
