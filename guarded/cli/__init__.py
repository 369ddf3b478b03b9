"""The ``guarded`` command line.

Each subcommand lives in its own module listed in :data:`COMMANDS` or :data:`TOOL_COMMANDS`; the
module exposes ``register(subparsers)``, which adds its parser (with a ``description``) and sets
``handler`` (``Namespace -> int``) as a default. A backend's command (``guarded pg``) comes from its
command line (:class:`~guarded.cli.plugin.BackendCommandLine`), found by name or entry point, never
imported here. Every command follows one convention, shared through
:mod:`guarded.cli.support` and tabled in docs/cli.md: a user error is one ``error: ...; hint: ...``
line and exit 2, an unreachable backend exit 3 naming the target tried, pending migrations exit 4,
a problem found exit 1, Ctrl-C exit 130 after saying what was done.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias

from .. import __version__
from .plugin import Subparsers, backend_command_lines
from .support import DOCUMENTATION_URL, EXIT_CODES, EXIT_INTERRUPTED, ArgumentParser, CommandError, report

Handler: TypeAlias = Callable[[argparse.Namespace], int]

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a command whose output pipe closed."""

COMMANDS: tuple[str, ...] = (
    "guarded.cli.check",
    "guarded.cli.dlq",
    "guarded.cli.snapshot",
)
"""Modules that each register a command for any store, in the order ``--help`` lists them; the
backends' commands follow, then :data:`TOOL_COMMANDS`."""
TOOL_COMMANDS: tuple[str, ...] = ("guarded.demo.command", "guarded.cli.assets")
"""Modules that each register a command of guarded's own tools, listed last."""

EPILOG = (
    "exit codes: "
    + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES)
    + f". See {DOCUMENTATION_URL}cli/."
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered: :data:`COMMANDS`, each backend's,
    :data:`TOOL_COMMANDS`."""
    parser = ArgumentParser(
        prog="guarded",
        description="Make PenguiFlow StateStores production-safe: check, inspect and operate them.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"guarded {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    for command_line in backend_command_lines():
        command_line.register(subparsers)
    for name in TOOL_COMMANDS:
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
    except CommandError as exc:
        return report(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``guarded ... | head``): stop quietly, as command-line tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


__all__ = ["COMMANDS", "EPILOG", "TOOL_COMMANDS", "Handler", "Subparsers", "build_parser", "main"]
