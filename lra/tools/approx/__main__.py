"""``python -m lra.tools.approx``: see :mod:`lra.tools.approx.command`."""

import sys

from lra.tools.approx.command import cli

if __name__ == "__main__":
    sys.exit(cli())
