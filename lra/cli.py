"""The one grammar of the entry points' options: ``--help`` lists them with examples (exit 0); an unknown
or bad ``--flag`` is one line that names it and points at ``--help`` (exit 2), not argparse's usage block.

Configuration is given as Hydra overrides (``key=value``) everywhere; flags (``--name``) steer the command.
Commands built on argparse take the overrides as a positional ``overrides`` list (:meth:`Parser.add_overrides`);
``lra.train`` hands its command line to ``@hydra.main`` (:func:`hydra_args`, :func:`hand_to_hydra`). This
module is the only one that reads or sets ``sys.argv``.
"""

from __future__ import annotations

import argparse
import sys

# The flags Hydra's own command line accepts (python -m lra.train --help, -m, --cfg job, ...).
HYDRA_FLAGS = frozenset(
    {
        "-h",
        "--help",
        "--hydra-help",
        "--version",
        "-c",
        "--cfg",
        "--resolve",
        "-p",
        "--package",
        "-m",
        "--multirun",
        "-sc",
        "--shell-completion",
        "-cp",
        "--config-path",
        "-cn",
        "--config-name",
        "-cd",
        "--config-dir",
        "-i",
        "--info",
        "--experimental-rerun",
    }
)
HARNESS_OVERRIDES = ("run_tag=",)  # set by the harness itself (lra.train, lra.tools.sweep), never by the user


class UsageError(ValueError):
    """A command line its command does not accept: the message is the one line to print."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; {self.prog} --help lists the options\n")

    def add_overrides(self, what: str = "Hydra overrides of the run's configuration (conf/)") -> None:
        """A positional ``overrides`` list of ``key=value``; parse with ``parse_intermixed_args`` so flags
        may sit between them."""
        self.add_argument("overrides", nargs="*", metavar="key=value", help=what)


def typed(argv: list[str] | None = None) -> list[str]:
    """The arguments as the user typed them (``sys.argv[1:]`` when ``argv`` is None), for an output to record."""
    return list(sys.argv[1:] if argv is None else argv)


def hydra_args(argv: list[str] | None = None) -> list[str]:
    """The command line of a Hydra entry point (``sys.argv[1:]`` when ``argv`` is None), without what only the
    harness sets (``run_tag=``). Raises :class:`UsageError` for a ``--flag`` neither we nor Hydra know."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith(HARNESS_OVERRIDES)]
    unknown = [a for a in args if a.startswith("-") and a.split("=")[0] not in HYDRA_FLAGS]
    if unknown:
        raise UsageError(f"unknown argument {unknown[0]!r}: overrides are key=value (--help lists them)")
    return args


def wants_hydra_itself(args: list[str]) -> bool:
    """Hydra's own flags (``--help``, ``-m``, ``--cfg job``) ask Hydra, not a run."""
    return any(a.startswith("-") for a in args)


def hand_to_hydra(args: list[str]) -> None:
    """``@hydra.main`` reads ``sys.argv``: give it ``args`` (the user's, with what the harness adds)."""
    sys.argv[1:] = list(args)
