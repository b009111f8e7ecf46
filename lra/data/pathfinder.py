"""Pathfinder: reader of the official layout (folders or the release archive), generated on the fly
when absent (``lra/data/pathfinder_gen.py``).

Layout (docs/facts.md §3.2): ``pathfinder{32,64,128,256}/<difficulty>/imgs/<k>/sample_<i>.png`` with
``<difficulty>/metadata/<k>.npy``; difficulty folders ``curv_baseline`` (easy, contour length 6),
``curv_contour_length_9`` (intermediate), ``curv_contour_length_14`` (hard; LRA's "Pathfinder" is
32 px hard, "Path-X" is 128 px hard). Despite the extension the released metadata files are text,
one line per image, ``imgs/<k> sample_<i>.png <i> <label> ...``; the original generator writes real
``.npy`` arrays of the same fields: both are read.

Where (first found wins): ``task.path`` (a difficulty folder, a ``pathfinder<res>`` folder, a
folder to search, or the release archive); a ``pathfinder<res>/<difficulty>`` folder anywhere
under the data root (an unpacked release, S4's ``pathfinder/`` layout, ...); the release archive
``lra_release.gz`` under the data root (the one difficulty folder is streamed out of it; it holds
two ``pathfinder128`` copies, of which LRA issue 38 reports one does not generalise: the first in
the archive is used, unpack it and set ``task.path`` to choose); finally a generated set,
``<data root>/generated/<label>-<key>/pathfinder<res>/<difficulty>`` with ``GENERATED.json``, one
folder per generator setting (the key hashes them), made if absent (``task.generate``).

Empty or unreadable PNGs are skipped and counted in the log (the release has one empty file,
``pathfinder32/curv_baseline/imgs/0/sample_172.png``); more than 1% missing is an error.
``n_images`` below the number available takes a seeded subset. Split: a seeded permutation,
80 / 10 / 10 (train / val / test), each split kept in the canonical (metadata) order.

Tokens are the raw pixel values 0..255 (vocabulary 256, no offset) and every pixel is a real token:
lengths == resolution², so the mask is all ones (black pixels are not padding).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from lra.data.base import GENERATED_DIR, DataError, Split, data_workers, progress_bar, worker_pool
from lra.data.cache import cached_splits, source_fingerprint
from lra.data.pathfinder_gen import DIFFICULTIES, GENERATOR_VERSION, GeneratorParams, write_dataset
from lra.data.provenance import Origin, generator_fields, relative_path
from lra.data.registry import register_task
from lra.data.release import (
    RELEASE_URL,
    explicit_path,
    is_archive,
    iter_tar,
    member_prefix,
    natural_key,
    release_archives,
    walk,
)
from lra.tasks import PathfinderSpec

log = logging.getLogger(__name__)

NPY_MAGIC = b"\x93NUMPY"
MAX_SKIPPED = 0.01  # share of unreadable/missing images tolerated


# ------------------------------------------------------------------------------ metadata
def parse_metadata(data: bytes, where: str) -> list[tuple[str, int]]:
    """``(image path relative to the difficulty folder, label)`` per line of a metadata file, text or
    a real ``.npy`` array of the same fields. Errors name the file and line."""
    if data.startswith(NPY_MAGIC):
        try:
            arr = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as e:
            raise DataError(f"{where}: unreadable .npy metadata ({e})") from None
        arr = np.atleast_2d(arr)
        rows = [[x.decode() if isinstance(x, bytes) else str(x) for x in row] for row in arr.tolist()]
    else:
        rows = [line.split() for line in data.decode("utf-8", errors="replace").splitlines()]
    out = []
    for lineno, f in enumerate(rows, start=1):
        if not f:
            continue
        if len(f) < 4:
            raise DataError(
                f"{where}:{lineno}: expected at least 4 fields ('imgs/<k> sample_<i>.png <i> <label> "
                f"...'), got {len(f)}"
            )
        if f[3] not in ("0", "1"):
            raise DataError(f"{where}:{lineno}: label (field 4) must be 0 or 1, got {f[3]!r}")
        out.append((f"{f[0]}/{f[1]}", int(f[3])))
    return out


def decode_png(data: bytes | None, n: int, where: str) -> np.ndarray | str:
    """The image as uint8 (n, n), or the reason it is skipped (``missing``, ``empty``, ``unreadable``)."""
    if data is None:
        return "missing"
    if not data:
        return "empty"
    try:
        with Image.open(io.BytesIO(data)) as im:
            im = im.convert("L") if im.mode != "L" else im
            arr = np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return "unreadable"
    if arr.shape != (n, n):
        raise DataError(
            f"{where}: image is {arr.shape[1]}x{arr.shape[0]}, expected {n}x{n}; is this the "
            f"pathfinder{n} folder? (task.resolution={n})"
        )
    return arr


def _decode_files(args):
    folder, rels, n = args
    out = []
    for rel in rels:
        p = folder / rel
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            data = None
        except OSError:
            data = b"\0"  # unreadable
        out.append(decode_png(data, n, str(p)))
    return out


def _decode_blobs(args):
    blobs, n, where = args
    return [decode_png(b, n, f"{where}/{rel}") for rel, b in blobs]


# ------------------------------------------------------------------------------ locating
def is_generated(folder: Path) -> bool:
    return (folder / "GENERATED.json").exists()


def _diff_folder(candidate: Path, res: int, dirname: str) -> Path | None:
    """``candidate`` itself if it holds ``metadata/`` (a difficulty folder, whatever its name), else its
    ``<dirname>`` or ``pathfinder<res>/<dirname>`` subfolder."""
    for f in (candidate, candidate / dirname, candidate / f"pathfinder{res}" / dirname):
        if (f / "metadata").is_dir():
            return f
    return None


def locate(root: Path, explicit: Path | None, res: int, dirname: str):
    """``("folder", difficulty folder)`` or ``("archive", file)`` of OFFICIAL (not generated) data."""
    if explicit is not None:
        if explicit.is_file():
            if not is_archive(explicit):
                raise DataError(f"task.path={explicit}: expected a pathfinder folder or the release archive")
            return "archive", explicit
        direct = _diff_folder(explicit, res, dirname)
        if direct is not None:
            return "folder", direct
    base = explicit or root
    for folder, dirs, _ in walk(base):
        if folder.name == f"pathfinder{res}" and dirname in dirs:
            f = folder / dirname
            if (f / "metadata").is_dir() and not is_generated(f):
                return "folder", f
    archives = release_archives(base)
    if archives:
        return "archive", archives[0]
    return None


def missing_error(root: Path, explicit: Path | None, res: int, dirname: str) -> DataError:
    where = f"task.path={explicit}" if explicit else f"the data root {root}"
    return DataError(
        f"Pathfinder data (pathfinder{res}/{dirname}) not found under {where}, and generation is off "
        f"(task.generate=false).\nEither let it be generated (the official distribution, seeded): "
        f"`make data task=pathfinder` (or drop task.generate=false), or use the official images: put "
        f"lra_release.gz ({RELEASE_URL}) anywhere under {root} (read without unpacking), or unpack it there so "
        f"that .../pathfinder{res}/{dirname}/{{imgs,metadata}} exists."
    )


# ------------------------------------------------------------------------------ reading
def read_folder(folder: Path, res: int, n_images: int | None, seed: int, workers: int, progress: bool):
    metas = sorted((folder / "metadata").glob("*.npy"), key=lambda p: natural_key(p.stem))
    if not metas:
        raise DataError(f"{folder}/metadata: no metadata files (*.npy); the folder is incomplete, copy it again")
    records = [r for m in metas for r in parse_metadata(m.read_bytes(), str(m))]
    records = _subset(records, n_images, seed)
    rels = [rel for rel, _ in records]
    chunk = max(1, min(2000, -(-len(rels) // max(1, workers * 4))))
    jobs = [(folder, rels[i : i + chunk], res) for i in range(0, len(rels), chunk)]
    results = _run(_decode_files, jobs, workers, progress, len(rels), f"reading {folder}")
    return records, results, metas


def read_archive(path: Path, res: int, dirname: str, n_images: int | None, seed: int, workers: int, progress: bool):
    rel_dir = f"pathfinder{res}/{dirname}"
    prefixes: list[str] = []
    metas: dict[str, bytes] = {}
    pngs: dict[str, bytes] = {}

    def want(name: str) -> bool:
        p = member_prefix(name, rel_dir)
        if p is None:
            return False
        if not prefixes:
            prefixes.append(p)
        elif p not in prefixes:
            log.warning(
                "%s also holds %s%s; using the first copy, %s%s (unpack it and set task.path to choose)",
                path,
                p,
                rel_dir,
                prefixes[0],
                rel_dir,
            )
            prefixes.append(p)
        return p == prefixes[0] and (name.endswith(".png") or "/metadata/" in name)

    for name, f in iter_tar(path, want, desc=f"reading {rel_dir} from {path.name}", progress=progress):
        rel = name[len(prefixes[0]) + len(rel_dir) + 1 :]
        (metas if rel.startswith("metadata/") else pngs)[rel] = f.read()
    if not metas:
        raise DataError(
            f"{path}: no {rel_dir}/metadata/ in this archive (is it lra_release.gz?); or pick another "
            f"task.resolution / task.difficulty"
        )
    where = f"{path}:{prefixes[0]}{rel_dir}"
    records = [r for k in sorted(metas, key=natural_key) for r in parse_metadata(metas[k], f"{where}/{k}")]
    records = _subset(records, n_images, seed)
    blobs = [(rel, pngs.get(rel)) for rel, _ in records]
    chunk = max(1, min(2000, -(-len(blobs) // max(1, workers * 4))))
    jobs = [(blobs[i : i + chunk], res, where) for i in range(0, len(blobs), chunk)]
    return records, _run(_decode_blobs, jobs, workers, progress, len(blobs), "decoding"), [path]


def _subset(records, n_images, seed):
    if n_images is None or n_images >= len(records):
        return records
    keep = np.sort(np.random.default_rng(seed).choice(len(records), size=n_images, replace=False))
    log.info("Pathfinder: using a seeded subset of %d of the %d images (task.n_images)", n_images, len(records))
    return [records[i] for i in keep]


def _run(fn, jobs, workers, progress, total, desc):
    bar = None
    if progress:
        bar = progress_bar(total, desc, "img")
    out = []
    try:
        if workers > 1 and len(jobs) > 1:
            with worker_pool(min(workers, len(jobs))) as pool:
                for part in pool.imap(fn, jobs):
                    out += part
                    if bar:
                        bar.update(len(part))
        else:
            for job in jobs:
                part = fn(job)
                out += part
                if bar:
                    bar.update(len(part))
    finally:
        if bar:
            bar.close()
    return out


def assemble(records, results, res: int, where: str, split_seed: int) -> dict[str, Split]:
    """Drop skipped images (logged with counts), stack, split 80/10/10 by a seeded permutation."""
    ok = [i for i, r in enumerate(results) if not isinstance(r, str)]
    skipped = {}
    for (rel, _), r in zip(records, results):
        if isinstance(r, str):
            skipped.setdefault(r, []).append(rel)
    n_skip = len(records) - len(ok)
    if n_skip:
        detail = ", ".join(f"{len(v)} {k} (e.g. {v[0]})" for k, v in skipped.items())
        if n_skip > MAX_SKIPPED * len(records):  # docs/data.md: more than 1% is an error, however few images
            raise DataError(
                f"{where}: {n_skip} of {len(records)} images cannot be used: {detail}. The data is "
                f"incomplete or damaged: copy or unpack it again."
            )
        log.warning("Pathfinder: skipped %d of %d images: %s", n_skip, len(records), detail)
    if len(ok) < 10:
        raise DataError(f"{where}: only {len(ok)} usable images; at least 10 are needed for a split")
    tokens = np.stack([results[i] for i in ok]).reshape(len(ok), res * res)
    labels = np.array([records[i][1] for i in ok], dtype=np.int64)
    n = len(ok)
    n_val = n_test = n // 10
    perm = np.random.default_rng(split_seed).permutation(n)
    idx = {
        "train": np.sort(perm[n_val + n_test :]),
        "val": np.sort(perm[:n_val]),
        "test": np.sort(perm[n_val : n_val + n_test]),
    }
    lengths = np.full(n, res * res, dtype=np.int32)
    return {s: Split(tokens[i], lengths[i], labels[i]) for s, i in idx.items()}


# ------------------------------------------------------------------------------ loader
def generator_params(spec: PathfinderSpec) -> GeneratorParams:
    return GeneratorParams(
        resolution=spec.resolution,
        difficulty=spec.difficulty,
        n_images=spec.n_images or 200_000,
        seed=spec.generator.seed,
        chunk=spec.generator.chunk,
    )


def generated_folder(root: Path, label, params: GeneratorParams) -> Path:
    """Where the set generated with ``params`` lives:
    ``<root>/generated/<label>-<key of the settings>/pathfinder<res>/<difficulty folder>`` (``label`` is
    ``task.gen_dir``'s last part, ``pathfinder`` by default: a name for people, the key tells sets apart)."""
    name = Path(str(label or ".")).name or "pathfinder"
    blob = json.dumps({"version": GENERATOR_VERSION, **asdict(params)}, sort_keys=True)
    key = hashlib.sha1(blob.encode()).hexdigest()[:12]
    return Path(root) / GENERATED_DIR / f"{name}-{key}" / f"pathfinder{params.resolution}" / params.dirname


def _stamped_params(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "GENERATED.json").read_text()).get("params")
    except (OSError, ValueError, AttributeError):
        return None


def prepare_generated(spec: PathfinderSpec, root: Path, params: GeneratorParams, workers: int, progress: bool) -> Path:
    """The generated difficulty folder with these parameters, made if needed."""
    folder = generated_folder(root, spec.gen_dir, params)
    if _stamped_params(folder) == asdict(params):
        return folder
    release = root / (spec.gen_dir or ".") / f"pathfinder{params.resolution}" / params.dirname
    if release.exists() and not is_generated(release):  # not accepted as official data by locate(): incomplete
        raise DataError(
            f"{release} is not complete Pathfinder data (no metadata/) and was not generated by the "
            f"harness; it is left as it is. Complete it (imgs/ and metadata/), or move it away to let "
            f"Pathfinder images be generated."
        )
    if not spec.generate:
        raise missing_error(root, explicit_path(spec.path), params.resolution, params.dirname)
    log.warning(
        "Pathfinder data not found under %s: generating %d images of the official distribution "
        "(pathfinder%d %s, seed %d) into %s",
        root,
        params.n_images,
        params.resolution,
        params.difficulty,
        params.seed,
        folder,
    )
    return write_dataset(folder, params, workers=workers, progress=progress)


def load(spec: PathfinderSpec, root: Path, workers: int = 1, progress: bool = True) -> dict[str, Split]:
    res, difficulty = spec.resolution, spec.difficulty  # seq_len = res², checked by the spec
    dirname = DIFFICULTIES[difficulty][0]
    split_seed = spec.split_seed
    explicit = explicit_path(spec.path)
    found = locate(root, explicit, res, dirname)
    n_images = spec.n_images
    if found is None:
        if explicit is not None:
            raise DataError(f"task.path={explicit}: no pathfinder{res}/{dirname} (with metadata/) in it")
        params = generator_params(spec)
        found = ("folder", prepare_generated(spec, root, params, workers, progress))
        n_images = None  # the generated set is exactly the requested size
    kind, where = found
    if kind == "folder":
        files = sorted((where / "metadata").glob("*.npy")) + sorted((where / "imgs").glob("*"))
    else:
        files = [where]
    stamp = where / "GENERATED.json" if kind == "folder" else None
    key = {
        "task": "pathfinder",
        "resolution": res,
        "difficulty": difficulty,
        "split_seed": split_seed,
        "n_images": None if n_images is None else int(n_images),
        "source": kind,
        "sources": source_fingerprint(files),
        "generated": json.loads(stamp.read_text()) if stamp is not None and stamp.exists() else None,
    }

    def build():
        log.info("Pathfinder: reading %s %s", kind, where)
        n = None if n_images is None else int(n_images)
        if kind == "folder":
            records, results, _ = read_folder(where, res, n, split_seed, workers, progress)
        else:
            records, results, _ = read_archive(where, res, dirname, n, split_seed, workers, progress)
        return assemble(records, results, res, str(where), split_seed)

    return cached_splits(root, "pathfinder", key, build, origin(kind, where, root, res, dirname))


def origin(kind: str, where: Path, root: Path, res: int, dirname: str) -> Origin:
    """What the Pathfinder reader reads: a difficulty folder (generated, or the release's) or an archive."""
    rel = relative_path(where, root)
    if kind != "folder":
        return Origin("archive", kind, f"Pathfinder pathfinder{res}/{dirname} from {rel}", [where])
    paths = [where / "metadata", where / "imgs"]
    if not is_generated(where):
        return Origin("release", kind, f"Pathfinder release {rel}", paths)
    stamp = json.loads((where / "GENERATED.json").read_text())
    gen, facts = generator_fields(stamp, "lra.data.pathfinder_gen"), stamp.get("files") or {}
    return Origin(
        "generated",
        kind,
        f"Pathfinder pathfinder{res}/{dirname} generated by {gen['name']}",
        paths,
        notes=[f"generator v{gen['version']}", f"seed {gen['seed']}", f"{gen['params'].get('n_images')} images"],
        generator=gen,
        recorded={str(p): facts.get(p.name, {}).get("sha256") for p in paths},  # checked when the entry is built
    )


@register_task("pathfinder", spec=PathfinderSpec)
def load_with_all_cores(spec: PathfinderSpec, root: Path) -> dict[str, Split]:
    """The registered reader: images decoded by up to 8 processes (``load`` defaults to one)."""
    return load(spec, root, workers=data_workers())
