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
the line names the backend and the error, and the other items go on); ``skip`` (not asked here, past
the check's time budget, or no true figure to be had: the overhead on a loaded machine). Reports: ``report.md``
and ``report.json`` under ``doctor/<time>/`` of the runs root, rewritten after each result (a stopped doctor
leaves what it found, and says where it stopped). Exit code 1 when an item failed, else 0.
"""

from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from lra.files import write_json, write_text
from lra.tools.doctor import checks
from lra.tools.doctor.base import CHECKS, STATUSES, Budget, Options, OverBudget, Result, one_line, watchdog
from lra.tools.doctor.env import environment as read_environment
from lra.tools.doctor.env import lines as environment_lines

__all__ = ["CHECKS", "Options", "Result", "run", "write_report", "report_folder"]


def run(
    opts: Options,
    say: Callable[[str], None] = print,
    results: list[Result] | None = None,
    environment: dict | None = None,
    progress: Callable[[str, bool], None] | None = None,
) -> tuple[dict, list[Result]]:
    """The environment and the checks ``opts`` selects, each result said as it comes.

    Each check runs under its own :class:`Budget` (``opts.budget_s``): its items look at the clock (the
    overhead check inside its timing loop, the resume check while it waits for its runs), and a
    :func:`watchdog` stops an item still running ``grace`` past the budget, so a check ends within
    ``budget_s + grace`` plus the time its item in flight takes to wind down.

    Args:
        opts: what to check (:class:`Options`).
        say: where each result line goes as soon as it is known.
        results: the list the results are appended to as they come (what an interrupted doctor has found).
        environment: :func:`lra.tools.doctor.env.environment` if already read.
        progress: called as ``progress(check, finished)`` after each result and at each check's end
            (``main`` rewrites the report there, so a stopped doctor leaves what it found).

    Returns:
        ``(environment, results)``.

    Example:
        >>> env, results = run(Options(checks=("backends",), quick=True, backends=("softmax",)))  # doctest: +SKIP
    """
    environment = environment or read_environment(opts.device)
    for line in environment_lines(environment):
        say(line)
    results = [] if results is None else results
    progress = progress or (lambda check, finished: None)
    for name in opts.checks:
        budget = Budget(opts.budget_s)
        progress(name, False)
        items = checks.CHECK_FUNCTIONS[name](opts, budget)
        ended = False
        while not ended:
            try:
                with watchdog(budget):
                    r = next(items, None)
            except OverBudget:
                r, ended = budget.cut_result(name), True
                _settle()
            except Exception as e:  # one check's own failure must not stop the others
                r, ended = Result(name, "check", "fail", detail=one_line(e)), True
            if r is None:
                break
            if budget.cut and r.status == "fail":  # an error the watchdog's cut caused: not the backend's
                r = Result(r.check, r.item, "skip", r.figure, f"cut at the check's time budget ({r.detail})", r.data)
            results.append(r)
            say(r.line())
            progress(name, False)
        say(f"         {name}: {budget.elapsed():.0f} s")
        progress(name, True)
    return environment, results


def _settle() -> None:
    """After a cut: the compiled graphs a cut compilation left half-built go (gc.collect is left to the
    next item: it costs a second on a large heap)."""
    if "torch._dynamo" in sys.modules:  # imported by a compile; importing it costs a second
        try:
            torch._dynamo.reset()
        except Exception:  # best effort
            pass


def state_line(state: dict) -> str:
    """Where the doctor is: complete, running a check, or stopped during one (report.md's second line)."""
    if state.get("complete"):
        return "Complete: every check ran."
    doing = f"check `{state['during']}`" if state.get("during") else "a pause between checks"
    rest = f"; not run: {', '.join(state['not_run'])}" if state.get("not_run") else ""
    if state.get("stopped"):
        return (
            f"Incomplete: stopped by {state['stopped']} during {doing}: the results below are those found "
            f"until then (the checks before it are complete){rest}."
        )
    return f"Incomplete: in progress, running {doing}{rest}."


def render_markdown(environment: dict, results: list[Result], opts: Options, state: dict | None = None) -> str:
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    out = [
        "# lra-doctor report",
        "",
        f"{environment['date']} · {'quick shapes' if opts.quick else 'preset ' + opts.preset}"
        f" · hardware={opts.hardware} · checks: {', '.join(opts.checks)} · budget {opts.budget_s:.0f} s a check",
        "",
        "**" + ", ".join(f"{n} {s}" for s, n in counts.items()) + "**",
        "",
        state_line(state or {"complete": True}),
        "",
        "## Environment",
        "",
    ]
    out += [f"- {ln}" for ln in environment_lines(environment)]
    for name in opts.checks:
        rows = [r for r in results if r.check == name]
        if not rows and name in (state or {}).get("not_run", ()):
            continue
        out += ["", f"## {name}", "", "| status | item | figure | detail |", "|---|---|---|---|"]
        out += [f"| {r.status} | {r.item} | {r.figure} | {r.detail.replace('|', '/')} |" for r in rows]
    return "\n".join(out) + "\n"


def write_report(
    folder: Path, environment: dict, results: list[Result], opts: Options, state: dict | None = None
) -> Path:
    """``report.md`` and ``report.json`` in ``folder`` (each written to a temporary name, then renamed).

    ``state``: where the doctor is (:func:`state_line`); None: complete."""
    meta = {
        k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()
    }
    state = state or {"complete": True}
    write_json(
        folder / "report.json",
        {"environment": environment, "options": meta, "state": state, "results": [asdict(r) for r in results]},
    )
    return write_text(folder / "report.md", render_markdown(environment, results, opts, state))


def report_folder(root: Path) -> Path:
    """A new folder under ``root/doctor`` named by the time (never one that exists)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(100):
        folder = root / "doctor" / (stamp if i == 0 else f"{stamp}-{i}")
        if not folder.exists():
            return folder
    raise FileExistsError(f"no free report folder under {root / 'doctor'}")
