"""Console scripts (pyproject ``[project.scripts]``) for the entry points whose ``main`` does not fit one.

A console script calls a function with no arguments and exits with what it returns: these import their
entry point when called (``lra.data.__main__`` and ``lra.tools.doctor.__main__`` are ``__main__`` modules) or turn
what it returns into an exit code (``lra.tools.bench.main`` returns its result rows).
"""

from __future__ import annotations


# Each imports its entry point when called, so `lra-data` does not pay for importing the benchmark.
def data() -> int:
    from lra.data.__main__ import main

    return main()  # argparse reads the command line


def bench() -> int:
    from lra.tools.bench import main

    main()  # argparse reads the command line
    return 0


def doctor() -> int:
    from lra.tools.doctor.__main__ import main

    return main()  # argparse reads the command line


def share_bench() -> int:
    from lra.tools.share_bench import main

    return main()  # argparse reads the command line
