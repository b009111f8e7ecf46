"""A partial copy of an official set (ListOps release, AAN, CIFAR-10) is one DataError naming the folder, what is
short and what to do, before anything is cached; a set of other sizes throughout (the fixtures) is read as it is.
IMDB's cases: tests/test_data_text.py. The fixtures' sizes stand for the official ones (lra/data/official.py)."""

import pytest

from lra.data import DataError, official
from lra.data import image as im
from lra.data import listops as lo
from lra.data import retrieval as rv
from tests import test_data_image as ti
from tests import test_data_retrieval as tr
from tests import test_listops as tl

LISTOPS_ROWS = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM 3 ) 4 ) ] )", 7)]


def listops_cut(root):
    folder = root / "listops-1000"
    tl._write_official(folder, {"train": LISTOPS_ROWS})
    (folder / "basic_val.tsv").write_text("Source\tTarget\n" + "\t".join(map(str, LISTOPS_ROWS[0])) + "\n")  # cut
    return folder, lambda: lo.load(tl._cfg(), root)


def retrieval_cut(root):
    folder = tr.write_folder(root / "tsv_data")
    test = folder / rv.FILES["test"]
    test.write_bytes(test.read_bytes().split(b"\n", 1)[1])  # one of two pairs left
    return folder, lambda: rv.load(tr.cfg(), root, progress=False)


def image_cut(root):
    folder = ti.write_pickles(root)
    (folder / "data_batch_5").write_bytes(ti.batch_bytes(ti.TRAIN[40:45], ti.YTR[40:45], "b4"))  # 45 of 50 images
    return folder, lambda: im.load(ti.cfg(), root, progress=False)


CASES = {  # task: (a partial copy, the fixture's sizes as official, the line's middle)
    "listops": (listops_cut, {"train": 2, "val": 2, "test": 2}, "val holds 1 of 2 rows"),
    "retrieval": (retrieval_cut, {"train": 3, "val": 1, "test": 2}, "test holds 1 of 2 pairs"),
    "image": (image_cut, {"train": 50, "test": 10}, "train holds 45 of 50 images"),
}


@pytest.mark.parametrize("task", sorted(CASES))
def test_partial_official_set_is_named_before_it_is_cached(tmp_path, monkeypatch, task):
    cut, sizes, short = CASES[task]
    monkeypatch.setitem(official.OFFICIAL, task, sizes)
    folder, load = cut(tmp_path)
    with pytest.raises(DataError) as e:
        load()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{folder}: {short} (a partial copy of the official set); ")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    monkeypatch.setitem(official.OFFICIAL, task, {k: 10**6 for k in sizes})
    load()  # no part of official size: another set, read as it is
