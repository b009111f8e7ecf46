"""What a sweep's jobs will cost on this device before they run, and which of them a time budget can finish.

A job's time is ``fixed + steps left x step + evaluations left x evaluation``: ``fixed`` is everything that
is not a training step or a validation (start-up, data, the memory fit, compilation, the test, the
record), and early stopping makes the whole an upper bound (the protocol's ``max_steps`` is what the run
may take). The three rates of a kind of job (the job's overrides less its seed: seeds cost alike) come
from, best first:

1. the job's own folder, when an earlier window trained part of it (its record's steps and times);
2. a finished run of the same kind on this device, launched by a sweep (its ``.sweep_job.json`` has the
   wall time from start to end);
3. a probe: the job itself for :data:`PROBE_STEPS` optimizer steps and one validation, in a scratch
   runs root, ``parallel`` probes at a time as the jobs will run (so contention is in the figure).

Measured rates are kept in ``<runs root>/.cost/<device>/<kind>.json``: a dry run followed by the sweep
probes once, and the carry pack (lra.tools.carry) takes them to the next machine of the same device. What is read
from there, and from records, markers, checkpoints and metrics (steps, times, counts), is data: a figure that is not
a number of the right kind and sign is none (:func:`lra.tools.sweep.jobs.number`), never a traceback or a negative time.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lra import REPO_ROOT
from lra.files import write_json
from lra.tools.sweep.base import FINISHED, MARKER
from lra.tools.sweep.grid import quote
from lra.tools.sweep.jobs import count, number, read_json, start_run

log = logging.getLogger("lra.tools.sweep")

PROBE_STEPS = 40  # optimizer steps a probe trains: past the first steps' warm-up, seconds on a CPU
PROBE_LOG_EVERY = 10  # its throughput rows: the pace of steps 20-40 (the first twenty are one-off, in fixed: the
PROBE_SKIP_ROWS = 2  # probes beside it may still be starting, which a run's long middle does not see)
MIN_PROBE_S = 60.0  # what a probe takes at least, start-up to record (33-72 s on a 2-core CPU): a budget's cap
COST_DIR = ".cost"
NOT_A_KIND = ("seed", "run_tag", "force", "name", "train.ckpt_every_steps")  # they do not change what a job costs


@dataclass
class Rate:
    """What one kind of job costs here: seconds outside training and validation, per optimizer step,
    per validation; and where the figures come from."""

    fixed_s: float
    step_s: float
    eval_s: float
    source: str  # "probe" | "run <folder>" | "own record"
    device: str = ""
    parallel: int = 1

    def problem(self) -> str | None:
        """What makes these rates no rates (None: they are): each a finite number, not below 0, per step above 0."""
        for k in ("fixed_s", "step_s", "eval_s"):
            if number(getattr(self, k), above_zero=k == "step_s") is None:
                return f"{k} is {getattr(self, k)!r}"
        if not (isinstance(self.source, str) and isinstance(self.device, str) and count(self.parallel)):
            return f"source {self.source!r}, device {self.device!r}, parallel {self.parallel!r}"
        return None


def kind_of(overrides: list[str]) -> str:
    """The kind of a job (12 hex digits): its overrides less those that do not change its cost."""
    keep = sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in NOT_A_KIND)
    return hashlib.sha256(json.dumps(keep).encode()).hexdigest()[:12]


def device_name(gpus: list[str]) -> str:
    """This machine's device as the runs' records name it: the first visible GPU's name (nvidia-smi, so the
    driver holds no CUDA context on a card the runs share), else ``cpu``."""
    if gpus:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env = dict(os.environ)
            env.pop("CUDA_VISIBLE_DEVICES", None)  # nvidia-smi -i takes the id or UUID itself
            out = subprocess.run(
                ["nvidia-smi", "-i", gpus[0], "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                env=env,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        return "cuda"
    return "cpu"


def device_slug(device) -> str:
    """A device as a folder name (results/<device>/, the rates' folder): ``NVIDIA H100 80GB HBM3`` ->
    ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", str(device or "").lower()).strip("-") or "unknown-device"


# ----------------------------------------------------------------------------- the work a job has left
@dataclass
class Work:
    max_steps: int
    eval_every: int
    early_stop: bool  # patience set: the run may end sooner, the estimate is an upper bound
    done: int = 0  # steps an earlier window trained (resumed from last.ckpt)
    least_end: int | None = None  # the earliest step early stopping can end it (its best validation + patience)

    @property
    def steps_left(self) -> int:
        return max(self.max_steps - self.done, 0)

    @property
    def evals_left(self) -> int:
        every = max(self.eval_every, 1)
        return max(self.max_steps // every - self.done // every, 0)

    @property
    def least_left(self) -> int:
        """The fewest steps it can still take: to its early stop if no validation improves, else to max_steps."""
        end = self.max_steps if self.least_end is None else min(self.least_end, self.max_steps)
        return max(end - self.done, 0)


def work_of(job) -> Work | None:
    """The steps and validations ``job`` has left (None: an invalid job). A finished job has none; a job an
    earlier window stopped resumes from its ``checkpoints/last.ckpt``, at the step its record says."""
    if job.train is None:
        return None
    patience = int(job.train.get("patience") or 0)
    w = Work(int(job.train["max_steps"]), int(job.train["eval_every"]), bool(patience))
    last = None if job.run_dir is None else Path(job.run_dir) / "checkpoints" / "last.ckpt"
    if job.status in FINISHED:
        w.done = w.max_steps
    elif last is not None and last.exists():
        w.done = min(count(job.record.get("steps")) or _checkpoint_step(last), w.max_steps)
        best = _best_val_step(Path(job.run_dir) / "metrics.csv") if patience else None
        if best is not None:
            w.least_end = best + patience * w.eval_every
    return w


def _checkpoint_step(last: Path) -> int:
    """The step ``last.ckpt`` continues from: a record written before records counted an interrupted run's
    steps says 0, the checkpoint knows (read as data)."""
    from lra.protocol import RunError, read_checkpoint  # lightning: only for such a record

    try:
        return count(read_checkpoint(last).get("global_step")) or 0
    except RunError:
        return 0


def _best_val_step(metrics: Path) -> int | None:
    """The optimizer step of the lowest validation loss so far (what early stopping watches), from metrics.csv
    (its rows count the steps taken: the validation after step 500 is at 500)."""
    with contextlib.suppress(OSError, ValueError, KeyError, csv.Error):
        with open(metrics, newline="") as f:
            vals = [(float(r["val/loss"]), int(r["step"])) for r in csv.DictReader(f) if r.get("val/loss")]
        vals = [v for v in vals if math.isfinite(v[0]) and v[1] > 0]  # a diverged validation is no best
        if vals:
            return min(vals, key=lambda v: (v[0], v[1]))[1]  # the first of equal losses: a tie is no improvement
    return None


def wall_of(run_dir: Path) -> float | None:
    """Seconds from a job's start to its end, as its ``.sweep_job.json`` says (None: it does not, in numbers)."""
    marker = read_json(run_dir / MARKER) or {}
    t0, t1 = number(marker.get("t_start")), number(marker.get("t_end"))
    return t1 - t0 if t0 is not None and t1 is not None and t1 >= t0 else None


def seconds(work: Work, rate: Rate) -> float:
    if work.steps_left == 0:
        return 0.0
    return rate.fixed_s + work.steps_left * rate.step_s + work.evals_left * rate.eval_s


# ----------------------------------------------------------------------------- rates
def rate_of_record(rec: dict, eval_every: int, wall_s: float | None, source: str, parallel: int) -> Rate | None:
    """The rates a run's record shows: per step from its training time, per validation from its
    validation time, and (given its wall time from start to end) the rest as ``fixed``."""
    steps, train_s = count(rec.get("steps")), number(rec.get("train_time_s"), above_zero=True)
    eval_s = number(rec.get("eval_time_s"))
    if not steps or train_s is None or eval_s is None:
        return None
    n_evals = max(steps // max(int(eval_every), 1), 1)
    fixed = None if number(wall_s) is None else max(wall_s - train_s - eval_s, 0.0)
    return Rate(
        fixed_s=fixed if fixed is not None else float("nan"),
        step_s=train_s / steps,
        eval_s=eval_s / n_evals,
        source=source,
        device=str(rec.get("device") or ""),
        parallel=parallel,
    )


def rate_of_metrics(metrics: Path, parallel: int) -> Rate | None:
    """A run's pace from its metrics.csv where its record has none (a record written before records counted an
    interrupted run's steps): training seconds over steps at its last validation (``time/train_s`` adds up
    over every stretch); its validations are not timed there, so they count as none."""
    with contextlib.suppress(OSError, ValueError, KeyError, csv.Error):
        with open(metrics, newline="") as f:
            timed = [(int(r["step"]), float(r["time/train_s"])) for r in csv.DictReader(f) if r.get("time/train_s")]
        if timed and timed[-1][0] > 0 and number(timed[-1][1], above_zero=True):
            steps, train_s = timed[-1]
            return Rate(float("nan"), train_s / steps, 0.0, "own metrics (validations not timed)", "", parallel)
    return None


def steady_step_s(metrics: Path, effective_batch) -> float | None:
    """Seconds per optimizer step after the first :data:`PROBE_SKIP_ROWS` logged intervals, from a probe's
    throughput rows."""
    if not number(effective_batch, above_zero=True):
        return None
    with contextlib.suppress(OSError, ValueError, KeyError):
        with open(metrics) as f:
            rows = [r for r in csv.DictReader(f) if r.get("throughput/samples_per_s")]
        rates = [float(r["throughput/samples_per_s"]) for r in rows[PROBE_SKIP_ROWS:]]
        if rates and all(number(r, above_zero=True) for r in rates):
            return effective_batch / (sum(rates) / len(rates))
    return None


class Estimator:
    """The rates of a sweep's kinds of jobs on this device (``root/.cost/<device>/``), from finished runs,
    the jobs' own records, and probes; and each job's estimate."""

    def __init__(self, root: Path, device: str, parallel: int):
        self.root, self.device, self.parallel = Path(root), device, max(int(parallel), 1)
        self.folder = self.root / COST_DIR / device_slug(device)
        self.rates: dict[str, Rate] = {}
        for f in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            data = read_json(f) or {}
            try:
                r = Rate(**{k: v for k, v in data.items() if k in Rate.__dataclass_fields__})
                why = r.problem()
            except TypeError:
                why = "not JSON, or a figure missing"
            if why:  # it travels in carry packs: damaged, or edited by hand
                log.warning("%s: no rate (%s); ignored: its jobs have no estimate until measured again", f, why)
            elif r.device == device and r.parallel == self.parallel:
                self.rates[f.stem] = r

    def learn_from(self, jobs: list) -> None:
        """A finished job that a sweep ran from scratch on this device gives its kind's rates (better than
        a probe: the whole run, evaluations and all)."""
        for j in jobs:
            if j.status not in FINISHED or j.train is None or j.record.get("resumed_from_step") is not None:
                continue
            if str(j.record.get("device") or "") != self.device:
                continue
            machine = j.record.get("machine")
            ran_beside = machine.get("sweep_parallel") if isinstance(machine, dict) else None
            if ran_beside is not None and ran_beside != self.parallel:  # another load: another pace
                continue
            wall = wall_of(Path(j.run_dir))
            if wall is None:
                continue
            r = rate_of_record(j.record, j.train["eval_every"], wall, f"run {j.rel}", self.parallel)
            if r is not None:
                self.save(kind_of(j.overrides), r)

    def save(self, kind: str, rate: Rate) -> None:
        self.rates[kind] = rate
        with contextlib.suppress(OSError):
            write_json(self.folder / f"{kind}.json", asdict(rate))

    def rate(self, job) -> Rate | None:
        """``job``'s rates: its kind's, with steps and validations from its own record where an earlier
        window trained it (its share of the device then is in the figure)."""
        base = self.rates.get(kind_of(job.overrides))
        own = None
        if job.status not in FINISHED and job.train is not None and job.record.get("steps"):
            first = job.record.get("resumed_from_step") is None and job.run_dir
            wall = wall_of(Path(job.run_dir)) if first else None
            own = rate_of_record(job.record, job.train["eval_every"], wall, "own record", self.parallel)
            if own is not None and own.device not in ("", self.device):
                own = None
        if own is None and job.run_dir and str(job.record.get("device") or "") == self.device:
            own = rate_of_metrics(Path(job.run_dir) / "metrics.csv", self.parallel)
        if own is None:
            return base
        fixed, source = base.fixed_s if base is not None else own.fixed_s, own.source
        if math.isnan(fixed):
            fixed = self.typical_fixed()
        if fixed is None:  # its pace is known, its start-up not (a run no sweep launched): counted as none
            fixed, source = 0.0, f"{source}, start-up not measured"
        return Rate(fixed, own.step_s, own.eval_s, source, self.device, self.parallel)

    def typical_fixed(self) -> float | None:
        fixed = [r.fixed_s for r in self.rates.values() if not math.isnan(r.fixed_s)]
        return max(fixed) if fixed else None

    def estimate(self, job) -> tuple[float | None, Rate | None, Work | None]:
        work = work_of(job)
        if work is None:
            return None, None, None
        if work.steps_left == 0:
            return 0.0, None, work
        rate = self.rate(job)
        return (seconds(work, rate) if rate is not None else None), rate, work

    def unmeasured(self, jobs: list) -> list:
        """One job of each kind that has no rates yet (the ones a probe measures)."""
        out: dict[str, object] = {}
        for j in jobs:
            if j.train is None or j.error:
                continue
            k = kind_of(j.overrides)
            if k not in out and self.estimate(j)[0] is None:
                out[k] = j
        return list(out.values())

    def probe(self, jobs: list, env_of=None, steps: int = PROBE_STEPS, until: float | None = None) -> float:
        """Run a probe of each of ``jobs`` (one per kind), ``parallel`` at a time; returns the seconds spent.
        A probe that fails leaves its kind without an estimate (its job still runs, reported as usual). With
        ``until`` (a time.time()), a batch starts only if it can end by then (as long as the longest batch so far,
        :data:`MIN_PROBE_S` for the first) and is killed there: its kinds stay unmeasured."""
        t0 = time.time()
        scratch = Path(tempfile.mkdtemp(prefix="lra-probe-"))
        procs: list = []
        longest = None
        try:
            for start in range(0, len(jobs), self.parallel):
                if until is not None and time.time() + (longest or MIN_PROBE_S) > until:
                    break
                t_batch = time.time()
                batch = jobs[start : start + self.parallel]
                # fill idle slots with repeats so each probe shares the machine as the jobs will
                slots = [batch[i % len(batch)] for i in range(self.parallel)] if len(batch) < self.parallel else batch
                procs = []
                for i, j in enumerate(slots):
                    run_dir = scratch / f"{start + i}"
                    env, extra = env_of(i, j) if env_of else (dict(os.environ), [])
                    env["LRA_RUNS"] = str(scratch / "runs")
                    cmd = [
                        sys.executable,
                        "-m",
                        "lra.train",
                        *[o for o in j.overrides if not o.startswith("run_tag=")],
                        *extra,
                        f"train.max_steps={steps}",
                        f"train.eval_every={steps}",
                        "train.warmup=0",
                        "trainer.progress=false",
                        f"trainer.log_every_n_steps={PROBE_LOG_EVERY}",
                        "logger=csv",
                        f"fit.cache_dir={quote(self.root / '.fit-cache')}",
                        f"hydra.run.dir={quote(run_dir)}",
                    ]
                    log_file = open(scratch / f"{start + i}.log", "w")  # closed below
                    proc = start_run(cmd, env=env, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
                    procs.append((j, run_dir, time.time(), proc, log_file))
                for j, run_dir, t, p, log_file in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(None if until is None else max(until - time.time(), 0.01))
                    cut = p.poll() is None
                    if cut:  # at its deadline
                        p.kill()
                        p.wait()
                    log_file.close()
                    wall = time.time() - t
                    rec = read_json(run_dir / "result.json") or {}
                    r = rate_of_record(rec, steps, wall, "probe", self.parallel) if p.returncode == 0 else None
                    steady = steady_step_s(run_dir / "metrics.csv", rec.get("effective_batch"))
                    if r is not None and steady is not None:  # the first steps' extra time is paid once: fixed
                        r.fixed_s = max(r.fixed_s + (r.step_s - steady) * rec["steps"], 0.0)  # sped up: none
                        r.step_s = steady
                    if r is None:
                        why = "cut at its deadline" if cut else f"failed (exit {p.returncode})"
                        log.warning("probe of %s %s: no estimate for its kind", j.rel, why)
                    elif kind_of(j.overrides) not in self.rates or self.rates[kind_of(j.overrides)].source == "probe":
                        if r.device and r.device != self.device:
                            log.warning("probe of %s ran on %s, not %s", j.rel, r.device, self.device)
                        r.device = self.device
                        self.save(kind_of(j.overrides), r)
                longest = max(longest or 0.0, time.time() - t_batch)
        finally:  # interrupted: no probe outlives the sweep
            for *_, p, log_file in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log_file.close()
            shutil.rmtree(scratch, ignore_errors=True)
        return time.time() - t0


# ----------------------------------------------------------------------------- a time budget
@dataclass
class Slot:
    job: object
    estimate_s: float | None
    start_s: float  # from now, in the plan
    finishes: bool | None  # expected to finish inside the budget (None: no estimate, it may)


def plan_budget(todo: list, estimates: dict, batch: int, budget_s: float, carry: bool) -> tuple[list[Slot], list]:
    """Which jobs of ``todo`` (in order) to start within ``budget_s``: the launcher runs them in batches of
    ``batch`` and starts a batch when the one before has ended, so a batch lasts as long as its longest job.
    A job joins the current batch when it is expected to finish inside the budget, or has no estimate (it may:
    it starts in the grid's order, its batch may last to the budget, and it is carried if it does not finish);
    with ``carry``, the slots left in the last batch that can start take jobs that will not finish (stopped at
    the budget, carried). Returns (the jobs to start, as planned, in launch order; the jobs left for later)."""
    chosen: list[Slot] = []
    left = []
    t, current = 0.0, []

    def length(slots) -> float:  # a batch with a job of unknown length may take what is left of the budget
        return max(budget_s - t if s.estimate_s is None else s.estimate_s for s in slots)

    for j in todo:
        est = estimates.get(id(j))
        if t < budget_s and (est is None or t + est <= budget_s):
            current.append(Slot(j, est, t, None if est is None else True))
            if len(current) == batch:
                chosen += current
                t += length(current)
                current = []
        else:
            left.append(j)
    start = t  # when the last, unfilled batch starts
    chosen += current
    if current:
        t += length(current)
    if carry and left:  # the slots that can still start, filled in order with jobs to carry
        open_slots = batch - len(current) if current else (batch if t < budget_s else 0)
        chosen += [Slot(j, estimates.get(id(j)), start, False) for j in left[:open_slots]]
        left = left[open_slots:]
    return chosen, left


def fmt_h(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min" if x < 7200 else f"{x / 3600:.1f} h"
