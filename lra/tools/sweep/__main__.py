"""``python -m lra.tools.sweep``: :func:`lra.tools.sweep.cli.main`."""

import sys

from lra.tools.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
