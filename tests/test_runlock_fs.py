"""The run lock on shared file systems: a file system without flock (Lustre without -o flock) is one line saying
what to do, before the run starts, not a traceback; LRA_RUN_LOCK=off runs without the lock, and says so."""

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys

import pytest

import lra.runlock as runlock
from lra.tools.sweep import jobs
from tests.helpers import TINY, run_env

NO_FLOCK = """import errno, fcntl
def _no_flock(fd, op):
    raise OSError(errno.ENOLCK, "No locks available")
fcntl.flock = _no_flock
"""


@pytest.mark.slow  # a whole lra.train start-up; the checks themselves are tested in-process below
def test_a_file_system_without_flock_is_one_line_saying_what_to_do(tmp_path):
    """lra.train on a runs root whose file system refuses flock (here: flock made to fail as Lustre's does)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_FLOCK)
    env = run_env(tmp_path)
    env["PYTHONPATH"] = f"{site}:{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-m", "lra.train", *TINY], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    (line,) = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "does not support flock" in ln]
    assert "LRA_RUNS" in line and "LRA_RUN_LOCK=off" in line
    assert not list((tmp_path / "runs").rglob("*"))  # refused before the run's folder was made


def test_run_lock_off_lets_two_holders_in_and_warns(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(runlock.LOCK_ENV, "off")
    with runlock.hold(tmp_path / "run"), runlock.hold(tmp_path / "run"):
        pass
    assert "is not locked" in caplog.text


def test_a_run_on_a_file_system_without_flock_is_refused_before_its_folder_exists(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    with pytest.raises(runlock.LockUnsupported, match="LRA_RUN_LOCK=off"):
        runlock.check_lockable(tmp_path / "runs" / "quick" / "seed0")
    assert not list(tmp_path.iterdir())  # its probe file removed, no folder made
    monkeypatch.setenv(runlock.LOCK_ENV, "off")
    runlock.check_lockable(tmp_path / "runs")


def test_holders_of_a_folder_on_a_file_system_without_flock_are_unknown_not_a_crash(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text('{"pid": 1, "host": "x"}')

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    assert runlock.holder_pid(tmp_path / "run") is None
    with pytest.raises(runlock.LockUnsupported, match="does not support flock"):
        with runlock.hold(tmp_path / "other"):
            pass


def test_removing_the_lock_file_under_a_live_run_does_not_let_a_second_command_in(tmp_path):
    """``rm <run>/.lock`` while a run holds the folder (a clean-up after a crash): the same command again must be
    refused, as it is with the file in place (its flock was on the removed inode: both ran, one metrics.csv)."""
    run = tmp_path / "run"
    with runlock.hold(run):
        (run / ".lock").unlink()
        with pytest.raises(runlock.RunLocked, match="is in use by"):
            with runlock.hold(run):
                pytest.fail("a second holder got into a held run folder")
    with runlock.hold(run) as me:  # released when its holder ends: the next command runs
        assert runlock.holder_pid(run) == me["pid"]


def test_a_folder_that_cannot_be_locked_still_locks_its_lock_file(tmp_path, monkeypatch):
    """Where folders cannot be flocked (NFS locks regular files only), ``.lock`` alone refuses a second holder."""
    real = runlock.fcntl.flock

    def files_only(fd, op):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(runlock.fcntl, "flock", files_only)
    with runlock.hold(tmp_path / "run"):
        with pytest.raises(runlock.RunLocked):
            with runlock.hold(tmp_path / "run"):
                pass


def _held(run, content: str) -> int:
    """``run/.lock`` locked as a live run holds it (another open file: flock sees another holder), with ``content``."""
    run.mkdir(exist_ok=True)
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, content.encode())
    return fd


def test_a_lock_held_from_another_host_is_never_a_local_pid(tmp_path):
    """Where flock holds across nodes (NFS v4, Lustre -o flock), a run another node holds names a pid of that node:
    running (never resumed or packed here), never signalled here, and said as held by <pid> on <host>."""
    run = tmp_path / "run"
    fd = _held(run, json.dumps({"pid": os.getpid(), "host": "node-b", "started": "2024-05-01T10:00:00"}))
    try:
        assert jobs.run_status(run)[0] == "running"
        assert runlock.holder_pid(run) is None
        with pytest.raises(runlock.RunLocked, match=f"in use by pid {os.getpid()} on node-b since"):
            with runlock.hold(run):
                pytest.fail("a second holder got into a held run folder")
    finally:
        os.close(fd)
    assert jobs.run_status(run)[0] == "pending" and runlock.holder_pid(run) is None  # released: free


def test_a_lock_that_does_not_parse_is_held_by_an_unknown_process_never_free(tmp_path):
    """A .lock whose holder wrote over a longer, older content without truncating it no longer parses: the folder is
    held all the same (by a process it does not name), never free to resume or pack. A holder writes it whole."""
    run, here = tmp_path / "run", socket.gethostname()
    for content in (
        '{"pid": 12, "host": "h"}ost-b", "started": "then"}',
        "",
        "[1]",
        json.dumps({"pid": -1, "host": here}),
        json.dumps({"pid": 0, "host": here}),
    ):
        fd = _held(run, content)
        try:
            assert jobs.run_status(run)[0] == "running", content
            assert runlock.holder_pid(run) is None, content
            with pytest.raises(runlock.RunLocked, match="in use by another process"):
                with runlock.hold(run):
                    pytest.fail("a second holder got into a held run folder")
        finally:
            os.close(fd)
    (run / ".lock").write_text(json.dumps({"pid": 1, "host": "a-longer-host-name-than-this-one" * 4}))
    with runlock.hold(run) as me:
        assert json.loads((run / ".lock").read_text())["pid"] == runlock.holder_pid(run) == me["pid"]
        (run / ".lock").unlink()  # removed under a live run (a clean-up after a crash): its folder is still held
        assert jobs.run_status(run)[0] == "running"
