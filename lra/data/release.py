"""Finding data anywhere under the data root, and reading members straight out of tar archives.

The official LRA archive ``lra_release.gz`` is a gzipped tar (about 8.2 GB packed, 18.6 GB unpacked)
whose members start with ``lra_release/`` and mostly ``lra_release/lra_release/`` (``listops-1000/``,
``tsv_data/``, ``pathfinder{32,64,128,256}/``). Users unpack it anywhere, or not at all, so the
readers search: :func:`find_dirs` / :func:`find_files` walk the data root (breadth first, a few
levels deep, skipping the cache and the huge leaf folders of images and reviews), and
:func:`iter_tar` streams an archive once, handing over only the members a reader asks for, so a task
is read from the tarball without unpacking the other 18 GB. Gzip cannot seek, so every read of an
archive is one sequential pass; the readers tokenise into the cache, so that pass happens once.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import tarfile
import zlib
from collections import deque
from pathlib import Path
from typing import IO, Callable, Iterator

from lra.checks import place
from lra.data.base import GENERATED_DIR, DataError, progress_bar

log = logging.getLogger(__name__)

MAX_DEPTH = 7  # <root>/hub/datasets--OpenNLPLab--lra/snapshots/<rev>/data/aan/ is 6 levels down
# Folders never worth entering: our cache and generated sets, image and review leaf folders (tens of
# thousands of files).
PRUNE = {"cache", GENERATED_DIR, "imgs", "pos", "neg", "unsup", "__pycache__", "node_modules", "checkpoints", "runs"}
RELEASE_ARCHIVES = ("lra_release.gz", "lra_release.tar.gz", "lra_release.tgz", "lra_release.tar")
RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"


def walk(root: Path, max_depth: int = MAX_DEPTH) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``(folder, subfolder names, file names)`` under ``root``, breadth first and sorted, so the
    shallowest match comes first. Follows symlinks (data is often linked in) without looping."""
    root = Path(root)
    if not root.is_dir():
        return
    queue, seen = deque([(root, 0)]), set()
    while queue:
        folder, depth = queue.popleft()
        try:
            real = os.path.realpath(folder)
            if real in seen:
                continue
            seen.add(real)
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs, files = [], []
        for e in entries:
            try:
                (dirs if e.is_dir() else files).append(e.name)
            except OSError:
                continue
        yield folder, dirs, files
        if depth < max_depth:
            for d in dirs:
                if d in PRUNE or d.startswith("."):
                    continue
                queue.append((folder / d, depth + 1))


def find_dirs(
    root: Path, accept: Callable[[Path, list[str], list[str]], bool], max_depth: int = MAX_DEPTH
) -> list[Path]:
    """Folders under ``root`` (``root`` included) for which ``accept(folder, dirs, files)`` holds."""
    return [folder for folder, dirs, files in walk(root, max_depth) if accept(folder, dirs, files)]


def find_files(root: Path, accept: Callable[[str], bool], max_depth: int = MAX_DEPTH) -> list[Path]:
    """Files under ``root`` whose name passes ``accept``, shallowest first."""
    return [folder / f for folder, _, files in walk(root, max_depth) for f in files if accept(f)]


def release_archives(root: Path) -> list[Path]:
    """Official release tarballs (``lra_release.gz`` and spellings of it) under ``root``."""
    return find_files(root, lambda name: name in RELEASE_ARCHIVES)


def is_archive(path: Path) -> bool:
    name = Path(path).name.lower()
    return Path(path).is_file() and (name.endswith((".tar", ".tar.gz", ".tgz", ".gz")))


def member_prefix(name: str, rel: str) -> str | None:
    """If archive member ``name`` lies under a folder path ``rel`` (e.g. ``pathfinder32/curv_baseline``),
    the part of ``name`` before it (``lra_release/lra_release/``, or ``""``); else None. Whole
    path components only."""
    parts, relparts = name.split("/"), rel.strip("/").split("/")
    k = len(relparts)
    for i in range(len(parts) - k):  # rel must be a folder: at least one component follows it
        if parts[i : i + k] == relparts:
            return "/".join(parts[:i]) + ("/" if i else "")
    return None


class _Progress:
    """A file wrapper that advances a tqdm bar by the bytes read (the archive's packed size)."""

    def __init__(self, f: IO[bytes], bar):
        self.f, self.bar = f, bar

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        if self.bar is not None:
            self.bar.update(len(b))
        return b

    def close(self):
        self.f.close()


class _Tail:
    """The tar byte stream as tarfile reads it, counting bytes and where the last non-zero byte ends, so
    that after the last member we can tell a proper end (zero blocks) from a cut or damaged archive."""

    def __init__(self, f):
        self.f, self.pos, self.data_end = f, 0, 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        stripped = len(b.rstrip(b"\0"))
        if stripped:
            self.data_end = self.pos + stripped
        self.pos += len(b)
        return b


class TruncatedArchive(tarfile.TarError):
    pass


def _check_end(tail: _Tail, offset: int) -> None:
    """tarfile stops quietly at a missing, short or damaged header, so a cut archive looks complete. A
    whole one ends, where the next header would be, with zero blocks (at least one, 512 bytes) and
    nothing but zeros after them."""
    while tail.read(1 << 20):  # the rest (for gzip this also checks the length and CRC)
        pass
    if tail.pos - offset < tarfile.BLOCKSIZE:
        raise TruncatedArchive(
            f"it ends at byte {tail.pos} without the end-of-archive block, inside or right " f"after a member"
        )
    if tail.data_end > offset:
        raise TruncatedArchive(
            f"the members stop at byte {offset} but data follows up to byte {tail.data_end} " f"(a damaged header)"
        )


_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)


def archive_error(path: Path, e: Exception) -> DataError:
    return DataError(
        f"{path}: cannot read this archive ({type(e).__name__}: {e}). It is truncated or not a "
        f"(gzipped) tar file: download it again, or unpack it with `tar xzf {Path(path).name}` and "
        f"point the task at the unpacked folder."
    )


class _Member:
    """A member's file object whose read errors (a truncated archive) become :class:`DataError`."""

    def __init__(self, f: IO[bytes], archive: Path):
        self.f, self.archive = f, archive

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except _ARCHIVE_ERRORS as e:
            raise archive_error(self.archive, e) from None

    def read(self, n: int = -1) -> bytes:
        return self._guard(self.f.read, n)

    def readline(self, n: int = -1) -> bytes:
        return self._guard(self.f.readline, n)

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line


def iter_tar(
    path: Path, wanted: Callable[[str], bool], desc: str | None = None, progress: bool = True
) -> Iterator[tuple[str, IO[bytes]]]:
    """Stream ``path`` (tar, tar.gz, or the LRA ``.gz``) once, yielding ``(member name, file object)``
    for every regular file ``wanted(name)`` accepts. A file object is valid until the next item.

    A truncated or corrupt archive raises :class:`DataError` naming it, after the members before the
    damage were handed over (callers build into the cache only once the whole pass is done). tarfile
    alone stops silently at a cut or damaged header, so gzip is decompressed here (a short stream or a
    bad CRC is an error) and the tar stream must end with zero blocks (:func:`_check_end`).
    """
    path = Path(path)
    bar = None
    if progress:
        bar = progress_bar(path.stat().st_size, desc or f"reading {path.name}", "B", unit_scale=True)
    raw = _Progress(open(path, "rb"), bar)
    try:
        magic = raw.f.read(2)
        raw.f.seek(0)
        tail = _Tail(gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw)
        with tarfile.open(fileobj=tail, mode="r|") as tf:
            for m in tf:
                name = m.name[2:] if m.name.startswith("./") else m.name
                if m.isfile() and wanted(name):
                    f = tf.extractfile(m)
                    if f is not None:
                        yield name, _Member(f, path)
            _check_end(tail, tf.offset)
    except _ARCHIVE_ERRORS as e:
        raise archive_error(path, e) from None
    finally:
        raw.close()
        if bar is not None:
            bar.close()


def natural_key(s: str):
    """Sort key that orders embedded numbers numerically (``sample_2`` before ``sample_10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def explicit_path(path: str | None) -> Path | None:
    """``task.path`` (a file or folder the user points at: a task spec's ``path``), checked to exist."""
    if not path:
        return None
    p = Path(path).expanduser()
    place("task.path", p, "point it at the data, or leave it unset", folder=None)  # a name too long: not an OSError
    if not p.exists():
        raise DataError(
            f"task.path={p} does not exist. Point it at the data (folder or archive), or leave it "
            f"unset to search the data root."
        )
    return p.resolve()
