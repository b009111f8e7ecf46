"""The driver's progress line: counts, mean time per job and an ETA, printed every few seconds while the launcher
runs."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

from lra.tools.sweep.base import FINISHED, MARKER
from lra.tools.sweep.jobs import read_json

log = logging.getLogger("lra.tools.sweep")


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

    def update(
        self, done: int, running: int, failed: int, pending: int, durations=(), running_elapsed=()
    ) -> str | None:
        counts = (done, running, failed, pending)
        now = self.clock()
        if counts == self._last and (self.every_s <= 0 or now - self._t < self.every_s):
            return None
        mean = sum(durations) / len(durations) if durations else None
        eta = eta_s(pending, self.parallel, durations, running_elapsed)
        line = f"[{self.label}] {done} done, {running} running, {failed} failed, {pending} pending; " + (
            f"mean {fmt_s(mean)}/job, ETA {fmt_s(eta)}" if mean is not None else "ETA after the first job"
        )
        self.emit(line)
        self._last, self._t = counts, now
        return line


def job_progress(run_dir: Path, since: float, now: float) -> tuple[str, float | None]:
    """(done|failed|running|pending, duration or elapsed) of a grid job in THIS invocation (started
    after ``since``), from its ``.sweep_job.json``: cheap enough to poll (no squeue, no pid check)."""
    info = read_json(Path(run_dir) / MARKER) or {}
    if float(info.get("t_start") or 0) < since:
        return "pending", None
    if info.get("t_end") is None:
        return "running", now - float(info["t_start"])
    rec = read_json(Path(run_dir) / "result.json") or {}
    return ("done" if rec.get("status") in FINISHED else "failed"), float(info["t_end"]) - float(info["t_start"])


class GridWatch(threading.Thread):
    """Polls the launched jobs' folders while the Hydra launcher blocks, feeding :class:`Progress`."""

    def __init__(self, run_dirs: list[Path], progress: Progress, since: float, poll_s: float = 2.0):
        super().__init__(daemon=True, name="lra.tools.sweep progress")
        self.run_dirs, self.progress, self.since, self.poll_s = list(run_dirs), progress, since, poll_s
        self._halt = threading.Event()

    def tick(self) -> str | None:
        now = time.time()
        states = {"done": [], "failed": [], "running": [], "pending": []}
        for d in self.run_dirs:
            state, secs = job_progress(d, self.since, now)
            states[state].append(secs)
        return self.progress.update(
            len(states["done"]),
            len(states["running"]),
            len(states["failed"]),
            len(states["pending"]),
            durations=states["done"],
            running_elapsed=states["running"],
        )

    def run(self) -> None:
        while not self._halt.wait(self.poll_s):
            with contextlib.suppress(Exception):  # a half-visible file on a network disk: next tick
                self.tick()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
