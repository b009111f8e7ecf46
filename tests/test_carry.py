"""``python -m lra.tools.carry``: a GPU window's unfinished runs travel to the next machine and resume there
exactly; what travels is checked before anything is written; finished runs are shipped as small files only."""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from lra.tools import carry
from lra.tools.sweep.base import FINISHED
from tests.helpers import kill_at, train_here
from tests.test_resume import EPOCHS

torch.set_num_threads(1)

# 64 training examples, micro-batches of 8 x accumulation 2: 14 optimizer steps, evaluated every 3 (as
# tests/test_resume.py's in-process runs); a resume checkpoint every 2nd step
RUN = [o for o in EPOCHS if not o.startswith(("trainer.log_every_n_steps", "logger="))]
REL = "quick/clean/listops/softmax/seed0"
SAME = ("status", "steps", "steps_to_best", "steps_at_stop", "stop_reason", "tested_ckpt")
CLOSE = ("test_acc", "best_val_acc", "test_loss")


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``python -m lra.tools.carry <argv>`` in this process: (exit code, stdout, stderr)."""
    try:
        code = carry.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> content): what a test compares before and after."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def fake_run(root: Path, rel: str, status: str, steps: int = 7, device: str | None = "cpu", ckpt: bool = True) -> Path:
    """A run folder as lra.train leaves it: a record the collector reads, metrics, log, .hydra, checkpoints, the
    lock and sweep marker files (a record of None: no result.json)."""
    d = root / rel
    (d / ".hydra").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    if status is not None:
        rec = {
            "schema_version": 1,
            "task": "listops",
            "attn": rel.split("/")[3],
            "seed": 0,
            "preset": "quick",
            "semantics": "clean",
            "status": status,
            "reason": None,
            "test_acc": 0.4 if status in FINISHED else None,
            "best_val_acc": 0.45 if status in FINISHED else None,
            "steps": steps,
            "train_time_s": 1.5,
            "time_per_1k_steps_s": 200.0,
            "peak_mem_bytes": None if device == "cpu" else 123456,
            "micro_batch": 8,
            "accum_steps": 2,
            "effective_batch": 16,
            "hardware": "cpu",
            "config": {"task": {"name": "listops"}},
            "git_commit": "abc",
            "device": device,
        }
        (d / "result.json").write_text(json.dumps(rec))
    (d / "metrics.csv").write_text("step,val/acc\n3,0.4\n")
    (d / "train.log").write_text(f"{rel} trained\n")
    (d / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (d / ".hydra" / "overrides.yaml").write_text("- task=listops\n- preset=quick\n- run_tag=x\n")
    (d / ".hydra" / "hydra.yaml").write_text("hydra: {}\n")
    (d / ".sweep_job.json").write_text("{}")
    (d / ".lock").write_text('{"pid": 1}')
    if ckpt:
        (d / "checkpoints" / "last.ckpt").write_bytes(os.urandom(6000))  # incompressible: parts by size
        (d / "checkpoints" / "best.ckpt").write_bytes(os.urandom(1000))
    return d


def members(folder: Path) -> list[str]:
    data = b"".join(p.read_bytes() for p in sorted(folder.glob("runs.tar.gz.part*")))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def manifest(root: Path) -> Path:
    m = root / "quick" / "sweeps" / "quick" / "manifest-0123456789.json"
    m.parent.mkdir(parents=True)
    m.write_text('{"jobs": []}')
    (m.parent / ".lock").write_text("")
    (m.parent / ".submitit" / "1").mkdir(parents=True)
    (m.parent / ".submitit" / "1" / "log.out").write_text("job log")
    return m


# ----------------------------------------------------------------------------- a real run
def _train(folder: Path, runs: str, stop_at: int | None = None) -> dict:
    """The tiny run in ``folder/runs`` (data in ``folder/data``), in this process; with ``stop_at``, SIGTERM after
    that many optimizer steps, as the GPU window's budget sends it (the interrupted record). Run again in the same
    folder, it resumes. Its own: it returns the record an interruption leaves, under a runs root of its own."""
    from lra.interrupts import Interrupted

    root = folder / runs
    stop = [] if stop_at is None else [kill_at(stop_at, signal.SIGTERM)]
    try:
        rec = train_here(folder, *RUN, f"runs_root={root}", callbacks=stop, run_dir=root / REL)
    except Interrupted:
        rec = json.loads((root / REL / "result.json").read_text())
    assert rec["config"]["runs_root"] == str(root)  # the test's own root wins over train_here's default
    return rec


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """(the uninterrupted run's record, the folder of its runs, the pack of the same run stopped by SIGTERM after
    step 10: after its best evaluation (step 9) and before a worse one (step 12), so a resume that lost the
    selection picks the wrong checkpoint)."""
    folder = tmp_path_factory.mktemp("carried")
    reference = _train(folder, "ref")
    assert reference["status"] == "completed" and reference["steps"] == 14 and reference["steps_to_best"] == 9
    stopped = _train(folder, "window1", stop_at=10)
    assert stopped["status"] == "interrupted" and stopped["steps"] == 10
    (folder / "window1" / ".fit-cache").mkdir(exist_ok=True)  # a GPU run's fit decisions: they stay behind
    (folder / "window1" / ".fit-cache" / "fit.json").write_text("{}")
    assert carry.main(["pack", str(folder / "window1"), "--out", str(folder / "pack")]) == 0
    names = members(folder / "pack")
    assert f"{REL}/checkpoints/last.ckpt" in names and f"{REL}/result.json" in names
    assert not any(".fit-cache" in n or n.endswith(".lock") for n in names)
    return reference, folder


def _resume_from_pack(folder: Path, runs: str, capsys) -> dict:
    code, out, _ = cli(capsys, "unpack", folder / "pack", "--runs", folder / runs)
    assert code == 0 and f"unpacked {REL}: interrupted, last.ckpt at step 10" in out and "resume: " in out
    resumed = _train(folder, runs)
    assert resumed["resumed_from_step"] == 10
    return resumed


def _same_record(resumed: dict, reference: dict) -> None:
    for k in SAME:
        assert resumed[k] == reference[k], (k, resumed[k], reference[k])
    for k in CLOSE:
        assert resumed[k] == pytest.approx(reference[k], abs=1e-6), (k, resumed[k], reference[k])


def test_an_interrupted_run_carried_to_a_fresh_machine_finishes_as_the_uninterrupted_run(carried, capsys):
    """The next window's machine has nothing of the first one but the pack; its runs root is where the first
    one's was (the checkout at the same place)."""
    reference, folder = carried
    os.rename(folder / "window1", folder / "window1-gone")
    _same_record(_resume_from_pack(folder, "window1", capsys), reference)


def test_an_interrupted_run_carried_to_another_runs_root_finishes_as_the_uninterrupted_run(carried, capsys):
    """Stopped after its best evaluation (step 9) and before a worse one (step 12): resumed under a runs root at
    another path, it must still remember step 9 as its best (Lightning forgets a moved folder's best score)."""
    reference, folder = carried
    _same_record(_resume_from_pack(folder, "elsewhere/runs", capsys), reference)


# ----------------------------------------------------------------------------- pack
def test_pack_carries_unfinished_runs_whole_finished_runs_records_and_manifests_never_caches_or_locks(tmp_path, capsys):
    root = tmp_path / "runs"
    for status in FINISHED:
        fake_run(root, f"quick/clean/listops/{status}/seed0", status)
    carried = {
        "quick/clean/listops/interrupted/seed0": "interrupted",
        "quick/clean/listops/failed/seed0": "failed",
        "quick/clean/listops/running/seed0": "running",  # its process is gone: the lock is not held
        "quick/clean/listops/norecord/seed0": None,  # killed before its first record, with a checkpoint
    }
    for rel, status in carried.items():
        fake_run(root, rel, status)
    fake_run(root, "quick/clean/listops/fresh/seed0", None, ckpt=False)  # nothing to resume from
    fake_run(root, "quick/clean/listops/interrupted/seed0/tagged", "completed")  # a finished run inside one
    (root / ".fit-cache").mkdir()
    (root / ".fit-cache" / "a.json").write_text("{}")
    m = manifest(root)

    code, out, _ = cli(capsys, "pack", root, "--out", tmp_path / "pack")
    assert code == 0, out
    names = members(tmp_path / "pack")
    resumable = {n.removesuffix("/checkpoints/last.ckpt") for n in names if n.endswith("/checkpoints/last.ckpt")}
    assert resumable == set(carried)
    finished = [f"quick/clean/listops/{s}/seed0" for s in FINISHED] + ["quick/clean/listops/interrupted/seed0/tagged"]
    for run in finished:  # the next window's sweep must see them finished: their records travel, not checkpoints
        assert f"{run}/result.json" in names and f"{run}/.hydra/config.yaml" in names
        assert not [n for n in names if n.startswith(f"{run}/checkpoints")]
    assert m.relative_to(root).as_posix() in names
    assert not [n for n in names if ".fit-cache" in n or ".submitit" in n or n.endswith(".lock") or "fresh" in n]
    assert "quick/clean/listops/interrupted/seed0/checkpoints/best.ckpt" in names  # whole folders
    assert len([ln for ln in out.splitlines() if ln.startswith("packed ")]) == len(carried)
    info = json.loads((tmp_path / "pack" / "pack.json").read_text())
    assert {r["path"]: r["status"] for r in info["runs"]} == {k: v or "no record" for k, v in carried.items()}
    assert info["finished"] == sorted(finished)
    assert {r["steps"] for r in info["runs"]} == {7, None} and all(r["last_ckpt"] for r in info["runs"])
    assert info["git_commit"] and info["host"] and info["created_utc"].endswith("+00:00")
    # the checksum is of the joined parts, as sha256sum -c reads it
    joined = b"".join(p.read_bytes() for p in sorted((tmp_path / "pack").glob("runs.tar.gz.part*")))
    assert (tmp_path / "pack" / "runs.sha256").read_text() == f"{hashlib.sha256(joined).hexdigest()}  runs.tar.gz\n"


def test_parts_are_at_most_part_mib_and_a_pack_of_more_than_8_files_is_refused(tmp_path, capsys):
    root = tmp_path / "runs"
    fake_run(root, "quick/clean/listops/a/seed0", "interrupted")
    code, out, _ = cli(capsys, "pack", root, "--out", tmp_path / "pack", "--part-mib", 0.002)
    parts = sorted((tmp_path / "pack").glob("runs.tar.gz.part*"))
    assert code == 0 and 3 <= len(parts) <= 6, out
    assert all(p.stat().st_size <= 0.002 * 2**20 for p in parts)
    assert sorted(p.name for p in (tmp_path / "pack").iterdir()) == sorted(
        ["pack.json", "runs.sha256", *[f"runs.tar.gz.part{i:02d}" for i in range(len(parts))]]
    )

    code, out, err = cli(capsys, "pack", root, "--out", tmp_path / "small", "--part-mib", 0.0005)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "MiB" in err and "at most 8 files of 16 MiB" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack", "runs"]  # no pack, no temporary folder


def test_nothing_unfinished_is_one_line_and_writes_nothing(tmp_path, capsys):
    fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "completed")
    code, out, err = cli(capsys, "pack", tmp_path / "runs", "--out", tmp_path / "pack")
    assert code == 0 and len(out.splitlines()) == 1 and "nothing unfinished" in out and err == ""
    assert not (tmp_path / "pack").exists()


def test_a_live_run_is_not_packed(tmp_path, capsys):
    """A run a live process still trains (a budgeted sweep's job whose driver was SIGKILLed): the one line names
    the run, the pid that holds it and what to do."""
    from lra.runlock import hold

    run = fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "running")
    with hold(run):
        code, out, err = cli(capsys, "pack", tmp_path / "runs", "--out", tmp_path / "pack")
    pid = os.getpid()
    assert code == 2 and len(err.splitlines()) == 1 and f"{run} is held by pid {pid}" in err
    assert "wait for it to end" in err and f"kill -TERM {pid}" in err
    assert not (tmp_path / "pack").exists()


def test_a_run_held_from_another_host_or_by_an_unnamed_holder_is_not_packed(tmp_path, capsys):
    """The lock's pid is another host's (or its .lock does not parse): held all the same, never packed."""
    import fcntl

    run = fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "running")
    for said, who in (('{"pid": 7, "host": "node-b"}', "pid 7 on node-b"), ('{"pid": 7, "ho', "another process")):
        (run / ".lock").write_text(said)
        fd = os.open(run / ".lock", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            code, out, err = cli(capsys, "pack", tmp_path / "runs", "--out", tmp_path / "pack")
        finally:
            os.close(fd)
        assert code == 2 and f"is held by {who}" in err and not (tmp_path / "pack").exists(), err


def test_a_pack_is_at_most_8_files_with_its_checksum_and_manifest(tmp_path, capsys):
    """A window brings back 8 files: the parts, runs.sha256 and pack.json (the window's bundle takes its place):
    6 parts pack and 7 do not, at either end."""
    root = tmp_path / "runs"
    fake_run(root, "quick/clean/listops/a/seed0", "interrupted")
    assert cli(capsys, "pack", root, "--out", tmp_path / "one")[0] == 0
    size = json.loads((tmp_path / "one" / "pack.json").read_text())["tarball"]["bytes"]
    for n, want in ((6, 0), (7, 2)):
        code, out, err = cli(capsys, "pack", root, "--out", tmp_path / f"in{n}", "--part-mib", -(-size // n) / 2**20)
        assert code == want, (n, out, err)
    assert len(list((tmp_path / "in6").glob("runs.tar.gz.part*"))) == 6 and not (tmp_path / "in7").exists()
    assert "7 parts" in err and "= 9 files" in err
    joined = b"".join(p.read_bytes() for p in sorted((tmp_path / "in6").glob("runs.tar.gz.part*")))
    seven, step = tmp_path / "seven", -(-len(joined) // 7)
    seven.mkdir()
    for i in range(7):
        (seven / f"runs.tar.gz.part{i:02d}").write_bytes(joined[i * step : (i + 1) * step])
    (seven / "runs.sha256").write_bytes((tmp_path / "in6" / "runs.sha256").read_bytes())
    code, out, err = cli(capsys, "unpack", seven, "--runs", tmp_path / "next")
    assert code == 2 and out == "" and "holds 7 parts" in err and not (tmp_path / "next").exists(), err
    for p in sorted(seven.glob("runs.tar.gz.part*"))[1:]:
        p.unlink()
    (seven / "runs.tar.gz.part00").rename(seven / "runs.tar.gz.part99999999999")  # no range of that many
    code, out, err = cli(capsys, "unpack", seven, "--runs", tmp_path / "next")
    assert code == 2 and "lacks runs.tar.gz.part00" in err, err


def test_pack_carries_a_hard_linked_file_as_a_file_and_leaves_a_fifo_behind(tmp_path, capsys):
    """What pack writes, unpack takes: a hard link (tar's LNKTYPE) or a FIFO would make the whole pack refused."""
    root = tmp_path / "runs"
    run = fake_run(root, "quick/clean/listops/a/seed0", "interrupted")
    os.link(run / "checkpoints" / "last.ckpt", run / "checkpoints" / "copy.ckpt")
    os.mkfifo(run / "service.sock")
    assert cli(capsys, "pack", root, "--out", tmp_path / "pack")[0] == 0
    code, out, err = cli(capsys, "unpack", tmp_path / "pack", "--runs", tmp_path / "next")
    assert code == 0, err
    got = tmp_path / "next" / "quick/clean/listops/a/seed0"
    assert (got / "checkpoints" / "copy.ckpt").read_bytes() == (run / "checkpoints" / "last.ckpt").read_bytes()
    assert not (got / "service.sock").exists()


# ----------------------------------------------------------------------------- unpack
def _pack(tmp_path, capsys, root: Path) -> Path:
    code, out, err = cli(capsys, "pack", root, "--out", tmp_path / "pack", "--part-mib", 0.004)
    assert code == 0, out + err
    return tmp_path / "pack"


def test_a_damaged_part_is_refused_before_anything_is_written(tmp_path, capsys):
    fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "interrupted")
    pack = _pack(tmp_path, capsys, tmp_path / "runs")
    part = pack / "runs.tar.gz.part01"
    data = bytearray(part.read_bytes())
    data[100] ^= 0x01
    part.write_bytes(bytes(data))
    code, out, err = cli(capsys, "unpack", pack, "--runs", tmp_path / "next")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "does not match" in err
    assert not (tmp_path / "next").exists()


def _tar_pack(folder: Path, *members: tuple) -> None:
    """A pack in ``folder`` of ``members`` ((name, content, TarInfo fields)) with a matching runs.sha256: the
    checksum cannot catch what was packed so on purpose."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, *kw in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in (kw[0] if kw else {}).items():
                setattr(info, k, v)
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    folder.mkdir()
    (folder / "runs.tar.gz").write_bytes(buf.getvalue())
    (folder / "runs.sha256").write_text(f"{hashlib.sha256(buf.getvalue()).hexdigest()}  runs.tar.gz\n")


BAD = {  # a good run file, then what no pack may hold
    "symlink": ("quick/clean/listops/a/seed0/metrics.csv", b"", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}),
    "hardlink": ("quick/clean/listops/a/seed0/metrics.csv", b"", {"type": tarfile.LNKTYPE, "linkname": "/etc/passwd"}),
    "dotdot": ("quick/../../escape.txt", b"x"),
    "absolute": ("TMP/escape.txt", b"x"),  # TMP: the test's folder
    "newline": ("quick/clean/listops/a\nresume: rm -rf ~/seed0/result.json", b"{}"),  # a forged resume line
    "file-and-folder": ("quick/clean/listops/a/seed0/result.json/x", b"x"),
    "twice": ("quick/clean/listops/a/seed0/result.json", b"{}"),
    "run-at-top": ("result.json", b"{}"),  # the runs root itself a run: nothing to rename into place
    "too-many": ("quick/clean/listops/a/seed0/metrics.csv", b"x"),  # with MAX_MEMBERS of 1
}


@pytest.mark.parametrize("bad", BAD)
def test_a_member_no_pack_may_hold_is_refused_and_nothing_is_written(tmp_path, capsys, monkeypatch, bad):
    if bad == "too-many":
        monkeypatch.setattr(carry, "MAX_MEMBERS", 1)
    good = ("quick/clean/listops/a/seed0/result.json", b'{"status": "interrupted"}')
    _tar_pack(tmp_path / "pack", good, (BAD[bad][0].replace("TMP", str(tmp_path)), *BAD[bad][1:]))
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = cli(capsys, "unpack", tmp_path / "pack", "--runs", tmp_path / "sub" / "runs")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "nothing unpacked" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no runs root, no escape.txt
    assert not (tmp_path / "sub").exists()


def test_unpack_never_replaces_a_run_folder_or_manifest_that_is_there(tmp_path, capsys):
    there = tmp_path / "next"
    fake_run(there, "quick/clean/listops/a/seed0", "completed", steps=14)
    manifest(there).write_text('{"jobs": ["the newer one"]}')
    before = files(there)
    src = tmp_path / "runs"
    fake_run(src, "quick/clean/listops/a/seed0", "interrupted", steps=5)
    fake_run(src, "quick/clean/listops/b/seed0", "failed", steps=3)
    manifest(src)
    code, out, err = cli(capsys, "unpack", _pack(tmp_path, capsys, src), "--runs", there)
    assert code == 0, err
    assert files(there).items() >= before.items()  # every file that was there, byte for byte
    kept = [ln for ln in out.splitlines() if "quick/clean/listops/a/seed0" in ln and ln.startswith("kept")]
    assert len(kept) == 1 and "14 steps" in kept[0] and "5 steps" in kept[0]
    assert "kept the existing quick/sweeps/quick/manifest-0123456789.json" in out
    b = there / "quick/clean/listops/b/seed0"
    assert files(b) == {k: v for k, v in files(src / "quick/clean/listops/b/seed0").items() if k != ".lock"}
    assert not [p for p in there.iterdir() if p.name.startswith(".carry")]  # the temporary folder is gone
    assert "resume: LRA_RUNS=" in out and "python -m lra.train task=listops preset=quick" in out


def test_a_file_where_the_pack_has_a_folder_is_refused_before_anything_is_written(tmp_path, capsys):
    src = tmp_path / "runs"
    fake_run(src, "other/clean/listops/b/seed0", "interrupted", ckpt=False)  # placed first, were nothing checked
    fake_run(src, "quick/clean/listops/a/seed0", "interrupted", ckpt=False)
    pack, there = _pack(tmp_path, capsys, src), tmp_path / "next"
    there.mkdir()
    (there / "quick").write_text("a file")
    code, out, err = cli(capsys, "unpack", pack, "--runs", there)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and f"{there / 'quick'} is a file" in err, err
    assert files(there) == {"quick": b"a file"} and [p.name for p in there.iterdir()] == ["quick"]


def test_a_part_larger_than_a_pack_can_be_is_refused_before_it_is_read(tmp_path, capsys):
    pack = tmp_path / "pack"
    pack.mkdir()
    with open(pack / "runs.tar.gz.part00", "wb") as f:
        f.truncate(17 * 2**20)  # sparse: no disk, and no memory unless read
    (pack / "runs.sha256").write_text(f"{hashlib.sha256(bytes(17 * 2**20)).hexdigest()}  runs.tar.gz\n")
    code, out, err = cli(capsys, "unpack", pack, "--runs", tmp_path / "next")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "runs.tar.gz.part00 is 17.0 MiB" in err and "at most 16 MiB" in err
    assert not (tmp_path / "next").exists()


def test_a_pack_larger_than_the_free_space_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "interrupted")
    pack = _pack(tmp_path, capsys, tmp_path / "runs")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    code, out, err = cli(capsys, "unpack", pack, "--runs", tmp_path / "next")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "0.00 MiB free" in err, err
    assert not (tmp_path / "next").exists()


def test_a_full_disk_leaves_no_pack_and_no_partial_run(tmp_path, capsys, monkeypatch):
    src = tmp_path / "runs"
    for name in ("a", "b"):
        fake_run(src, f"quick/clean/listops/{name}/seed0", "interrupted", ckpt=False)
    pack = _pack(tmp_path, capsys, src)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as mp:
        mp.setattr(tarfile, "copyfileobj", full)  # every file tar writes, packing or unpacking
        for argv in (["pack", src, "--out", tmp_path / "p2"], ["unpack", pack, "--runs", tmp_path / "new/runs"]):
            code, out, err = cli(capsys, *argv)
            assert code == 1 and len(err.splitlines()) == 1 and "No space left on device" in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack", "runs"]  # no pack, no runs root, no temporary

    moved, replace = [], os.replace  # the disk fills as the second run is put in place: the first is whole

    def filling(a, b):
        moved.append(b)
        if len([m for m in moved if "/b/" in str(m)]) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace(a, b)

    with monkeypatch.context() as mp:
        mp.setattr(os, "replace", filling)
        code, out, err = cli(capsys, "unpack", pack, "--runs", tmp_path / "next")
    assert code == 1 and len(err.splitlines()) == 1 and "quick/clean/listops/b/seed0" in err, err
    a, b = tmp_path / "next/quick/clean/listops/a/seed0", tmp_path / "next/quick/clean/listops/b/seed0"
    assert files(a) == {k: v for k, v in files(src / "quick/clean/listops/a/seed0").items() if k != ".lock"}
    assert not b.exists() and not list((tmp_path / "next").rglob("*carry*"))


@pytest.mark.parametrize(
    "damage, says",
    [
        ("trailing", "13 bytes of trailing data after the archive's end"),
        ("cut", "ends before its archive does (truncated)"),
        ("flipped", "is corrupt"),
    ],
)
def test_a_pack_that_matches_its_checksum_but_is_no_whole_archive_says_what_it_is(tmp_path, capsys, damage, says):
    fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "interrupted")
    pack = tmp_path / "pack"
    assert cli(capsys, "pack", tmp_path / "runs", "--out", pack)[0] == 0
    part = pack / "runs.tar.gz.part00"
    data = part.read_bytes()
    middle = len(data) // 2
    data = {
        "trailing": data + b"trailing junk",
        "cut": data[:middle],
        "flipped": data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :],
    }[damage]
    part.write_bytes(data)
    (pack / "runs.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  runs.tar.gz\n")  # made so
    code, out, err = cli(capsys, "unpack", pack, "--runs", tmp_path / "next")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "next").exists()


def test_a_packs_overrides_never_put_code_in_a_resume_line(tmp_path, capsys):
    """A pack is data: its runs arrive, but an override that names code to import (a callback whose nested
    _target_ is os.system, attn.target) or a config to load (a hydra search path, a flag, an interpolation), or
    holds an escape sequence, withholds that run's resume line, saying which override and why; a plain run's line
    is printed."""
    root = tmp_path / "runs"
    hostile = {
        "lambda": "+callbacks.x={_target_: lightning.pytorch.callbacks.LambdaCallback, "
        "on_fit_start: {_target_: os.system, _partial_: true}}",
        "external": "attn.target=os:system",
        "searchpath": "hydra.searchpath=[file:///tmp/evil]",
        "flag": "--config-dir=/tmp/evil",
        "interpolation": "data_root=${oc.env:HOME}",
        "nested": "+trainer.x.y={a: {b: [{_target_: os.system}]}}",
        "escape": "train.lr=1\x1b]0;pasted\x07",  # a terminal escape in a line to paste
    }
    for name, override in hostile.items():
        run = fake_run(root, f"quick/clean/listops/{name}/seed0", "interrupted", ckpt=False)
        (run / ".hydra" / "overrides.yaml").write_text(json.dumps(["task=listops", override]))  # JSON is YAML
    fake_run(root, "quick/clean/listops/plain/seed0", "interrupted", ckpt=False)
    code, out, err = cli(capsys, "unpack", _pack(tmp_path, capsys, root), "--runs", tmp_path / "next")
    assert code == 0 and err == "", err
    resume = [ln for ln in out.splitlines() if ln.startswith("resume: ")]
    assert len(resume) == 1 and "task=listops preset=quick" in resume[0]  # the plain run's
    for name, override in hostile.items():
        assert (tmp_path / "next" / f"quick/clean/listops/{name}/seed0/result.json").is_file()  # unpacked
        withheld = [ln for ln in out.splitlines() if ln.startswith(f"resume withheld for quick/clean/listops/{name}/")]
        assert len(withheld) == 1 and ascii(override)[:40] in withheld[0], (name, out)


def test_what_a_pack_says_of_its_runs_is_read_as_data(tmp_path, capsys):
    """A record nested too deep for json, a status with a terminal escape and a step count that is no number, a
    checkpoint whose step is no number: each run arrives and prints one plain line, never a traceback."""
    buf = io.BytesIO()
    torch.save({"global_step": "9" * 5000}, buf)
    run = "quick/clean/listops/{}/seed0/"
    _tar_pack(
        tmp_path / "pack",
        (run.format("deep") + "result.json", b"[" * 10000 + b"]" * 10000),
        (
            run.format("escape") + "result.json",
            json.dumps({"status": "interrupted\x1b[2J", "steps": "9" * 5000}).encode(),
        ),
        (run.format("step") + "result.json", b'{"status": "interrupted", "steps": 3}'),
        (run.format("step") + "checkpoints/last.ckpt", buf.getvalue()),
    )
    code, out, err = cli(capsys, "unpack", tmp_path / "pack", "--runs", tmp_path / "next")
    assert code == 0 and err == "" and "\x1b" not in out, err
    assert f"unpacked {run.format('deep')[:-1]}: unreadable, no last.ckpt" in out
    assert f"unpacked {run.format('escape')[:-1]}: unreadable, no last.ckpt" in out
    assert f"unpacked {run.format('step')[:-1]}: interrupted, a last.ckpt that holds no step" in out


# ----------------------------------------------------------------------------- export
def test_export_ships_only_the_small_files_under_the_device_and_the_collector_reads_them(tmp_path, capsys):
    root, to = tmp_path / "runs", tmp_path / "results"
    fake_run(root, "quick/clean/listops/softmax/seed0", "completed", device="NVIDIA H100 80GB HBM3")
    fake_run(root, "quick/clean/listops/performer/seed0", "stopped_early", device="cpu")
    fake_run(root, "quick/clean/listops/nystrom/seed0", "interrupted")
    code, out, err = cli(capsys, "export", root, "--to", to)
    assert code == 0, err
    assert sorted(files(to)) == sorted(
        f"{dev}/quick/clean/listops/{attn}/seed0/{name}"
        for dev, attn in (("nvidia-h100-80gb-hbm3", "softmax"), ("cpu", "performer"))
        for name in carry.SMALL
    )
    assert len([ln for ln in out.splitlines() if ln.startswith("exported ")]) == 2
    assert carry.device_slug(None) == "unknown-device"

    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.collect", "--runs", str(to), "--out", str(tmp_path / "tables")]
        + ["--no-plots", "--no-html", "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(tmp_path / "tables" / "runs.csv", newline="") as f:
        rows = {r["path"]: r for r in csv.DictReader(f)}
    assert set(rows) == {
        "nvidia-h100-80gb-hbm3/quick/clean/listops/softmax/seed0",
        "cpu/quick/clean/listops/performer/seed0",
    }
    assert all(r["usable"] == "True" and r["task"] == "listops" for r in rows.values())

    # again: identical files are left as they are; a file with other content refuses its run, not the others
    code, out, err = cli(capsys, "export", root, "--to", to)
    assert code == 0 and err == "" and "0 runs exported, 2 already there" in out
    log = to / "cpu/quick/clean/listops/performer/seed0/train.log"
    log.write_text("edited\n")
    (to / "nvidia-h100-80gb-hbm3/quick/clean/listops/softmax/seed0/metrics.csv").unlink()
    code, out, err = cli(capsys, "export", root, "--to", to)
    assert code == 1 and len(err.splitlines()) == 1 and "performer/seed0" in err and str(log) in err
    assert log.read_text() == "edited\n" and "exported quick/clean/listops/softmax/seed0" in out


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.carry", "pack", str(tmp_path / "missing"), "--out", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "missing" in proc.stderr and "Traceback" not in proc.stderr

    fake_run(tmp_path / "runs", "quick/clean/listops/a/seed0", "interrupted")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "nosum").mkdir()
    (tmp_path / "nosum" / "runs.tar.gz.part00").write_bytes(b"x")
    before = files(tmp_path)
    for argv, says in (
        (["pack", tmp_path / "runs", "--out", tmp_path / "full"], "not an empty folder"),
        (["pack", tmp_path / "runs", "--out", tmp_path / "p", "--part-mib", 17], "at most 16"),
        (["pack", tmp_path / "runs/quick/clean/listops/a/seed0", "--out", tmp_path / "p"], "is itself a run folder"),
        (["unpack", tmp_path / "nosum", "--runs", tmp_path / "next"], "runs.sha256"),
        (["export", tmp_path / "missing", "--to", tmp_path / "results"], "missing"),
        (["unpack", tmp_path / "nosum"], "--runs"),
    ):
        code, out, err = cli(capsys, *argv)
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err, (argv, err)
    assert files(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["full", "nosum", "runs"]


def test_the_next_window_sees_the_finished_runs_finished_and_is_told_to_resume_only_the_others(tmp_path, capsys):
    """A window that finished some runs and stopped others: on the next machine the sweep must skip the first
    (their records travel) and resume the second; the resume lines name only what is left to train."""
    root = tmp_path / "runs"
    fake_run(root, "quick/clean/listops/done/seed0", "completed")
    fake_run(root, "quick/clean/listops/stopped/seed0", "interrupted")
    assert cli(capsys, "pack", root, "--out", tmp_path / "pack")[0] == 0
    code, out, _ = cli(capsys, "unpack", tmp_path / "pack", "--runs", tmp_path / "next")
    assert code == 0
    done, stopped = (
        tmp_path / "next/quick/clean/listops/done/seed0",
        tmp_path / "next/quick/clean/listops/stopped/seed0",
    )
    assert json.loads((done / "result.json").read_text())["status"] == "completed"
    assert not list(done.rglob("*.ckpt"))  # a finished run travels without its checkpoints
    assert (stopped / "checkpoints" / "last.ckpt").is_file()
    resume = [ln for ln in out.splitlines() if ln.startswith("resume: ")]
    assert len(resume) == 1  # the stopped run; a finished one has nothing to resume


def test_export_names_this_machines_folders_by_their_variables_never_by_path(tmp_path, capsys):
    """results/ is published: a record's runs root and data root (a checkpoint path, the config) are this
    machine's, so the copy says $LRA_RUNS and $LRA_DATA; the source run keeps its own files as they were."""
    root = tmp_path / "runs"
    run = fake_run(root, "quick/clean/listops/done/seed0", "completed")
    rec = json.loads((run / "result.json").read_text())
    rec["best_ckpt"] = str(run / "checkpoints" / "best.ckpt")
    rec["config"]["data_root"] = str(tmp_path / "data")
    (run / "result.json").write_text(json.dumps(rec))
    (run / "train.log").write_text(f"loaded {tmp_path / 'data'}/listops; saved {run}/checkpoints/best.ckpt\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert cli(capsys, "export", root, "--to", tmp_path / "results")[0] == 0
    out = tmp_path / "results" / "cpu" / "quick/clean/listops/done/seed0"
    for f in ("result.json", "train.log"):
        assert str(tmp_path) not in (out / f).read_text(), f
    copy = json.loads((out / "result.json").read_text())
    assert copy["best_ckpt"] == "$LRA_RUNS/quick/clean/listops/done/seed0/checkpoints/best.ckpt"
    assert copy["config"]["data_root"] == "$LRA_DATA"
    assert (out / "train.log").read_text().startswith("loaded $LRA_DATA/listops; saved $LRA_RUNS/quick/")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # exporting again is a no-op, not a clash with the published copy
    code, printed, _ = cli(capsys, "export", root, "--to", tmp_path / "results")
    assert code == 0 and "0 runs exported, 1 already there" in printed


def test_export_replaces_a_local_folder_only_as_a_whole_path(tmp_path, capsys):
    """The runs root /x/runs is not /x/runs2, /x/runs.old nor /y/x/runs; a data root inside the runs root is
    $LRA_DATA (the longer path first); a record's data root of / replaces nothing."""
    root = tmp_path / "runs"
    run = fake_run(root, "quick/clean/listops/done/seed0", "completed")
    rec = json.loads((run / "result.json").read_text())
    rec["config"]["data_root"] = str(root / "data")
    (run / "result.json").write_text(json.dumps(rec))
    others = f"{root}2/a {root}.old/a /y{root}/a"
    (run / "train.log").write_text(f"loaded {root}/data/listops; saved {root}/a; runs_root={root} {others}\n")
    slash = fake_run(root, "quick/clean/listops/slash/seed0", "completed")
    rec["config"]["data_root"] = "/"
    (slash / "result.json").write_text(json.dumps(rec))
    assert cli(capsys, "export", root, "--to", tmp_path / "results")[0] == 0
    out = tmp_path / "results" / "cpu" / "quick/clean/listops"
    log = f"loaded $LRA_DATA/listops; saved $LRA_RUNS/a; runs_root=$LRA_RUNS {others}\n"
    assert (out / "done/seed0/train.log").read_text() == log
    assert json.loads((out / "done/seed0/result.json").read_text())["config"]["data_root"] == "$LRA_DATA"
    assert (out / "slash/seed0/train.log").read_text() == (slash / "train.log").read_text()
    assert json.loads((out / "slash/seed0/result.json").read_text())["config"]["data_root"] == "/"


REPO = Path(__file__).resolve().parent.parent
CARRIED = REPO / "carry" / "skeinformer_paper-listops-seed0"
PACK_COMMIT = "52039ac"  # whose history holds the latest window's pack (its README's restore command)


def _carried_pack(to: Path) -> Path:
    """The latest window's pack as its README restores it: the parts and their checksum from the history of
    PACK_COMMIT (a shallow clone without that commit skips the test: nothing to restore)."""
    rel = CARRIED.relative_to(REPO).as_posix()
    git = ["git", "-C", str(REPO)]
    names = subprocess.run([*git, "show", "--name-only", "--format=", PACK_COMMIT, "--", rel], capture_output=True)
    if names.returncode != 0:
        pytest.skip(f"this clone does not hold commit {PACK_COMMIT} (shallow?): the pack cannot be restored")
    to.mkdir()
    for name in [n for n in names.stdout.decode().split() if ".part" in n or n.endswith("runs.sha256")]:
        blob = subprocess.run([*git, "show", f"{PACK_COMMIT}:{name}"], capture_output=True, check=True).stdout
        (to / Path(name).name).write_bytes(blob)
    return to


def test_the_carried_pack_restores_its_runs_ready_to_resume(tmp_path, capsys):
    """The carried pack, restored as its README says in a fresh clone: it unpacks to the runs its README
    lists, each at the step the README says, and each checkpoint's resume key is the one this harness computes
    for that run today (its overrides, the memory fit's micro-batch, the generated data's fingerprint that the
    README names): the window's command continues them instead of refusing or starting over. A change to the
    config, the fit or the key that would strand them fails here, not on the next GPU."""
    from lra.config import load
    from lra.fit import plan
    from lra.protocol import read_checkpoint

    readme = (CARRIED / "README.md").read_text()
    rows = re.findall(r"^\| [^|]+ \| (\w+) \| (\d+) \|", readme, flags=re.M)
    finished = re.findall(r"^\| [^|]+ \| (\w+) \| finished \|", readme, flags=re.M)
    data = re.search(r"data fingerprint `([0-9a-f]{16})`", readme).group(1)
    assert len(rows) == 4 and finished == ["linformer"]
    code, out, _ = cli(capsys, "unpack", _carried_pack(tmp_path / "pack"), "--runs", tmp_path / "runs")
    assert code == 0 and "5 runs into" in out
    assert "unpacked skeinformer_paper/paper/listops/linformer/seed0: stopped_early, finished" in out
    for attn, step in rows:
        rel = f"skeinformer_paper/paper/listops/{attn}/seed0"
        run = tmp_path / "runs" / rel
        assert f"unpacked {rel}: interrupted, last.ckpt at step {step}" in out
        saved = read_checkpoint(run / "checkpoints" / "last.ckpt")
        overrides = [ln[2:] for ln in (run / ".hydra" / "overrides.yaml").read_text().splitlines()]
        # as on the GPU they go back to: the precision it resolves (16-mixed) is in the key
        spec = load([*overrides, f"runs_root={tmp_path / 'runs'}", "trainer.accelerator=gpu"], run_dir=run)
        p = plan(spec)
        assert saved["global_step"] == int(step)
        assert spec.resume_key(p.micro_batch, p.accum_steps, data) == saved["resume_key"], attn
