"""The grid file (conf/sweep/<name>.yaml), the command line folded into it, and which sweep it defines (its key)."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import re
import shlex
from dataclasses import dataclass

from omegaconf import OmegaConf

from lra.config import ConfigError
from lra.naming import run_tag
from lra.tools.sweep.base import GRID_DIR, MIN_START_S, SWEEP_OPTIONS

log = logging.getLogger("lra.tools.sweep")


# ----------------------------------------------------------------------------- the grid file
@dataclass
class Grid:
    name: str
    overrides: dict[str, str]  # key -> "key=value", fixed for every job
    axes: dict[str, list[str]]  # key -> ["key=v1", "key=v2", ...]
    launcher: str | None = None  # conf/hydra/launcher entry (None: Hydra's basic launcher)
    parallel: int = 1
    jobs_per_gpu: int | None = None  # k runs share each GPU (None: each parallel job its own GPUs)
    search: dict | None = None  # {n_trials, params: {key: "interval(..)"}, sampler, pruner, storage}
    doc: str = ""
    command: str = ""  # the lra.tools.sweep command line that runs it (apply_cli): the resume line
    order: list[str] | None = None  # the axes from slowest to fastest (None: as the grid lists them)

    def jobs(self) -> list[list[str]]:
        """Every point of the grid, in the order the jobs start: the product of the axes taken in ``order``
        (the first varies slowest), each axis's values as listed. ``order: [seed, task, attn]`` with
        ``task: [listops, text, ...]`` runs seed 0 of every ListOps row before Text, and seed 1 last."""
        fixed = [v for k, v in self.overrides.items() if k not in self.axes]
        keys = [k for k in (self.order or []) if k in self.axes]
        keys += [k for k in self.axes if k not in keys]
        return [fixed + list(point) for point in itertools.product(*(self.axes[k] for k in keys))]


def available_grids() -> list[str]:
    return sorted(p.stem for p in GRID_DIR.glob("*.yaml"))


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def load_grid(name: str) -> Grid:
    path = GRID_DIR / f"{name}.yaml"
    if not path.exists():
        raise SystemExit(
            f"lra.tools.sweep: no grid {name!r} (conf/sweep/{name}.yaml); available: " f"{', '.join(available_grids())}"
        )
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    unknown = set(raw) - {"overrides", "grid", "launcher", "parallel", "jobs_per_gpu", "search", "order"}
    if unknown:
        raise SystemExit(f"lra.tools.sweep: {path} has unknown keys {sorted(unknown)}")
    fixed: dict[str, str] = {}
    for line in raw.get("overrides") or []:
        fixed[_key_of(line)] = str(line)
    axes = {
        str(k): [f"{k}={_scalar(v)}" for v in (vals if isinstance(vals, list) else [vals])]
        for k, vals in (raw.get("grid") or {}).items()
    }
    doc = "\n".join(ln[2:] for ln in path.read_text().splitlines() if ln.startswith("# "))
    return Grid(
        name=name,
        overrides=fixed,
        axes=axes,
        launcher=raw.get("launcher"),
        parallel=int(raw.get("parallel") or 1),
        search=raw.get("search"),
        doc=doc,
        order=_order(path, raw.get("order"), axes),
        jobs_per_gpu=_positive_int("jobs_per_gpu", raw["jobs_per_gpu"])
        if raw.get("jobs_per_gpu") is not None
        else None,
    )


def _order(path, order, axes: dict) -> list[str] | None:
    """The grid file's ``order``: a list of its axes (slowest first); others follow in the file's order."""
    if order is None:
        return None
    if not isinstance(order, list) or any(str(k) not in axes for k in order):
        raise SystemExit(
            f"lra.tools.sweep: {path}: order must list axes of its grid ({', '.join(axes)}), slowest first; "
            f"got {order!r}"
        )
    return [str(k) for k in order]


def override_parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _parse(parser, line: str):
    """One override, or a one-line refusal naming it (Hydra's own error is a multi-line traceback)."""
    from hydra.errors import HydraException

    try:
        return parser.parse_override(str(line))
    except HydraException as e:
        raise SystemExit(
            f"lra.tools.sweep: {line!r} is not an override ({str(e).splitlines()[0]}); give key=value, "
            "a list key=a,b or a sweep key=range(0,3)"
        ) from None


def _key_of(line: str) -> str:
    return _parse(override_parser(), line).get_key_element()


# ----------------------------------------------------------------------------- which sweep this is
NOT_DEFINING = ("force", "name")  # re-runs the same jobs (a name is a label): the same sweep
LAUNCH_ONLY = ("hydra/launcher", "hydra.launcher.", "hydra.verbose", "hydra/job_logging", "hydra/hydra_logging")


def canonical(line: str) -> tuple[str, str]:
    """(key, value) of one override, the value as Hydra reads it: ``train.lr=1e-3`` and ``train.lr=0.001``
    are one entry, ``a=true`` and ``a=True`` too."""
    ov = _parse(override_parser(), line)
    return ov.get_key_element(), json.dumps(ov.value(), sort_keys=True, default=str)


def definition(grid: Grid, hydra_ovs: list[str]) -> dict:
    """What a grid sweep is, whatever the spelling: its fixed overrides and axes (canonical values, the
    order of axes and values left out: they order the jobs, they do not make others; an axis of one
    value is a fixed override), and the Hydra overrides that reach the jobs. Left out: how the jobs are
    launched (launcher, its resources, parallel, jobs_per_gpu) and ``force`` (the same jobs again)."""
    fixed = dict(canonical(v) for k, v in grid.overrides.items() if k not in grid.axes)
    axes = {}
    for k, values in grid.axes.items():
        canon = sorted({canonical(v)[1] for v in values})
        if len(canon) == 1:
            fixed[k] = canon[0]
        else:
            axes[k] = canon
    fixed = {k: v for k, v in fixed.items() if k.lstrip("+~") not in NOT_DEFINING}
    hydra = sorted(o for o in hydra_ovs if not o.lstrip("+~").startswith(LAUNCH_ONLY))
    return {
        "kind": "grid",
        "grid": grid.name,
        "fixed": dict(sorted(fixed.items())),
        "axes": dict(sorted(axes.items())),
        "hydra": hydra,
    }


def sweep_key(defn: dict) -> str:
    """10 hex digits of the definition's hash: the manifest's name (and a search's study name)."""
    return hashlib.sha256(json.dumps(defn, sort_keys=True, default=str).encode()).hexdigest()[:10]


def apply_cli(grid: Grid, args: list[str]) -> tuple[dict, list[str]]:
    """Fold command-line overrides into the grid. Returns (sweep options, hydra overrides)."""
    opts = {
        "parallel": None,
        "jobs_per_gpu": None,
        "dry_run": False,
        "n_trials": None,
        "progress": None,
        "budget": None,
        "carry": False,
        "probe": None,  # None: a budget probes what is not measured, a dry run does not (it runs nothing)
    }
    hydra_ovs: list[str] = []
    parser = override_parser()
    grid.command = shlex.join(["python", "-m", "lra.tools.sweep", *args])
    for arg in args:
        key = arg.split("=", 1)[0]
        if key in SWEEP_OPTIONS:
            value = arg.split("=", 1)[1] if "=" in arg else ""
            if key == "jobs_per_gpu" and value == "auto":
                opts[key] = "auto"  # the k share-bench measured best on this device (share.auto_jobs_per_gpu)
            elif key in ("parallel", "jobs_per_gpu", "n_trials"):
                opts[key] = _positive_int(key, value)
            elif key in ("dry_run", "carry", "probe"):
                opts[key] = switch(f"lra.tools.sweep: {key}", value)
            elif key == "budget":
                opts[key] = parse_budget(value)
            elif key == "progress":
                opts[key] = _seconds(key, value)
            continue
        if grid.search is not None and arg.lstrip("~").startswith("search."):  # the search block itself
            grid.search = _edit_search(grid.search, arg)
            continue
        ov = _parse(parser, arg)
        k = ov.get_key_element()
        if ov.is_hydra_override() or k.lstrip("+~").startswith("hydra/"):
            hydra_ovs.append(arg)
        elif ov.is_sweep_override():
            if grid.search is not None:  # a search-space entry (choice, range, interval): sweep/search.py reads it
                grid.search.setdefault("params", {})[k] = arg.split("=", 1)[1]
                grid.overrides.pop(k, None)
                continue
            if not ov.is_discrete_sweep():
                raise SystemExit(
                    f"lra.tools.sweep: {arg!r}: a grid takes lists of values (a,b,c or range()); "
                    "intervals belong to a search"
                )
            grid.axes[k] = [f"{k}={v}" for v in ov.sweep_string_iterator()]
            grid.overrides.pop(k, None)
        else:
            if k in grid.axes:
                del grid.axes[k]
            if grid.search is not None:  # a fixed value replaces that search parameter
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
        raise SystemExit(f"lra.tools.sweep: {key}={value}: give a whole number >= 1")
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
    if not (x >= 0 and x != float("inf")):  # NaN fails every comparison: refused with the rest
        raise SystemExit(f"lra.tools.sweep: {key}={value}: give a number of seconds >= 0 (0: a line on changes only)")
    return x


def parse_budget(value: str) -> float:
    """``budget=90s|10m|1.5h`` (a bare number: seconds) -> seconds, or a one-line refusal."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h)?\s*", str(value))
    x = float(m.group(1)) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)] if m else 0.0
    if not (x > 0 and math.isfinite(x)):
        raise SystemExit(f"lra.tools.sweep: budget={value}: give a time such as 600, 90s, 10m or 1.5h")
    if x < MIN_START_S:  # no job would start: nothing to do but refuse
        raise SystemExit(
            f"lra.tools.sweep: budget={value}: too short to do anything: a run needs about {MIN_START_S:.0f} s to "
            f"start and write its first record; give at least {MIN_START_S:.0f}s"
        )
    return x


def _edit_search(search: dict, arg: str) -> dict:
    """``search.pruner.name=hyperband`` sets, ``~search.pruner.n_startup_trials`` deletes a key of the block."""
    key, _, value = arg.lstrip("~").partition("=")
    if key.startswith("search.params."):  # a parameter's name holds dots (train.lr): one key
        params = dict(search.get("params") or {})
        name = key[len("search.params.") :]
        if arg.startswith("~"):
            if name not in params:
                raise SystemExit(
                    f"lra.tools.sweep: {arg!r}: the search has no parameter {name!r} ({', '.join(params)})"
                )
            del params[name]
        else:
            params[name] = value
        return {**search, "params": params}
    cfg = OmegaConf.create({"search": search})
    if arg.startswith("~"):
        path = arg[1:].split("=", 1)[0].split(".")
        node = OmegaConf.select(cfg, ".".join(path[:-1]))
        if node is None or path[-1] not in node:
            raise SystemExit(f"lra.tools.sweep: {arg!r}: the search has no {'.'.join(path)}")
        del node[path[-1]]
    else:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([arg]))
    return OmegaConf.to_container(cfg, resolve=False)["search"]


def with_run_tag(overrides: list[str]) -> list[str]:
    """``overrides`` with the run folder's canonical tag (:func:`lra.naming.run_tag`, what ``lra.train``
    names its folder by), so the launcher composes the folder the run will use: grid points that resolve
    to one configuration share it, whatever their spelling. A job that cannot be resolved keeps its
    overrides (it is reported as the run's own one-line error)."""
    ovs = [o for o in overrides if not o.startswith(("run_tag=", "hydra.", "hydra/"))]
    try:
        return [*overrides, f"run_tag={quote(run_tag(ovs))}"]
    except ConfigError:
        return list(overrides)


def quote(s: str) -> str:
    """A Hydra override value that stays one string whatever it holds (paths hold '=' and ',')."""
    return "'" + str(s).replace("\\", "\\\\").replace("'", "\\'") + "'"
