"""Retrieval (AAN citation matching, byte level): the official TSVs from wherever they are, as two
documents per example for the dual-encoder head (``task.dual``).

Files: ``new_aan_pairs.{train,eval,test}.tsv``, searched (first found wins) in

1. ``task.path``: a folder holding the three files, or the release archive;
2. any folder under the data root holding all three: the release tree
   (``lra_release/lra_release/tsv_data/``), the HF mirror ``OpenNLPLab/lra`` (``data/aan/``), S4's
   ``aan/``, or the files dropped anywhere;
3. the release archive ``lra_release.gz`` under the data root: the three members are streamed out.

With ``task.download=true``, missing files are fetched from the HF mirror (``lra/data/download.py``).

Format (docs/facts.md §3): no header; five tab-separated fields ``label id1 id2 text1 text2``; the label
may be written as a float (``1.0``). Quotes are ordinary characters (LRA reads with
``use_quote_delim=False``), so a line is split on tabs and never parsed with CSV quoting. The text
fields are taken as raw bytes, exactly as the official pipeline does (in the release they are
Python bytes literals such as ``b'...'``, kept verbatim, escapes and all).

Tokens: each text cut to its first ``max_length`` (4000) bytes, id = byte + 1, 0 = padding, padded
to ``seq_len`` (4096): tokens ``(N, 2, seq_len)``, lengths ``(N, 2)``. Splits: train / eval / test as
released (147,086 / 18,090 / 17,437), in file order.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import IO, Iterable

import numpy as np

from lra.data import download
from lra.data.base import DataError, Split, progress_bar
from lra.data.cache import cached_splits, source_fingerprint
from lra.data.official import check_whole, split_sizes
from lra.data.provenance import Origin, downloaded_stamp, relative_path
from lra.data.registry import register_task
from lra.data.release import RELEASE_URL, explicit_path, is_archive, iter_tar, release_archives, walk
from lra.data.text import encode_bytes
from lra.tasks import RetrievalSpec

log = logging.getLogger(__name__)

FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


def parse_lines(lines: Iterable[bytes], where: str, max_length: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """Both texts (already cut to ``max_length`` bytes) and the labels of one TSV. Errors name file:line."""
    t1, t2, labels = [], [], []
    for lineno, line in enumerate(lines, start=1):
        line = line.rstrip(b"\r\n")
        if not line:
            continue
        parts = line.split(b"\t")
        if len(parts) != 5:
            raise DataError(
                f"{where}:{lineno}: expected 5 tab-separated fields (label, id1, id2, text1, text2), "
                f"got {len(parts)}. Is this an AAN file from lra_release.gz (tsv_data/)?"
            )
        try:
            lab = float(parts[0])
        except ValueError:
            lab = -1.0
        if lab not in (0.0, 1.0):
            raise DataError(f"{where}:{lineno}: label must be 0 or 1, got {parts[0][:20]!r}")
        labels.append(int(lab))
        t1.append(parts[3][:max_length])
        t2.append(parts[4][:max_length])
    if not labels:
        raise DataError(f"{where}: no examples (the file is empty); copy it again from lra_release.gz")
    return t1, t2, labels


def to_split(t1, t2, labels, max_length: int, seq_len: int) -> Split:
    a, la = encode_bytes(t1, max_length, seq_len)
    b, lb = encode_bytes(t2, max_length, seq_len)
    return Split(np.stack([a, b], axis=1), np.stack([la, lb], axis=1), np.asarray(labels, dtype=np.int64))


def _read_file(path: Path, max_length: int, progress: bool):
    bar = None
    if progress:
        bar = progress_bar(path.stat().st_size, f"reading {path.name}", "B", unit_scale=True)

    def lines(f: IO[bytes]):
        for line in f:
            if bar is not None:
                bar.update(len(line))
            yield line

    try:
        with open(path, "rb") as f:
            return parse_lines(lines(f), str(path), max_length)
    finally:
        if bar is not None:
            bar.close()


def locate(root: Path, explicit: Path | None):
    """``("folder", folder)`` or ``("archive", file)``, and notes on incomplete folders."""
    notes = []
    if explicit is not None and explicit.is_file():
        if is_archive(explicit):
            return ("archive", explicit), notes
        explicit = explicit.parent
    for folder, _, files in walk(explicit or root):
        have = [s for s, f in FILES.items() if f in files]
        if len(have) == 3:
            return ("folder", folder), notes
        if have:
            notes.append(
                f"{folder} has {', '.join(FILES[s] for s in have)} but not "
                f"{', '.join(FILES[s] for s in FILES if s not in have)}"
            )
    archives = release_archives(explicit or root)
    if archives:
        return ("archive", archives[0]), notes
    return None, notes


def missing_error(root: Path, explicit: Path | None, notes: list[str]) -> DataError:
    where = f"task.path={explicit}" if explicit else f"the data root {root}"
    extra = "".join(f"\n  - {n}" for n in notes)
    return DataError(
        f"AAN retrieval data (task=retrieval) not found under {where}.{extra}\n"
        f"Looked for a folder holding {', '.join(FILES.values())}, or the release archive lra_release.gz.\n"
        f"The retrieval pairs cannot be generated. Get them in one of these ways:\n"
        f"  - the LRA release {RELEASE_URL} (8.2 GB; its public link has been reported to answer 403): put "
        f"lra_release.gz anywhere under {root} (it is read without unpacking), or unpack it there "
        f"(the files are in lra_release/lra_release/tsv_data/)\n"
        f"  - the HF mirror: hf download OpenNLPLab/lra --repo-type dataset --local-dir {root}/OpenNLPLab-lra "
        f"(the files are in data/aan/)\n"
        f"  - or copy the three .tsv files into {root}/tsv_data/\n"
        f"{download.hint('retrieval', root)}\n"
        f"then run `make data task=retrieval`."
    )


def read_archive(path: Path, max_length: int, progress: bool) -> dict:
    """The three TSVs streamed out of the release archive (the first copy found in it)."""
    wanted = {f: s for s, f in FILES.items()}
    got, prefix = {}, None

    def want(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return base in wanted and (prefix is None or name == prefix + base)

    for name, f in iter_tar(path, want, progress=progress):
        split = wanted[name.rsplit("/", 1)[-1]]
        if split in got:
            continue
        prefix = prefix or name[: len(name) - len(FILES[split])]
        got[split] = parse_lines(f, f"{path}:{name}", max_length)
    missing = [FILES[s] for s in FILES if s not in got]
    if missing:
        raise DataError(
            f"{path}: the archive has no {', '.join(missing)}; it is not the full LRA release "
            f"(lra_release.gz, tsv_data/)"
        )
    return got


@register_task("retrieval", spec=RetrievalSpec)
def load(spec: RetrievalSpec, root: Path, progress: bool = True) -> dict[str, Split]:
    explicit = explicit_path(spec.path)
    found, notes = locate(root, explicit)
    if found is None and spec.download:
        download.fetch(
            "retrieval",
            root,
            explicit,
            progress,
            by_hand=f"download {RELEASE_URL} to {root}/ (read without unpacking), or put "
            f"new_aan_pairs.{{train,eval,test}}.tsv in {root}/tsv_data/",
        )
        found, notes = locate(root, explicit)
    if found is None:
        raise missing_error(root, explicit, notes)
    kind, where = found
    files = [where / f for f in FILES.values()] if kind == "folder" else [where]
    max_length, seq_len = spec.max_length, spec.seq_len
    key = {
        "task": "retrieval",
        "max_length": max_length,
        "seq_len": seq_len,
        "source": kind,
        "sources": source_fingerprint(files),
    }

    def build():
        log.info("AAN: reading %s %s", kind, where)
        if kind == "folder":
            parsed = {s: _read_file(where / f, max_length, progress) for s, f in FILES.items()}
        else:
            parsed = read_archive(where, max_length, progress)
        return {s: to_split(*parsed[s], max_length, seq_len) for s in FILES}

    downloaded = downloaded_stamp(where, root)  # task.download's copy of the HF mirror
    data_kind = "archive" if kind == "archive" else "hf" if downloaded else "release"
    fix = (
        "delete the folder and download it again (task.download=true)"
        if downloaded
        else f"copy or unpack the files again from {RELEASE_URL}"
    )
    return cached_splits(
        root,
        "retrieval",
        key,
        build,
        Origin(data_kind, kind, f"AAN pairs, {kind} {relative_path(where, root)}", files, downloaded=downloaded),
        check=lambda sp: check_whole("retrieval", split_sizes(sp), where, "pairs", fix),
    )
