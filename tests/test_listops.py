"""ListOps: evaluator on hand-made expressions, generator statistics (docs/facts.md §3.3), tokenizer, reader errors."""

import csv
import io
import json
import random
import re
import statistics
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from lra.data import DataError
from lra.data import listops as lo
from lra.data.listops import load as load_listops
from lra.tasks import task_spec


@pytest.mark.parametrize(
    "src,value",
    [
        ("[MAX 2 9 ]", 9),
        ("[MIN 4 1 7 ]", 1),
        ("[MED 4 9 ]", 6),  # even count: mean of the middle two (6.5), truncated
        ("[MED 1 2 8 9 ]", 5),  # (2 + 8) / 2
        ("[MED 3 1 2 ]", 2),
        ("[SM 9 9 5 ]", 3),  # 23 mod 10
        ("[SM 0 0 ]", 0),
        ("[MAX 1 [MIN 7 3 ] [SM 5 6 ] ]", 3),
        ("[MED [MAX 1 9 ] [MIN 0 4 ] 5 [SM 2 2 ] ]", 4),  # args 9, 0, 5, 4 -> (4 + 5) / 2 = 4.5 -> 4
    ],
)
def test_evaluate_hand_made(src, value):
    assert lo.evaluate(lo.parse(src)) == value


def test_official_string_form_and_parse_round_trip():
    tree = ("[MAX", [2, 9])
    assert lo.to_string(tree) == "( ( ( [MAX 2 ) 9 ) ] )"
    rng = random.Random(0)
    for _ in range(200):
        t, _ = lo.sample_tree(rng, 1, 6, 10)
        assert lo.parse(lo.to_string(t)) == t


def test_tokenizer_round_trip_and_fixed_vocab():
    assert lo.VOCAB_SIZE == 16 and lo.TOKEN_ID["<pad>"] == 0
    assert lo.VOCAB[1:5] == ("[MIN", "[MAX", "[MED", "[SM") and lo.VOCAB[-1] == "X"
    src = "( ( ( [MAX 2 ) ( ( ( [SM 3 ) 4 ) ] ) ) ] )"
    ids = lo.tokenize(src)
    assert lo.detokenize(ids) == "[MAX 2 [SM 3 4 X X"
    assert ids.count(lo.TOKEN_ID["X"]) == 2  # closing brackets are kept
    with pytest.raises(ValueError, match="FOO"):
        lo.tokenize("[FOO 1 ]")


@pytest.fixture(scope="module")
def sample():
    params = lo.GeneratorParams(seed=123, n_train=2500, n_val=250, n_test=250)
    return params, lo.generate(params, workers=1, progress=False)


def test_generator_statistics(sample):
    params, splits = sample
    rows = [r for s in splits.values() for r in s]
    assert len(rows) == 3000 and len({s for s, _ in rows}) == 3000  # no duplicates
    lengths = [len(lo.tokenize(s)) for s, _ in rows]
    assert min(lengths) > 500 and max(lengths) < 2000
    assert 950 < statistics.mean(lengths) < 1180  # docs/facts.md §3.3: mean about 1064
    assert 900 < statistics.median(lengths) < 1100  # median about 995
    shares = Counter(lab for _, lab in rows)
    assert 0.14 < shares[0] / 3000 < 0.21 and 0.14 < shares[9] / 3000 < 0.21  # about 17% each
    for d in range(1, 9):
        assert 0.05 < shares[d] / 3000 < 0.12
    for s, lab in rows[:300]:
        assert lo.evaluate(lo.parse(s)) == lab


def test_acceptance_rate_about_8_percent():
    rng = random.Random(7)
    draws = 30000
    acc = sum(500 < lo.sample_tree(rng, 1, 10, 10)[1] < 2000 for _ in range(draws))
    assert 0.07 < acc / draws < 0.095


def test_same_seed_same_files_any_worker_count(tmp_path):
    params = lo.GeneratorParams(seed=5, n_train=300, n_val=30, n_test=30, min_length=20, max_length=200, max_depth=6)
    a = lo.write_dataset(tmp_path / "a", params, workers=1, progress=False)
    b = lo.write_dataset(tmp_path / "b", params, workers=2, progress=False)
    for split in lo.SPLITS:
        assert (a / f"basic_{split}.tsv").read_bytes() == (b / f"basic_{split}.tsv").read_bytes()
    rows = lo.read_tsv(a / "basic_train.tsv")  # the bytes csv.writer wrote before the generator wrote them itself
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerows([("Source", "Target"), *rows])
    assert (a / "basic_train.tsv").read_bytes() == buf.getvalue().encode()
    c = lo.write_dataset(
        tmp_path / "c", lo.GeneratorParams(**{**lo.asdict(params), "seed": 6}), workers=1, progress=False
    )
    assert (a / "basic_train.tsv").read_bytes() != (c / "basic_train.tsv").read_bytes()
    lines = (a / "basic_val.tsv").read_text().splitlines()
    assert lines[0] == "Source\tTarget" and len(lines) == 31
    assert not list(tmp_path.glob(".tmp-*"))


def test_tokenising_in_blocks_gives_the_same_arrays_any_worker_count_and_names_the_bad_line(sample, tmp_path):
    rows = sample[1]["train"]  # 2500 rows: above the 2000 a pool is started for
    one = lo.tokenize_split(rows, tmp_path / "t.tsv", 1000, 2048, workers=1, tokenizer="alnum")
    two = lo.tokenize_split(rows, tmp_path / "t.tsv", 1000, 2048, workers=2, tokenizer="alnum")
    for f in ("tokens", "lengths", "labels"):
        assert np.array_equal(getattr(one, f), getattr(two, f)) and getattr(one, f).dtype == getattr(two, f).dtype
    assert one.lengths.max() == 1000 and one.tokens[:, 1000:].max() == 0 and one.tokens[:, 999].max() > 0  # cut
    bad = list(rows)
    bad[2222] = ("[MAX 2 [FOO 1 ] ]", 1)  # in the last of 8 blocks: its line is counted from the file's start
    with pytest.raises(DataError, match=r"t\.tsv:2224: unknown ListOps symbol '\[FOO'"):
        lo.tokenize_split(bad, tmp_path / "t.tsv", 1000, 2048, workers=2)


def test_data_workers_are_the_cores_this_process_may_use_unless_the_user_sets_them(monkeypatch):
    from lra.data import base

    monkeypatch.delenv(base.WORKERS_ENV, raising=False)
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(base.os, "cpu_count", lambda: 64)  # the host's count: not ours to use
    assert base.data_workers() == 16  # no cap of 8: a 16-core GPU node generates on all 16
    monkeypatch.setenv(base.WORKERS_ENV, "3")
    assert base.data_workers() == 3
    for raw in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv(base.WORKERS_ENV, raw)
        with pytest.raises(DataError, match=rf"^LRA_DATA_WORKERS='{re.escape(raw)}' is not allowed: an integer >= 1"):
            base.data_workers()


def test_a_bad_worker_count_is_one_line_and_exit_2_before_any_work(tmp_path, monkeypatch, caplog):
    from lra.data import __main__ as data_main

    monkeypatch.setenv("LRA_DATA", str(tmp_path))
    monkeypatch.setenv("LRA_DATA_WORKERS", "lots")
    with caplog.at_level("INFO"):
        assert data_main.main(["task=listops", "preset=quick"]) == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "LRA_DATA_WORKERS='lots' is not allowed: an integer >= 1 (processes that prepare data)"
    ]
    assert not any(tmp_path.iterdir())


def _node(dirname="listops-1000", **gen):
    return {
        "name": "listops",
        "max_length": 2000,
        "seq_len": 2048,
        "dirname": dirname,
        "generate": False,
        "generator": gen,
    }


def _cfg(dirname="listops-1000", **gen):
    """The typed spec of a listops node (what the reader takes)."""
    return task_spec(_node(dirname, **gen))


def _write_official(folder, rows_by_split):
    folder.mkdir(parents=True)
    for split in lo.SPLITS:
        rows = rows_by_split.get(split, rows_by_split["train"])
        text = "Source\tTarget\n" + "".join(f"{s}\t{y}\n" for s, y in rows)
        (folder / f"basic_{split}.tsv").write_text(text)


def test_reads_official_release_layout(tmp_path):
    rows = {"train": [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM 3 ) 4 ) ] )", 7)]}
    _write_official(tmp_path / "lra_release" / "lra_release" / "listops-1000", rows)
    splits = load_listops(_cfg(), tmp_path)
    tr = splits["train"]
    assert tr.tokens.shape == (2, 2048) and list(tr.labels) == [9, 7] and list(tr.lengths) == [4, 4]
    assert lo.detokenize(tr.tokens[0]) == "[MAX 2 9 X"
    again = load_listops(_cfg(), tmp_path)  # from the cache
    assert np.array_equal(again["train"].tokens, tr.tokens)
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_missing_data_error_names_path_and_command(tmp_path):
    with pytest.raises(DataError) as e:
        load_listops(_cfg(), tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "listops-1000") in msg and "make data task=listops" in msg


@pytest.mark.parametrize(
    "line,needle",
    [
        ("( ( ( [MAX 2 ) 9 ) ] )\t12", "label must be a digit"),
        ("( ( ( [MAX 2 ) 9 ) ] )", "2 tab-separated fields"),
        ("( ( ( [BAD 2 ) 9 ) ] )\t3", "unknown ListOps symbol"),
    ],
)
def test_corrupt_line_reports_file_and_line(tmp_path, line, needle):
    good = "( ( ( [MIN 2 ) 9 ) ] )\t2"
    folder = tmp_path / "listops-1000"
    folder.mkdir()
    for split in lo.SPLITS:
        (folder / f"basic_{split}.tsv").write_text(f"Source\tTarget\n{good}\n{good}\n{line}\n")
    with pytest.raises(DataError) as e:
        load_listops(_cfg(), tmp_path)
    assert needle in str(e.value) and ".tsv:4" in str(e.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


# --------------------------------------------------------------------- never lose data, never accept wrong data
SMALL = dict(seed=1, n_train=256, n_val=5, n_test=5, min_length=10, max_length=60, max_depth=5)


def _gen_cfg(generate=True, **over):
    return task_spec(
        {**_node("listops-small", **{**SMALL, **over}), "generate": generate, "max_length": 60, "seq_len": 64}
    )


@pytest.fixture(autouse=True)
def one_worker(monkeypatch):
    """Generation in one process here (a pool costs seconds to start; the pool is tested on its own)."""
    monkeypatch.setattr(lo, "data_workers", lambda: 1)


def _generated(root):
    """The one generated set under ``root``."""
    (folder,) = (root / "generated").iterdir()
    return folder


def spy_generation(monkeypatch, module=lo) -> list:
    """Folders ``module.write_dataset`` generates into from now on (ListOps, or Pathfinder's module)."""
    made, real = [], module.write_dataset
    monkeypatch.setattr(module, "write_dataset", lambda folder, *a, **k: made.append(folder) or real(folder, *a, **k))
    return made


def snapshot(folder):
    """Every file under ``folder`` with its bytes and mtime: equal snapshots = untouched."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_incomplete_official_folder_is_an_error_and_left_untouched(tmp_path):
    folder = tmp_path / "listops-1000"
    _write_official(folder, {"train": [("( ( ( [MAX 2 ) 9 ) ] )", 9)]})
    (folder / "basic_test.tsv").unlink()
    (folder / "NOTES.txt").write_text("my notes\n")
    before = snapshot(folder)
    with pytest.raises(DataError) as e:
        load_listops(replace(_cfg(), generate=True), tmp_path)
    msg = str(e.value)
    assert str(folder) in msg and "basic_test.tsv" in msg and "basic_train.tsv" not in msg
    assert "make data task=listops" in msg and "left as it is" in msg
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["listops-1000"]  # no generated sibling, no temp folder


def test_generated_folder_records_rows_bytes_and_checksums_and_is_made_by_rename(tmp_path):
    import hashlib

    load_listops(_gen_cfg(), tmp_path)
    folder = _generated(tmp_path)
    stamp = json.loads((folder / "GENERATED.json").read_text())
    for name, facts in stamp["files"].items():
        data = (folder / name).read_bytes()
        assert facts == {"rows": data.count(b"\n") - 1, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert stamp["files"]["basic_train.tsv"]["rows"] == 256
    assert sorted(p.name for p in (tmp_path / "generated").iterdir()) == [folder.name]  # no temporary folder left


def test_regeneration_keeps_files_the_user_added(tmp_path):
    load_listops(_gen_cfg(), tmp_path)
    folder = _generated(tmp_path)
    (folder / "NOTES.txt").write_bytes(b"mine\x00\xff")
    (folder / "extra").mkdir()
    (folder / "extra" / "a.tsv").write_text("x\n")
    train = folder / "basic_train.tsv"
    full = train.read_bytes()
    train.write_bytes(full[: len(full) // 2])  # damaged: the harness regenerates its own files
    load_listops(_gen_cfg(), tmp_path)
    assert (folder / "NOTES.txt").read_bytes() == b"mine\x00\xff" and (folder / "extra" / "a.tsv").read_text() == "x\n"
    assert train.read_bytes() == full
    assert sorted(p.name for p in (tmp_path / "generated").iterdir()) == [folder.name]


def test_generated_tsv_truncated_at_a_line_boundary_is_detected(tmp_path, caplog):
    first = load_listops(_gen_cfg(), tmp_path)
    path = _generated(tmp_path) / "basic_train.tsv"
    full = path.read_bytes()
    lines = full.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:100]))  # header + 99 of 256 rows, ends with a newline
    with pytest.raises(DataError) as e:
        load_listops(_gen_cfg(generate=False), tmp_path)
    assert "basic_train.tsv" in str(e.value) and "truncated" in str(e.value)
    with caplog.at_level("WARNING"):
        again = load_listops(_gen_cfg(), tmp_path)  # allowed to generate: the harness's own file is rewritten
    assert "regenerating" in caplog.text and path.read_bytes() == full
    assert len(again["train"]) == 256 and np.array_equal(np.asarray(again["train"].tokens), first["train"].tokens)


def test_write_dataset_refuses_a_folder_it_did_not_generate(tmp_path):
    folder = tmp_path / "listops-small"
    folder.mkdir()
    (folder / "basic_train.tsv").write_text("user data\n")
    with pytest.raises(DataError, match="not generated by the harness"):
        lo.write_dataset(folder, lo.GeneratorParams(**SMALL), workers=1, progress=False)
    assert (folder / "basic_train.tsv").read_text() == "user data\n"


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    folder = tmp_path / "listops-1000"
    _write_official(folder, {"train": [("( ( ( [MAX 2 ) 9 ) ] )", 9)] * 3})
    path = folder / "basic_val.tsv"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b"( ( ( [MAX 2 ) 9 ) \xff] )\t9\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(DataError) as e:
        load_listops(_cfg(), tmp_path)
    assert f"{path}:3: not UTF-8" in str(e.value) and "0xff" in str(e.value)


def test_task_path_is_honoured_and_checked(tmp_path):
    with pytest.raises(DataError, match=r"task.path=.*nonexistent does not exist"):
        load_listops(replace(_cfg(), generate=True, path=str(tmp_path / "nonexistent")), tmp_path)
    mine = tmp_path / "elsewhere" / "my-listops"
    _write_official(mine, {"train": [("( ( ( [MAX 2 ) 9 ) ] )", 9)], "val": [("( ( ( [SM 3 ) 4 ) ] )", 7)]})
    splits = load_listops(replace(_cfg(), path=str(mine)), tmp_path / "root")  # nothing under the root
    assert list(splits["val"].labels) == [7]
    (mine / "basic_test.tsv").unlink()
    with pytest.raises(DataError) as e:
        load_listops(replace(_cfg(), generate=True, path=str(mine)), tmp_path / "root")
    assert str(mine) in str(e.value) and "basic_test.tsv" in str(e.value)
    with pytest.raises(DataError, match="expected a folder"):
        load_listops(replace(_cfg(), path=str(mine / "basic_val.tsv")), tmp_path / "root")
    assert not (tmp_path / "root" / "listops-1000").exists()


def test_a_generated_file_edited_in_place_is_one_line_naming_it_and_is_never_used_or_overwritten(tmp_path):
    """Bug caught (issue 39): a generated TSV edited without changing its size (a label changed) passed the
    rows-and-bytes check, was tokenised, and its runs were recorded as the generator's output."""
    import hashlib

    first = load_listops(_gen_cfg(), tmp_path)
    folder = _generated(tmp_path)
    path = folder / "basic_train.tsv"
    original = path.read_bytes()
    facts = json.loads((folder / lo.STAMP).read_text())["files"]["basic_train.tsv"]
    assert facts["sha256"] == hashlib.sha256(original).hexdigest()
    i = original.index(b"\t", original.index(b"\n")) + 1  # the first row's label
    path.write_bytes(original[:i] + str((original[i] - 48 + 1) % 10).encode() + original[i + 1 :])  # same size
    before = snapshot(folder)
    with pytest.raises(DataError) as e:
        load_listops(_gen_cfg(), tmp_path)
    assert str(e.value) == (
        f"{path} differs from what the generator wrote (its SHA-256 is not the one {lo.STAMP} recorded): it was "
        f"edited; move it aside (or delete it) and run `make data task=listops` to regenerate it, or point "
        f"task.path at a folder of your own"
    )
    assert snapshot(folder) == before
    path.rename(tmp_path / "mine.tsv")  # moved aside: the harness regenerates its own file
    again = load_listops(_gen_cfg(), tmp_path)
    assert path.read_bytes() == original and np.array_equal(np.asarray(again["train"].labels), first["train"].labels)


def _draws_at_most(monkeypatch, limit: int) -> list:
    """The generator's chunks drawn (a list that grows by one a chunk); a test fails past ``limit`` of them."""
    draws, real = [], lo._chunk

    def chunk(args):
        draws.append(1)
        if len(draws) > limit:
            pytest.fail("the generator kept drawing")
        return real(args)

    monkeypatch.setattr(lo, "_chunk", chunk)
    return draws


@pytest.mark.parametrize(
    "over,message",
    [
        (
            {"seq_len": 32},
            "task.max_length=60 is more than task.seq_len=32: each example keeps up to max_length tokens, padded "
            "to seq_len; set task.max_length to at most 32 or task.seq_len to at least 60",
        ),
        (
            {"max_length": None, "seq_len": 32},
            "task.max_length=null keeps every token, and task.generator.max_length=60 makes examples of up to 59 "
            "tokens, more than task.seq_len=32; set task.max_length to at most 32 or task.seq_len "
            "to at least 59",
        ),
        (
            {"generator": {**SMALL, "max_depth": 2, "min_length": 20}},
            "task.generator.min_length=20 cannot be met: trees of task.generator.max_depth=2 with at most "
            "task.generator.max_args=10 arguments have at most 12 symbols; lower min_length or raise max_depth",
        ),
    ],
    ids=["seq_len-below-max_length", "every-token-longer-than-seq_len", "no-tree-long-enough"],
)
def test_data_options_that_contradict_the_task_are_one_line_before_anything_is_generated(
    tmp_path, monkeypatch, over, message
):
    """Bug caught (issue 39): a seq_len below the tokens kept ended in a numpy broadcast traceback from deep in
    tokenising, after the whole set was generated; a generator that can draw no tree long enough drew forever."""
    from lra.data import load_task

    made, draws = spy_generation(monkeypatch), _draws_at_most(monkeypatch, 50)
    node = {**_node("listops-small", **SMALL), "generate": True, "max_length": 60, "seq_len": 64, **over}
    with pytest.raises(DataError) as e:
        load_task(node, tmp_path)
    assert str(e.value) == message and made == [] and draws == []
    assert not any(tmp_path.iterdir())


def test_a_generator_that_runs_out_of_distinct_trees_stops_with_one_line(monkeypatch):
    """Bug caught (issue 39): settings with fewer distinct trees than examples asked for (depth 2, two arguments:
    400 trees) drew forever."""
    _draws_at_most(monkeypatch, 100)
    params = lo.GeneratorParams(n_train=500, n_val=1, n_test=1, min_length=3, max_length=5, max_depth=2, max_args=2)
    with pytest.raises(DataError) as e:
        lo.generate(params, workers=1, progress=False)
    assert str(e.value) == (
        "task.generator drew 200000 trees in a row without a new one of 3 < length < 5 (400 of the 502 asked for): "
        "widen the lengths, raise max_depth or max_args, or ask for fewer examples"
    )


def test_an_example_longer_than_seq_len_when_every_token_is_kept_names_its_line(tmp_path):
    """Bug caught (issue 39): ``task.max_length=null`` with a release row longer than ``task.seq_len`` was a numpy
    broadcast traceback from tokenising."""
    short, long = "( ( ( [MAX 2 ) 9 ) ] )", "( ( ( ( ( [MAX 2 ) 9 ) 3 ) 4 ) ] )"  # 4 and 6 tokens
    _write_official(tmp_path / "listops-1000", {"train": [(short, 9), (long, 9)]})
    with pytest.raises(DataError) as e:
        load_listops(replace(_cfg(), max_length=None, seq_len=5), tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'listops-1000' / 'basic_train.tsv'}:3: 6 tokens, more than task.seq_len=5 (task.max_length=null "
        "keeps every token); set task.max_length to at most 5 or task.seq_len to at least 6"
    )


# ----------------------------------------------------------------------------- generated sets keyed by their settings
def test_generated_listops_other_settings_get_their_own_folder_and_the_default_is_not_regenerated(
    tmp_path, monkeypatch
):
    made = spy_generation(monkeypatch)
    default = load_listops(_gen_cfg(), tmp_path)
    (first,) = made
    before = snapshot(first)
    other = load_listops(_gen_cfg(n_train=300), tmp_path)  # other generation settings: a folder of their own
    assert len(made) == 2 and made[1] != first and len(other["train"]) == 300
    assert json.loads((made[1] / "GENERATED.json").read_text())["params"]["n_train"] == 300
    again = load_listops(_gen_cfg(), tmp_path)  # the default again: found, not regenerated
    assert len(made) == 2 and snapshot(first) == before
    assert np.array_equal(np.asarray(again["train"].tokens), np.asarray(default["train"].tokens))
    assert sorted(p.name for p in (tmp_path / "generated").iterdir()) == sorted(p.name for p in made)
    assert not (tmp_path / "listops-small").exists()  # the release's folder name is never generated into


def test_a_listops_folder_the_user_copies_in_after_generation_is_used_and_never_overwritten(tmp_path, monkeypatch):
    load_listops(_gen_cfg(), tmp_path)
    made = spy_generation(monkeypatch)
    folder = tmp_path / "listops-small"
    _write_official(folder, {"train": [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM 3 ) 4 ) ] )", 7)]})
    before = snapshot(folder)
    for seed in (1, 2):  # whatever the generation settings, the user's complete folder wins and stays as it is
        got = load_listops(_gen_cfg(seed=seed), tmp_path)
        assert list(got["train"].labels) == [9, 7]
    assert made == [] and snapshot(folder) == before


# ------------------------------------------------------------------------------ issue 19: Ctrl-C during generation
def _interrupt_generation(monkeypatch, tmp_path, how):
    """Run ``python -m lra.data`` in this process on a ListOps generation that ``how()`` interrupts."""
    from lra.data import __main__ as data_main

    monkeypatch.setenv("LRA_DATA", str(tmp_path / "data"))
    calls = []
    real = lo._chunk

    def chunk(args):
        calls.append(1)
        if len(calls) == 2:
            how()
        return real(args)

    monkeypatch.setattr(lo, "_chunk", chunk)
    return data_main.main(["task=listops", "preset=quick", "task.generator.n_train=100000"])


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_during_listops_generation_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch, caplog, capsys, sig):
    import os
    import signal
    import time

    def interrupt():
        if sig == "SIGINT":
            raise KeyboardInterrupt  # what Python makes of SIGINT in the main process
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises before this ends

    def not_handled(signum, frame):  # here only if lra.data left SIGTERM to the process's previous handler
        raise AssertionError("SIGTERM reached the handler lra.data should have replaced")

    previous = signal.signal(signal.SIGTERM, not_handled)
    try:
        with caplog.at_level("INFO"):
            code = _interrupt_generation(monkeypatch, tmp_path, interrupt)
        assert signal.getsignal(signal.SIGTERM) is not_handled  # the process's own handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 128 + getattr(signal, sig)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"interrupted by {sig}") and "same command again" in errors[0]
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*"))  # no half folder, no temp


def test_data_pool_workers_leave_ctrl_c_to_the_main_process():
    import signal

    from lra.data.base import worker_pool

    with worker_pool(1) as pool:  # a worker that took SIGINT would print its own KeyboardInterrupt traceback
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN


@pytest.mark.slow
@pytest.mark.parametrize(
    "task,extra",
    [("listops", "task.generator.n_train=1000000"), ("pathfinder", "task.n_images=100000")],
)
def test_ctrl_c_to_the_process_group_during_generation_prints_one_line(tmp_path, task, extra):
    """The real thing: Ctrl-C reaches `python -m lra.data` and its worker processes at once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "LRA_DATA": str(tmp_path / "data")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lra.data", f"task={task}", "preset=quick", extra],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # as from a terminal
    try:
        lines = []
        for line in proc.stderr:  # wait until the workers are generating
            lines.append(line)
            if "generating" in line:
                break
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        out = "".join(lines) + proc.communicate(timeout=60)[1]  # a pool stopped badly can hang: fail, not wait
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert "Traceback" not in out and out.count("interrupted by SIGINT") == 1
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*"))
