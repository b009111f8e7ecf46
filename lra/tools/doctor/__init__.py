"""``lra-doctor``: does the harness work on this machine, how fast, and at what cost (docs/doctor.md).

The environment, then six checks, each a list of one-line results with a status and a figure:

1. ``backends``: every registered backend's training step (forward, backward, AdamW) at each task's
   training shape on the device, eager and, where the run would compile, compiled: time and peak memory;
2. ``fit``: the memory fit's estimate against the measured peak of the same step, a few backends;
3. ``overhead``: the harness's time per optimizer step against a bare PyTorch loop, interleaved in one
   process (:mod:`lra.tools.doctor.overhead`);
4. ``compile``: compiled against eager, whole step, ListOps and Text;
5. ``resume``: a tiny run killed with SIGKILL and resumed, against an uninterrupted one
   (:mod:`lra.tools.doctor.resume`);
6. ``cost``: what each task of a preset will cost here (time per 1k steps x its step budget).

Statuses: ``pass``; ``warn`` (it ran, a figure is outside what the harness expects); ``fail`` (an error:
the line names the backend and the error, and the other items go on); ``skip`` (not asked here, or past
the check's time budget). Reports: ``report.md`` and ``report.json`` under ``doctor/<time>/`` of the
runs root. Exit code 1 when an item failed, else 0.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from lra.files import write_json, write_text
from lra.tools.doctor import checks
from lra.tools.doctor.base import CHECKS, STATUSES, Budget, Options, Result, one_line
from lra.tools.doctor.env import environment as read_environment
from lra.tools.doctor.env import lines as environment_lines

__all__ = ["CHECKS", "Options", "Result", "run", "write_report", "report_folder"]


def run(
    opts: Options,
    say: Callable[[str], None] = print,
    results: list[Result] | None = None,
    environment: dict | None = None,
) -> tuple[dict, list[Result]]:
    """The environment and the checks ``opts`` selects, each result said as it comes.

    Args:
        opts: what to check (:class:`Options`).
        say: where each result line goes as soon as it is known.
        results: the list the results are appended to as they come (what an interrupted doctor has found).
        environment: :func:`lra.tools.doctor.env.environment` if already read.

    Returns:
        ``(environment, results)``.

    Example:
        >>> env, results = run(Options(checks=("backends",), quick=True, backends=("softmax",)))  # doctest: +SKIP
    """
    environment = environment or read_environment(opts.device)
    for line in environment_lines(environment):
        say(line)
    results = [] if results is None else results
    for name in opts.checks:
        budget = Budget(opts.budget_s)
        t0 = time.perf_counter()
        try:
            for r in checks.CHECK_FUNCTIONS[name](opts, budget):
                results.append(r)
                say(r.line())
        except Exception as e:  # noqa: BLE001 - one check's own failure must not stop the others
            r = Result(name, "check", "fail", detail=one_line(e))
            results.append(r)
            say(r.line())
        say(f"         {name}: {time.perf_counter() - t0:.0f} s")
    return environment, results


def render_markdown(environment: dict, results: list[Result], opts: Options) -> str:
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    out = [
        "# lra-doctor report",
        "",
        f"{environment['date']} · {'quick shapes' if opts.quick else 'preset ' + opts.preset}"
        f" · hardware={opts.hardware} · checks: {', '.join(opts.checks)}",
        "",
        "**" + ", ".join(f"{n} {s}" for s, n in counts.items()) + "**",
        "",
        "## Environment",
        "",
    ]
    out += [f"- {ln}" for ln in environment_lines(environment)]
    for name in opts.checks:
        rows = [r for r in results if r.check == name]
        out += ["", f"## {name}", "", "| status | item | figure | detail |", "|---|---|---|---|"]
        out += [f"| {r.status} | {r.item} | {r.figure} | {r.detail.replace('|', '/')} |" for r in rows]
    return "\n".join(out) + "\n"


def write_report(folder: Path, environment: dict, results: list[Result], opts: Options) -> Path:
    """``report.md`` and ``report.json`` in ``folder`` (each written to a temporary name, then renamed)."""
    meta = {
        k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()
    }
    write_json(
        folder / "report.json", {"environment": environment, "options": meta, "results": [asdict(r) for r in results]}
    )
    return write_text(folder / "report.md", render_markdown(environment, results, opts))


def report_folder(root: Path) -> Path:
    """A new folder under ``root/doctor`` named by the time (never one that exists)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(100):
        folder = root / "doctor" / (stamp if i == 0 else f"{stamp}-{i}")
        if not folder.exists():
            return folder
    raise FileExistsError(f"no free report folder under {root / 'doctor'}")
