"""``python -m lra.data task=<task> [overrides]`` (``make data``): prepare and cache a task's data.

Generates what can be generated offline (ListOps, Pathfinder), tokenises through the cache, and
prints the split sizes. Tasks that cannot be generated explain where to get the files. Takes the
same overrides as ``lra.train`` (e.g. ``experiment=quick`` prepares the quick data).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time

from lra.config import ConfigError, load
from lra.data import DataError, load_task

USAGE = """usage: python -m lra.data task=<task> [hydra overrides ...]   (make data task=<task>)

Prepare (generate, tokenise, cache) a task's data under the data root ($LRA_DATA or data/).
  python -m lra.data task=listops                      # generate the official ListOps distribution
  python -m lra.data task=pathfinder experiment=quick  # the quick preset's small Pathfinder set
  python -m lra.data task=text                         # IMDB: says where to put aclImdb_v1.tar.gz"""


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    log = logging.getLogger("lra.data")
    unknown = [a for a in argv if a.startswith("-")]
    t0 = time.perf_counter()
    try:
        with _sigterm_raises():
            if unknown:
                raise ConfigError(f"unknown argument {unknown[0]!r}; python -m lra.data --help lists the options")
            spec = load(argv)
            splits = load_task(spec.data.options, spec.data.root)
    except (ConfigError, DataError) as e:
        log.error("%s", e)
        return 2
    except (KeyboardInterrupt, Terminated) as e:
        sig = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
        log.error("interrupted by %s: no partial data was put in place (generated sets and cache entries appear only "
                  "when complete; a download continues where it stopped); run the same command again", sig.name)
        return 128 + sig
    for name, s in splits.items():
        log.info("%s %s: %d examples, tokens %s, majority class %.1f%%", spec.task, name, len(s),
                 tuple(s.tokens.shape), 100 * s.majority_rate())
    log.info("ready in %.1f s under %s", time.perf_counter() - t0, spec.data.root)
    return 0


class Terminated(BaseException):
    """SIGTERM, raised where the main thread is, so every ``finally`` runs (worker pools stopped, temporary
    folders removed) before the one line; a BaseException, so no ``except Exception`` swallows it."""


def _terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises():
    if threading.current_thread() is not threading.main_thread():  # signals can only be set there
        yield
        return
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
