"""``python -m lra.bench``: see :mod:`lra.bench.cli`."""

from lra.bench.cli import main

main()
