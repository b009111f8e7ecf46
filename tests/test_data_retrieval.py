"""Retrieval (AAN): the release tree, the HF mirror, the release archive; literal quotes; two-document batches."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from lra.data import DataError
from lra.data import retrieval as rv
from lra.data.text import decode_bytes
from lra.tasks import task_spec

LONG = "b'" + "y" * 4500 + "'"
ROWS = {
    "train": [
        ("1", "p1", "p2", "b'Says \"hi\" and leaves'", "b'Other \"quoted text'"),
        ("0.0", "p3", "p4", LONG, "b'short'"),
        ("1.0", "p5", "p6", "b'caf\\xc3\\xa9'", "b'\u2603 snow'"),
    ],
    "val": [("0", "p7", "p8", "b'x'", "b'y'")],
    "test": [("1", "p9", "p1", "b'left'", "b'right'"), ("0", "p2", "p3", "b'l'", "b'r'")],
}


def tsv(split) -> bytes:
    return "".join("\t".join(r) + "\n" for r in ROWS[split]).encode()


def write_folder(folder: Path):
    folder.mkdir(parents=True)
    for split, name in rv.FILES.items():
        (folder / name).write_bytes(tsv(split))
    return folder


def write_release_archive(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tf:
        members = {f"lra_release/lra_release/tsv_data/{name}": tsv(s) for s, name in rv.FILES.items()}
        members["lra_release/lra_release/listops-1000/basic_train.tsv"] = b"Source\tTarget\n"
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def cfg(**kw):
    """The typed spec of a retrieval node (what the reader takes)."""
    return task_spec({"name": "retrieval", "max_length": 4000, "seq_len": 4096, "dual": True, "path": None, **kw})


LAYOUTS = {
    "release_tree": lambda r: write_folder(r / "lra_release" / "lra_release" / "tsv_data"),
    "hf_mirror": lambda r: write_folder(r / "OpenNLPLab-lra" / "data" / "aan"),
    "s4_layout": lambda r: write_folder(r / "aan"),
    "release_archive": lambda r: write_release_archive(r / "downloads" / "lra_release.gz"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_gives_the_same_arrays(tmp_path, layout):
    LAYOUTS[layout](tmp_path)
    splits = rv.load(cfg(), tmp_path, progress=False)
    tr = splits["train"]
    assert tr.tokens.shape == (3, 2, 4096) and tr.lengths.shape == (3, 2) and tr.tokens.dtype == np.int16
    assert list(tr.labels) == [1, 0, 1] and (len(splits["val"]), len(splits["test"])) == (1, 2)
    # quotes are ordinary bytes; the bytes-literal text is kept verbatim
    assert decode_bytes(tr.tokens[0, 0]) == b"b'Says \"hi\" and leaves'"
    assert decode_bytes(tr.tokens[0, 1]) == b"b'Other \"quoted text'"
    assert decode_bytes(tr.tokens[2, 0]) == b"b'caf\\xc3\\xa9'"
    assert decode_bytes(tr.tokens[2, 1]) == "b'\u2603 snow'".encode()
    assert tr.lengths[1, 0] == 4000 and tr.lengths[1, 1] == len("b'short'")  # each text cut to 4000 bytes
    assert tr.tokens[1, 0, 4000:].max() == 0 and tr.tokens[0, 0, 0] == ord("b") + 1
    if layout == "release_tree":
        ref = rv.load(cfg(), tmp_path, progress=False)["train"]
        assert np.array_equal(ref.tokens, tr.tokens)


def test_archive_and_folder_agree(tmp_path):
    write_folder(tmp_path / "a" / "tsv_data")
    write_release_archive(tmp_path / "b" / "lra_release.gz")
    a = rv.load(cfg(), tmp_path / "a", progress=False)
    b = rv.load(cfg(path=str(tmp_path / "b" / "lra_release.gz")), tmp_path / "b", progress=False)
    for s in ("train", "val", "test"):
        assert np.array_equal(a[s].tokens, b[s].tokens) and np.array_equal(a[s].lengths, b[s].lengths)
        assert np.array_equal(a[s].labels, b[s].labels)


def test_two_document_batches_reach_the_dual_head(tmp_path):
    from lra.data.module import LRADataModule
    from lra.model import LRAClassifier

    write_folder(tmp_path / "tsv_data")
    splits = rv.load(cfg(max_length=16, seq_len=16), tmp_path, progress=False)
    batch = next(iter(LRADataModule(splits, batch_size=3).train_dataloader()))
    assert batch["tokens"].shape == (3, 2, 16) and batch["mask"].shape == (3, 2, 16)
    assert batch["mask"].sum(-1).tolist() == splits["train"].lengths.tolist()  # the whole split, in order
    model = LRAClassifier(vocab_size=257, seq_len=16, num_classes=2, attn_name="softmax", dual=True)
    assert (
        model(batch["tokens"], batch["mask"]).shape == (3, 2)
        and torch.isfinite(model(batch["tokens"], batch["mask"])).all()
    )


@pytest.mark.parametrize(
    "line,needle",
    [
        ("1\tp1\tp2\tb'only four fields'", "expected 5 tab-separated fields"),
        ("2\tp1\tp2\tb'a'\tb'b'", "label must be 0 or 1"),
        ("yes\tp1\tp2\tb'a'\tb'b'", "label must be 0 or 1"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, needle):
    folder = write_folder(tmp_path / "tsv_data")
    (folder / rv.FILES["test"]).write_bytes(tsv("test") + line.encode() + b"\n")
    with pytest.raises(DataError) as e:
        rv.load(cfg(), tmp_path, progress=False)
    assert needle in str(e.value) and f"{folder / rv.FILES['test']}:3" in str(e.value)


def test_partial_and_missing_data(tmp_path):
    folder = write_folder(tmp_path / "tsv_data")
    (folder / rv.FILES["val"]).unlink()
    with pytest.raises(DataError) as e:
        rv.load(cfg(), tmp_path, progress=False)
    msg = str(e.value)
    assert f"{folder} has new_aan_pairs.train.tsv, new_aan_pairs.test.tsv but not new_aan_pairs.eval.tsv" in msg
    for needle in ("lra_release.gz", "OpenNLPLab/lra", str(tmp_path / "tsv_data"), "make data task=retrieval"):
        assert needle in msg, needle


def test_archive_without_aan_files(tmp_path):
    p = tmp_path / "lra_release.gz"
    with tarfile.open(p, "w:gz") as tf:
        info = tarfile.TarInfo("lra_release/lra_release/listops-1000/basic_train.tsv")
        tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(DataError, match="new_aan_pairs.train.tsv"):
        rv.load(cfg(), tmp_path, progress=False)


def test_config():
    from lra.config import compose

    c = compose(["task=retrieval"])  # the default preset, quirks=skeinformer
    assert c.task.dual and (c.task.max_length, c.task.seq_len, c.task.vocab_size) == (
        4000,
        4096,
        512,
    )  # paper: 512 rows
    q = compose(["task=retrieval", "preset=quick"])
    assert (q.task.max_length, q.task.seq_len) == (512, 512)
