"""Text (IMDB, byte level): every on-disk format gives the same arrays; tokens, splits, errors; the real set."""

import logging
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from lra.config import ConfigError, compose
from lra.data import DataError
from lra.data import text as tx
from lra.tasks import task_spec

# The real IMDB release (aclImdb_v1.tar.gz, 50,000 labelled reviews), for the one test that reads it: the path in
# LRA_IMDB_ARCHIVE, else the archive at the top of the data root (LRA_DATA, else data/ in the checkout).
DATA_ROOT = Path(os.environ.get("LRA_DATA") or Path(__file__).resolve().parents[1] / "data")
REAL_IMDB = Path(os.environ.get("LRA_IMDB_ARCHIVE") or DATA_ROOT / "aclImdb_v1.tar.gz")

LONG = "Long review é☃ " + "x" * 5000  # over 4000 bytes; é and ☃ are multi-byte
REVIEWS = {
    ("train", "pos"): {"0_9.txt": 'Great film.<br /><br />Loved it, "really".', "1_8.txt": LONG, "2_10.txt": "Fine."},
    ("train", "neg"): {"0_1.txt": "Terrible.", "1_2.txt": "Bad\tbad\nbad", "2_3.txt": "Meh, not good."},
    ("test", "pos"): {"0_7.txt": "Nice.", "1_10.txt": "Superb acting."},
    ("test", "neg"): {"0_4.txt": "Dull.", "1_2.txt": "Awful plot, awful cast."},
}


def cfg(**kw):
    """The typed spec of a text node (what the reader takes)."""
    base = {
        "name": "text",
        "max_length": 4000,
        "seq_len": 4096,
        "dev_split": "carve",
        "val_fraction": 0.34,
        "split_seed": 0,
        "path": None,
    }
    return task_spec({**base, **kw})


def write_acl(root: Path) -> Path:
    for (split, cls), files in REVIEWS.items():
        d = root / "aclImdb" / split / cls
        d.mkdir(parents=True)
        for name, body in files.items():
            (d / name).write_bytes(body.encode())
    (root / "aclImdb" / "README").write_text("fixture")
    return root / "aclImdb"


def write_tar(root: Path) -> Path:
    src = write_acl(root / "src")
    out = root / "aclImdb_v1.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(src, arcname="aclImdb")
    return out


def rows(split):
    return [(body, int(cls == "pos")) for (s, cls), files in REVIEWS.items() if s == split for body in files.values()]


def write_parquet(root: Path) -> Path:
    import pandas as pd

    d = root / "imdb" / "plain_text"
    d.mkdir(parents=True)
    for split in ("train", "test"):
        pd.DataFrame(rows(split), columns=["text", "label"]).to_parquet(d / f"{split}-00000-of-00001.parquet")
    pd.DataFrame([("unlabelled", -1)], columns=["text", "label"]).to_parquet(d / "unsupervised-00000-of-00001.parquet")
    return d


def write_hf_disk(root: Path) -> Path:
    datasets = pytest.importorskip("datasets")  # the `data` extra; absent on some machines

    dd = datasets.DatasetDict(
        {
            s: datasets.Dataset.from_dict({"text": [t for t, _ in rows(s)], "label": [y for _, y in rows(s)]})
            for s in ("train", "test")
        }
    )
    dd.save_to_disk(str(root / "imdb_saved"))
    return root / "imdb_saved"


def expected_train_tokens():
    ordered = sorted((lab, body.encode()) for body, lab in rows("train"))
    return tx.encode_bytes([b for _, b in ordered], 4000, 4096)


@pytest.mark.parametrize("fmt", ["folder", "tar", "parquet", "hf_disk"])
def test_every_format_gives_the_same_arrays(tmp_path, fmt):
    {"folder": write_acl, "tar": write_tar, "parquet": write_parquet, "hf_disk": write_hf_disk}[fmt](tmp_path / "data")
    splits = tx.load(cfg(dev_split="test"), tmp_path / "data", progress=False)
    tokens, lengths = expected_train_tokens()
    tr = splits["train"]
    assert tr.tokens.dtype == np.int16 and tr.tokens.shape == (6, 4096)
    assert np.array_equal(tr.tokens, tokens) and np.array_equal(tr.lengths, lengths)
    assert list(tr.labels) == [0, 0, 0, 1, 1, 1]  # canonical order: label, then bytes
    assert len(splits["test"]) == 4 and splits["val"] is splits["test"]
    assert len(list((tmp_path / "data" / "cache").iterdir())) == 1


def test_tokens_are_bytes_plus_one_padded_and_cut_at_max_length(tmp_path):
    write_acl(tmp_path)
    tr = tx.load(cfg(dev_split="test"), tmp_path, progress=False)["train"]
    lengths = list(tr.lengths)
    assert max(lengths) == 4000  # the long review is cut at 4000 BYTES
    i = lengths.index(4000)
    assert tx.decode_bytes(tr.tokens[i]) == LONG.encode()[:4000] and tr.tokens[i, 4000:].max() == 0
    j = [tx.decode_bytes(t) for t in tr.tokens].index(b"Bad\tbad\nbad")
    assert list(tr.tokens[j, :3]) == [ord("B") + 1, ord("a") + 1, ord("d") + 1] and lengths[j] == 11
    assert tr.tokens.min() == 0 and tr.tokens.max() <= 256
    short = tx.load(cfg(dev_split="test", max_length=10, seq_len=16), tmp_path, progress=False)["train"]
    assert short.tokens.shape == (6, 16) and short.lengths.max() == 10


def test_carved_validation_is_seeded_and_disjoint(tmp_path):
    write_acl(tmp_path)
    a = tx.load(cfg(), tmp_path, progress=False)
    b = tx.load(cfg(split_seed=1), tmp_path, progress=False)
    assert (len(a["train"]), len(a["val"]), len(a["test"])) == (4, 2, 4)
    full = {tx.decode_bytes(t) for t in expected_train_tokens()[0]}
    tr, va = ({tx.decode_bytes(t) for t in a[s].tokens} for s in ("train", "val"))
    assert tr | va == full and not tr & va
    assert np.array_equal(a["val"].tokens, tx.load(cfg(), tmp_path, progress=False)["val"].tokens)
    assert {tx.decode_bytes(t) for t in b["val"].tokens} != va  # another seed, another carve (for this fixture)
    tr_idx, va_idx = tx.carve(25_000, 0.1, 0)
    assert len(va_idx) == 2500 and len(tr_idx) == 22_500 and not set(tr_idx) & set(va_idx)


def test_config_keys_for_presets():
    c = compose(["task=text", "preset=quick"])
    assert (c.task.max_length, c.task.seq_len, c.task.dev_split) == (512, 512, "carve")
    c = compose(["task=text", "preset=quick", "task.max_length=1000", "task.dev_split=test"])
    assert (c.task.max_length, c.task.seq_len, c.task.dev_split, c.task.vocab_size) == (1000, 1024, "test", 257)
    c = compose(["task=text", "preset=quick", "task.max_length=4000"])
    assert c.task.seq_len == 4096
    with pytest.raises(ConfigError, match="task.dev_split='dev' is not allowed: one of carve, test"):
        cfg(dev_split="dev")  # refused with the node, before the reader looks for data


def test_missing_data_says_where_to_get_it_and_where_to_put_it(tmp_path):
    with pytest.raises(DataError) as e:
        tx.load(cfg(), tmp_path, progress=False)
    msg = str(e.value)
    for needle in (
        str(tmp_path / "aclImdb_v1.tar.gz"),
        str(tmp_path / "aclImdb"),
        "stanfordnlp/imdb",
        "make data task=text",
        "not inside lra_release.gz",
    ):
        assert needle in msg, needle


def test_make_data_explains_and_fails(tmp_path, monkeypatch, caplog):
    from lra.data.__main__ import main

    monkeypatch.setenv("LRA_DATA", str(tmp_path))
    with caplog.at_level(logging.ERROR):
        assert main(["task=text"]) == 2
    assert "aclImdb_v1.tar.gz" in caplog.text and "stanfordnlp/imdb" in caplog.text


def test_partial_folder_is_named(tmp_path):
    acl = write_acl(tmp_path)
    import shutil

    shutil.rmtree(acl / "test" / "neg")
    with pytest.raises(DataError) as e:
        tx.load(cfg(), tmp_path, progress=False)
    assert f"{acl} is incomplete (no test/neg)" in str(e.value)


@pytest.mark.parametrize("keep", [0.3, 0.5, 0.9, 0.99])
def test_truncated_archive_is_named(tmp_path, keep):
    good = write_tar(tmp_path / "x")
    bad = tmp_path / "data" / "aclImdb_v1.tar.gz"
    bad.parent.mkdir()
    bad.write_bytes(good.read_bytes()[: int(good.stat().st_size * keep)])
    with pytest.raises(DataError) as e:
        tx.load(cfg(), tmp_path / "data", progress=False)
    assert str(bad) in str(e.value) and "download it again" in str(e.value)


def test_parquet_without_text_column_is_named(tmp_path):
    import pandas as pd

    d = tmp_path / "imdb"
    d.mkdir()
    for s in ("train", "test"):
        pd.DataFrame({"review": ["a"], "label": [0]}).to_parquet(d / f"{s}-00000-of-00001.parquet")
    with pytest.raises(DataError) as e:
        tx.load(cfg(), tmp_path, progress=False)
    assert "train-00000-of-00001.parquet" in str(e.value) and "'text'" in str(e.value)


def test_bad_label_is_named(tmp_path):
    import pandas as pd

    d = tmp_path / "imdb"
    d.mkdir()
    for s in ("train", "test"):
        pd.DataFrame({"text": ["a", "b"], "label": [0, 7]}).to_parquet(d / f"{s}.parquet")
    with pytest.raises(DataError, match=r"row 1: label must be 0 \(neg\) or 1 \(pos\), got 7"):
        tx.load(cfg(), tmp_path, progress=False)


def test_real_imdb_loads(tmp_path):
    if not REAL_IMDB.exists():
        pytest.skip(f"the real IMDB archive is not at {REAL_IMDB} (LRA_IMDB_ARCHIVE names it)")
    splits = tx.load(cfg(path=str(REAL_IMDB), val_fraction=0.1, dev_split="test"), tmp_path, progress=False)
    tr, te = splits["train"], splits["test"]
    assert len(tr) == 25_000 and len(te) == 25_000
    assert tr.labels.sum() == 12_500 and te.labels.sum() == 12_500
    assert tr.tokens.shape == (25_000, 4096) and tr.lengths.max() == 4000 and te.lengths.max() == 4000
    assert tr.tokens[:, 4000:].max() == 0 and tr.tokens.min() == 0 and tr.tokens.max() <= 256
    assert (tr.lengths == 4000).sum() > 0 and tr.lengths.min() > 0


def test_plain_tar_cut_at_any_block_boundary_is_named(tmp_path):
    """tarfile stops quietly where a plain tar is cut at a 512-byte boundary; every such cut before the
    end-of-archive block must be an error naming the file, and a cut inside the trailing zero padding
    (all members whole) must read like the whole archive."""
    src = write_acl(tmp_path / "src")
    whole = tmp_path / "aclImdb_v1.tar"
    with tarfile.open(whole, "w") as tf:
        tf.add(src, arcname="aclImdb")
    data = whole.read_bytes()
    members_end = -(-len(data.rstrip(b"\0")) // 512) * 512  # where the end-of-archive block starts
    full = tx.read_tar(whole, progress=False)
    assert sum(len(v) for v in full.values()) == 10
    bad = tmp_path / "cut" / "aclImdb_v1.tar"
    bad.parent.mkdir()
    for cut in range(512, len(data), 512):
        bad.write_bytes(data[:cut])
        if cut < members_end + 512:
            with pytest.raises(DataError) as e:
                tx.read_tar(bad, progress=False)
            assert str(bad) in str(e.value) and "download it again" in str(e.value), cut
        else:
            assert tx.read_tar(bad, progress=False) == full
    bad.write_bytes(data[: members_end + 512])
    assert tx.load(cfg(path=str(bad)), tmp_path / "root", progress=False)["train"].labels.size > 0
    bad.write_bytes(data[:members_end])
    with pytest.raises(DataError, match="without the end-of-archive block"):
        tx.load(cfg(path=str(bad)), tmp_path / "root", progress=False)


def test_archive_missing_one_class_is_named(tmp_path):
    src = write_acl(tmp_path / "src")
    arch = tmp_path / "aclImdb_v1.tar.gz"
    with tarfile.open(arch, "w:gz") as tf:
        tf.add(src, arcname="aclImdb", filter=lambda ti: None if "/train/neg" in ti.name else ti)
    with pytest.raises(DataError, match=r"no aclImdb/train/neg/\*\.txt members"):
        tx.read_tar(arch, progress=False)


# The fixture's sizes stand for the official ones (12,500 reviews per split and class): the check is the same,
# without writing 50,000 files.
AS_OFFICIAL = {f"{s}/{c}": len(files) for (s, c), files in REVIEWS.items()}


def test_partly_unpacked_imdb_is_one_line_before_anything_is_cached(tmp_path, monkeypatch, caplog):
    """An interrupted `tar xzf` (train/pos holding 215 of 12,500 reviews) used to train at majority 98.4 %."""
    from lra.data.__main__ import main
    from lra.data.official import OFFICIAL

    monkeypatch.setitem(OFFICIAL, "text", AS_OFFICIAL)
    acl = write_acl(tmp_path)
    (acl / "train" / "pos" / "1_8.txt").unlink()
    monkeypatch.setenv("LRA_DATA", str(tmp_path))
    with caplog.at_level(logging.INFO):
        assert main(["task=text"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert f"{acl}: train/pos holds 2 of 3 reviews" in errors[0] and "unpack aclImdb_v1.tar.gz again" in errors[0]
    assert "majority class" not in caplog.text
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("cached", [False, True])
def test_partial_imdb_in_hf_form_or_in_an_old_cache_entry_is_refused(tmp_path, monkeypatch, cached):
    """The split arrays are counted too: the HF forms, and a cache entry built from a partial set before the check."""
    import pandas as pd

    from lra.data import official

    monkeypatch.setitem(official.OFFICIAL, "text", AS_OFFICIAL)
    d = tmp_path / "imdb"
    d.mkdir()
    pd.DataFrame(rows("train")[1:], columns=["text", "label"]).to_parquet(d / "train-00000-of-00001.parquet")
    pd.DataFrame(rows("test"), columns=["text", "label"]).to_parquet(d / "test-00000-of-00001.parquet")
    if cached:
        with monkeypatch.context() as m:  # built by a harness without the check
            m.setattr(tx, "check_source", lambda *a, **k: None)
            tx.load(cfg(), tmp_path, progress=False)
    with pytest.raises(DataError, match=r"train/pos holds 2 of 3 reviews \(a partial copy of the official set\)"):
        tx.load(cfg(), tmp_path, progress=False)
    monkeypatch.setitem(official.OFFICIAL, "text", {k: 12_500 for k in AS_OFFICIAL})
    tx.load(cfg(), tmp_path, progress=False)  # a set of other sizes throughout is read as it is
