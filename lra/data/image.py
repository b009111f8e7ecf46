"""Image (CIFAR-10 in grayscale, one token per pixel): readers for every form CIFAR-10 comes in.

Sources, searched under ``task.path`` if set, else under the data root (first found wins):

1. ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``): read with torchvision's
   ``CIFAR10`` class when torchvision is installed and imports (with a CPU torch it usually does
   not: docs/facts.md §7), else by our reader of the same pickles. Both give the same arrays.
2. ``cifar-10-python.tar.gz``: the same pickles, read straight from the archive.
3. HF ``uoft-cs/cifar10`` parquet: ``train-*.parquet`` and ``test-*.parquet`` with columns ``img``
   (PNG bytes) and ``label``, in a folder whose path mentions ``cifar`` (``task.path`` lifts that).
4. A saved HF dataset (``DatasetDict.save_to_disk``, read with ``datasets.load_from_disk``) with the
   same columns, path mentioning ``cifar``.

CIFAR-10 is not in ``lra_release.gz`` and cannot be generated. With ``task.download=true`` a missing
CIFAR-10 is fetched from the Hub as format 4 (``lra/data/download.py``).

Grayscale (``task.grayscale``): ``luminance`` (default) = round(0.299 R + 0.587 G + 0.114 B), the
ITU-R 601 weights; ``tf`` reproduces the LRA pipeline bit for bit (TF's ``rgb_to_grayscale``:
weights 0.2989 / 0.5870 / 0.1140 on float32 pixels / 255, back to uint8 by ×255.5 and truncation).
The two differ by at most one grey level. Tokens are the grey values 0..255 (vocabulary 256), every
pixel a real token (lengths 1024, the mask all ones).

Splits (the LRA / TFDS split): train = the first 90% of the 50,000 training images in batch order
(45,000), val = the last 10% (5,000), test = the 10,000 test images.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import pickle
import re
from pathlib import Path

import numpy as np

from lra.data import download
from lra.data.base import DataError, Split, hf_datasets
from lra.data.cache import cached_splits, source_fingerprint
from lra.data.official import check_whole, split_sizes
from lra.data.provenance import Origin, downloaded_stamp, relative_path
from lra.data.registry import register_task
from lra.data.release import explicit_path, is_archive, iter_tar, walk
from lra.tasks import ImageSpec

log = logging.getLogger(__name__)

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
_TAR_MEMBER = re.compile(r"(?:^|/)cifar-10-batches-py/(data_batch_[1-5]|test_batch)$")


# ------------------------------------------------------------------------------ grayscale
def to_gray(rgb: np.ndarray, method: str = "luminance") -> np.ndarray:
    """(..., 3) uint8 RGB -> (...) uint8 grey."""
    if method == "luminance":
        g = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
        return np.clip(np.rint(g), 0, 255).astype(np.uint8)
    if method == "tf":
        f = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
        w = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
        g = np.tensordot(f, w, axes=([-1], [0])).astype(np.float32)
        return (g * np.float32(255.5)).astype(np.uint8)
    raise ValueError(f"task.grayscale must be 'luminance' or 'tf', got {method!r}")


# ------------------------------------------------------------------------------ pickles
class _BatchUnpickler(pickle.Unpickler):
    """Loads a CIFAR batch (a dict of numpy arrays and lists) and nothing else."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch")


def read_batch(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """RGB images (N, 32, 32, 3) uint8 and labels (N,) of one pickled batch."""
    try:
        d = _BatchUnpickler(io.BytesIO(data), encoding="bytes").load()
        d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}
        x = np.asarray(d["data"], dtype=np.uint8)
        y = np.asarray(d["labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, AttributeError, TypeError, ValueError) as e:
        raise DataError(
            f"{where}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); download " f"{CIFAR_URL} again"
        ) from None
    if x.ndim != 2 or x.shape[1] != 3072 or len(x) != len(y):
        raise DataError(f"{where}: expected data of shape (N, 3072) and N labels, got {x.shape} and {len(y)}")
    if y.min() < 0 or y.max() > 9:
        raise DataError(f"{where}: labels must be 0..9")
    return x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), y


def _torchvision(folder: Path):
    """torchvision's CIFAR10 reader, if it is installed and works (it checks the files' MD5s)."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        from torchvision.datasets import CIFAR10

        out = {}
        for split, train in (("train", True), ("test", False)):
            ds = CIFAR10(str(folder.parent), train=train, download=False)
            out[split] = (np.asarray(ds.data, dtype=np.uint8), np.asarray(ds.targets, dtype=np.int64))
        log.info("CIFAR-10: read %s with torchvision", folder)
        return out
    except Exception as e:  # a broken torchvision (CPU torch) fails in many ways
        log.info(
            "CIFAR-10: torchvision cannot read %s (%s: %s); reading the pickles directly",
            folder,
            type(e).__name__,
            str(e)[:200],
        )
        return None


def read_pickles(folder: Path) -> dict:
    missing = [b for b in TRAIN_BATCHES + (TEST_BATCH,) if not (folder / b).is_file()]
    if missing:
        raise DataError(
            f"{folder} is incomplete: no {', '.join(missing)}. Unpack {CIFAR_URL} again "
            f"(it holds cifar-10-batches-py/ with data_batch_1..5 and test_batch)"
        )
    tv = _torchvision(folder)
    if tv is not None:
        return tv
    train = [read_batch((folder / b).read_bytes(), str(folder / b)) for b in TRAIN_BATCHES]
    test = read_batch((folder / TEST_BATCH).read_bytes(), str(folder / TEST_BATCH))
    return {"train": (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])), "test": test}


def read_tar(path: Path, progress: bool = True) -> dict:
    got = {}
    for name, f in iter_tar(path, lambda n: _TAR_MEMBER.search(n) is not None, progress=progress):
        got[_TAR_MEMBER.search(name).group(1)] = read_batch(f.read(), f"{path}:{name}")
    missing = [b for b in TRAIN_BATCHES + (TEST_BATCH,) if b not in got]
    if missing:
        raise DataError(f"{path}: no cifar-10-batches-py/{missing[0]} in this archive; expected {CIFAR_URL}")
    return {
        "train": (
            np.concatenate([got[b][0] for b in TRAIN_BATCHES]),
            np.concatenate([got[b][1] for b in TRAIN_BATCHES]),
        ),
        "test": got[TEST_BATCH],
    }


# ------------------------------------------------------------------------------ HF formats
def _decode_images(blobs, where) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(blobs), 32, 32, 3), dtype=np.uint8)
    for i, b in enumerate(blobs):
        data = b.get("bytes") if isinstance(b, dict) else b
        try:
            with Image.open(io.BytesIO(data)) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except Exception as e:
            raise DataError(f"{where}: row {i}: 'img' is not a readable image ({type(e).__name__})") from None
        if arr.shape != (32, 32, 3):
            raise DataError(f"{where}: row {i}: image is {arr.shape[1]}x{arr.shape[0]}, expected 32x32")
        out[i] = arr
    return out


def _labels(values, where) -> np.ndarray:
    y = np.asarray(values, dtype=np.int64)
    if len(y) and (y.min() < 0 or y.max() > 9):
        raise DataError(f"{where}: labels must be 0..9")
    return y


def _split_files(files: list[str], split: str) -> list[str]:
    pat = re.compile(rf"(?:^|[-_.]){split}(?:[-_.][-_.0-9of]*)?\.parquet$")
    return sorted(f for f in files if pat.search(f))


def read_parquet(folder: Path, files: dict) -> dict:
    import pandas as pd

    out = {}
    for split, names in files.items():
        xs, ys = [], []
        for name in names:
            f = folder / name
            try:
                df = pd.read_parquet(f, columns=["img", "label"])
            except Exception as e:
                raise DataError(
                    f"{f}: cannot read the columns 'img' and 'label' ({type(e).__name__}: {e}); "
                    f"expected the HF uoft-cs/cifar10 parquet files"
                ) from None
            xs.append(_decode_images(df["img"].tolist(), f))
            ys.append(_labels(df["label"].tolist(), f))
        out[split] = (np.concatenate(xs), np.concatenate(ys))
    return out


def read_hf_disk(folder: Path) -> dict:
    datasets = hf_datasets(f"reading {folder}")

    try:
        dd = datasets.load_from_disk(str(folder))
    except Exception as e:
        raise DataError(f"{folder}: datasets.load_from_disk failed ({type(e).__name__}: {e})") from None
    out = {}
    for split in ("train", "test"):
        if split not in dd:
            raise DataError(f"{folder}: the saved dataset has splits {list(dd)}, needs train and test")
        ds = dd[split]
        if not {"img", "label"} <= set(ds.column_names):
            raise DataError(f"{folder}/{split}: columns {ds.column_names}, expected 'img' and 'label'")
        ds = ds.cast_column("img", datasets.Image(decode=False))
        out[split] = (_decode_images(ds["img"], folder / split), _labels(ds["label"], folder / split))
    return out


# ------------------------------------------------------------------------------ locating
def locate(root: Path, explicit: Path | None):
    """(kind, path, extra) of the first source found, and notes on incomplete ones."""
    notes = []
    if explicit is not None and explicit.is_file():
        if is_archive(explicit):
            return ("tar", explicit, None), notes
        explicit = explicit.parent
    base = explicit or root
    found = {}
    for folder, dirs, files in walk(base):
        if folder.name == "cifar-10-batches-py" or (folder == explicit and "data_batch_1" in files):
            have = [b for b in TRAIN_BATCHES + (TEST_BATCH,) if b in files]
            if len(have) == 6:
                found.setdefault("pickles", (folder, None))
            else:
                notes.append(f"{folder} is incomplete: has {have or 'no batches'}")
        for f in files:
            if f.startswith("cifar-10-python") and f.endswith((".tar.gz", ".tgz", ".tar")):
                found.setdefault("tar", (folder / f, None))
        if explicit is not None or "cifar" in str(folder.relative_to(base.parent)).lower():
            pq = {s: _split_files(files, s) for s in ("train", "test")}
            if all(pq.values()):
                found.setdefault("parquet", (folder, pq))
            if "dataset_dict.json" in files:
                found.setdefault("hf_disk", (folder, None))
    for kind in ("pickles", "tar", "parquet", "hf_disk"):
        if kind in found:
            return (kind, *found[kind]), notes
    return None, notes


def missing_error(root: Path, explicit: Path | None, notes: list[str]) -> DataError:
    where = f"task.path={explicit}" if explicit else f"the data root {root}"
    extra = "".join(f"\n  - {n}" for n in notes)
    return DataError(
        f"CIFAR-10 (task=image) not found under {where}.{extra}\n"
        f"Looked for cifar-10-batches-py/ (data_batch_1..5, test_batch), cifar-10-python.tar.gz, HF "
        f"uoft-cs/cifar10 parquet (train-*.parquet + test-*.parquet) or a saved HF dataset (dataset_dict.json) "
        f"in a folder whose path contains 'cifar'.\n"
        f"CIFAR-10 cannot be generated and is not inside lra_release.gz. Get it in one of these ways:\n"
        f"  - download {CIFAR_URL} and put the file at {root}/cifar-10-python.tar.gz (read without unpacking; "
        f"unpacked, it is {root}/cifar-10-batches-py/)\n"
        f"  - hf download uoft-cs/cifar10 --repo-type dataset --local-dir {root}/cifar10\n"
        f"  - python -c \"import datasets; datasets.load_dataset('uoft-cs/cifar10').save_to_disk('{root}/cifar10')\"\n"
        f"{download.hint('image', root)}\n"
        f"then run `make data task=image`."
    )


@register_task("image", spec=ImageSpec)
def load(spec: ImageSpec, root: Path, progress: bool = True) -> dict[str, Split]:
    method, val_fraction = spec.grayscale, float(spec.val_fraction)
    explicit = explicit_path(spec.path)
    found, notes = locate(root, explicit)
    if found is None and spec.download:
        download.fetch(
            "image", root, explicit, progress, by_hand=f"download {CIFAR_URL} to {root}/cifar-10-python.tar.gz"
        )
        found, notes = locate(root, explicit)
    if found is None:
        raise missing_error(root, explicit, notes)
    kind, where, extra = found
    if kind == "pickles":
        files = [where / b for b in TRAIN_BATCHES + (TEST_BATCH,)]
    elif kind == "parquet":
        files = [where / f for fs in extra.values() for f in fs]
    elif kind == "hf_disk":
        files = [where / "dataset_dict.json", where / "train", where / "test"]
    else:
        files = [where]
    key = {
        "task": "image",
        "grayscale": method,
        "val_fraction": val_fraction,
        "source": kind,
        "sources": source_fingerprint(files),
    }

    def build():
        log.info("CIFAR-10: reading %s %s", kind, where)
        if kind == "pickles":
            data = read_pickles(where)
        elif kind == "tar":
            data = read_tar(where, progress)
        elif kind == "parquet":
            data = read_parquet(where, extra)
        else:
            data = read_hf_disk(where)
        (xtr, ytr), (xte, yte) = data["train"], data["test"]
        gtr, gte = to_gray(xtr, method).reshape(len(xtr), -1), to_gray(xte, method).reshape(len(xte), -1)
        n_val = int(round(val_fraction * len(xtr)))
        if not 0 < n_val < len(xtr):
            raise ValueError(f"task.val_fraction={val_fraction} leaves no train or val images")
        cut = len(xtr) - n_val
        full = lambda x, y: Split(x, np.full(len(x), x.shape[1], np.int32), y)  # noqa: E731
        return {"train": full(gtr[:cut], ytr[:cut]), "val": full(gtr[cut:], ytr[cut:]), "test": full(gte, yte)}

    kinds = {"pickles": "release", "tar": "archive", "parquet": "hf", "hf_disk": "hf"}
    fix = (
        f"download it again ({CIFAR_URL})"
        if kind in ("pickles", "tar")
        else "delete the folder and download it again (task.download=true)"
    )
    sizes = lambda sp: split_sizes(sp, {"train": ("train", "val")})  # noqa: E731 - val is train's end
    return cached_splits(
        root,
        "image",
        key,
        build,
        Origin(
            kinds[kind],
            kind,
            f"CIFAR-10 ({method} grayscale), {kind} {relative_path(where, root)}",
            files,
            downloaded=downloaded_stamp(where, root),
        ),
        check=lambda sp: check_whole("image", sizes(sp), where, "images", fix),
    )
