"""Console scripts (pyproject ``[project.scripts]``) for the entry points whose ``main`` does not fit one.

A console script calls a function with no arguments and exits with what it returns:
``lra.data.__main__.main`` needs argv, and ``lra.bench.main`` returns its result rows.
"""

from __future__ import annotations

import sys


# Each imports its entry point when called, so `lra-data` does not pay for importing the benchmark.
def data() -> int:
    from lra.data.__main__ import main

    return main(sys.argv[1:])


def bench() -> int:
    from lra.bench import main

    main(sys.argv[1:])
    return 0


def doctor() -> int:
    from lra.doctor.__main__ import main

    return main(sys.argv[1:])
