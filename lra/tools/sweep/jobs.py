"""One job of a sweep (the Hydra task function that runs ``python -m lra.train`` in a child process), and whether a
run folder's job is alive, finished or interrupted."""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import functools
import json
import logging
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from omegaconf import DictConfig

from lra import REPO_ROOT
from lra.devices import MEMORY_LIMIT_ENV
from lra.files import write_json
from lra.record import Record, read_record
from lra.runlock import LOCK_ENV, holder, holder_pid
from lra.tools.sweep.base import FINISHED, MARKER, STOP_GRACE_S, STOP_WAIT_S, BudgetReached
from lra.tools.sweep.grid import quote
from lra.tools.sweep.share import (
    describe,
    device_total_gib,
    gpu_of_slot,
    hw_of,
    job_share,
    not_reported,
    visible_gpus,
)

log = logging.getLogger("lra.tools.sweep")
END_ENV = "LRA_SWEEP_END"  # a budget's end (time.time()) that a job keeps whether or not its driver lives
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache  # looked up on the first job, not at import: a command's --help loads no library
def _prctl():
    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


# ----------------------------------------------------------------------------- one job (runs in the job)
def run_job(cfg: DictConfig) -> float | None:
    """Hydra task function of a sweep job: ``python -m lra.train <the job's overrides>`` in the job's
    run folder, in a child process (so Lightning's DDP launcher sees a single run and a crash never
    takes the sweep down). Leaves ``.sweep_job.json`` (host, pid, attempts) in the folder and returns
    the run's best validation accuracy, the objective of searches."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    rank0 = os.environ.get("SLURM_PROCID", "0") == "0"
    marker = run_dir / MARKER
    info = read_json(marker) or {}
    name = str(hc.job.override_dirname)
    tag = cfg.get("run_tag")
    if tag is not None and info.get("run_tag") not in (None, tag):  # run_tag names the folder: never happens
        raise RuntimeError(f"run folder collision: {run_dir} holds a run of [{info['run_tag']}], this job is [{tag}]")
    if rank0:
        info.update(
            attempts=(count(info.get("attempts")) or 0) + 1,
            host=socket.gethostname(),
            pid=os.getpid(),
            slurm_job=_slurm_job_id(),
            started=now_iso(),
            t_start=time.time(),
            finished=None,
            t_end=None,
            returncode=None,
            run_pid=None,  # the last attempt's, until this one's starts: never a pid to stop
            overrides=overrides,
            override_dirname=name,
            run_tag=tag,
        )
        write_json(marker, info)
    env = dict(os.environ)
    extra = assign_gpus(env, int(hc.job.get("num") or 0), cfg)
    given = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in {e.split("=", 1)[0] for e in extra}]
    cmd = [sys.executable, "-m", "lra.train", *given, *extra, f"hydra.run.dir={quote(run_dir)}"]
    log.info("%s", " ".join(shlex.quote(c) for c in cmd))
    ctrl_c_for_the_run()
    proc = start_run(cmd, env=env, cwd=str(hc.runtime.cwd or REPO_ROOT))
    if rank0:  # a run still starting holds no lock yet: stop_jobs finds it by this pid
        info.update(run_pid=proc.pid)
        write_json(marker, info)
    try:
        rc = wait_run(proc)
    finally:
        if rank0:
            info.update(finished=now_iso(), t_end=time.time(), returncode=proc.poll())
            write_json(marker, info)
    rec = read_record(run_dir) or Record()
    if rc != 0 or rec.get("status") not in FINISHED:
        raise RuntimeError(
            f"lra.train exited {rc}, status {rec.get('status')!r}: {rec.get('reason')} "
            f"(log: {run_dir / 'train.log'})"
        )
    return rec.get("best_val_acc")


def start_run(cmd: list[str], **popen) -> subprocess.Popen:
    """``cmd`` started as this process's run: on Linux the kernel sends it SIGTERM when the thread that started it
    ends, so a driver (or job) killed with SIGKILL leaves no run training on without its budget: it writes its
    ``interrupted`` record and keeps its last checkpoint, as at the budget."""
    prctl = _prctl()
    return subprocess.Popen(
        cmd, preexec_fn=functools.partial(_stop_with, os.getpid(), prctl) if prctl else None, **popen
    )


def _stop_with(parent: int, prctl) -> None:
    """A child's preexec_fn: SIGTERM when its parent ends; ended now if that was before this call."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


def wait_run(proc: subprocess.Popen) -> int:
    """lra.train's exit code. Interrupted (Ctrl-C, a scheduler's signal, the driver's budget) or at the budget's end
    this job keeps (``LRA_SWEEP_END``: its driver may be gone), it gets SIGTERM to write its ``interrupted`` record,
    then SIGKILL."""
    end = os.environ.get(END_ENV)
    try:
        try:
            return proc.wait(None if not end else max(float(end) - time.time(), 0.01))
        except subprocess.TimeoutExpired:
            raise BudgetReached from None
    except BaseException as e:
        budget = isinstance(e, BudgetReached)  # the driver's own clock told nobody else, and its end is bounded
        with contextlib.suppress(Exception):
            proc.wait(timeout=0 if budget else 5)  # a Ctrl-C reached it too
        with contextlib.suppress(Exception):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=STOP_WAIT_S if budget else 60)
        if proc.poll() is None:
            proc.kill()
        raise


def ctrl_c_for_the_run() -> None:
    """A local launcher's job starts with SIGINT blocked (:func:`ctrl_c_to_the_driver`). Its lra.train
    must still get a Ctrl-C to write its ``interrupted`` record: unblock it, with a do-nothing handler
    here (a handler is reset to the default in an exec'd child; this process just waits for lra.train
    and reports how it ended)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or threading.current_thread() is not threading.main_thread():
        return  # the basic launcher runs jobs in the driver: its Ctrl-C handling is the driver's
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def ctrl_c_to_the_driver(on: bool):
    """The local launcher starts a submitit controller per job, a child of the driver in the terminal's
    process group: a Ctrl-C would end each with a KeyboardInterrupt traceback on the sweep's console.
    Started while this thread blocks SIGINT, they keep it blocked (a blocked signal stays blocked across
    fork and exec; lra.train gets it back in :func:`ctrl_c_for_the_run`). The driver still gets it: the
    kernel hands it to a thread that does not block it (the :class:`GridWatch` thread, started before),
    and Python runs the handler in this thread at its next poll (submitit polls every second)."""
    if not on or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def assign_gpus(env: dict, job_num: int, cfg: DictConfig) -> list[str]:
    """Parallel local jobs on a multi-GPU box: job k of a batch gets its own slice of the visible GPUs;
    with jobs_per_gpu=k (LRA_SWEEP_JOBS_PER_GPU) slot s gets GPU s // k and its share of the memory: the
    profile's fit kept where the profile is smaller than the card, else 1/k of it (lra/tools/sweep/share.py;
    the returned overrides for lra.train, and the allocator limit in LRA_MEMORY_LIMIT_GIB)."""
    parallel = int(env.get("LRA_SWEEP_PARALLEL") or 1)
    if env.get("LRA_SWEEP_JOBS_PER_GPU"):
        k = int(env["LRA_SWEEP_JOBS_PER_GPU"])
        # the driver's list: submitit_local would hand every job GPUs 0..n-1 whatever the driver's mask
        gpus = [d for d in env.get("LRA_SWEEP_GPUS", "").split(",") if d.strip()] or visible_gpus(env)
        gpu = gpu_of_slot(job_num % parallel, k, gpus)
        hw = hw_of(cfg)
        share = job_share(hw, k, gpu, total_of=lambda g: device_total_gib(g, env))
        if share is None:
            raise not_reported(gpu, hw, k)
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env[MEMORY_LIMIT_ENV] = f"{share['limit_gib']:.6f}"
        log.info(
            "GPU %s shared by up to %d runs, %s mode (%s): hardware.total_gib=%s (fit budget %.2f GiB), "
            "allocator limit %.2f GiB",
            gpu,
            k,
            share["mode"],
            describe(share, k),
            share["total_gib"],
            share["budget_gib"],
            share["limit_gib"],
        )
        return [f"hardware.total_gib={share['total_gib']}"]
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    per_job = cfg.trainer.devices if isinstance(cfg.trainer.devices, int) and cfg.trainer.devices > 0 else 1
    if parallel > 1 and env.get("SUBMITIT_EXECUTOR") == "local" and len(visible) >= parallel * per_job:
        slot = job_num % parallel
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[slot * per_job : (slot + 1) * per_job])
    return []


def _slurm_job_id() -> str | None:
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return os.environ.get("SLURM_JOB_ID")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_json(path: Path, kind: type = dict):
    """The JSON ``kind`` (an object: a dict) in ``path``; None if it is missing, not JSON or not a ``kind``."""
    try:
        got = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, kind) else None


def number(x, above_zero: bool = False) -> float | None:
    """``x`` if it is a finite number, not below zero (above it with ``above_zero``), else None: a figure read from a
    runs folder (a record, a marker, the rates' cache, a checkpoint) is data, and may be damaged or hand-edited."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok and (x > 0 if above_zero else x >= 0) else None


def count(x) -> int | None:
    """``x`` if it is a whole number not below zero (a step, an attempt, a pid), else None (see :func:`number`)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def alive(info: dict | None) -> bool:
    """Is the job that wrote this marker still running (same host: its pid; SLURM: squeue)?"""
    if not info or info.get("finished"):
        return False
    if info.get("slurm_job"):
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", str(info["slurm_job"])], capture_output=True, text=True, timeout=30
            )
            return out.returncode == 0 and bool(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            return False
    if info.get("host") != socket.gethostname():
        return False
    return _alive_pid(info.get("pid"))


def stop_jobs(
    run_dirs: list[Path],
    signum: int,
    grace_s: float | None = None,
    wait_s: float = 60.0,
    poll_s: float = 0.2,
    kill: bool = False,
) -> list[int]:
    """After the driver was interrupted: give the runs still holding their folders ``grace_s`` to end by
    themselves (a Ctrl-C, ``timeout`` or a scheduler signals the whole process group: each lra.train
    writes its ``interrupted`` record), then send ``signum`` to those still there (the driver alone was
    signalled) and wait up to ``wait_s``; with ``kill``, SIGKILL what is still there (runs and their job
    processes: a record left ``running`` reads as interrupted). Returns the pids signalled. Runs on other
    hosts (SLURM) are left to the scheduler; a second signal to a run busy writing its record is what the
    grace avoids."""
    run_dirs = [Path(d) for d in run_dirs if d is not None]
    grace_s = STOP_GRACE_S if grace_s is None else grace_s

    def holders() -> dict[Path, int]:
        """Each run's process: the lock's holder, or (a run still starting, no lock yet) the pid its job wrote."""
        out = {}
        for d in run_dirs:
            pid = holder_pid(d)
            if pid is None:
                info = read_json(d / MARKER)
                if _job_here(info) and _alive_pid(info.get("run_pid")):
                    pid = info["run_pid"]
            if pid is not None:
                out[d] = pid
        return out

    def busy() -> bool:  # a run, or the job process around it that has yet to mark its folder finished
        return bool(holders()) or any(_job_here(read_json(d / MARKER)) for d in run_dirs)

    deadline = time.monotonic() + grace_s
    while busy() and time.monotonic() < deadline:
        time.sleep(poll_s)
    sent = []
    for d, pid in holders().items():
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
            sent.append(pid)
            log.info("stopping %s (pid %d) with %s", d, pid, signal.Signals(signum).name)
    deadline = time.monotonic() + wait_s
    while busy() and time.monotonic() < deadline:
        time.sleep(poll_s)
    if kill and busy():
        jobs = [i["pid"] for d in run_dirs if _job_here(i := read_json(d / MARKER))]
        for pid in [*holders().values(), *(p for p in jobs if p != os.getpid())]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                log.warning("pid %d did not stop within %.0f s: killed", pid, wait_s)
        deadline = time.monotonic() + 2.0  # the kernel reaps them: the folders' status is read next
        while bool(holders()) and time.monotonic() < deadline:
            time.sleep(poll_s)
    return sent


def _alive_pid(pid) -> bool:
    """Is ``pid`` a live process here (0, -1 and what is no whole number are none: os.kill(-1) signals them all)?"""
    if not count(pid):
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _job_here(info: dict | None) -> bool:
    """A job process on this host that has not marked its folder finished (SLURM jobs: not waited for)."""
    return bool(info) and not info.get("finished") and not info.get("slurm_job") and alive(info)


def carried(run_dir: Path) -> bool:
    """Does ``python -m lra.tools.carry pack`` take this run folder: a record that is not finished (or does not
    read), or none but a ``checkpoints/last.ckpt``. A run stopped before both has nothing to resume."""
    try:
        rec = read_record(run_dir)
    except (OSError, ValueError):
        return True
    return (Path(run_dir) / "checkpoints" / "last.ckpt").is_file() if rec is None else rec.get("status") not in FINISHED


def run_status(run_dir: Path) -> tuple[str, dict]:
    """(status, record or {}) of a run folder. A folder an lra.train holds (:func:`lra.runlock.hold`) on
    this host is running. A record saying ``running`` was written by an lra.train that held the lock: on
    this host, with nobody holding it now, that run is gone (killed) and the folder is ``interrupted``
    (resumable), whatever process now has the pid its job's marker names; only a new attempt still
    starting (its marker newer than the record) runs."""
    try:
        rec = (read_record(run_dir) or Record()).to_json()  # the manifest's rows read it as a dict
    except (ValueError, OSError):  # not JSON, or a result.json that is a folder
        rec = {"status": "unreadable"}
    if rec.get("status") in FINISHED:
        return rec["status"], rec
    info = read_json(run_dir / MARKER)
    if holder(run_dir) is not None or (alive(info) and not _run_gone(run_dir, rec, info)):
        return "running", rec  # a process holds the folder (here or from another node), or its job runs
    if rec.get("status") and rec["status"] != "running":  # "running" with nobody on it: killed
        return rec["status"], rec
    if (run_dir / MARKER).exists() or (run_dir / "checkpoints").exists():
        return "interrupted", rec
    return "pending", rec


def _run_gone(run_dir: Path, rec: dict, info: dict) -> bool:
    """A ``running`` record whose writer no longer holds the folder's lock (asked before), on this host (the
    lock is known here only), and no newer attempt starting (its job's marker written after the record)."""
    if rec.get("status") != "running" or info.get("slurm_job") or os.environ.get(LOCK_ENV, "").lower() == "off":
        return False
    try:
        written = (Path(run_dir) / "result.json").stat().st_mtime
    except OSError:
        return False
    return (number(info.get("t_start")) or 0) <= written
