"""Image (CIFAR-10 grayscale): pickles, the archive, HF parquet and saved datasets agree; grey levels; splits;
errors."""

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from lra.data import DataError
from lra.data import image as im
from lra.tasks import task_spec

RNG = np.random.default_rng(0)
TRAIN = RNG.integers(0, 256, size=(50, 32, 32, 3), dtype=np.uint8)  # 5 batches of 10
TEST = RNG.integers(0, 256, size=(10, 32, 32, 3), dtype=np.uint8)
YTR, YTE = RNG.integers(0, 10, 50), RNG.integers(0, 10, 10)


def batch_bytes(x, y, name) -> bytes:
    planar = x.transpose(0, 3, 1, 2).reshape(len(x), 3072)  # the CIFAR layout: R plane, G plane, B plane
    return pickle.dumps(
        {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in y],
            b"data": planar,
            b"filenames": [b"f.png"] * len(x),
        },
        protocol=2,
    )


def batches():
    out = {
        f"data_batch_{i + 1}": batch_bytes(TRAIN[10 * i : 10 * i + 10], YTR[10 * i : 10 * i + 10], f"b{i}")
        for i in range(5)
    }
    out["test_batch"] = batch_bytes(TEST, YTE, "test")
    return out


def write_pickles(root: Path) -> Path:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for name, data in batches().items():
        (d / name).write_bytes(data)
    return d


def write_tar(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    p = root / "cifar-10-python.tar.gz"
    with tarfile.open(p, "w:gz") as tf:
        for name, data in batches().items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return p


def png(x) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(x).save(buf, format="PNG")
    return buf.getvalue()


def write_parquet(root: Path) -> Path:
    import pandas as pd

    d = root / "cifar10" / "plain_text"
    d.mkdir(parents=True)
    for split, x, y in (("train", TRAIN, YTR), ("test", TEST, YTE)):
        pd.DataFrame({"img": [{"bytes": png(a), "path": None} for a in x], "label": y}).to_parquet(
            d / f"{split}-00000-of-00001.parquet"
        )
    return d


def write_hf_disk(root: Path) -> Path:
    datasets = pytest.importorskip("datasets")  # the `data` extra; absent on some machines
    from PIL import Image

    feats = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    dd = datasets.DatasetDict(
        {
            s: datasets.Dataset.from_dict(
                {"img": [Image.fromarray(a) for a in x], "label": [int(v) for v in y]}, features=feats
            )
            for s, x, y in (("train", TRAIN, YTR), ("test", TEST, YTE))
        }
    )
    dd.save_to_disk(str(root / "cifar10_saved"))
    return root / "cifar10_saved"


def cfg(**kw):
    """The typed spec of an image node (what the reader takes)."""
    return task_spec(
        {"name": "image", "seq_len": 1024, "grayscale": "luminance", "val_fraction": 0.1, "path": None, **kw}
    )


@pytest.mark.parametrize("fmt", ["pickles", "tar", "parquet", "hf_disk"])
def test_every_format_gives_the_same_arrays(tmp_path, fmt):
    {"pickles": write_pickles, "tar": write_tar, "parquet": write_parquet, "hf_disk": write_hf_disk}[fmt](
        tmp_path / "data"
    )
    s = im.load(cfg(), tmp_path / "data", progress=False)
    assert (len(s["train"]), len(s["val"]), len(s["test"])) == (45, 5, 10)  # 90/10 of train, then test
    gray = np.rint(TRAIN @ np.array([0.299, 0.587, 0.114])).astype(np.uint8).reshape(50, 1024)
    assert np.array_equal(s["train"].tokens, gray[:45]) and np.array_equal(s["val"].tokens, gray[45:])
    assert np.array_equal(s["train"].labels, YTR[:45]) and np.array_equal(s["test"].labels, YTE)
    assert s["test"].tokens.dtype == np.uint8 and s["test"].tokens.shape == (10, 1024)
    assert (s["train"].lengths == 1024).all()  # every pixel is a real token: the mask is all ones


def test_grayscale_weights_and_the_tf_variant():
    px = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0], [10, 200, 30]], np.uint8)
    assert im.to_gray(px).tolist() == [76, 150, 29, 255, 0, 124]  # rint(0.299 R + 0.587 G + 0.114 B)
    tf = im.to_gray(px, "tf")
    assert tf.tolist() == [76, 149, 29, 255, 0, 124]  # TF: trunc(0.5870 * 255.5) = 149
    diff = np.abs(im.to_gray(TRAIN).astype(int) - im.to_gray(TRAIN, "tf").astype(int))
    assert diff.max() <= 1
    with pytest.raises(ValueError, match="grayscale"):
        im.to_gray(px, "average")


def test_tf_variant_is_cached_separately(tmp_path):
    write_pickles(tmp_path)
    a = im.load(cfg(), tmp_path, progress=False)
    b = im.load(cfg(grayscale="tf"), tmp_path, progress=False)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert np.abs(a["test"].tokens.astype(int) - b["test"].tokens.astype(int)).max() <= 1


def test_pickle_with_foreign_objects_is_refused(tmp_path):
    d = write_pickles(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError) as e:
        im.load(cfg(), tmp_path, progress=False)
    assert str(d / "data_batch_3") in str(e.value) and "not a CIFAR-10 python batch" in str(e.value)


def test_incomplete_folder_and_missing_data(tmp_path):
    d = write_pickles(tmp_path)
    (d / "data_batch_5").unlink()
    with pytest.raises(DataError) as e:
        im.load(cfg(), tmp_path, progress=False)
    msg = str(e.value)
    assert f"{d} is incomplete" in msg
    for needle in (
        "cifar-10-python.tar.gz",
        "uoft-cs/cifar10",
        str(tmp_path / "cifar-10-batches-py"),
        "make data task=image",
        "cannot be generated",
    ):
        assert needle in msg, needle


def test_broken_torchvision_falls_back_to_the_pickles(tmp_path, monkeypatch, caplog):
    import importlib.util
    import sys

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "torchvision" else real(n, *a))
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails like a CUDA build on a CPU torch
    write_pickles(tmp_path)
    with caplog.at_level("INFO"):
        s = im.load(cfg(), tmp_path, progress=False)
    assert "torchvision cannot read" in caplog.text and len(s["train"]) == 45


def test_config():
    from lra.config import compose

    c = compose(["task=image", "quirks=none"])
    assert (c.task.vocab_size, c.task.seq_len, c.task.num_classes, c.task.grayscale) == (256, 1024, 10, "luminance")
    c = compose(["task=image"])  # the default preset's quirks=skeinformer: TF grayscale, pixel 0 as pad
    assert (c.task.vocab_size, c.task.grayscale, c.task.mask) == (256, "tf", "nonzero")
    c = compose(["task=image", "preset=quick", "task.grayscale=tf"])
    assert c.task.grayscale == "tf" and c.task.max_examples.test == 1000
