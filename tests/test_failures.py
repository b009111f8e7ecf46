"""Never lose a run: SIGTERM/SIGINT to the whole process group (loader workers included) ends a run as
``interrupted`` and the same command resumes it to the uninterrupted record; a run folder has one
owner; damaged records and checkpoints, disk full and unwritable roots are one-line errors."""

import csv
import errno
import json
import os
import signal
import sys
import time

import pytest
import torch

from lra.config import ConfigError, load
from tests.helpers import TINY, record, run_train, start_train, train_here
from tests.test_resume import CLOSE, RESUME, SAME


def _popen(tmp_path, runs, *extra):
    # a session of its own: the signal goes to the whole process group, as timeout/SLURM/Kubernetes send it
    return start_train(tmp_path, *RESUME, *extra, runs=runs, start_new_session=True)


def _finish(proc):
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def _signal_group_at_checkpoint(tmp_path, runs, proc, sig, min_step=9):
    deadline, step = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None and step is None:
        last = next((tmp_path / runs).rglob("last.ckpt"), None) if (tmp_path / runs).exists() else None
        try:
            s = torch.load(last, map_location="cpu", weights_only=False)["global_step"] if last else None
        except Exception:  # being replaced right now
            s = None
        if s is not None and s >= min_step:
            step = s
            os.killpg(proc.pid, sig)
        time.sleep(0.05)
    rc, out = _finish(proc)
    assert step is not None, f"no checkpoint at step >= {min_step}:\n{out[-3000:]}"
    return rc, out


@pytest.mark.parametrize("workers", [2, pytest.param(0, marks=pytest.mark.slow)])
def test_sigterm_to_process_group_then_rerun_matches_uninterrupted(tmp_path, workers):
    extra = [f"trainer.num_workers={workers}"]
    ref = _popen(tmp_path, "ref", *extra)
    rc, out = _signal_group_at_checkpoint(tmp_path, "runs", _popen(tmp_path, "runs", *extra), signal.SIGTERM)
    assert rc == 143, out[-3000:]
    assert "killed by signal" not in out and "Traceback" not in out
    stopped = record(tmp_path / "runs")
    assert stopped["status"] == "interrupted" and stopped["reason"].startswith("SIGTERM")
    assert not list((tmp_path / "runs").rglob("*.tmp"))
    rc, out = _finish(_popen(tmp_path, "runs", *extra))
    assert rc == 0 and "resuming from" in out, out[-3000:]
    rc, out = _finish(ref)
    assert rc == 0, out[-3000:]
    resumed, reference = record(tmp_path / "runs"), record(tmp_path / "ref")
    for k in SAME:
        assert resumed[k] == reference[k], (k, resumed[k], reference[k])
    for k in CLOSE:
        assert resumed[k] == reference[k], (k, resumed[k], reference[k])  # exact: same RNG streams, same data


@pytest.mark.slow  # the SIGTERM test above compares 2 workers with an uninterrupted run in the main suite
def test_worker_count_does_not_change_the_run(tmp_path):
    """Every loader has its own generator: 0 and 2 workers draw the same dropout and give one record."""
    runs = {}
    for w in (0, 2):
        run_train(tmp_path, *TINY, "trainer.progress=false", f"trainer.num_workers={w}", runs=f"w{w}")
        runs[w] = record(tmp_path / f"w{w}")
    for k in ("test_acc", "test_loss", "best_val_acc", "steps", "steps_to_best"):
        assert runs[0][k] == runs[2][k], k


@pytest.mark.slow  # 20-30 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_sigint_to_process_group_is_interrupted_130(tmp_path):
    rc, out = _signal_group_at_checkpoint(
        tmp_path, "runs", _popen(tmp_path, "runs", "trainer.num_workers=2"), signal.SIGINT
    )
    assert rc == 130 and "Traceback" not in out, out[-3000:]
    assert record(tmp_path / "runs")["status"] == "interrupted"
    # the console says so, and the command that resumes it (without the harness's own run_tag)
    assert "interrupted (SIGINT)" in out and "resume with the same command: python -m lra.train preset=quick" in out
    assert "run_tag" not in out.split("resume with the same command:")[1].splitlines()[0]


@pytest.mark.slow  # 30-50 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_two_commands_on_one_run_folder_one_runs_one_is_refused(tmp_path):
    log = open(tmp_path / "first.log", "w")  # not a pipe: nobody reads it while the second command runs
    first = start_train(tmp_path, *RESUME, "train.max_steps=150", "train.patience=null", stdout=log)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "runs").rglob("last.ckpt")):  # training, lock held
        time.sleep(0.05)
    second = run_train(tmp_path, *RESUME, "train.max_steps=150", "train.patience=null", check=False)
    assert second.returncode == 75, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"pid {first.pid}" in second.stdout + second.stderr and "in use by" in second.stdout + second.stderr
    assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    log.close()
    with open(next((tmp_path / "runs").rglob("metrics.csv")), newline="") as f:
        rows = [tuple(r.items()) for r in csv.DictReader(f)]
    assert len(rows) == len(set(rows)) and rows
    # the lock does not outlive its holder: the same command now reports the finished run
    again = run_train(tmp_path, *RESUME, "train.max_steps=150", "train.patience=null", check=False)
    assert again.returncode == 0 and "already holds a finished run" in again.stdout + again.stderr


def test_disk_full_leaves_a_record_or_the_previous_one_and_no_temporary_files(tmp_path, monkeypatch):
    import lightning.pytorch.trainer.trainer as trainer_mod

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer_mod.Trainer, "save_checkpoint", full)
    tiny = (tmp_path, *TINY, "trainer.progress=false", "train.eval_every=4")
    with pytest.raises(OSError):
        train_here(*tiny, run_dir=tmp_path / "run")
    rec = json.loads((tmp_path / "run" / "result.json").read_text())
    assert rec["status"] == "failed" and "No space left" in rec["reason"]
    assert not list((tmp_path / "run").rglob("*.tmp"))
    # when the record cannot be written either, the previous one stays as it was
    import lra.files

    before = (tmp_path / "run" / "result.json").read_bytes()
    monkeypatch.setattr(lra.files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError):
        train_here(*tiny, "force=true", run_dir=tmp_path / "run")
    assert (tmp_path / "run" / "result.json").read_bytes() == before
    assert not list((tmp_path / "run").rglob("*.tmp"))


@pytest.mark.slow  # 30-50 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_damaged_record_and_checkpoint_are_one_line_errors(tmp_path, quick_run):
    def cli(*extra):
        return quick_run("trainer.progress=false", "train.max_steps=40", "train.eval_every=5", *extra, check=False)

    assert cli().returncode == 0
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    (run_dir / "result.json").write_text('{"status": "compl')
    bad = cli()
    out = bad.stdout + bad.stderr
    assert bad.returncode == 2 and "result.json is not a readable run record" in out and "Traceback" not in out
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
    (run_dir / "result.json").write_text('{"status": "interrupted"}')
    bad = cli()
    out = bad.stdout + bad.stderr
    assert bad.returncode == 2 and "last.ckpt cannot be read" in out and "force=true" in out
    assert "Traceback" not in out
    ok = cli("force=true")
    assert ok.returncode == 0 and json.loads((run_dir / "result.json").read_text())["status"] == "completed"


def test_unwritable_runs_root_is_one_line_before_anything(tmp_path, quick_run):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    bad = quick_run("trainer.progress=false", f"runs_root={blocker}/runs", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: runs_root=")
    assert len(bad.stderr.strip().splitlines()) == 1 and blocker.read_text() == "not a folder"


def test_best_checkpoint_compares_scores_across_devices(monkeypatch):
    """A score restored from a checkpoint lives on the CPU and a new one on the GPU: comparing them must
    not need one device (the CUDA resume crash was torch.equal across devices)."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from lra.protocol import BestCheckpoint

    def no_cross_device(a, b):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(torch, "equal", no_cross_device)
    scores = iter([torch.tensor(0.5), torch.tensor(0.7)])

    def fake_update(self, trainer, pl_module):  # what ModelCheckpoint does: a new best score
        self.best_model_score = next(scores)

    monkeypatch.setattr(ModelCheckpoint, "on_validation_end", fake_update)
    best = BestCheckpoint(monitor="val/acc", mode="max")
    best.best_model_score = torch.tensor(0.5, dtype=torch.float64)  # as restored (CPU, another dtype)
    best.on_validation_end(SimpleNamespace(global_step=10), None)
    assert best.best_step is None  # same score: not a new best
    best.on_validation_end(SimpleNamespace(global_step=20), None)
    assert best.best_step == 20


def test_changed_data_is_refused_not_resumed(tmp_path):
    """The resume key holds a fingerprint of the data: a checkpoint never continues on other arrays
    (before, a smaller train split made the restored loader position unreachable: a hang)."""
    from lra.train import RunError, resume_step

    spec = load(["preset=quick"])
    key = spec.resume_key(32, 1, "fingerprint-of-the-old-data")
    assert key != spec.resume_key(32, 1, "fingerprint-of-the-new-data")
    assert key == spec.resume_key(32, 1, "fingerprint-of-the-old-data")
    torch.save({"resume_key": key, "global_step": 7}, tmp_path / "last.ckpt")
    assert resume_step(tmp_path / "last.ckpt", key) == 7
    with pytest.raises(RunError, match="another configuration, data or micro-batch"):
        resume_step(tmp_path / "last.ckpt", spec.resume_key(32, 1, "fingerprint-of-the-new-data"))


def test_worker_hides_only_the_fd_servers_hangup(capsys):
    """multiprocessing.resource_sharer reports a main process that hung up mid-fetch (it is stopping)
    through sys.excepthook; loader workers keep that quiet and print every other error."""
    from lra.data.module import _quiet_hangup

    ns: dict = {}
    exec(
        compile(
            "def serve():\n    raise ConnectionResetError('reset by peer')\n",
            "/py/multiprocessing/resource_sharer.py",
            "exec",
        ),
        ns,
    )
    for fail in (ns["serve"], lambda: 1 / 0):
        try:
            fail()
        except Exception:
            _quiet_hangup(*sys.exc_info())
    err = capsys.readouterr().err
    assert "reset by peer" not in err and "ZeroDivisionError" in err


# ----------------------------------------------------------------------------- issue 32: one line, before any work
LONG = "/".join(["x" * 200] * 25)  # a 5,000-character path


@pytest.mark.parametrize(
    "case, override, expected",
    [
        ("devices 0", "trainer.devices=0", "trainer.devices=0 is not allowed: a count >= 1"),
        ("gpu without one", "trainer.accelerator=gpu", "trainer.accelerator=gpu but this machine has no CUDA GPU"),
        ("data root a file", None, "is a file, not a folder: set LRA_DATA"),
        ("runs root too long", None, "is too long (5"),
        ("data root too long", None, "is too long (5"),
        ("checkpoints a file", None, "checkpoints is a file, not a folder: move it aside"),
        ("result.json a folder", None, "result.json is a folder, not a file: move it aside"),
    ],
)
def test_user_errors_about_devices_and_places_are_one_line_before_any_work(
    tmp_path, monkeypatch, case, override, expected
):
    """Each used to start work (data generated, the batch fitted, even 150 steps trained) and end in a
    Lightning or OS traceback. lra.train's checks, in-process: a ConfigError (main prints it as one line,
    exit 2) before the data is read; nothing the user owns is changed."""
    import lra.train as train

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # this machine has no GPU, whatever it has
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def reached(*a, **k):
        raise AssertionError("the data was read: the check came too late")

    monkeypatch.setattr(train, "checked_splits", reached)
    runs, data, run_dir = tmp_path / "runs", tmp_path / "data", tmp_path / "runs" / "run"
    if case == "data root a file":
        data.write_text("mine")
    if case == "runs root too long":
        runs = tmp_path / LONG
    if case == "data root too long":
        data = tmp_path / LONG
    if case == "checkpoints a file":
        run_dir.mkdir(parents=True)
        (run_dir / "checkpoints").write_text("mine")
    if case == "result.json a folder":
        (run_dir / "result.json").mkdir(parents=True)
    monkeypatch.setenv("LRA_RUNS", str(runs))
    monkeypatch.setenv("LRA_DATA", str(data))
    args = [
        "task=listops",
        "attn=softmax",
        "preset=quick",
        f"hydra.run.dir={run_dir}",
        *([override] if override else []),
    ]
    with pytest.raises(ConfigError) as e:
        train.check_before_run(args)
    assert expected in str(e.value) and "\n" not in str(e.value)
    assert len(str(e.value)) < 400  # a 5,000-character path is shortened
    if case == "data root a file":
        assert data.read_text() == "mine"
    if case == "checkpoints a file":
        assert (run_dir / "checkpoints").read_text() == "mine"


def test_devices_the_machine_lacks_are_refused_and_what_lightning_accepts_is_not():
    from lra.devices import check_devices

    for accelerator, devices, gpus in [
        ("cpu", 0, 0),
        ("auto", "0", 0),
        ("cpu", [], 0),
        ("cpu", True, 0),
        ("gpu", 1, 0),
        ("cuda", "auto", 0),
        ("gpu", 2, 1),
        ("gpu", [0, 3], 2),
        ("auto", 2, 1),
        ("gpu", "0,0", 2),
    ]:
        with pytest.raises(ConfigError):
            check_devices(accelerator, devices, cuda_count=gpus, mps=False)
    for accelerator, devices, gpus in [
        ("cpu", 1, 0),
        ("auto", 1, 0),
        ("auto", 2, 0),  # two CPU processes
        ("cpu", -1, 0),
        ("auto", "auto", 0),
        ("gpu", -1, 1),
        ("gpu", [1], 2),
        ("cuda", "0,1", 2),
        ("gpu", "2", 2),
    ]:
        check_devices(accelerator, devices, cuda_count=gpus, mps=False)
