"""A sweep against the clock: each job's estimate on this device (``dry_run=true`` prints them with the grid's
total), and with ``budget=<time>`` the jobs expected to finish inside it, started in the grid's order and
stopped with SIGTERM when it runs out (interrupted, resumable: :mod:`lra.tools.carry` takes them to the next
machine). The estimates: :mod:`lra.tools.sweep.cost`."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from lra.tools.sweep.base import FINISHED, MIN_START_S
from lra.tools.sweep.cost import MIN_PROBE_S, PROBE_STEPS, Estimator, device_name, fmt_h, plan_budget, rate_of_metrics
from lra.tools.sweep.jobs import assign_gpus, carried

PROBE_SHARE = 0.25  # of a budget, at most, for probes: the rest is the jobs'


def estimates(
    todo: list, root: Path, gpus: list[str], batch: int, parallel: int, jobs_per_gpu, probe: bool, jobs=(), end=None
) -> tuple[Estimator, dict]:
    """(the estimator, {id(job): seconds or None}) for the jobs to run, probing each kind not measured yet
    unless ``probe`` is false, ``batch`` at a time (the launcher's batch: how many jobs share the machine).
    ``jobs``: the whole grid (its finished runs measure their kinds). ``end``: a budget's end (time.time()):
    the probes get :data:`PROBE_SHARE` of what is left, none if a probe does not fit in that."""
    est = Estimator(root, device_name(gpus), batch)
    est.learn_from(list(jobs) or todo)
    missing = est.unmeasured(todo) if probe else []
    until = None if end is None else time.time() + PROBE_SHARE * (end - time.time())
    if missing and until is not None and until - time.time() < MIN_PROBE_S:
        print(
            f"no probe: {len(missing)} kind(s) of job not measured on {est.device}, and a probe takes about "
            f"{fmt_h(MIN_PROBE_S)}, more than the {PROBE_SHARE:.0%} of the budget probes may take; their jobs "
            "start in the grid's order without an estimate (stopped at the budget and carried if they do not finish)",
            flush=True,
        )
        missing = []
    if missing:
        print(
            f"measuring {len(missing)} kind(s) of job on {est.device}: a probe of {PROBE_STEPS} steps and one "
            f"validation each, {est.parallel} at a time "
            f"(kept in {est.folder})",
            flush=True,
        )

        def env_of(slot: int, job):
            env = dict(os.environ)
            if not jobs_per_gpu:
                return env, []
            env.update(
                LRA_SWEEP_PARALLEL=str(parallel),
                LRA_SWEEP_JOBS_PER_GPU=str(jobs_per_gpu),
                LRA_SWEEP_GPUS=",".join(gpus),
            )
            return env, assign_gpus(env, slot, job.cfg)

        spent = est.probe(missing, env_of, until=until)
        print(f"probes took {fmt_h(spent)}", flush=True)
    return est, {id(j): est.estimate(j)[0] for j in todo}


def describe(est: Estimator, job) -> str:
    """``~ 1.2 min (probe; 600 steps, 4 validations left, early stop: at most)``."""
    secs, rate, work = est.estimate(job)
    if work is None:
        return ""
    if work.steps_left == 0:
        return "  ~ 0 s (finished)"
    if secs is None:
        return "  ~ ? (not measured here yet; probe=true measures it)"
    bound = ", at most: early stopping may end it sooner" if work.early_stop else ""
    done = f" of {work.max_steps}, from step {work.done}" if work.done else ""
    return (
        f"  ~ {fmt_h(secs)} ({rate.source}; {work.steps_left} steps{done}, {work.evals_left} validations left{bound})"
    )


def totals(todo: list, est_by_job: dict, batch: int, device: str) -> str:
    """The grid's total: job time, the wall time at ``batch`` at a time, and what is not measured."""
    known = [est_by_job[id(j)] for j in todo if est_by_job.get(id(j)) is not None]
    unknown = len(todo) - len(known)
    wall = 0.0
    for start in range(0, len(todo), max(batch, 1)):  # the launcher's batches: each as long as its longest job
        wall += max((est_by_job.get(id(j)) or 0.0 for j in todo[start : start + batch]), default=0.0)
    if not known:
        return (
            f"{len(todo)} jobs to run: no estimate on {device} yet ({unknown} not measured; probe=true measures them)"
        )
    return (
        f"{len(todo)} jobs to run: about {fmt_h(sum(known))} of job time on {device}; {batch} at a time, "
        f"about {fmt_h(wall)} of wall time ({wall / 3600:.2f} h of this machine)"
        + (f"; {unknown} not measured (not counted)" if unknown else "")
    )


def plan(todo: list, est_by_job: dict, batch: int, left_s: float, carry: bool) -> tuple[list, list, str]:
    """(the jobs to start, the jobs left, the line that says so) for ``left_s`` seconds of budget."""
    slots, left = plan_budget(todo, est_by_job, batch, left_s, carry)
    finish = [s for s in slots if s.finishes]
    stop = [s for s in slots if s.finishes is False]
    unknown = [s for s in slots if s.finishes is None]
    line = (
        f"budget: {fmt_h(max(left_s, 0))} left: starting {len(slots)} of {len(todo)} jobs, {len(finish)} expected "
        f"to finish"
        + (f", {len(stop)} to stop at the budget and carry" if stop else "")
        + (f", {len(unknown)} without an estimate (carried if they do not finish)" if unknown else "")
        + f"; {len(left)} left for a later window"
        + ("" if carry or not left else " (carry=true also starts jobs that cannot finish, to carry them)")
    )
    return [s.job for s in slots], left, line


def run_on_budget(todo, jobs, est, batch, end, carry, run_batch, started: list, inv: dict, now=time.time) -> None:
    """Start ``todo`` a batch at a time while the budget (which ends at ``end``) lasts: before each batch the plan
    is made again with what the jobs finished so far measured (a kind probed badly, or not at all, is
    known after its first run). ``started`` receives each batch before it runs (the caller stops them
    when the budget runs out); ``inv`` the first plan's line and each started job's estimate."""
    remaining = list(todo)
    while remaining:
        est.learn_from(jobs)
        by_job = {id(j): est.estimate(j)[0] for j in remaining}
        remaining.sort(key=lambda j: soonest(est, j))  # a window finishes cells: the soonest to end go first
        chosen, _, line = plan(remaining, by_job, batch, end - now(), carry)
        if "plan" not in inv:
            inv["plan"] = line
            print(line, flush=True)
        nxt = chosen[:batch]
        if not nxt or end - now() < MIN_START_S:  # a run started now would be stopped before its first record
            return
        inv["estimates_s"].update({j.rel: by_job.get(id(j)) for j in nxt})
        for j in nxt:
            with_checkpoints(j, est.estimate(j)[1])
        started += nxt
        remaining = [j for j in remaining if j not in nxt]
        run_batch(nxt)
        for j in nxt:
            j.refresh()


def soonest(est: Estimator, job) -> tuple:
    """Sort key: the least time ``job`` can still take here (to its early stop if no validation improves), jobs
    without an estimate after those with one; the grid's order breaks ties (a stable sort). A run carried from
    another card is ordered at its pace there: it is slower or faster here, but so are the others."""
    _, rate, work = est.estimate(job)
    if rate is None and work is not None and job.run_dir is not None and work.done:
        rate = rate_of_metrics(Path(job.run_dir) / "metrics.csv", est.parallel)
    if rate is None or work is None:
        return (1, 0.0)
    left, fixed = work.least_left, 0.0 if math.isnan(rate.fixed_s) else rate.fixed_s
    return (0, fixed + left * rate.step_s + left // max(work.eval_every, 1) * rate.eval_s)


CKPT_EVERY_S = 30.0  # a run stopped at the budget loses at most about this much training


def with_checkpoints(job, rate) -> None:
    """A run the budget may stop resumes from its last checkpoint, written at each evaluation (every 150 to
    500 steps: minutes): unless the job says how often, a resume checkpoint every ~30 s of its training too
    (``train.ckpt_every_steps``: neither its folder nor its resume key changes)."""
    if any(o.split("=", 1)[0].lstrip("+~") == "train.ckpt_every_steps" for o in job.overrides):
        return
    every = max(10, int(CKPT_EVERY_S / rate.step_s)) if rate is not None and rate.step_s > 0 else 50
    job.overrides = [*job.overrides, f"train.ckpt_every_steps={every}"]


def report(jobs: list, started: list, left: list, reached: bool, command: str, root: Path) -> list[str]:
    """What a budgeted sweep did: finished, carried (what ``lra.tools.carry pack`` takes: resumable, or at least
    a record), still running (another process holds it: the pack takes it once it ends),
    started but stopped before its first record (nothing to carry), left; and how to go on."""
    done = [j for j in started if j.status in FINISHED]
    running = [j for j in jobs if not j.error and j.status == "running"]
    carry = [j for j in jobs if not j.error and j.status not in (*FINISHED, "running") and carried(j.run_dir)]
    seen = {id(j) for j in carry + running}
    lost = [j for j in started if j.status not in FINISHED and id(j) not in seen]
    seen |= {id(j) for j in started}
    not_started = [j for j in jobs if not j.error and j.status not in FINISHED and id(j) not in seen]
    lines = [
        ("budget reached: the runs still training were stopped with SIGTERM" if reached else "budget not reached")
        + f"; {len(done)} finished this time, {len(carry)} to carry (python -m lra.tools.carry pack takes them), "
        + (f"{len(running)} still running (the pack takes them once they end), " if running else "")
        + (f"{len(lost)} stopped before their first record (nothing to carry: they start over), " if lost else "")
        + f"{len(not_started)} not started"
    ]
    lines += [f"  finished {j.rel}" for j in done]
    for j in carry:
        ckpt = "resume from last.ckpt" if (Path(j.run_dir) / "checkpoints" / "last.ckpt").is_file() else "no checkpoint"
        lines.append(f"  carry    {j.rel} ({j.status}, step {j.record.get('steps') or 0}, {ckpt})")
    lines += [f"  running  {j.rel} (another process holds it)" for j in running]
    lines += [f"  restart  {j.rel} (stopped before its first record)" for j in lost]
    if carry or running or lost or not_started:
        lines.append(
            f"next window: python -m lra.tools.carry pack {root} --out <folder> (what is left, and what finished), then"
        )
        lines.append(f"  there: python -m lra.tools.carry unpack <folder> --runs <runs root>; {command}")
    return lines
