"""The ``guarded`` command line.

Each subcommand lives in its own module listed in :data:`COMMANDS`; the module exposes
``register(subparsers)``, which adds its parser and sets ``handler`` (``Namespace -> int``)
as a default. Exit codes: 0 success, 1 the command ran and found a problem, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias

from . import __version__

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler: TypeAlias = Callable[[argparse.Namespace], int]

COMMANDS: tuple[str, ...] = (
    "guarded.cli_check",
    "guarded.cli_dlq",
    "guarded.backends.postgres.cli",
    "guarded.demo.cli",
)
"""Modules that each register one subcommand, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand of :data:`COMMANDS` registered."""
    parser = argparse.ArgumentParser(
        prog="guarded",
        description="Make PenguiFlow StateStores production-safe: check, inspect and operate them.",
    )
    parser.add_argument("--version", action="version", version=f"guarded {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


__all__ = ["COMMANDS", "Handler", "Subparsers", "build_parser", "main"]
