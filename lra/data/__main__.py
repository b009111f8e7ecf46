"""``python -m lra.data task=<task> [overrides]`` (``make data``): prepare and cache a task's data.

Generates what can be generated offline (ListOps; see the task's loader), tokenises through the
cache, and prints the split sizes. Tasks that cannot be generated explain where to get the files.
Takes the same overrides as ``lra.train`` (e.g. ``experiment=quick`` prepares the quick data).
"""

from __future__ import annotations

import logging
import sys
import time

from omegaconf import OmegaConf


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    log = logging.getLogger("lra.data")
    from lra.config import compose
    from lra.data import DataError, data_root, load_task

    cfg = compose(argv)
    t0 = time.perf_counter()
    root = data_root(cfg.data_root)
    try:
        splits = load_task(OmegaConf.to_container(cfg.task, resolve=True), root)
    except DataError as e:
        log.error("%s", e)
        return 2
    for name, s in splits.items():
        log.info("%s %s: %d examples, tokens %s, majority class %.1f%%", cfg.task.name, name, len(s),
                 tuple(s.tokens.shape), 100 * s.majority_rate())
    log.info("ready in %.1f s under %s", time.perf_counter() - t0, root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
