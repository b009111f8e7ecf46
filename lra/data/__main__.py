"""``python -m lra.data task=<task> [overrides]`` (``make data``): prepare and cache a task's data.

Generates what can be generated offline (ListOps, Pathfinder), tokenises through the cache, and
prints the split sizes. Tasks that cannot be generated explain where to get the files. Takes the
same overrides as ``lra.train`` (e.g. ``preset=quick`` prepares the quick data).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from lra.cli import Parser
from lra.config import ConfigError, load
from lra.data import DataError, data_record, load_task
from lra.data.base import data_workers
from lra.interrupts import Interrupted, signal_of, sigterm_raises

USAGE = "%(prog)s task=<task> [hydra overrides ...]   (make data task=<task>)"
ABOUT = "Prepare (generate, tokenise, cache) a task's data under the data root ($LRA_DATA or data/)."
EXAMPLES = """examples:
  python -m lra.data task=listops                      # generate the official ListOps distribution
  python -m lra.data task=pathfinder preset=quick  # the quick preset's small Pathfinder set
  python -m lra.data task=text                         # IMDB: says where to put aclImdb_v1.tar.gz"""


def parser() -> Parser:
    p = Parser(
        prog="python -m lra.data",
        usage=USAGE,
        description=ABOUT,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_overrides("Hydra overrides, as lra.train takes them: task=<task>, preset=<preset>, task.<key>=<value>")
    return p


def main(argv: list[str] | None = None) -> int:
    """The exit code: 0 done (or --help), 2 a bad command line, config or missing data, 128 + signal if stopped."""
    try:  # argv None: argparse reads the command line
        overrides = parser().parse_intermixed_args(argv).overrides
    except SystemExit as e:  # --help (0) or a one-line usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    log = logging.getLogger("lra.data")
    t0 = time.perf_counter()
    try:
        with sigterm_raises():
            spec = load(overrides)
            data_workers()  # a bad LRA_DATA_WORKERS is refused here, before any work
            root = spec.data.root
            if root.exists() and not root.is_dir():
                raise DataError(
                    f"the data root {root} is a file, not a folder: set LRA_DATA (or data_root=) to a folder"
                )
            splits = load_task(spec.data.spec, root)  # the file system's refusal too is a DataError
    except (ConfigError, DataError) as e:
        log.error("%s", e)
        return 2
    except (KeyboardInterrupt, Interrupted) as e:
        sig = signal.Signals(signal_of(e))
        log.error(
            "interrupted by %s: no partial data was put in place (generated sets and cache entries appear only "
            "when complete; a download continues where it stopped); run the same command again",
            sig.name,
        )
        return 128 + sig
    for name, s in splits.items():
        log.info(
            "%s %s: %d examples, tokens %s, majority class %.1f%%",
            spec.task,
            name,
            len(s),
            tuple(s.tokens.shape),
            100 * s.majority_rate(),
        )
    data = data_record(splits)
    log.info("data id %s (%s): %s", data["id"], data["kind"], data["description"])
    log.info("ready in %.1f s under %s", time.perf_counter() - t0, spec.data.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
