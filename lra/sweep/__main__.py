"""``python -m lra.sweep``: :func:`lra.sweep.cli.main`."""

import sys

from lra.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
