"""task.download=true (lra/data/download.py) without the network: a local "hub" folder ($LRA_HUB) holds tiny
copies of stanfordnlp/imdb, uoft-cs/cifar10 and OpenNLPLab/lra laid out as on the Hub, and the real
path runs: datasets.load_dataset / a copy of the TSVs -> row and size checks -> rename into the data root ->
the task's reader; the Hub route of the TSVs (huggingface_hub's hf_hub_download) runs against fakes of its
two calls that read the same folder. Also: interrupted downloads leave nothing a reader accepts and resume,
wrong sizes fail in one line, the user's folders are never replaced."""

import hashlib
import io
import json
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from lra.config import ConfigError  # noqa: E402
from lra.data import DataError, data_record, download, load_task  # noqa: E402
from lra.data import __main__ as data_main  # noqa: E402

IMDB = {
    "train": [("A fine film.<br />Loved it.", 1), ('Bad "quoted" plot.', 0), ("Great.", 1)],
    "test": [("Dull.", 0), ("Superb acting, é☃.", 1)],
}
AAN = {
    "train": [
        b"1\tid1\tid2\tb'first \"paper\" text'\tb'second text'",
        b"0.0\tid3\tid4\tb'alpha'\tb'beta, gamma'",
        b"1.0\tid5\tid6\tb'x'\tb'y'",
    ],
    "val": [b"0\tid7\tid8\tb'eval one'\tb'eval two'"],
    "test": [b"1\tid9\tid10\tb'test one'\tb'test two'", b"0\tid11\tid12\tb'3'\tb'4'"],
}
AAN_NAMES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
N_IMAGES = {"train": 10, "test": 4}

TASKS = {
    "text": {"name": "text", "max_length": 64, "seq_len": 64, "dev_split": "test", "path": None},
    "image": {"name": "image", "grayscale": "luminance", "val_fraction": 0.2, "path": None},
    "retrieval": {"name": "retrieval", "max_length": 32, "seq_len": 32, "path": None},
}


def _png(seed: int) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, format="PNG")
    return b.getvalue()


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """The three repositories as the Hub lays them out, a few rows each."""
    h = tmp_path_factory.mktemp("hub")
    d = h / "stanfordnlp" / "imdb" / "plain_text"
    d.mkdir(parents=True)
    for s, rows in IMDB.items():
        datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [y for _, y in rows]}).to_parquet(
            str(d / f"{s}-00000-of-00001.parquet")
        )
    datasets.Dataset.from_dict({"text": ["unlabelled"], "label": [-1]}).to_parquet(
        str(d / "unsupervised-00000-of-00001.parquet")
    )
    d = h / "uoft-cs" / "cifar10" / "plain_text"
    d.mkdir(parents=True)
    feats = datasets.Features(img=datasets.Image(), label=datasets.ClassLabel(names=[str(i) for i in range(10)]))
    for k, (s, n) in enumerate(N_IMAGES.items()):
        datasets.Dataset.from_dict(
            {
                "img": [{"bytes": _png(100 * k + i), "path": None} for i in range(n)],
                "label": [i % 10 for i in range(n)],
            },
            features=feats,
        ).to_parquet(str(d / f"{s}-00000-of-00001.parquet"))
    d = h / "OpenNLPLab" / "lra" / "data" / "aan"
    d.mkdir(parents=True)
    for s, lines in AAN.items():
        (d / AAN_NAMES[s]).write_bytes(b"\n".join(lines) + b"\n")
    return h


@pytest.fixture
def tiny(monkeypatch, hub):
    """Point the module at the local hub, with the fixture's row counts as the expected sizes."""
    monkeypatch.setenv(download.HUB_ENV, str(hub))
    rows = {
        "text": {s: len(r) for s, r in IMDB.items()},
        "image": dict(N_IMAGES),
        "retrieval": {s: len(r) for s, r in AAN.items()},
    }
    for task, r in rows.items():
        monkeypatch.setitem(download.SOURCES, task, replace(download.SOURCES[task], rows=r))
    return hub


def _fixture_splits(task: str, hub: Path, tmp_path: Path):
    """What the reader gives for the hub's own files (task.path): the downloaded copy must equal it."""
    path = {
        "text": hub / "stanfordnlp" / "imdb" / "plain_text",
        "image": hub / "uoft-cs" / "cifar10" / "plain_text",
        "retrieval": hub / "OpenNLPLab" / "lra" / "data" / "aan",
    }[task]
    return load_task({**TASKS[task], "path": str(path)}, tmp_path / "reference-root")


def _left_over(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".download"))


@pytest.mark.parametrize("task", ["text", "image", "retrieval"])
def test_download_then_read_gives_the_hub_data(tmp_path, tiny, task):
    root = tmp_path / "data"
    got = load_task({**TASKS[task], "download": True}, root)
    want = _fixture_splits(task, tiny, tmp_path)
    assert set(got) == set(want) == {"train", "val", "test"}
    for s in want:
        assert len(got[s]) > 0
        for f in ("tokens", "lengths", "labels"):
            assert np.array_equal(getattr(got[s], f), getattr(want[s], f)), (s, f)
    folder = root / download.SOURCES[task].folder
    stamp = json.loads((folder / download.STAMP).read_text())
    assert stamp["rows"] == download.SOURCES[task].rows and stamp["task"] == task
    assert _left_over(root) == []
    # the record's data (bug: AAN TSVs fetched from the HF mirror recorded as the release; a download and the
    # same files read in place under two ids): an HF copy naming its repo, with the id of the files themselves
    rec = data_record(got)
    assert rec["kind"] == "hf" and rec["downloaded"]["repo"] == download.SOURCES[task].repo
    assert rec["id"] == data_record(want)["id"]
    # found again without download, and a second download=true does not fetch again
    again = load_task({**TASKS[task], "download": False}, root)
    assert np.array_equal(again["train"].tokens, got["train"].tokens)
    mtime = (folder / download.STAMP).stat().st_mtime_ns
    load_task({**TASKS[task], "download": True}, root)
    assert (folder / download.STAMP).stat().st_mtime_ns == mtime


def test_aan_files_are_copied_byte_for_byte(tmp_path, tiny):
    root = tmp_path / "data"
    load_task({**TASKS["retrieval"], "download": True}, root)
    folder = root / download.SOURCES["retrieval"].folder
    for s, name in AAN_NAMES.items():
        assert (folder / name).read_bytes() == (tiny / "OpenNLPLab/lra/data/aan" / name).read_bytes()
    assert json.loads((folder / download.STAMP).read_text())["files"][AAN_NAMES["train"]]["bytes"] > 0


@pytest.mark.parametrize("task", ["text", "image", "retrieval"])
def test_off_by_default_and_the_message_says_how(tmp_path, tiny, task):
    with pytest.raises(DataError) as e:
        load_task(dict(TASKS[task]), tmp_path)
    assert "task.download=true" in str(e.value) and download.SOURCES[task].repo in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing fetched, nothing written


@pytest.fixture
def fake_hub(monkeypatch, tiny):
    """The Hub route (no $LRA_HUB) with huggingface_hub's two calls served from the fixture folder, the
    network check skipped: what download.py asks the Hub for, and what it does with the answers."""
    import huggingface_hub

    monkeypatch.delenv(download.HUB_ENV)
    monkeypatch.setattr(download, "check_network", lambda *a, **k: None)
    base = tiny / "OpenNLPLab" / "lra"
    state = {"info": [], "downloads": [], "fail": set(), "size_delta": 0, "sha": None}

    class Api:
        def get_paths_info(self, repo_id, paths, *, revision=None, repo_type=None, **kw):
            state["info"].append((repo_id, tuple(paths), revision, repo_type))
            return [
                SimpleNamespace(
                    path=p,
                    size=(base / p).stat().st_size + state["size_delta"],
                    lfs={"sha256": state["sha"] or hashlib.sha256((base / p).read_bytes()).hexdigest()},
                )
                for p in paths
            ]

    def hf_hub_download(repo_id, filename, *, repo_type=None, revision=None, local_dir=None, **kw):
        state["downloads"].append(
            {"repo": repo_id, "file": filename, "repo_type": repo_type, "revision": revision, "local_dir": local_dir}
        )
        if filename in state["fail"]:
            state["fail"].discard(filename)
            raise ConnectionResetError("connection reset by peer")
        dest = Path(local_dir) / filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((base / filename).read_bytes())
        return str(dest)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return state


def test_aan_from_the_hub_goes_through_huggingface_hub_at_the_pinned_revision(tmp_path, tiny, fake_hub):
    root = tmp_path / "data"
    src = download.SOURCES["retrieval"]
    got = load_task({**TASKS["retrieval"], "download": True}, root)
    folder = root / src.folder
    assert fake_hub["info"] == [(src.repo, tuple(src.files.values()), src.revision, "dataset")]
    assert [d["file"] for d in fake_hub["downloads"]] == list(src.files.values())
    for d in fake_hub["downloads"]:  # pinned, a dataset, resumable state inside the dot folder
        assert (d["repo"], d["repo_type"], d["revision"]) == (src.repo, "dataset", src.revision)
        assert Path(d["local_dir"]) == root / f".download-{src.folder}" / "hub"
    for name in AAN_NAMES.values():
        assert (folder / name).read_bytes() == (tiny / "OpenNLPLab/lra/data/aan" / name).read_bytes()
    stamp = json.loads((folder / download.STAMP).read_text())
    assert stamp["revision"] == src.revision and all(len(f["sha256"]) == 64 for f in stamp["files"].values())
    assert _left_over(root) == []
    want = _fixture_splits("retrieval", tiny, tmp_path)
    assert np.array_equal(got["train"].tokens, want["train"].tokens)


def test_interrupted_hub_download_leaves_nothing_readable_and_resumes(tmp_path, tiny, fake_hub):
    """A transfer cut on the second file: one line, only the dot folder; the next try fetches the files not
    yet whole (huggingface_hub continues the cut one from its .incomplete file in the same local_dir)."""
    root = tmp_path / "data"
    src = download.SOURCES["retrieval"]
    val = src.files["val"]
    fake_hub["fail"].add(val)
    with pytest.raises(DataError, match="run again: it continues") as e:
        load_task({**TASKS["retrieval"], "download": True}, root)
    assert "\n" not in str(e.value) and "ConnectionResetError" in str(e.value)
    folder = root / src.folder
    assert not folder.exists() and _left_over(root) == [f".download-{folder.name}"]
    with pytest.raises(DataError, match="not found"):  # the half download is invisible to the reader
        load_task(dict(TASKS["retrieval"]), root)
    first = fake_hub["downloads"][:]
    load_task({**TASKS["retrieval"], "download": True}, root)
    again = fake_hub["downloads"][len(first) :]
    assert [d["file"] for d in again] == [val, src.files["test"]]  # the whole train file is kept
    assert {d["local_dir"] for d in first + again} == {str(root / f".download-{folder.name}" / "hub")}
    assert _left_over(root) == [] and (folder / download.STAMP).is_file()


@pytest.mark.parametrize("damage,message", [("size", "expected"), ("sha", "SHA-256 differs")])
def test_a_hub_file_of_the_wrong_size_or_checksum_is_one_line_and_removed(tmp_path, tiny, fake_hub, damage, message):
    if damage == "size":
        fake_hub["size_delta"] = 1
    else:
        fake_hub["sha"] = "0" * 64
    root = tmp_path / "data"
    with pytest.raises(DataError, match=message) as e:
        load_task({**TASKS["retrieval"], "download": True}, root)
    assert "\n" not in str(e.value) and not (root / download.SOURCES["retrieval"].folder).exists()
    dot = root / f".download-{download.SOURCES['retrieval'].folder}"
    assert not [p for p in dot.rglob("*.tsv")]  # the file that differs is gone, nothing half-checked stays


def test_interrupted_dataset_write_leaves_nothing_readable_and_restarts(tmp_path, tiny, monkeypatch):
    calls = []
    real = datasets.Dataset.save_to_disk

    def cut(self, path, *a, **kw):
        calls.append(path)
        if len(calls) == 2:  # the train split is written, the test split hits a full disk
            raise OSError(28, "No space left on device")
        return real(self, path, *a, **kw)

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", cut)
    root = tmp_path / "data"
    with pytest.raises(DataError, match="No space left") as e:
        load_task({**TASKS["text"], "download": True}, root)
    assert "\n" not in str(e.value)
    folder = root / download.SOURCES["text"].folder
    assert not folder.exists() and (root / f".download-{folder.name}" / "out" / "train").is_dir()
    with pytest.raises(DataError, match="not found"):  # the half written dataset is not accepted
        load_task(dict(TASKS["text"]), root)
    got = load_task({**TASKS["text"], "download": True}, root)
    assert len(calls) >= 4 and _left_over(root) == []
    want = _fixture_splits("text", tiny, tmp_path)
    assert all(np.array_equal(got[s].tokens, want[s].tokens) for s in want)


@pytest.mark.parametrize("task", ["text", "retrieval"])
def test_wrong_row_count_fails_in_one_line_and_writes_nothing(tmp_path, tiny, monkeypatch, task):
    rows = {s: n + 1 if s == "train" else n for s, n in download.SOURCES[task].rows.items()}
    monkeypatch.setitem(download.SOURCES, task, replace(download.SOURCES[task], rows=rows))
    root = tmp_path / "data"
    with pytest.raises(DataError, match="wrong number of rows: train") as e:
        load_task({**TASKS[task], "download": True}, root)
    assert "\n" not in str(e.value)
    assert not (root / download.SOURCES[task].folder).exists()


def test_a_folder_of_the_user_is_never_replaced(tmp_path, tiny):
    root = tmp_path / "data"
    mine = root / download.SOURCES["image"].folder
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my own files")
    with pytest.raises(DataError, match="not written by task.download") as e:
        load_task({**TASKS["image"], "download": True}, root)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and _left_over(root) == []


def test_bad_values_are_refused_before_any_work(tmp_path, tiny):
    with pytest.raises(ConfigError, match="task.download='yes' is not allowed: true or false"):
        load_task({**TASKS["text"], "download": "yes"}, tmp_path)  # a node is typed first, as the config does
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(DataError, match="task.path"):
        load_task({**TASKS["retrieval"], "download": True, "path": str(elsewhere)}, tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_make_data_reaches_the_download(tmp_path, tiny, monkeypatch, caplog):
    """`make data task=retrieval ARGS='task.download=true'`: the CLI passes the task node to the reader."""
    monkeypatch.setenv("LRA_DATA", str(tmp_path / "data"))
    assert data_main.main(["task=retrieval", "task.download=true"]) == 0
    assert (tmp_path / "data" / download.SOURCES["retrieval"].folder / download.STAMP).is_file()
    assert data_main.main(["task=image"]) == 2  # off by default: the message, exit code 2
    assert "task.download=true" in caplog.text


def test_a_damaged_download_of_ours_is_replaced(tmp_path, tiny):
    """A stamped folder the reader refuses (a TSV deleted) is ours: the next download=true replaces it."""
    root = tmp_path / "data"
    load_task({**TASKS["retrieval"], "download": True}, root)
    folder = root / download.SOURCES["retrieval"].folder
    (folder / AAN_NAMES["test"]).unlink()
    (folder / "extra.txt").write_text("left by hand")
    with pytest.raises(DataError, match="not found"):
        load_task(dict(TASKS["retrieval"]), root)
    got = load_task({**TASKS["retrieval"], "download": True}, root)
    assert len(got["test"]) == len(AAN["test"]) and (folder / AAN_NAMES["test"]).is_file()
    assert _left_over(root) == []
    aside = [p for p in root.iterdir() if p.name.startswith(".replaced-")]
    assert len(aside) == 1 and (aside[0] / "extra.txt").read_text() == "left by hand"  # moved aside, not deleted


# ------------------------------------------------------------------------------ issue 19: no network
NETWORK_ENV = (
    "LRA_HUB",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_ENDPOINT",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
)


@pytest.fixture
def no_network(monkeypatch):
    """Every connection attempt raises ``state["error"]`` and is recorded; nothing may be fetched."""
    import socket

    for v in NETWORK_ENV:
        monkeypatch.delenv(v, raising=False)
    state = {"error": socket.gaierror(-2, "Name or service not known"), "tries": []}

    def connect(address, timeout=None, *a, **k):
        state["tries"].append(address)
        raise state["error"]

    def fetch(*a, **k):
        raise AssertionError("a download was attempted without a network")

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(download, "_load_dataset", fetch)
    monkeypatch.setattr(download, "_copy_files", fetch)
    return state


@pytest.mark.parametrize("failure", ["name resolution", "connection refused"])
@pytest.mark.parametrize(
    "task,by_hand",
    [("text", "aclImdb_v1.tar.gz"), ("retrieval", "lra_release.gz"), ("image", "cifar-10-python.tar.gz")],
)
def test_download_with_no_network_is_one_clear_line_at_once_without_retries(
    tmp_path, no_network, task, by_hand, failure
):
    if failure == "connection refused":
        no_network["error"] = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(DataError) as e:
        load_task({**TASKS[task], "download": True}, tmp_path / "data")
    msg = str(e.value)
    assert no_network["tries"] == [("huggingface.co", 443)]  # one attempt, no retry
    assert "\n" not in msg and "no network" in msg and download.SOURCES[task].repo in msg
    assert ("cannot resolve huggingface.co" if failure == "name resolution" else "refused") in msg
    assert by_hand in msg and str(tmp_path / "data") in msg  # how to get it by hand, and where to put it
    assert not (tmp_path / "data").exists()  # nothing written, not even the download's dot folder


def test_no_network_through_make_data_is_exit_2_with_one_line(tmp_path, no_network, monkeypatch, caplog):
    monkeypatch.setenv("LRA_DATA", str(tmp_path / "data"))
    with caplog.at_level("WARNING"):
        assert data_main.main(["task=text", "task.download=true"]) == 2
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "no network" in lines[0] and len(no_network["tries"]) == 1


def test_the_network_check_goes_through_the_proxy_and_honours_offline_mode(tmp_path, no_network, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    no_network["error"] = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(DataError, match="the proxy proxy.example:3128 refused"):
        load_task({**TASKS["text"], "download": True}, tmp_path)
    assert no_network["tries"] == [("proxy.example", 3128)]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="HF_HUB_OFFLINE=1 forbids the network"):
        load_task({**TASKS["text"], "download": True}, tmp_path)
    assert len(no_network["tries"]) == 1  # offline mode: not even one attempt
