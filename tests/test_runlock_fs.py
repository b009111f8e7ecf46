"""The run lock on shared file systems: a file system without flock (Lustre without -o flock) is one line saying
what to do, before the run starts, not a traceback; LRA_RUN_LOCK=off runs without the lock, and says so."""

import errno
import os
import subprocess
import sys

import pytest

import lra.runlock as runlock
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
