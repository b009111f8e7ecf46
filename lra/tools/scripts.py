"""Console scripts (pyproject ``[project.scripts]``) for the entry points whose ``main`` does not fit one.

A console script calls a function with no arguments and exits with what it returns: these import their
entry point when called (``lra.data.__main__`` is a ``__main__`` module) or turn what it returns into an exit
code (``lra.tools.bench.main`` returns its result rows). ``lra-doctor`` and ``lra-share-bench`` are short for
``lra-bench doctor`` and ``lra-bench share``: the bench is the one measuring command.
"""

from __future__ import annotations

from lra.cli import typed


# Each imports its entry point when called, so `lra-data` does not pay for importing the benchmark.
def data() -> int:
    from lra.data.__main__ import main

    return main()  # argparse reads the command line


def bench(*mode: str) -> int:
    from lra.tools.bench import main

    main([*mode, *typed()])  # a measurement named by ``mode`` exits with its own code (SystemExit)
    return 0


def doctor() -> int:
    return bench("doctor")


def share_bench() -> int:
    return bench("share")
