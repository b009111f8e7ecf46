"""Sweeps: ``python -m lra.sweep grid=<name> [overrides]`` (``make sweep grid=<name> ARGS='...'``).

A sweep is a file ``conf/sweep/<name>.yaml``: fixed ``overrides``, a ``grid`` of axes (cartesian
product) and the ``launcher`` and ``parallel`` to use; or, with a ``search`` block, an Optuna search
(lra/search.py). Command-line overrides join every job; one with several values (``seed=0,1,2``)
replaces that axis or adds one (in a search: adds or replaces a search parameter). ``parallel=N``,
``jobs_per_gpu=k`` (k runs share each GPU, each with 1/k of its memory: :func:`share_plan`),
``dry_run=true``, ``progress=S``, ``n_trials=N`` (searches) and ``hydra/launcher=...``,
``hydra.launcher.*`` steer the sweep itself. docs/sweeps.md has the commands for a laptop, a GPU box
and a SLURM cluster.

Every job is an ordinary run: ``python -m lra.train <its overrides>``, in the run folder Hydra names
(``runs/<preset>/<task>/<attn>/seed<seed>[/<other overrides>]``), so the collector reads sweeps and
single runs alike. A grid is:

1. expanded and composed job by job with Hydra (the run folder of each; two jobs that would share a
   folder stop the sweep before anything runs);
2. written to ``<runs root>/<preset>/sweeps/<name>/manifest-<key>.json`` with each job's status read
   from its run folder: ``completed``/``stopped_early``/``stuck`` (finished: skipped), ``running`` (a
   live job holds it: skipped), ``failed``, ``interrupted`` (a job started there and died: launched,
   and lra.train resumes it from its last checkpoint), ``pending``, ``invalid`` (does not compose).
   ``<key>`` is a short hash of the sweep's definition (:func:`definition`: its jobs' overrides with
   the values as Hydra reads them, order-free), so two sweeps of one grid with other overrides keep
   their own manifests and the same command again finds its own (:func:`find_manifest`);
3. launched as one Hydra multirun of the unfinished jobs through the chosen launcher (Hydra's
   ``basic``, ``local`` = submitit_local, ``slurm`` = submitit_slurm; conf/hydra/launcher/), in
   batches of ``parallel`` on one machine, as one job array on SLURM;
4. watched while the launcher blocks (a progress line with an ETA, :class:`GridWatch`), and
   summarised (and the manifest updated) when it returns. SIGINT or SIGTERM to the driver
   (:func:`interruptible`) stops the jobs (:func:`stop_jobs`), re-reads every job's status from its
   folder, writes the manifest and says so in one line with the command that resumes (exit 130/143).

Run the same command again and it finishes where it stopped. Why not ``python -m lra.train -m``
with the basic sweeper: that can only launch cartesian products, not "the jobs still to do", and
Lightning's DDP re-executes ``sys.argv`` for every extra device, which must be a single run. So the
multirun is driven from here with Hydra's own launchers and config loader, and each job runs
lra.train in a child process (:func:`run_job`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import itertools
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lra import CONF_DIR, REPO_ROOT
from lra.config import ConfigError, register_resolvers, run_tag
from lra.files import write_json
from lra.gpu_share import MEMORY_LIMIT_ENV, budget_gib, limit_gib, share_gib
from lra.record import read_record
from lra.runlock import holder_pid

log = logging.getLogger("lra.sweep")
register_resolvers()

GRID_DIR = CONF_DIR / "sweep"
FINISHED = ("completed", "stopped_early", "stuck")  # = lra.train.FINISHED: lra.train returns at once
MARKER = ".sweep_job.json"        # written by run_job in the run folder: who runs it, attempts
SWEEP_OPTIONS = ("grid", "parallel", "jobs_per_gpu", "dry_run", "n_trials", "progress")   # consumed here, never passed to a run
MANIFEST_VERSION = 2                # 2: manifest-<key>.json per sweep definition (1: manifest.json per grid)
LEGACY_MANIFEST = "manifest.json"   # a version-1 manifest: read as it is, never rewritten or deleted
STOP_GRACE_S = 10.0                 # an interrupted sweep's jobs get this long to end on their own signal


class Refusal(SystemExit):
    """A one-line refusal of the command (exit 2: bad input; 75: the sweep is in use); its text is the line."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the sweep's driver (:func:`interruptible`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def signal_of(e: BaseException) -> int:
    """The signal behind an interruption: Interrupted knows it; a bare KeyboardInterrupt is a Ctrl-C."""
    return getattr(e, "signum", signal.SIGINT)


@contextlib.contextmanager
def interruptible():
    """SIGINT and SIGTERM raise :class:`Interrupted` in the driver, once: a second signal while the sweep
    winds down is ignored, so the jobs are stopped and the manifest is written (without this a SIGTERM
    ends the driver at once, silently, its manifest left saying ``pending``)."""
    if threading.current_thread() is not threading.main_thread():   # signal.signal works in the main thread only
        yield
        return
    got: list[int] = []

    def handler(signum, frame):
        if not got:
            got.append(signum)
            raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ----------------------------------------------------------------------------- the grid file
@dataclass
class Grid:
    name: str
    overrides: dict[str, str]            # key -> "key=value", fixed for every job
    axes: dict[str, list[str]]           # key -> ["key=v1", "key=v2", ...]
    launcher: str | None = None          # conf/hydra/launcher entry (None: Hydra's basic launcher)
    parallel: int = 1
    jobs_per_gpu: int | None = None      # k runs share each GPU (None: each parallel job its own GPUs)
    search: dict | None = None           # {sweeper, n_trials, params: {key: "interval(..)"}}
    doc: str = ""
    command: str = ""                    # the lra.sweep command line that runs it (apply_cli): the resume line

    def jobs(self) -> list[list[str]]:
        fixed = [v for k, v in self.overrides.items() if k not in self.axes]
        return [fixed + list(point) for point in itertools.product(*self.axes.values())]


def available_grids() -> list[str]:
    return sorted(p.stem for p in GRID_DIR.glob("*.yaml"))


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def load_grid(name: str) -> Grid:
    path = GRID_DIR / f"{name}.yaml"
    if not path.exists():
        raise SystemExit(f"lra.sweep: no grid {name!r} (conf/sweep/{name}.yaml); available: "
                         f"{', '.join(available_grids())}")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    unknown = set(raw) - {"overrides", "grid", "launcher", "parallel", "jobs_per_gpu", "search"}
    if unknown:
        raise SystemExit(f"lra.sweep: {path} has unknown keys {sorted(unknown)}")
    fixed: dict[str, str] = {}
    for line in raw.get("overrides") or []:
        fixed[_key_of(line)] = str(line)
    axes = {str(k): [f"{k}={_scalar(v)}" for v in (vals if isinstance(vals, list) else [vals])]
            for k, vals in (raw.get("grid") or {}).items()}
    doc = "\n".join(l[2:] for l in path.read_text().splitlines() if l.startswith("# "))
    return Grid(name=name, overrides=fixed, axes=axes, launcher=raw.get("launcher"),
                parallel=int(raw.get("parallel") or 1), search=raw.get("search"), doc=doc,
                jobs_per_gpu=_positive_int("jobs_per_gpu", raw["jobs_per_gpu"]) if raw.get("jobs_per_gpu") is not None
                else None)


def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _parse(parser, line: str):
    """One override, or a one-line refusal naming it (Hydra's own error is a multi-line traceback)."""
    from hydra.errors import HydraException

    try:
        return parser.parse_override(str(line))
    except HydraException as e:
        raise SystemExit(f"lra.sweep: {line!r} is not an override ({str(e).splitlines()[0]}); give key=value, "
                         "a list key=a,b or a sweep key=range(0,3)") from None


def _key_of(line: str) -> str:
    return _parse(_parser(), line).get_key_element()


# ----------------------------------------------------------------------------- which sweep this is
NOT_DEFINING = ("force",)   # re-runs the same jobs: the same sweep
LAUNCH_ONLY = ("hydra/launcher", "hydra.launcher.", "hydra.verbose", "hydra/job_logging", "hydra/hydra_logging")


def _canonical(line: str) -> tuple[str, str]:
    """(key, value) of one override, the value as Hydra reads it: ``train.lr=1e-3`` and ``train.lr=0.001``
    are one entry, ``a=true`` and ``a=True`` too."""
    ov = _parse(_parser(), line)
    return ov.get_key_element(), json.dumps(ov.value(), sort_keys=True, default=str)


def definition(grid: Grid, hydra_ovs: list[str]) -> dict:
    """What a grid sweep is, whatever the spelling: its fixed overrides and axes (canonical values, the
    order of axes and values left out: they order the jobs, they do not make others; an axis of one
    value is a fixed override), and the Hydra overrides that reach the jobs. Left out: how the jobs are
    launched (launcher, its resources, parallel, jobs_per_gpu) and ``force`` (the same jobs again)."""
    fixed = dict(_canonical(v) for k, v in grid.overrides.items() if k not in grid.axes)
    axes = {}
    for k, values in grid.axes.items():
        canon = sorted({_canonical(v)[1] for v in values})
        if len(canon) == 1:
            fixed[k] = canon[0]
        else:
            axes[k] = canon
    fixed = {k: v for k, v in fixed.items() if k.lstrip("+~") not in NOT_DEFINING}
    hydra = sorted(o for o in hydra_ovs if not o.lstrip("+~").startswith(LAUNCH_ONLY))
    return {"kind": "grid", "grid": grid.name, "fixed": dict(sorted(fixed.items())),
            "axes": dict(sorted(axes.items())), "hydra": hydra}


def sweep_key(defn: dict) -> str:
    """10 hex digits of the definition's hash: the manifest's name (and a search's study name)."""
    return hashlib.sha256(json.dumps(defn, sort_keys=True, default=str).encode()).hexdigest()[:10]


def apply_cli(grid: Grid, args: list[str]) -> tuple[dict, list[str]]:
    """Fold command-line overrides into the grid. Returns (sweep options, hydra overrides)."""
    opts = {"parallel": None, "jobs_per_gpu": None, "dry_run": False, "n_trials": None, "progress": None}
    hydra_ovs: list[str] = []
    parser = _parser()
    grid.command = shlex.join(["python", "-m", "lra.sweep", *args])
    for arg in args:
        key = arg.split("=", 1)[0]
        if key in SWEEP_OPTIONS:
            value = arg.split("=", 1)[1] if "=" in arg else ""
            if key in ("parallel", "jobs_per_gpu", "n_trials"):
                opts[key] = _positive_int(key, value)
            elif key == "dry_run":
                opts["dry_run"] = switch(f"lra.sweep: {key}", value)
            elif key == "progress":
                opts[key] = _seconds(key, value)
            continue
        if grid.search is not None and arg.lstrip("~").startswith("search."):   # the search block itself
            grid.search = _edit_search(grid.search, arg)
            continue
        ov = _parse(parser, arg)
        k = ov.get_key_element()
        if ov.is_hydra_override() or k.lstrip("+~").startswith("hydra/"):
            hydra_ovs.append(arg)
        elif ov.is_sweep_override():
            if grid.search is not None:   # a search-space entry (choice, range, interval): lra.search reads it
                grid.search.setdefault("params", {})[k] = arg.split("=", 1)[1]
                grid.overrides.pop(k, None)
                continue
            if not ov.is_discrete_sweep():
                raise SystemExit(f"lra.sweep: {arg!r}: a grid takes lists of values (a,b,c or range()); "
                                 "intervals belong to a search")
            grid.axes[k] = [f"{k}={v}" for v in ov.sweep_string_iterator()]
            grid.overrides.pop(k, None)
        else:
            if k in grid.axes:
                del grid.axes[k]
            if grid.search is not None:   # a fixed value replaces that search parameter
                params = grid.search.get("params") or {}
                for name in [n for n in params if n.lstrip("+~") == k.lstrip("+~")]:
                    del params[name]
            grid.overrides.pop(k, None)
            grid.overrides[k] = arg
    return opts, hydra_ovs


def _positive_int(key: str, value) -> int:
    try:
        n = int(str(value))
    except ValueError:
        n = 0
    if n < 1:
        raise SystemExit(f"lra.sweep: {key}={value}: give a whole number >= 1")
    return n


def switch(what: str, value: str) -> bool:
    """A true/false option: ``dry_run=ture`` must not run the sweep for real. A bare ``dry_run`` is true."""
    if value.lower() in ("true", ""):
        return True
    if value.lower() == "false":
        return False
    raise SystemExit(f"{what}={value}: give true or false")


def _seconds(key: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    if not (x >= 0 and x != float("inf")):   # NaN fails every comparison: refused with the rest
        raise SystemExit(f"lra.sweep: {key}={value}: give a number of seconds >= 0 (0: a line on changes only)")
    return x


def _edit_search(search: dict, arg: str) -> dict:
    """``search.pruner.name=hyperband`` sets, ``~search.pruner.n_startup_trials`` deletes a key of the block."""
    key, _, value = arg.lstrip("~").partition("=")
    if key.startswith("search.params."):   # a parameter's name holds dots (train.lr): one key
        params = dict(search.get("params") or {})
        name = key[len("search.params."):]
        if arg.startswith("~"):
            if name not in params:
                raise SystemExit(f"lra.sweep: {arg!r}: the search has no parameter {name!r} ({', '.join(params)})")
            del params[name]
        else:
            params[name] = value
        return {**search, "params": params}
    cfg = OmegaConf.create({"search": search})
    if arg.startswith("~"):
        path = arg[1:].split("=", 1)[0].split(".")
        node = OmegaConf.select(cfg, ".".join(path[:-1]))
        if node is None or path[-1] not in node:
            raise SystemExit(f"lra.sweep: {arg!r}: the search has no {'.'.join(path)}")
        del node[path[-1]]
    else:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([arg]))
    return OmegaConf.to_container(cfg, resolve=False)["search"]


def command(args: list[str], run) -> int:
    """``python -m lra.sweep`` / ``lra.search`` once the flags are checked: the grid of ``grid=``, the command
    line folded in, ``run(grid, opts, hydra_ovs)``. A refusal is one line on stderr and exit code 2 (75:
    the sweep is in use); an interruption before any job started is one line and 130/143."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)   # optuna's SQLite storage is chatty
    name = [a for a in args if a.startswith("grid=")][-1].split("=", 1)[1]
    grid = None
    try:
        grid = load_grid(name)
        opts, hydra_ovs = apply_cli(grid, args)
        return run(grid, opts, hydra_ovs)
    except Refusal as e:
        print(e, file=sys.stderr)
        raise
    except SystemExit as e:
        if isinstance(e.code, str):   # the sweep's one-line refusals: bad input, exit 2 (README)
            print(e.code, file=sys.stderr)
            raise Refusal(e.code) from None
        raise
    except KeyboardInterrupt as e:   # before any job started (run_grid and run_search say it themselves after)
        print(f"lra.sweep {name}: interrupted by {signal.Signals(signal_of(e)).name} before any job started; "
              f"resume with: {(grid.command if grid else '') or 'the same command'}", file=sys.stderr)
        return 128 + signal_of(e)


# ----------------------------------------------------------------------------- Hydra plumbing
class Composer:
    """Hydra's own config loader, as ``python -m lra.train -m`` would build it (job name "sweep")."""

    def __init__(self):
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        self._ctx = initialize_config_dir(config_dir=str(CONF_DIR), job_name="sweep", version_base="1.3")

    def __enter__(self):
        from hydra.core.global_hydra import GlobalHydra

        self._ctx.__enter__()
        self.hydra = GlobalHydra.instance().hydra
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def primary(self, overrides: list[str], logging: bool = False) -> DictConfig:
        """The multirun's own config (sweep dir, launcher, sweeper; its hydra overrides reach every job)."""
        from hydra.types import RunMode

        return self.hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN,
                                         with_log_configuration=logging)

    def job(self, primary: DictConfig, overrides: list[str]) -> tuple[DictConfig, Path]:
        """The job's config and run folder, exactly as the launcher will compose them."""
        from hydra.core.hydra_config import HydraConfig

        cfg = self.hydra.config_loader.load_sweep_config(primary, list(overrides))
        HydraConfig.instance().set_config(cfg)
        return cfg, Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)

    def context(self, cfg: DictConfig):
        from hydra.core.utils import setup_globals
        from hydra.types import HydraContext
        from hydra._internal.callbacks import Callbacks

        setup_globals()
        return HydraContext(config_loader=self.hydra.config_loader, callbacks=Callbacks(cfg))


def with_run_tag(overrides: list[str]) -> list[str]:
    """``overrides`` with the run folder's canonical tag (:func:`lra.config.run_tag`, what ``lra.train``
    names its folder by), so the launcher composes the folder the run will use: grid points that resolve
    to one configuration share it, whatever their spelling. A job that cannot be resolved keeps its
    overrides (it is reported as the run's own one-line error)."""
    ovs = [o for o in overrides if not o.startswith(("run_tag=", "hydra.", "hydra/"))]
    try:
        return [*overrides, f"run_tag={_quote(run_tag(ovs))}"]
    except ConfigError:
        return list(overrides)


def _quote(s: str) -> str:
    """A Hydra override value that stays one string whatever it holds (paths hold '=' and ',')."""
    return "'" + str(s).replace("\\", "\\\\").replace("'", "\\'") + "'"


def launcher_kind(cfg: DictConfig) -> str:
    target = str(cfg.hydra.launcher.get("_target_", ""))
    return "slurm" if target.endswith("SlurmLauncher") else "local" if target.endswith("LocalLauncher") else "basic"


def visible_gpus(env=None) -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES if set (ids or UUIDs), else nvidia-smi's list."""
    vis = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [d.strip() for d in vis.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(1 for line in out.splitlines() if line.startswith("GPU ")))]


def _gpu_count() -> int:
    return len(visible_gpus())


# ----------------------------------------------------------------------------- several runs per GPU
class ShareError(ValueError):
    """jobs_per_gpu cannot be honoured (one line: what, and what to do)."""


def gpu_of_slot(slot: int, jobs_per_gpu: int, gpus: list[str]) -> str:
    """Job slot s (0 <= s < parallel) runs on GPU s // k: slots 0..k-1 share the first GPU, and so on."""
    i = slot // jobs_per_gpu
    if i >= len(gpus):
        raise ShareError(f"job slot {slot} with jobs_per_gpu={jobs_per_gpu} needs GPU #{i}, but only "
                         f"{len(gpus)} are visible ({','.join(gpus) or 'none'})")
    return gpus[i]


def check_sharing(jobs_per_gpu: int, parallel: int, gpus: list[str], kind: str) -> None:
    """What jobs_per_gpu needs, checked before anything runs."""
    k = jobs_per_gpu
    if kind != "local":
        raise ShareError(f"jobs_per_gpu={k} shares the GPUs of this machine between the local launcher's parallel "
                         f"jobs; the {kind} launcher cannot: add hydra/launcher=local (or drop jobs_per_gpu)")
    if not gpus:
        raise ShareError(f"jobs_per_gpu={k}: no GPU visible here (CUDA_VISIBLE_DEVICES empty or nvidia-smi lists "
                         "none); set CUDA_VISIBLE_DEVICES=<ids> or drop jobs_per_gpu")
    if parallel > k * len(gpus):
        raise ShareError(f"parallel={parallel} with jobs_per_gpu={k} needs parallel <= jobs_per_gpu x GPUs = "
                         f"{k} x {len(gpus)} = {k * len(gpus)} (visible: {','.join(gpus)}); lower parallel or "
                         "raise jobs_per_gpu")


def device_total_gib(gpu: str, env=None) -> float | None:
    """torch's total_memory of one GPU (for hardware=auto), asked in a short child process so that this
    process holds no CUDA context on a card the runs share. None: no such CUDA device here."""
    code = "import torch; print(torch.cuda.get_device_properties(0).total_memory)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**(os.environ if env is None else env), "CUDA_VISIBLE_DEVICES": gpu})
        return int(out.stdout.strip().splitlines()[-1]) / 2 ** 30 if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def job_share(hw: dict, jobs_per_gpu: int, gpu: str, total_of=device_total_gib) -> dict | None:
    """One of k runs on ``gpu``: ``hardware.total_gib`` = T/k for it (lra.fit's budget becomes
    (T - k c) / (k (1 + m))) and its allocator limit T/k - c (lra/gpu_share.py derives both).
    ``hw``: the job's composed hardware profile. None: hardware=auto and the GPU is not here to ask."""
    k, name = jobs_per_gpu, hw.get("name")
    if str(hw.get("devices", 1)) != "1":
        raise ShareError(f"jobs_per_gpu={k} places single-GPU runs; this grid has trainer.devices={hw['devices']}: "
                         "drop one of the two")
    total = hw.get("total_gib")
    if total is None:
        if name != "auto":
            raise ShareError(f"jobs_per_gpu={k} with hardware={name}: the profile has no GPU memory to share; use "
                             "hardware=auto or a GPU profile (conf/hardware/, e.g. hardware=h100_80gb)")
        total = total_of(gpu)
        if total is None:
            return None
    context, margin = float(hw.get("cuda_context_gib") or 0.0), float(hw.get("allocator_margin") or 0.0)
    limit = limit_gib(total, context, k)
    if limit <= 0:
        raise ShareError(f"jobs_per_gpu={k} on hardware={name} ({float(total):.2f} GiB, a {context} GiB CUDA context "
                         f"per run) leaves {limit:.2f} GiB per run; lower jobs_per_gpu")
    return {"gpu": gpu, "total_gib": share_gib(total, k), "limit_gib": round(limit, 6),
            "budget_gib": budget_gib(total, context, margin, k), "profile_total_gib": float(total)}


def share_plan(todo: list, jobs_per_gpu: int, parallel: int, gpus: list[str], total_of=device_total_gib) -> list:
    """(GPU, share) of each job to run, as :func:`launch` places them: batches of ``parallel``, the
    i-th job in slot i % parallel."""
    totals: dict[str, float | None] = {}

    def cached(gpu):   # hardware=auto: ask each GPU once
        if gpu not in totals:
            totals[gpu] = total_of(gpu)
        return totals[gpu]

    out = []
    for i, j in enumerate(todo):
        gpu = gpu_of_slot(i % parallel, jobs_per_gpu, gpus)
        out.append((gpu, job_share(j.hw or {}, jobs_per_gpu, gpu, total_of=cached)))
    return out


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
    info = _read_json(marker) or {}
    name = str(hc.job.override_dirname)
    tag = cfg.get("run_tag")
    if tag is not None and info.get("run_tag") not in (None, tag):  # run_tag names the folder: never happens
        raise RuntimeError(f"run folder collision: {run_dir} holds a run of [{info['run_tag']}], this job is [{tag}]")
    if rank0:
        info.update(attempts=int(info.get("attempts", 0)) + 1, host=socket.gethostname(), pid=os.getpid(),
                    slurm_job=_slurm_job_id(), started=_now(), t_start=time.time(), finished=None, t_end=None,
                    returncode=None,
                    overrides=overrides, override_dirname=name, run_tag=tag)
        write_json(marker, info)
    env = dict(os.environ)
    extra = _assign_gpus(env, int(hc.job.get("num") or 0), cfg)
    given = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in {e.split("=", 1)[0] for e in extra}]
    cmd = [sys.executable, "-m", "lra.train", *given, *extra, f"hydra.run.dir={_quote(run_dir)}"]
    log.info("%s", " ".join(shlex.quote(c) for c in cmd))
    _ctrl_c_for_the_run()
    proc = subprocess.Popen(cmd, env=env, cwd=str(hc.runtime.cwd or REPO_ROOT))
    try:
        rc = proc.wait()
    except BaseException:  # Ctrl-C, a scheduler's signal: let lra.train write its "interrupted" record
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)          # a Ctrl-C reached it too
        with contextlib.suppress(Exception):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        if proc.poll() is None:
            proc.kill()
        raise
    finally:
        if rank0:
            info.update(finished=_now(), t_end=time.time(), returncode=proc.poll())
            write_json(marker, info)
    rec = read_record(run_dir) or {}
    if rc != 0 or rec.get("status") not in FINISHED:
        raise RuntimeError(f"lra.train exited {rc}, status {rec.get('status')!r}: {rec.get('reason')} "
                           f"(log: {run_dir / 'train.log'})")
    return rec.get("best_val_acc")


def _ctrl_c_for_the_run() -> None:
    """A local launcher's job starts with SIGINT blocked (:func:`_ctrl_c_to_the_driver`). Its lra.train
    must still get a Ctrl-C to write its ``interrupted`` record: unblock it, with a do-nothing handler
    here (a handler is reset to the default in an exec'd child; this process just waits for lra.train
    and reports how it ended)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or threading.current_thread() is not threading.main_thread():
        return   # the basic launcher runs jobs in the driver: its Ctrl-C handling is the driver's
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _ctrl_c_to_the_driver(on: bool):
    """The local launcher starts a submitit controller per job, a child of the driver in the terminal's
    process group: a Ctrl-C would end each with a KeyboardInterrupt traceback on the sweep's console.
    Started while this thread blocks SIGINT, they keep it blocked (a blocked signal stays blocked across
    fork and exec; lra.train gets it back in :func:`_ctrl_c_for_the_run`). The driver still gets it: the
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


def _assign_gpus(env: dict, job_num: int, cfg: DictConfig) -> list[str]:
    """Parallel local jobs on a multi-GPU box: job k of a batch gets its own slice of the visible GPUs;
    with jobs_per_gpu=k (LRA_SWEEP_JOBS_PER_GPU) slot s gets GPU s // k and 1/k of its memory (the
    returned overrides for lra.train, and the allocator limit in LRA_MEMORY_LIMIT_GIB)."""
    parallel = int(env.get("LRA_SWEEP_PARALLEL") or 1)
    if env.get("LRA_SWEEP_JOBS_PER_GPU"):
        k = int(env["LRA_SWEEP_JOBS_PER_GPU"])
        # the driver's list: submitit_local would hand every job GPUs 0..n-1 whatever the driver's mask
        gpus = [d for d in env.get("LRA_SWEEP_GPUS", "").split(",") if d.strip()] or visible_gpus(env)
        gpu = gpu_of_slot(job_num % parallel, k, gpus)
        share = job_share(_hw_of(cfg), k, gpu, total_of=lambda g: device_total_gib(g, env))
        if share is None:
            raise ShareError(f"hardware=auto: GPU {gpu} did not report its memory to torch.cuda; name a GPU profile "
                             "(e.g. hardware=h100_80gb)")
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env[MEMORY_LIMIT_ENV] = f"{share['limit_gib']:.6f}"
        log.info("GPU %s shared by up to %d runs: hardware.total_gib=%s (fit budget %.2f GiB), allocator limit "
                 "%.2f GiB", gpu, k, share["total_gib"], share["budget_gib"], share["limit_gib"])
        return [f"hardware.total_gib={share['total_gib']}"]
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    per_job = cfg.trainer.devices if isinstance(cfg.trainer.devices, int) and cfg.trainer.devices > 0 else 1
    if parallel > 1 and env.get("SUBMITIT_EXECUTOR") == "local" and len(visible) >= parallel * per_job:
        slot = job_num % parallel
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[slot * per_job:(slot + 1) * per_job])
    return []


def _slurm_job_id() -> str | None:
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return os.environ.get("SLURM_JOB_ID")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _alive(info: dict | None) -> bool:
    """Is the job that wrote this marker still running (same host: its pid; SLURM: squeue)?"""
    if not info or info.get("finished"):
        return False
    if info.get("slurm_job"):
        try:
            out = subprocess.run(["squeue", "-h", "-j", str(info["slurm_job"])], capture_output=True, text=True,
                                 timeout=30)
            return out.returncode == 0 and bool(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            return False
    if info.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return True


def stop_jobs(run_dirs: list[Path], signum: int, grace_s: float | None = None, wait_s: float = 60.0,
              poll_s: float = 0.2) -> list[int]:
    """After the driver was interrupted: give the runs still holding their folders ``grace_s`` to end by
    themselves (a Ctrl-C, ``timeout`` or a scheduler signals the whole process group: each lra.train
    writes its ``interrupted`` record), then send ``signum`` to those still there (the driver alone was
    signalled) and wait up to ``wait_s``. Returns the pids signalled. Runs on other hosts (SLURM) are
    left to the scheduler; a second signal to a run busy writing its record is what the grace avoids."""
    run_dirs = [Path(d) for d in run_dirs if d is not None]
    grace_s = STOP_GRACE_S if grace_s is None else grace_s

    def holders() -> dict[Path, int]:
        return {d: pid for d in run_dirs if (pid := holder_pid(d)) is not None}

    def busy() -> bool:   # a run, or the job process around it that has yet to mark its folder finished
        return bool(holders()) or any(_job_here(_read_json(d / MARKER)) for d in run_dirs)

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
    return sent


def _job_here(info: dict | None) -> bool:
    """A job process on this host that has not marked its folder finished (SLURM jobs: not waited for)."""
    return bool(info) and not info.get("finished") and not info.get("slurm_job") and _alive(info)


def run_status(run_dir: Path) -> tuple[str, dict]:
    """(status, record or {}) of a run folder."""
    try:
        rec = read_record(run_dir) or {}
    except ValueError:
        rec = {"status": "unreadable"}
    if rec.get("status") in FINISHED:
        return rec["status"], rec
    if _alive(_read_json(run_dir / MARKER)):
        return "running", rec
    if rec.get("status") and rec["status"] != "running":   # "running" with nobody on it: killed
        return rec["status"], rec
    if (run_dir / MARKER).exists() or (run_dir / "checkpoints").exists():
        return "interrupted", rec
    return "pending", rec


# ----------------------------------------------------------------------------- manifest
@dataclass
class Job:
    overrides: list[str]
    run_dir: Path | None = None
    task: str | None = None
    attn: str | None = None
    seed: int | None = None
    preset: str | None = None
    error: str | None = None
    status: str = "pending"
    record: dict = field(default_factory=dict)
    data: tuple | None = None            # (task config, data root): what lra.data prepares for it
    hw: dict | None = None               # its hardware profile and trainer.devices (jobs_per_gpu shares)

    def refresh(self) -> None:
        if self.run_dir is not None:
            self.status, self.record = run_status(self.run_dir)

    def row(self, root: Path) -> dict:
        r = self.record
        marker = _read_json(self.run_dir / MARKER) if self.run_dir else None
        return {"run_dir": _rel(self.run_dir, root) if self.run_dir else None, "overrides": self.overrides,
                "task": self.task, "attn": self.attn, "seed": self.seed, "status": self.status,
                "error": self.error, "reason": r.get("reason"), "test_acc": r.get("test_acc"),
                "best_val_acc": r.get("best_val_acc"), "steps": r.get("steps"),
                "train_time_s": r.get("train_time_s"), "attempts": (marker or {}).get("attempts", 0)}


def _rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def counts(jobs: list[Job]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        key = "invalid" if j.error else j.status
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _job_ids(rows: list[dict]) -> list[str]:
    """The jobs of a manifest, by run folder (or, for an invalid job, its overrides)."""
    return sorted(r.get("run_dir") or " ".join(r.get("overrides") or []) for r in rows)


def find_manifest(folder: Path, key: str, jobs: list[Job], root: Path) -> tuple[Path, dict]:
    """(the sweep's manifest, what an earlier invocation left in it). ``manifest-<key>.json`` when there;
    else a version-1 ``manifest.json`` (one per grid) listing exactly these jobs is taken over: its
    creation time and invocations carry into the new file, and the old file stays as it is."""
    path = folder / f"manifest-{key}.json"
    if path.exists():
        return path, _read_json(path) or {}
    legacy = _read_json(folder / LEGACY_MANIFEST) or {}
    ours = _job_ids([{"run_dir": _rel(j.run_dir, root) if j.run_dir else None, "overrides": j.overrides}
                     for j in jobs])
    if legacy.get("kind", "grid") == "grid" and legacy.get("jobs") and _job_ids(legacy["jobs"]) == ours:
        return path, {"created": legacy.get("created"), "invocations": legacy.get("invocations", []),
                      "migrated_from": LEGACY_MANIFEST}
    return path, {}


def write_manifest(path: Path, head: dict, jobs: list[Job], root: Path, previous: dict | None = None) -> None:
    """Every job's row as its folder says now; ``previous``: what to carry over when ``path`` is new."""
    old = _read_json(path) or previous or {}
    body = {"schema_version": MANIFEST_VERSION, "created": old.get("created") or _now(), "updated": _now(),
            "runs_root": str(root), **head, "invocations": old.get("invocations", []),
            **({"migrated_from": old["migrated_from"]} if old.get("migrated_from") else {}),
            "counts": counts(jobs), "jobs": [j.row(root) for j in jobs]}
    if head.get("invocation"):
        body["invocations"] = body["invocations"] + [head["invocation"]]
        del body["invocation"]
    write_json(path, body)


@contextlib.contextmanager
def sweep_lock(folder: Path):
    """One driver per sweep on a host: a second `make sweep` of the same grid waits for nobody, it stops."""
    lock = folder / ".lock"
    info = _read_json(lock)
    if info and info.get("host") == socket.gethostname() and info.get("pid") != os.getpid() and _alive(info):
        raise Refusal(f"lra.sweep: {folder.name} is already being run by pid {info['pid']} on this host "
                      f"(since {info.get('started')}); wait for it, or remove {lock} if that is wrong", code=75)
    if info and info.get("host") != socket.gethostname():
        log.warning("%s was last driven from %s; make sure that driver is gone", folder, info.get("host"))
    folder.mkdir(parents=True, exist_ok=True)
    write_json(lock, {"host": socket.gethostname(), "pid": os.getpid(), "started": _now()})
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


# ----------------------------------------------------------------------------- progress
def fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.0f} s" if x < 600 else f"{x / 60:.0f} min" if x < 5400 else f"{x / 3600:.1f} h"


def eta_s(pending: int, parallel: int, durations, running_elapsed) -> float | None:
    """Seconds left if every job takes the mean duration of those done so far (None before the first):
    what the running jobs still need plus the pending ones, spread over ``parallel`` slots."""
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    left = sum(max(mean - e, 0.0) for e in running_elapsed) + pending * mean
    return left / max(int(parallel), 1)


class Progress:
    """The sweep's status line while it waits: printed when the counts change and every ``every_s``
    seconds otherwise (``progress=0``: on changes only)."""

    def __init__(self, label: str, parallel: int = 1, every_s: float = 30.0, clock=time.monotonic, emit=None):
        self.label, self.parallel, self.every_s, self.clock = label, parallel, float(every_s), clock
        self.emit = emit or (lambda line: print(line, flush=True))
        self._last: tuple | None = None
        self._t = -float("inf")

    def update(self, done: int, running: int, failed: int, pending: int, durations=(),
               running_elapsed=()) -> str | None:
        counts = (done, running, failed, pending)
        now = self.clock()
        if counts == self._last and (self.every_s <= 0 or now - self._t < self.every_s):
            return None
        mean = sum(durations) / len(durations) if durations else None
        eta = eta_s(pending, self.parallel, durations, running_elapsed)
        line = (f"[{self.label}] {done} done, {running} running, {failed} failed, {pending} pending; "
                + (f"mean {fmt_s(mean)}/job, ETA {fmt_s(eta)}" if mean is not None else "ETA after the first job"))
        self.emit(line)
        self._last, self._t = counts, now
        return line


def job_progress(run_dir: Path, since: float, now: float) -> tuple[str, float | None]:
    """(done|failed|running|pending, duration or elapsed) of a grid job in THIS invocation (started
    after ``since``), from its ``.sweep_job.json``: cheap enough to poll (no squeue, no pid check)."""
    info = _read_json(Path(run_dir) / MARKER) or {}
    if float(info.get("t_start") or 0) < since:
        return "pending", None
    if info.get("t_end") is None:
        return "running", now - float(info["t_start"])
    rec = _read_json(Path(run_dir) / "result.json") or {}
    return ("done" if rec.get("status") in FINISHED else "failed"), float(info["t_end"]) - float(info["t_start"])


class GridWatch(threading.Thread):
    """Polls the launched jobs' folders while the Hydra launcher blocks, feeding :class:`Progress`."""

    def __init__(self, run_dirs: list[Path], progress: Progress, since: float, poll_s: float = 2.0):
        super().__init__(daemon=True, name="lra.sweep progress")
        self.run_dirs, self.progress, self.since, self.poll_s = list(run_dirs), progress, since, poll_s
        self._halt = threading.Event()

    def tick(self) -> str | None:
        now = time.time()
        states = {"done": [], "failed": [], "running": [], "pending": []}
        for d in self.run_dirs:
            state, secs = job_progress(d, self.since, now)
            states[state].append(secs)
        return self.progress.update(len(states["done"]), len(states["running"]), len(states["failed"]),
                                    len(states["pending"]), durations=states["done"],
                                    running_elapsed=states["running"])

    def run(self) -> None:
        while not self._halt.wait(self.poll_s):
            with contextlib.suppress(Exception):   # a half-visible file on a network disk: next tick
                self.tick()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


# ----------------------------------------------------------------------------- grid sweeps
def _wandb_group(name: str, jobs_ovs: list[list[str]]) -> list[str]:
    """W&B groups the runs of a sweep: conf/logger/wandb.yaml reads WANDB_RUN_GROUP, set in every job."""
    if any(o.startswith("logger=") and "wandb" in o for ovs in jobs_ovs for o in ovs) and "WANDB_RUN_GROUP" not in os.environ:
        return [f"++hydra.job.env_set.WANDB_RUN_GROUP={name}"]
    return []


def plan(grid: Grid, hydra_ovs: list[str], composer: Composer) -> tuple[DictConfig, list[Job]]:
    job_lists = grid.jobs()
    if not job_lists:
        raise SystemExit(f"lra.sweep: grid {grid.name} has no jobs")
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
            job.hw = _hw_of(cfg)
        except Exception as e:  # noqa: BLE001 - an unknown task/attn: reported, the rest still runs
            job.error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        jobs.append(job)
    seen: dict[Path, Job] = {}
    for j in jobs:
        if j.run_dir is None:
            continue
        if j.run_dir in seen:
            raise SystemExit(f"lra.sweep: two jobs of grid {grid.name} name one run folder, {j.run_dir}: "
                             f"[{' '.join(seen[j.run_dir].overrides)}] and [{' '.join(j.overrides)}] are one "
                             f"configuration, or differ only in how a run executes (lra.config.UNTAGGED); remove "
                             f"one of the grid's values")
        seen[j.run_dir] = j
    return primary, jobs


def _hw_of(cfg: DictConfig) -> dict:
    hw = OmegaConf.to_container(cfg.hardware, resolve=True)
    return {"name": hw.get("name"), "total_gib": hw.get("total_gib"), "cuda_context_gib": hw.get("cuda_context_gib"),
            "allocator_margin": hw.get("allocator_margin"),
            "devices": OmegaConf.to_container(cfg.trainer, resolve=True).get("devices", 1)}


def sweep_folder(root: Path, grid: Grid, jobs: list[Job]) -> Path:
    presets = {j.preset for j in jobs if j.preset}
    return root / (presets.pop() if len(presets) == 1 else "") / "sweeps" / grid.name


def plain_hydra_command(grid: Grid, hydra_ovs: list[str]) -> str:
    fixed = [v for k, v in grid.overrides.items() if k not in grid.axes]
    axes = [f"{k}={','.join(v.split('=', 1)[1] for v in vals)}" for k, vals in grid.axes.items()]
    return " ".join(shlex.quote(a) for a in ["python", "-m", "lra.train", "-m", *fixed, *axes, *hydra_ovs])


def run_grid(grid: Grid, opts: dict, hydra_ovs: list[str]) -> int:
    t0 = time.time()
    if grid.launcher and not any(o.startswith("hydra/launcher=") for o in hydra_ovs):
        hydra_ovs = [f"hydra/launcher={grid.launcher}"] + hydra_ovs
    k = opts.get("jobs_per_gpu") or grid.jobs_per_gpu
    gpus = visible_gpus() if k else []
    parallel = opts["parallel"] or (k * len(gpus) if k and gpus else grid.parallel)
    defn = definition(grid, hydra_ovs)
    key = sweep_key(defn)
    with interruptible(), Composer() as composer:
        primary, jobs = plan(grid, hydra_ovs, composer)
        root = Path(str(primary.runs_root))
        folder = sweep_folder(root, grid, jobs)
        for j in jobs:
            j.refresh()
        force = any(o in ("force=true", "force=True") for o in jobs[0].overrides) if jobs else False
        todo = [j for j in jobs if not j.error and j.status != "running" and (force or j.status not in FINISHED)]
        kind = launcher_kind(primary)
        shares = None
        if k:
            try:
                check_sharing(k, parallel, gpus, kind)
                shares = share_plan(todo, k, parallel, gpus)
            except ShareError as e:
                raise SystemExit(f"lra.sweep: {e}") from None
            if not opts["dry_run"] and any(s is None for _, s in shares):
                raise SystemExit(f"lra.sweep: jobs_per_gpu={k} with hardware=auto: a GPU of {','.join(gpus)} did not "
                                 "report its memory to torch.cuda; check the GPUs or name a profile (hardware=h100_80gb)")
        if opts["dry_run"]:
            _print_plan(grid, jobs, todo, root, kind, parallel, hydra_ovs, k, gpus, shares)
            path, previous = find_manifest(folder, key, jobs, root)
            state = "exists" if path.exists() else f"new, taking over {LEGACY_MANIFEST}" if previous else "new"
            print(f"manifest: {path} ({state})")
            return 0
        with sweep_lock(folder):
            manifest, previous = find_manifest(folder, key, jobs, root)
            head = {"grid": grid.name, "kind": "grid", "key": key, "definition": defn, "command": grid.command,
                    "launcher": kind, "parallel": parallel, "plain_hydra_command": plain_hydra_command(grid, hydra_ovs),
                    **({"jobs_per_gpu": k, "gpus": gpus} if k else {})}
            write_manifest(manifest, head, jobs, root, previous)
            skipped = len(jobs) - len(todo)
            print(f"lra.sweep {grid.name}: {len(jobs)} jobs, {len(todo)} to run, {skipped} skipped "
                  f"({_fmt_counts(counts(jobs))}); launcher {kind}, {parallel} at a time"
                  + (f", {k} per GPU on GPUs {','.join(gpus)}" if k else "") + f"; manifest {manifest}",
                  flush=True)
            stopped = None
            try:
                if todo and (kind == "slurm" or (kind == "local" and parallel > 1)):
                    prepare_data(todo)
                if todo:
                    launch(composer, primary, grid, todo, kind, parallel, folder, hydra_ovs, manifest, head, jobs,
                           root, every_s=opts["progress"] if opts["progress"] is not None else 30.0,
                           jobs_per_gpu=k, gpus=gpus)
            except KeyboardInterrupt as e:   # SIGINT or SIGTERM (interruptible): stop the jobs, then the truth
                stopped = signal_of(e)
                stop_jobs([j.run_dir for j in todo], stopped)
            for j in jobs:   # each job's status as its folder says now, whatever the launcher reported
                j.refresh()
            wall = time.time() - t0
            inv = {"started": _dt.datetime.fromtimestamp(t0, _dt.timezone.utc).isoformat(timespec="seconds"),
                   "wall_s": round(wall, 1), "launched": len(todo), "skipped": skipped, "command": grid.command,
                   **({"interrupted": signal.Signals(stopped).name} if stopped else {})}
            write_manifest(manifest, {**head, "invocation": inv}, jobs, root)
    if stopped:
        print(interrupted_line(grid.name, stopped, counts(jobs), grid.command), file=sys.stderr, flush=True)
        return 128 + stopped
    _print_summary(grid, jobs, todo, root, manifest, wall)
    if any(o.startswith("logger=") and "wandb" in o for o in (jobs[0].overrides if jobs else [])):
        from lra.wandb_extras import log_sweep_table

        with contextlib.suppress(Exception):
            log_sweep_table(_read_json(manifest), folder)
    return 0 if all(j.status in FINISHED for j in jobs) else 1


def interrupted_line(name: str, signum: int, job_counts: dict[str, int], command: str) -> str:
    """The one line an interrupted sweep ends with: what happened, where its jobs stand, how to go on."""
    return (f"lra.sweep {name}: interrupted by {signal.Signals(signum).name}: {_fmt_counts(job_counts)}; "
            f"resume with: {command or 'the same command'}")


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
        except Exception as e:  # noqa: BLE001 - the job reports it with the data module's own message
            log.warning("could not prepare data for %s here: %s", j.task, str(e).splitlines()[0])


def launch(composer: Composer, primary: DictConfig, grid: Grid, todo: list[Job], kind: str, parallel: int,
           folder: Path, hydra_ovs: list[str], manifest: Path, head: dict, jobs: list[Job], root: Path,
           every_s: float = 30.0, jobs_per_gpu: int | None = None, gpus: list[str] | None = None) -> None:
    from hydra.core.plugins import Plugins

    extra = [f"++hydra.job.env_set.LRA_SWEEP_PARALLEL={parallel}", "hydra.output_subdir=null"]
    if jobs_per_gpu:   # run_job places each slot (and divides the memory) from these
        extra += [f"++hydra.job.env_set.LRA_SWEEP_JOBS_PER_GPU={jobs_per_gpu}",
                  f"++hydra.job.env_set.LRA_SWEEP_GPUS={_quote(','.join(gpus or []))}"]
    if kind in ("local", "slurm"):
        if not any(o.startswith("hydra.launcher.submitit_folder=") for o in hydra_ovs):
            extra.append(f"hydra.launcher.submitit_folder={_quote(folder / '.submitit' / '%j')}")
        extra += _resources(kind, primary, todo, hydra_ovs, parallel)
    primary = composer.primary(list(primary.hydra.overrides.hydra) + extra + list(primary.hydra.overrides.task),
                               logging=True)
    ctx = composer.context(primary)
    ctx.callbacks.on_multirun_start(config=primary, config_name="config")
    launcher = Plugins.instance().instantiate_launcher(hydra_context=ctx, task_function=run_job, config=primary)
    OmegaConf.save(primary, folder / f"multirun-{head['key']}.yaml")
    size = len(todo) if kind == "slurm" else (parallel if kind == "local" else 1)
    slots = (parallel if parallel > 1 else len(todo)) if kind == "slurm" else size
    watch = GridWatch([j.run_dir for j in todo], Progress(f"lra.sweep {grid.name}", parallel=slots,
                                                           every_s=every_s), since=time.time() - 5)
    watch.start()
    idx = 0
    try:
        with _ctrl_c_to_the_driver(kind == "local"):
            for start in range(0, len(todo), size):
                batch = todo[start:start + size]
                try:
                    launcher.launch([j.overrides for j in batch], initial_job_idx=idx)
                except Exception as e:  # noqa: BLE001 - a job killed hard (OOM, node lost): the others go on
                    log.error("a job of this batch died without a result (%s: %s); its folder keeps what it wrote",
                              type(e).__name__, e)
                idx += len(batch)
                for j in batch:
                    j.refresh()
                write_manifest(manifest, head, jobs, root)
    finally:   # interrupted too: no progress line after the sweep's last word
        watch.stop()
    watch.tick()
    ctx.callbacks.on_multirun_end(config=primary, config_name="config")


def _resources(kind: str, primary: DictConfig, todo: list[Job], hydra_ovs: list[str], parallel: int) -> list[str]:
    given = {o.split("=", 1)[0] for o in hydra_ovs}
    out = []
    if kind == "local" and "hydra.launcher.gpus_per_node" not in given and primary.hydra.launcher.get("gpus_per_node") is None:
        gpus = _gpu_count()  # submitit_local hides every GPU unless told how many the job gets
        if gpus:
            out.append(f"hydra.launcher.gpus_per_node={gpus}")
    if kind == "slurm":
        if "hydra.launcher.array_parallelism" not in given and parallel > 1:
            out.append(f"hydra.launcher.array_parallelism={parallel}")
        devices = {str(o.split("=", 1)[1]) for j in todo for o in j.overrides if o.startswith("trainer.devices=")}
        if len(devices) == 1:
            n = devices.pop()
            if n.isdigit() and int(n) > 1:   # Lightning on SLURM: one task per device
                for key in ("tasks_per_node", "gpus_per_node"):
                    if f"hydra.launcher.{key}" not in given:
                        out.append(f"hydra.launcher.{key}={n}")
    return out


def _fmt_counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in c.items())


def _print_plan(grid, jobs, todo, root, kind, parallel, hydra_ovs, jobs_per_gpu=None, gpus=(), shares=None) -> None:
    print(f"grid {grid.name}: {len(jobs)} jobs ({_fmt_counts(counts(jobs))}); would run {len(todo)} with "
          f"launcher {kind}, {parallel} at a time"
          + (f", {jobs_per_gpu} per GPU on GPUs {','.join(gpus)} (slot s on GPU s // {jobs_per_gpu}; each run "
             f"hardware.total_gib = total / {jobs_per_gpu}, fit budget (total - {jobs_per_gpu} x context) / "
             f"({jobs_per_gpu} x (1 + margin)))" if jobs_per_gpu else ""))
    placed = dict(zip(map(id, todo), shares or []))
    for j in jobs:
        where = _rel(j.run_dir, root) if j.run_dir else f"{' '.join(j.overrides)}: {j.error}"
        print(f"  {'run ' if j in todo else 'skip'} {j.status if not j.error else 'invalid':12s} {where}"
              + (_fmt_share(*placed[id(j)]) if id(j) in placed else ""))
    print("plain Hydra equivalent (no manifest, finished runs return at once):\n  "
          + plain_hydra_command(grid, hydra_ovs))


def _fmt_share(gpu: str, share: dict | None) -> str:
    if share is None:
        return f"  [GPU {gpu}; hardware=auto: budget from the GPU's memory at run time]"
    return (f"  [GPU {gpu}; hardware.total_gib={share['total_gib']:g}: fit budget {share['budget_gib']:.2f} GiB, "
            f"allocator limit {share['limit_gib']:.2f} GiB]")


def _print_summary(grid, jobs, todo, root, manifest, wall) -> None:
    c = counts(jobs)
    print(f"\nlra.sweep {grid.name}: {len(jobs)} jobs in {wall:.0f} s: {_fmt_counts(c)} "
          f"({len(todo)} launched this time)")
    for j in jobs:
        if j.error:
            print(f"  invalid  {' '.join(j.overrides)}: {j.error}")
        elif j.status not in FINISHED:
            print(f"  {j.status:8s} {_rel(j.run_dir, root)}: {j.record.get('reason') or ''}")
    print(f"manifest: {manifest}\ntables:   make tables (python -m lra.collect)")
    if any(j.status not in FINISHED for j in jobs):
        print("run the same command again to finish the rest (finished runs are skipped, interrupted ones resume)")
