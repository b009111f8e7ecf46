"""``python -m lra.approx``: see :mod:`lra.approx.command`."""

import sys

from lra.approx.command import cli

if __name__ == "__main__":
    sys.exit(cli())
