"""ListOps: evaluator on hand-made expressions, generator statistics (LRA_FACTS §3), tokenizer, reader errors."""

import json
import random
import statistics
from collections import Counter

import numpy as np
import pytest

from lra.data import DataError
from lra.data import listops as lo
from lra.data.listops import load as load_listops


@pytest.mark.parametrize("src,value", [
    ("[MAX 2 9 ]", 9),
    ("[MIN 4 1 7 ]", 1),
    ("[MED 4 9 ]", 6),          # even count: mean of the middle two (6.5), truncated
    ("[MED 1 2 8 9 ]", 5),      # (2 + 8) / 2
    ("[MED 3 1 2 ]", 2),
    ("[SM 9 9 5 ]", 3),         # 23 mod 10
    ("[SM 0 0 ]", 0),
    ("[MAX 1 [MIN 7 3 ] [SM 5 6 ] ]", 3),
    ("[MED [MAX 1 9 ] [MIN 0 4 ] 5 [SM 2 2 ] ]", 4),  # args 9, 0, 5, 4 -> (4 + 5) / 2 = 4.5 -> 4
])
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
    assert 950 < statistics.mean(lengths) < 1180  # LRA_FACTS: mean about 1064
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
    c = lo.write_dataset(tmp_path / "c", lo.GeneratorParams(**{**lo.asdict(params), "seed": 6}), workers=1,
                         progress=False)
    assert (a / "basic_train.tsv").read_bytes() != (c / "basic_train.tsv").read_bytes()
    lines = (a / "basic_val.tsv").read_text().splitlines()
    assert lines[0] == "Source\tTarget" and len(lines) == 31
    assert not list(tmp_path.glob(".tmp-*"))


def _cfg(dirname="listops-1000", **gen):
    return {"name": "listops", "max_length": 2000, "seq_len": 2048, "dirname": dirname, "generate": False,
            "generator": gen}


def _write_official(folder, rows_by_split):
    folder.mkdir(parents=True)
    for split in lo.SPLITS:
        text = "Source\tTarget\n" + "".join(f"{s}\t{l}\n" for s, l in rows_by_split.get(split, rows_by_split["train"]))
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


@pytest.mark.parametrize("line,needle", [
    ("( ( ( [MAX 2 ) 9 ) ] )\t12", "label must be a digit"),
    ("( ( ( [MAX 2 ) 9 ) ] )", "2 tab-separated fields"),
    ("( ( ( [BAD 2 ) 9 ) ] )\t3", "unknown ListOps symbol"),
])
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


def test_generated_folder_regenerates_when_params_change(tmp_path):
    small = dict(seed=1, n_train=50, n_val=5, n_test=5, min_length=10, max_length=60, max_depth=5)
    cfg = {**_cfg("listops-small", **small), "generate": True, "max_length": 60, "seq_len": 64}
    first = load_listops(cfg, tmp_path)
    stamp = json.loads((tmp_path / "listops-small" / "GENERATED.json").read_text())
    assert stamp["params"]["seed"] == 1 and len(first["train"]) == 50
    cfg["generator"] = {**small, "seed": 2}
    second = load_listops(cfg, tmp_path)
    assert not np.array_equal(np.asarray(first["train"].tokens), np.asarray(second["train"].tokens))
