"""The one grammar of the entry points' options: ``--help`` lists them with examples (exit 0); an unknown
or bad ``--flag`` is one line that names it and points at ``--help`` (exit 2), not argparse's usage block.
"""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; {self.prog} --help lists the options\n")
