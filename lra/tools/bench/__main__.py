"""``python -m lra.tools.bench``: see :mod:`lra.tools.bench.cli`."""

from lra.tools.bench.cli import main

main()
