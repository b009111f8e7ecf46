"""The cache of tokenised arrays: built once, memory-mapped, keyed by parameters and sources, atomic;
seeded subsets (task.max_examples); the release-tree search helpers."""

import io
import os
import tarfile
import time

import numpy as np
import pytest

from lra.data import release
from lra.data.base import DataError, Split
from lra.data.cache import cached_splits, source_fingerprint
from lra.data.registry import limit_examples


def splits(n=1000, L=1024):
    rng = np.random.default_rng(0)
    return {
        s: Split(rng.integers(0, 256, (n, L), dtype=np.uint8), np.full(n, L, np.int32), rng.integers(0, 2, n))
        for s in ("train", "val", "test")
    }


def test_built_once_then_memory_mapped(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return splits()

    a = cached_splits(tmp_path, "demo", {"x": 1}, build)
    t0 = time.perf_counter()
    b = cached_splits(tmp_path, "demo", {"x": 1}, build)
    load_s = time.perf_counter() - t0
    assert len(calls) == 1 and load_s < 1.0
    assert isinstance(b["train"].tokens, np.memmap) and b["train"].tokens.dtype == np.uint8
    for s in ("train", "val", "test"):
        assert np.array_equal(a[s].tokens, b[s].tokens) and np.array_equal(a[s].labels, b[s].labels)


def test_parameters_and_sources_key_the_entry(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("v1")
    build = lambda: splits(10, 8)  # noqa: E731
    cached_splits(tmp_path, "demo", {"max_length": 8, "sources": source_fingerprint([src])}, build)
    cached_splits(tmp_path, "demo", {"max_length": 4, "sources": source_fingerprint([src])}, build)
    src.write_text("version 2")
    os.utime(src, (time.time() + 5, time.time() + 5))
    cached_splits(tmp_path, "demo", {"max_length": 8, "sources": source_fingerprint([src])}, build)
    assert len(list((tmp_path / "cache").iterdir())) == 3


def test_a_failed_build_leaves_nothing(tmp_path):
    def build():
        raise DataError("broken source")

    with pytest.raises(DataError):
        cached_splits(tmp_path, "demo", {"x": 2}, build)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_max_examples_takes_seeded_subsets():
    s = splits(100, 4)
    out = limit_examples(s, {"val": 10, "test": 1000})
    assert len(out["val"]) == 10 and out["test"] is s["test"] and out["train"] is s["train"]
    again = limit_examples(s, {"val": 10})
    assert np.array_equal(out["val"].tokens, again["val"].tokens)
    rows = {tuple(r) for r in s["val"].tokens}
    assert all(tuple(r) in rows for r in out["val"].tokens)
    with pytest.raises(ValueError, match="unknown split"):
        limit_examples(s, {"dev": 3})


def test_search_skips_the_cache_and_finds_nested_release_trees(tmp_path):
    deep = tmp_path / "downloads" / "lra_release" / "lra_release" / "tsv_data"
    deep.mkdir(parents=True)
    (tmp_path / "cache" / "tsv_data").mkdir(parents=True)
    found = release.find_dirs(tmp_path, lambda f, d, fs: f.name == "tsv_data")
    assert found == [deep]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "lra_release.gz").write_bytes(b"")
    assert release.release_archives(tmp_path) == [tmp_path / "x" / "lra_release.gz"]
    assert release.member_prefix("lra_release/lra_release/tsv_data/a.tsv", "tsv_data") == "lra_release/lra_release/"
    assert release.member_prefix("tsv_data/a.tsv", "tsv_data") == ""
    assert release.member_prefix("x/my_tsv_data/a.tsv", "tsv_data") is None


def test_iter_tar_streams_only_wanted_members(tmp_path):
    p = tmp_path / "a.tar.gz"
    with tarfile.open(p, "w:gz") as tf:
        for name in ("lra_release/a.txt", "lra_release/b.txt", "lra_release/sub/c.txt"):
            info = tarfile.TarInfo(name)
            data = name.encode()
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    got = {
        n: f.read()
        for n, f in release.iter_tar(p, lambda n: n.endswith("c.txt") or n.endswith("a.txt"), progress=False)
    }
    assert got == {"lra_release/a.txt": b"lra_release/a.txt", "lra_release/sub/c.txt": b"lra_release/sub/c.txt"}
    p.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(DataError, match="cannot read this archive"):
        list(release.iter_tar(p, lambda n: True, progress=False))


def _tar_bytes(n=5):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(n):
            data = bytes([65 + i]) * (300 + 700 * i)
            info = tarfile.TarInfo(f"d/f{i}.bin")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    "how", ["cut after a member", "cut inside a member", "no end block", "garbage after", "gzip of a cut tar"]
)
def test_iter_tar_refuses_archives_tarfile_reads_quietly(tmp_path, how):
    """Whatever reads through iter_tar (Text, Retrieval, Pathfinder, Image archives) gets a DataError
    naming the file instead of the members before the damage."""
    import gzip

    data = _tar_bytes()
    members_end = -(-len(data.rstrip(b"\0")) // 512) * 512
    bad = {
        "cut after a member": data[: 512 * 2],  # header + data of f0, nothing more
        "cut inside a member": data[: 512 * 4],
        "no end block": data[:members_end],
        "garbage after": data[:members_end] + b"\x01" * 512 + b"\0" * 1024,
        "gzip of a cut tar": gzip.compress(data[: 512 * 2]),
    }[how]
    path = tmp_path / ("a.tar.gz" if "gzip" in how else "a.tar")
    path.write_bytes(bad)
    with pytest.raises(DataError) as e:
        list(n for n, f in release.iter_tar(path, lambda n: True, progress=False))
    assert str(path) in str(e.value)


def test_iter_tar_reads_whole_archives_with_one_or_two_end_blocks(tmp_path):
    data = _tar_bytes()
    members_end = -(-len(data.rstrip(b"\0")) // 512) * 512
    for i, blob in enumerate((data, data[: members_end + 512], data[: members_end + 1024])):
        path = tmp_path / f"{i}.tar"
        path.write_bytes(blob)
        got = {n: f.read() for n, f in release.iter_tar(path, lambda n: True, progress=False)}
        assert sorted(got) == [f"d/f{k}.bin" for k in range(5)] and got["d/f4.bin"] == b"E" * 3100


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: keep(len(data))])


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: _truncate(e / "train.tokens.npy", lambda n: n - 10),  # cut inside the data
        lambda e: _truncate(e / "val.labels.npy", lambda n: 60),  # cut inside the header
        lambda e: (e / "test.lengths.npy").write_bytes(b""),
        lambda e: (e / "train.lengths.npy").unlink(),
        lambda e: _truncate(e / "meta.json", lambda n: n // 2),  # partial JSON
        lambda e: (e / "meta.json").write_text("[1, 2]"),
        lambda e: (e / "meta.json").unlink(),
        lambda e: np.save(e / "val.tokens.npy", np.zeros((7, 8), np.uint8)),  # fewer rows than meta.json says
        lambda e: np.save(e / "val.tokens.npy", np.zeros((10, 9), np.uint8)),  # other shape, same rows
    ],
    ids=[
        "npy-data",
        "npy-header",
        "npy-empty",
        "npy-missing",
        "meta-partial",
        "meta-wrong",
        "meta-missing",
        "rows",
        "shape",
    ],
)
def test_a_damaged_entry_is_rebuilt_with_one_warning(tmp_path, caplog, damage):
    calls = []

    def build():
        calls.append(1)
        return splits(10, 8)

    first = {
        k: Split(*(np.array(getattr(v, f)) for f in ("tokens", "lengths", "labels")))
        for k, v in cached_splits(tmp_path, "demo", {"x": 3}, build).items()
    }  # copies, not the mapped files
    (entry,) = (tmp_path / "cache").iterdir()
    damage(entry)
    with caplog.at_level("WARNING"):
        again = cached_splits(tmp_path, "demo", {"x": 3}, build)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(calls) == 2 and len(warnings) == 1 and "damaged" in warnings[0].getMessage()
    assert str(entry) in warnings[0].getMessage()
    for s in ("train", "val", "test"):
        assert np.array_equal(first[s].tokens, again[s].tokens) and np.array_equal(first[s].lengths, again[s].lengths)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [entry.name]  # no temp or old folder left
    caplog.clear()
    cached_splits(tmp_path, "demo", {"x": 3}, build)
    assert len(calls) == 2 and not caplog.records


def test_fingerprint_follows_every_array_and_not_the_storage(tmp_path):
    from lra.data import fingerprint

    base = splits(50, 16)
    fp = fingerprint(base)
    assert len(fp) == 16 and fp == fingerprint(splits(50, 16))
    stored = cached_splits(tmp_path, "demo", {"x": 4}, lambda: base)  # memory-mapped copies: same data
    assert isinstance(stored["train"].tokens, np.memmap) and fingerprint(stored) == fp
    assert fingerprint(stored, chunk_bytes=100) == fp  # chunking does not change the hash
    for split in ("train", "val", "test"):
        for field in ("tokens", "lengths", "labels"):
            changed = {
                k: Split(*(np.array(getattr(v, f)) for f in ("tokens", "lengths", "labels"))) for k, v in base.items()
            }
            a = getattr(changed[split], field)
            a.flat[-1] += 1
            assert fingerprint(changed) != fp, (split, field)
    assert fingerprint({k: v for k, v in base.items() if k != "test"}) != fp
    cast = {k: Split(v.tokens.astype(np.int16), v.lengths, v.labels) for k, v in base.items()}
    assert fingerprint(cast) != fp  # another dtype is another cache format: a resume should notice


# ------------------------------------------------------------------------------ issue 19: checksums of cached arrays
def _copies(s):
    return {k: Split(*(np.array(getattr(v, f)) for f in ("tokens", "lengths", "labels"))) for k, v in s.items()}


def test_cached_labels_rewritten_with_random_labels_of_the_same_shape_are_rebuilt_with_a_warning(tmp_path, caplog):
    calls = []

    def build():
        calls.append(1)
        return splits(50, 8)

    first = _copies(cached_splits(tmp_path, "demo", {"x": 5}, build))
    (entry,) = (tmp_path / "cache").iterdir()
    labels = np.load(entry / "train.labels.npy")
    forged = np.random.default_rng(7).integers(0, 2, labels.shape).astype(labels.dtype)
    assert forged.shape == labels.shape and not np.array_equal(forged, labels)
    np.save(entry / "train.labels.npy", forged)  # same shape and dtype: only the checksum can tell
    with caplog.at_level("WARNING"):
        again = cached_splits(tmp_path, "demo", {"x": 5}, build)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(calls) == 2 and len(warnings) == 1
    assert "train.labels.npy" in warnings[0] and "checksum" in warnings[0] and str(entry) in warnings[0]
    assert np.array_equal(np.asarray(again["train"].labels), first["train"].labels)
    caplog.clear()
    cached_splits(tmp_path, "demo", {"x": 5}, build)
    assert len(calls) == 2 and not caplog.records


# ------------------------------------------------------------------------------ issue 39: verified, not trusted
def test_an_array_edited_behind_a_meta_json_made_to_agree_is_found_and_rebuilt(tmp_path, caplog):
    """Bug caught: an array was hashed again only when its size, mtime or ctime differed from those meta.json
    recorded, so an edit whose new stat was written into meta.json (or any edit of meta.json's stats) was used,
    and recorded under the old data id."""
    import json

    calls = []

    def build():
        calls.append(1)
        return splits(50, 8)

    first = _copies(cached_splits(tmp_path, "demo", {"x": 8}, build))
    (entry,) = (tmp_path / "cache").iterdir()
    path = entry / "train.labels.npy"
    np.save(path, 1 - np.load(path))  # same shape and dtype, every label flipped
    meta = json.loads((entry / "meta.json").read_text())
    st = path.stat()
    meta["checksums"]["train.labels.npy"]["stat"] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        again = cached_splits(tmp_path, "demo", {"x": 8}, build)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(calls) == 2 and len(warnings) == 1 and "train.labels.npy" in warnings[0]
    assert np.array_equal(np.asarray(again["train"].labels), first["train"].labels)


def test_the_training_loader_yields_every_example_once_in_each_of_several_epochs_and_after_a_resume():
    """Blind spot: no test iterated the training loader past its first epoch (a sampler that yields nothing
    after it trains forever on no data); and the loader's length is one epoch's batches, whatever position it
    resumed from (Lightning counts a resumed epoch's batches from its start)."""
    from lra.data.module import LRADataModule

    n = 10
    s = Split(np.arange(2 * n, dtype=np.uint8).reshape(n, 2), np.full(n, 2, np.int32), np.arange(n))
    loader = lambda: LRADataModule({"train": s}, batch_size=3, seed=1).train_dataloader()  # noqa: E731
    labels = lambda it: [b["label"].tolist() for b in it]  # noqa: E731
    first = loader()
    epochs = []
    for epoch in range(3):
        assert len(first) == 4, epoch
        got = labels(first)
        assert [len(b) for b in got] == [3, 3, 3, 1] and sorted(sum(got, [])) == list(range(n)), epoch
        epochs.append(got)
    assert epochs[0] != epochs[1] != epochs[2]  # a new order each epoch
    resumed = loader()
    resumed.load_state_dict({"epoch": 1, "position": 2})  # as a checkpoint two batches into epoch 1 restores it
    assert len(resumed) == 4 and labels(resumed) == epochs[1][2:]
    assert len(resumed) == 4 and labels(resumed) == epochs[2] and resumed.state_dict() == {"epoch": 3, "position": 0}


def test_a_cache_that_refuses_writes_says_so_before_the_build(tmp_path, monkeypatch):
    """Bug caught (issue 39): the arrays were built (minutes for the paper sets) before the cache was first written
    to, so a read-only data root failed only then. Simulated: the tests may run as root, whom modes do not stop."""
    import errno

    real, calls = os.mkdir, []

    def read_only(path, *a, **k):
        if str(path).startswith(str(tmp_path / "cache")):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", read_only)
    with pytest.raises(OSError, match="Read-only"):
        cached_splits(tmp_path, "demo", {"x": 9}, lambda: calls.append(1) or splits(10, 8))
    assert calls == [] and not (tmp_path / "cache").exists()
