"""A grid sweep: plan its jobs, print the plan or launch the unfinished ones through Hydra's launcher, and summarise."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lra.hydra_glue import Composer
from lra.tools.sweep import budget as clock
from lra.tools.sweep.base import (
    BUDGET_SLACK_S,
    FINISHED,
    STOP_WAIT_S,
    BudgetReached,
    Interrupted,
    deadline,
    interruptible,
    signal_of,
)
from lra.tools.sweep.grid import Grid, definition, quote, sweep_key, with_run_tag
from lra.tools.sweep.jobs import END_ENV, count, ctrl_c_to_the_driver, number, read_json, run_job, stop_jobs
from lra.tools.sweep.manifest import Job, counts, find_manifest, rel_path, sweep_lock, write_manifest
from lra.tools.sweep.progress import GridWatch, Progress
from lra.tools.sweep.share import (
    ShareError,
    auto_jobs_per_gpu,
    check_sharing,
    describe,
    gpu_count,
    hw_of,
    not_reported,
    share_plan,
    visible_gpus,
)

log = logging.getLogger("lra.tools.sweep")


# ----------------------------------------------------------------------------- grid sweeps
def _wandb_group(name: str, jobs_ovs: list[list[str]]) -> list[str]:
    """W&B groups the runs of a sweep: conf/logger/wandb.yaml reads WANDB_RUN_GROUP, set in every job."""
    if (
        any(o.startswith("logger=") and "wandb" in o for ovs in jobs_ovs for o in ovs)
        and "WANDB_RUN_GROUP" not in os.environ
    ):
        return [f"++hydra.job.env_set.WANDB_RUN_GROUP={name}"]
    return []


def plan(grid: Grid, hydra_ovs: list[str], composer: Composer) -> tuple[DictConfig, list[Job]]:
    job_lists = grid.jobs()
    if not job_lists:
        raise SystemExit(f"lra.tools.sweep: grid {grid.name} has no jobs")
    common = [o for o in job_lists[0] if all(o in j for j in job_lists)]
    extra = _wandb_group(grid.name, job_lists)
    primary = composer.primary(hydra_ovs + extra + common)
    jobs = []
    for ovs in job_lists:
        job = Job(overrides=with_run_tag(ovs))
        try:
            cfg, job.run_dir = composer.job(primary, job.overrides)
            job.task, job.attn, job.seed, job.preset = cfg.task.name, cfg.attn.label, int(cfg.seed), cfg.preset
            job.data = (OmegaConf.to_container(cfg.task, resolve=True), str(cfg.data_root))
            job.hw = hw_of(cfg)
            job.train = {k: cfg.train.get(k) for k in ("max_steps", "eval_every", "patience")}
            job.cfg = cfg
        except Exception as e:  # an unknown task/attn: reported, the rest still runs
            job.error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        jobs.append(job)
    seen: dict[Path, Job] = {}
    for j in jobs:
        if j.run_dir is None:
            continue
        if j.run_dir in seen:
            raise SystemExit(
                f"lra.tools.sweep: two jobs of grid {grid.name} name one run folder, {j.run_dir}: "
                f"[{' '.join(seen[j.run_dir].overrides)}] and [{' '.join(j.overrides)}] are one "
                f"configuration, or differ only in how a run executes (lra.tags.UNTAGGED); remove "
                f"one of the grid's values"
            )
        seen[j.run_dir] = j
    return primary, jobs


def sweep_folder(root: Path, grid: Grid, jobs: list[Job]) -> Path:
    presets = {j.preset for j in jobs if j.preset}
    return root / (presets.pop() if len(presets) == 1 else "") / "sweeps" / grid.name


def plain_hydra_command(grid: Grid, hydra_ovs: list[str]) -> str:
    fixed = [v for k, v in grid.overrides.items() if k not in grid.axes]
    axes = [f"{k}={','.join(v.split('=', 1)[1] for v in vals)}" for k, vals in grid.axes.items()]
    return " ".join(shlex.quote(a) for a in ["python", "-m", "lra.train", "-m", *fixed, *axes, *hydra_ovs])


def run_grid(grid: Grid, opts: dict, hydra_ovs: list[str], t0: float | None = None) -> int:
    """``t0``: when the sweep started (a budget counts from it; default: now)."""
    t0 = time.time() if t0 is None else t0
    if grid.launcher and not any(o.startswith("hydra/launcher=") for o in hydra_ovs):
        hydra_ovs = [f"hydra/launcher={grid.launcher}"] + hydra_ovs
    k = opts.get("jobs_per_gpu") or grid.jobs_per_gpu
    gpus = visible_gpus() if k else []
    defn = definition(grid, hydra_ovs)
    key = sweep_key(defn)
    with interruptible(), Composer() as composer:
        primary, jobs = plan(grid, hydra_ovs, composer)
        root = Path(str(primary.runs_root))
        if k == "auto":
            k = _auto_k(root, gpus, jobs)
        parallel = opts["parallel"] or (k * len(gpus) if k and gpus else grid.parallel)
        folder = sweep_folder(root, grid, jobs)
        for j in jobs:
            j.refresh()
            j.rel = rel_path(j.run_dir, root) if j.run_dir else " ".join(j.overrides)
        force = any(o in ("force=true", "force=True") for o in jobs[0].overrides) if jobs else False
        todo = [j for j in jobs if not j.error and j.status != "running" and (force or j.status not in FINISHED)]
        kind = launcher_kind(primary)
        shares = None
        if k:
            try:
                check_sharing(k, parallel, gpus, kind)
                shares = share_plan(todo, k, parallel, gpus)
            except ShareError as e:
                raise SystemExit(f"lra.tools.sweep: {e}") from None
            unknown = [(gpu, j) for j, (gpu, s) in zip(todo, shares) if s is None]
            if not opts["dry_run"] and unknown:
                raise SystemExit(f"lra.tools.sweep: {not_reported(unknown[0][0], unknown[0][1].hw or {}, k)}")
        batch = len(todo) if kind == "slurm" else (parallel if kind == "local" else 1)  # = launch()'s batches
        if opts["budget"] is not None and kind == "slurm":
            raise SystemExit(
                "lra.tools.sweep: budget= plans the jobs of this machine, and the slurm launcher's queue decides "
                "when they start; give the jobs a time limit there (hydra.launcher.timeout_min) or drop budget"
            )
        if opts["dry_run"]:
            if opts["probe"] and todo:
                prepare_data(todo)  # once, before parallel probes would each generate it
            est, by_job = clock.estimates(todo, root, gpus, batch, parallel, k, bool(opts["probe"]), jobs)
            _print_plan(grid, jobs, todo, root, kind, parallel, hydra_ovs, k, gpus, shares, est)
            print(clock.totals(todo, by_job, batch, est.device))
            if opts["budget"] is not None:
                print(clock.plan(todo, by_job, batch, opts["budget"] - (time.time() - t0), opts["carry"])[2])
            path, previous = find_manifest(folder, key, keep_aside=False)
            state = (
                ("exists" if previous else "damaged: the sweep keeps it aside and starts a new one")
                if path.exists()
                else "new"
            )
            print(f"manifest: {path} ({state})")
            return 0
        with sweep_lock(folder):
            manifest, previous = find_manifest(folder, key)
            head = {
                "grid": grid.name,
                "kind": "grid",
                "key": key,
                "definition": defn,
                "command": grid.command,
                "launcher": kind,
                "parallel": parallel,
                "plain_hydra_command": plain_hydra_command(grid, hydra_ovs),
                **({"jobs_per_gpu": k, "gpus": gpus} if k else {}),
            }
            write_manifest(manifest, head, jobs, root, previous)
            skipped = len(jobs) - len(todo)
            print(
                f"lra.tools.sweep {grid.name}: {len(jobs)} jobs, {len(todo)} to run, {skipped} skipped "
                f"({fmt_counts(counts(jobs))}); launcher {kind}, {parallel} at a time"
                + (f", {k} per GPU on GPUs {','.join(gpus)}" if k else "")
                + f"; manifest {manifest}",
                flush=True,
            )
            stopped, started, budget_inv = None, [], {}
            end = None if opts["budget"] is None else t0 + opts["budget"]
            go = functools.partial(
                launch,
                composer,
                primary,
                grid,
                kind=kind,
                parallel=parallel,
                folder=folder,
                hydra_ovs=hydra_ovs,
                manifest=manifest,
                head=head,
                jobs=jobs,
                root=root,
                every_s=opts["progress"] if opts["progress"] is not None else 30.0,
                jobs_per_gpu=k,
                gpus=gpus,
                end=end,
            )
            if end is not None:
                budget_inv = {"budget_s": opts["budget"], "estimates_s": {}}
                print(f"budget {clock.fmt_h(opts['budget'])}: ends at most {BUDGET_SLACK_S:.0f} s after it", flush=True)
            try:  # a budget counts everything: the data, the probes, the plan, the jobs
                with deadline(None if end is None else end - time.time()):
                    if todo and (kind == "slurm" or (kind == "local" and parallel > 1) or end is not None):
                        prepare_data(todo)
                    if end is None:
                        started = todo
                        if todo:
                            go(todo)
                    else:
                        probe = opts["probe"] is not False
                        est, by_job = clock.estimates(todo, root, gpus, batch, parallel, k, probe, jobs, end)
                        print(clock.totals(todo, by_job, batch, est.device), flush=True)
                        budget_inv["device"] = est.device
                        clock.run_on_budget(todo, jobs, est, batch, end, opts["carry"], go, started, budget_inv)
            except BudgetReached:  # only the runs were told: no grace, and SIGKILL for a run that does not stop
                stop_jobs([j.run_dir for j in started], signal.SIGTERM, grace_s=0.0, wait_s=STOP_WAIT_S, kill=True)
            except (KeyboardInterrupt, Interrupted) as e:
                # SIGINT or SIGTERM (interruptible): stop the jobs, then the truth
                stopped = signal_of(e)
                stop_jobs([j.run_dir for j in started], stopped)
            reached = end is not None and time.time() >= end  # spent, whether or not a run was still training
            left = [j for j in todo if j not in started]
            for j in jobs:  # each job's status as its folder says now, whatever the launcher reported
                j.refresh()
            wall = time.time() - t0
            inv = {
                "started": _dt.datetime.fromtimestamp(t0, _dt.timezone.utc).isoformat(timespec="seconds"),
                "wall_s": round(wall, 1),
                "launched": len(started),
                "skipped": skipped,
                "command": grid.command,
                **({"interrupted": signal.Signals(stopped).name} if stopped else {}),
                **({**budget_inv, "budget_reached": reached} if budget_inv else {}),
            }
            write_manifest(manifest, {**head, "invocation": inv}, jobs, root)
    if stopped:
        print(interrupted_line(grid.name, stopped, counts(jobs), grid.command), file=sys.stderr, flush=True)
        return 128 + stopped
    _print_summary(grid, jobs, started, root, manifest, wall)
    if opts["budget"] is not None:
        print("\n".join(clock.report(jobs, started, left, reached, grid.command, root)))
    if any(o.startswith("logger=") and "wandb" in o for o in (jobs[0].overrides if jobs else [])):
        from lra.tools.sweep.wandb_table import log_sweep_table

        with contextlib.suppress(Exception):
            log_sweep_table(read_json(manifest), folder)
    if opts["budget"] is not None:  # a window that ends with runs to carry did its job; a failed run did not
        return 1 if any(j.status == "failed" for j in started) else 0
    return 0 if all(j.status in FINISHED for j in jobs) else 1


def _auto_k(root: Path, gpus: list[str], jobs: list[Job]) -> int:
    """``jobs_per_gpu=auto``: the k share-bench measured best on this device (``<root>/share_bench``)."""
    from lra.tools.sweep.cost import device_name

    if not gpus:
        raise SystemExit("lra.tools.sweep: jobs_per_gpu=auto: no GPU visible here; drop jobs_per_gpu")
    measured = read_json(root / "share_bench" / "share_bench.json", list) or []  # data: a row of other figures is none
    measured = [r for r in measured if isinstance(r, dict) and count(r.get("k")) and number(r.get("steps_per_s"), True)]
    hw = next((j.hw for j in jobs if j.hw), {})
    try:
        k, why = auto_jobs_per_gpu(measured, device_name(gpus), hw, gpus[0])
    except ShareError as e:
        raise SystemExit(f"lra.tools.sweep: {e}") from None
    print(why, flush=True)
    return k


def interrupted_line(name: str, signum: int, job_counts: dict[str, int], command: str) -> str:
    """The one line an interrupted sweep ends with: what happened, where its jobs stand, how to go on."""
    return (
        f"lra.tools.sweep {name}: interrupted by {signal.Signals(signum).name}: {fmt_counts(job_counts)}; "
        f"resume with: {command or 'the same command'}"
    )


def prepare_data(todo: list[Job]) -> None:
    """Generate / tokenise each task's data once, here, before parallel jobs would all do it at once."""
    seen = set()
    for j in todo:
        key = json.dumps(j.data, sort_keys=True, default=str)
        if j.data is None or key in seen:
            continue
        seen.add(key)
        from lra.data import data_root, load_task

        t = time.time()
        try:
            load_task(j.data[0], data_root(j.data[1]))
            log.info("data for %s ready (%.0f s)", j.task, time.time() - t)
        except Exception as e:  # the job reports it with the data module's own message
            log.warning("could not prepare data for %s here: %s", j.task, str(e).splitlines()[0])


def launch(
    composer: Composer,
    primary: DictConfig,
    grid: Grid,
    todo: list[Job],
    *,
    kind: str,
    parallel: int,
    folder: Path,
    hydra_ovs: list[str],
    manifest: Path,
    head: dict,
    jobs: list[Job],
    root: Path,
    every_s: float = 30.0,
    jobs_per_gpu: int | None = None,
    gpus: list[str] | None = None,
    end: float | None = None,
) -> None:
    """``end``: a budget's end (time.time()), which each job keeps (it stops its run there itself, after the driver's
    own stop, if the driver is gone: killed, the local launcher's jobs outlive it)."""
    from hydra.core.plugins import Plugins

    extra = [f"++hydra.job.env_set.LRA_SWEEP_PARALLEL={parallel}", "hydra.output_subdir=null"]
    if end is not None:
        extra.append(f"++hydra.job.env_set.{END_ENV}={end + STOP_WAIT_S:.3f}")
    if jobs_per_gpu:  # run_job places each slot (and divides the memory) from these
        extra += [
            f"++hydra.job.env_set.LRA_SWEEP_JOBS_PER_GPU={jobs_per_gpu}",
            f"++hydra.job.env_set.LRA_SWEEP_GPUS={quote(','.join(gpus or []))}",
        ]
    if kind in ("local", "slurm"):
        if not any(o.startswith("hydra.launcher.submitit_folder=") for o in hydra_ovs):
            extra.append(f"hydra.launcher.submitit_folder={quote(folder / '.submitit' / '%j')}")
        extra += _resources(kind, primary, todo, hydra_ovs, parallel)
    primary = composer.primary(
        list(primary.hydra.overrides.hydra) + extra + list(primary.hydra.overrides.task), logging=True
    )
    ctx = composer.context(primary)
    ctx.callbacks.on_multirun_start(config=primary, config_name="config")
    launcher = Plugins.instance().instantiate_launcher(hydra_context=ctx, task_function=run_job, config=primary)
    OmegaConf.save(primary, folder / f"multirun-{head['key']}.yaml")
    size = len(todo) if kind == "slurm" else (parallel if kind == "local" else 1)
    slots = (parallel if parallel > 1 else len(todo)) if kind == "slurm" else size
    watch = GridWatch(
        [j.run_dir for j in todo],
        Progress(f"lra.tools.sweep {grid.name}", parallel=slots, every_s=every_s),
        since=time.time() - 5,
    )
    watch.start()
    idx = 0
    try:
        with ctrl_c_to_the_driver(kind == "local"):
            for start in range(0, len(todo), size):
                batch = todo[start : start + size]
                try:
                    launcher.launch([j.overrides for j in batch], initial_job_idx=idx)
                except Exception as e:  # a job killed hard (OOM, node lost): the others go on
                    log.error(
                        "a job of this batch died without a result (%s: %s); its folder keeps what it wrote",
                        type(e).__name__,
                        e,
                    )
                idx += len(batch)
                for j in batch:
                    j.refresh()
                write_manifest(manifest, head, jobs, root)
    finally:  # interrupted too: no progress line after the sweep's last word
        watch.stop()
    watch.tick()
    ctx.callbacks.on_multirun_end(config=primary, config_name="config")


def _resources(kind: str, primary: DictConfig, todo: list[Job], hydra_ovs: list[str], parallel: int) -> list[str]:
    given = {o.split("=", 1)[0] for o in hydra_ovs}
    out = []
    if (
        kind == "local"
        and "hydra.launcher.gpus_per_node" not in given
        and primary.hydra.launcher.get("gpus_per_node") is None
    ):
        gpus = gpu_count()  # submitit_local hides every GPU unless told how many the job gets
        if gpus:
            out.append(f"hydra.launcher.gpus_per_node={gpus}")
    if kind == "slurm":
        if "hydra.launcher.array_parallelism" not in given and parallel > 1:
            out.append(f"hydra.launcher.array_parallelism={parallel}")
        devices = {str(o.split("=", 1)[1]) for j in todo for o in j.overrides if o.startswith("trainer.devices=")}
        if len(devices) == 1:
            n = devices.pop()
            if n.isdigit() and int(n) > 1:  # Lightning on SLURM: one task per device
                for key in ("tasks_per_node", "gpus_per_node"):
                    if f"hydra.launcher.{key}" not in given:
                        out.append(f"hydra.launcher.{key}={n}")
    return out


def fmt_counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in c.items())


def _print_plan(
    grid, jobs, todo, root, kind, parallel, hydra_ovs, jobs_per_gpu=None, gpus=(), shares=None, est=None
) -> None:
    print(
        f"grid {grid.name}: {len(jobs)} jobs ({fmt_counts(counts(jobs))}); would run {len(todo)} with "
        f"launcher {kind}, {parallel} at a time"
        + (
            f", {jobs_per_gpu} per GPU on GPUs {','.join(gpus)} (slot s on GPU s // {jobs_per_gpu}; a profile "
            f"smaller than the card keeps its own fit, else each run gets total / {jobs_per_gpu}: "
            "lra.tools.sweep.share)"
            if jobs_per_gpu
            else ""
        )
    )
    placed = {id(j): (*gs, jobs_per_gpu) for j, gs in zip(todo, shares or [])}
    for j in jobs:
        where = rel_path(j.run_dir, root) if j.run_dir else f"{' '.join(j.overrides)}: {j.error}"
        print(
            f"  {'run ' if j in todo else 'skip'} {j.status if not j.error else 'invalid':12s} {where}"
            + (_fmt_share(*placed[id(j)]) if id(j) in placed else "")
            + (clock.describe(est, j) if est is not None and j in todo else "")
        )
    print(
        "plain Hydra equivalent (no manifest, finished runs return at once):\n  " + plain_hydra_command(grid, hydra_ovs)
    )


def _fmt_share(gpu: str, share: dict | None, k: int) -> str:
    if share is None:
        return f"  [GPU {gpu}: it did not report its memory here; the run reads it at run time]"
    return (
        f"  [GPU {gpu}; {describe(share, k)}: hardware.total_gib={share['total_gib']:g}, fit budget "
        f"{share['budget_gib']:.2f} GiB, allocator limit {share['limit_gib']:.2f} GiB]"
    )


def _print_summary(grid, jobs, todo, root, manifest, wall) -> None:
    c = counts(jobs)
    print(
        f"\nlra.tools.sweep {grid.name}: {len(jobs)} jobs in {wall:.0f} s: {fmt_counts(c)} "
        f"({len(todo)} launched this time)"
    )
    for j in jobs:
        if j.error:
            print(f"  invalid  {' '.join(j.overrides)}: {j.error}")
        elif j.status not in FINISHED:
            print(f"  {j.status:8s} {rel_path(j.run_dir, root)}: {j.record.get('reason') or ''}")
    print(f"manifest: {manifest}\ntables:   make tables (python -m lra.tools.collect)")
    if any(j.status not in FINISHED for j in jobs):
        print("run the same command again to finish the rest (finished runs are skipped, interrupted ones resume)")


def launcher_kind(cfg: DictConfig) -> str:
    target = str(cfg.hydra.launcher.get("_target_", ""))
    return "slurm" if target.endswith("SlurmLauncher") else "local" if target.endswith("LocalLauncher") else "basic"
