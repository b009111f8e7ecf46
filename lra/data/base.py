"""Shared data types and the error users see for missing or malformed data (the data root: lra/files.py)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

GENERATED_DIR = "generated"  # <data root>/generated/: every set the harness generates, one folder per setting


class DataError(RuntimeError):
    """Missing, partial or malformed data. The message says where we looked and what to do."""


WORKERS_ENV = "LRA_DATA_WORKERS"


def data_workers() -> int:
    """Processes for generating and tokenising data: every core this process may run on (its CPU affinity: a
    container's or ``taskset``'s share, not the host's count), or ``$LRA_DATA_WORKERS`` when the user sets it.
    The output does not depend on it (the generators seed fixed chunks; tokenising keeps row order)."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise DataError(f"{WORKERS_ENV}={raw!r} is not allowed: an integer >= 1 (processes that prepare data)")
        return int(raw)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class Split:
    """Tokenised examples of one split.

    tokens:  int array (N, L), or (N, 2, L) for two-document tasks, padded with 0 to L.
    lengths: int array (N,) or (N, 2): number of real tokens; real tokens form the prefix.
             Image-like tasks have lengths == L (pixel value 0 is a real token, never padding).
    labels:  int64 array (N,).
    zero_is_padding: the mask is ``tokens != 0`` wherever the zeros sit, not the length prefix: the
             public code's mask, which makes every black pixel of Image and Pathfinder padding
             (``task.mask=nonzero``, a public code's ``quirks=``; docs/fidelity.md).
    origin:  where the examples come from and their content fingerprint, as the cache attaches it
             (lra/data/provenance.py; None for arrays made outside the cache).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray
    zero_is_padding: bool = False
    origin: dict | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        n = len(self.labels)
        if len(self.tokens) != n or len(self.lengths) != n:
            raise ValueError(
                f"split arrays disagree: tokens {len(self.tokens)}, lengths {len(self.lengths)}, labels {n}"
            )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[-1]

    def mask(self, idx, tokens: np.ndarray) -> np.ndarray:
        """The padding mask (True = real token) of rows ``idx``, whose tokens the caller has read."""
        if self.zero_is_padding:
            return tokens != 0
        return np.arange(tokens.shape[-1]) < np.asarray(self.lengths[idx])[..., None]

    def majority_rate(self) -> float:
        """Share of the most frequent label (the accuracy of always guessing it)."""
        counts = np.bincount(np.asarray(self.labels))
        return float(counts.max() / counts.sum()) if counts.sum() else float("nan")


def worker_pool(workers: int):
    """A process pool for data preparation. Workers come from a fresh forkserver process, not from a
    fork of this one: a fork copies locks that another thread holds at that instant (a logging or
    stdout lock while the output pipe is full, torch's thread pools) and such a worker waits forever.
    Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the main process alone reports
    it and stops the pool (each worker would print its own KeyboardInterrupt traceback)."""
    return mp.get_context("forkserver").Pool(workers, initializer=_leave_sigint_to_the_main_process)


def _leave_sigint_to_the_main_process() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def made_parents(folder: Path):
    """Create ``folder``'s missing parent folders; if the block fails or is interrupted, remove again those
    it created that are still empty (an interrupted generation leaves no empty shell of its layout)."""
    made = [p for p in Path(folder).parents if not p.exists()]
    Path(folder).parent.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for p in made:  # nearest first
            try:
                p.rmdir()
            except OSError:
                break
        raise


def hf_datasets(why: str):
    """Hugging Face ``datasets`` (the ``data`` extra), or a one-line DataError saying how to get it."""
    try:
        import datasets  # optional dependency, only for the HF formats
    except ImportError:
        raise DataError(
            f"{why} needs the `datasets` package: pip install 'lra-harness[data]' " f"(or pip install datasets)"
        ) from None
    return datasets


def progress_bar(total, desc: str, unit: str, **kw):
    """The bar of a long data step (generating, reading, tokenising): a tqdm bar on a terminal; in a file (a batch
    job's log) no bar, whose carriage-return updates would fill the log, but a line saying what is being done and
    then, every :data:`LOG_EVERY_S` seconds, how far it is with an ETA, as training's progress lines."""
    if not sys.stderr.isatty():
        return LogProgress(total, desc, unit)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, mininterval=1.0, **kw)


LOG_EVERY_S = 30.0


class LogProgress:
    """A data step's progress as log lines: ``generating ListOps: 1200/100000 trees (1%), elapsed 0:00:30, ETA
    0:41:05``."""

    def __init__(self, total, desc: str, unit: str):
        self.total, self.desc, self.unit, self.n = total, desc, unit + ("s" if len(unit) > 1 else ""), 0
        self.start = self.said = time.monotonic()
        logging.getLogger("lra.data").info("%s: %s %s", desc, total, self.unit)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.said >= LOG_EVERY_S and self.total:
            self.said, elapsed, done = now, now - self.start, min(self.n / self.total, 1.0)
            logging.getLogger("lra.data").info(
                "%s: %s/%s %s (%.0f%%), elapsed %s, ETA %s",
                self.desc,
                self.n,
                self.total,
                self.unit,
                100 * done,
                hms(elapsed),
                hms(elapsed * (1 - done) / done) if done else "n/a",
            )

    def close(self) -> None:
        pass


def hms(seconds: float | None) -> str:
    """``0:01:05``: elapsed times and ETAs in progress lines (data steps, training, evaluation)."""
    return "n/a" if seconds is None else str(datetime.timedelta(seconds=round(seconds)))
