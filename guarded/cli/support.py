"""What every ``guarded`` subcommand shares: exit codes, one-line errors, argument values (durations,
numbers, ports).

The convention (docs/cli.md has the table):

* a user error (a bad argument, a factory that does not import, a file that is not a spill
  file) prints one line ``error: WHAT; hint: WHAT TO DO`` on stderr and exits
  :data:`EXIT_USAGE` (2), never a traceback;
* a backend the command cannot reach exits :data:`EXIT_UNREACHABLE` (3) and names the target it
  tried (which DSN, or which default);
* a schema whose migrations are pending exits :data:`EXIT_NOT_MIGRATED` (4);
* a command that ran and found a problem (a failed contract, writes left behind) exits
  :data:`EXIT_PROBLEM` (1);
* Ctrl-C exits :data:`EXIT_INTERRUPTED` (130) after saying what was done.

Long operations report progress on stderr through :class:`guarded.cli.progress.Progress`; tables,
byte sizes and ages are laid out by :mod:`guarded.cli.formatting`.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, NoReturn, TextIO

from ..durations import DURATION_EXAMPLES, DURATION_UNITS, parse_duration

EXIT_OK = 0
"""The command did what it was asked."""
EXIT_PROBLEM = 1
"""The command ran and found a problem: a contract failed, writes were left behind, a checksum differs."""
EXIT_USAGE = 2
"""A user error: a bad argument or option, a factory that does not import, a file of the wrong kind."""
EXIT_UNREACHABLE = 3
"""The backend could not be reached (connection refused, timed out, authentication failed)."""
EXIT_NOT_MIGRATED = 4
"""The schema's migrations are pending (``guarded pg migrate`` applies them)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), after the command said what it had done."""

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_PROBLEM, "the command ran and found a problem"),
    (EXIT_USAGE, "user error: one 'error: ...; hint: ...' line on stderr"),
    (EXIT_UNREACHABLE, "the backend is unreachable; the line names the target tried"),
    (EXIT_NOT_MIGRATED, "the schema's migrations are pending"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); what was done is reported"),
)
"""Every exit code, for ``--help`` epilogs and docs/cli.md."""

DOCUMENTATION_URL = "https://guarded-dev.github.io/guarded/"
"""The published documentation (the wheel ships none); help texts link its pages, e.g. ``cli/``."""

HINT_SEPARATOR = "; hint: "


class CommandError(Exception):
    """A failure the command reports as one ``error:`` line and an exit code, never a traceback."""

    code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self) -> str:
        """The one line printed on stderr."""
        return error_line(self.message, self.hint)


class UsageError(CommandError):
    """A user error: exit 2."""

    code = EXIT_USAGE


class ProblemError(CommandError):
    """The command ran and failed (a migration that failed, files held by live processes): exit 1."""

    code = EXIT_PROBLEM


class UnreachableError(CommandError):
    """The backend could not be reached: exit 3. ``target`` is what was tried."""

    code = EXIT_UNREACHABLE

    def __init__(self, message: str, hint: str | None = None, *, target: str | None = None) -> None:
        super().__init__(message, hint)
        self.target = target


class NotMigratedError(CommandError):
    """The schema's migrations are pending: exit 4."""

    code = EXIT_NOT_MIGRATED


class Interrupted(CommandError):
    """Ctrl-C, once the command has said what it had done (so nothing more is printed): exit 130."""

    code = EXIT_INTERRUPTED

    def __init__(self, message: str = "interrupted") -> None:
        super().__init__(message)

    def line(self) -> str:
        return ""


def error_line(message: str, hint: str | None = None) -> str:
    """``error: MESSAGE; hint: HINT`` on one line (newlines in either are flattened)."""
    text = "error: " + " ".join(message.split())
    if hint:
        text += HINT_SEPARATOR + " ".join(hint.split())
    return text


def print_error(message: str, hint: str | None = None, *, stream: TextIO | None = None) -> None:
    """Print the one-line error on stderr."""
    print(error_line(message, hint), file=stream or sys.stderr, flush=True)


def report(error: CommandError) -> int:
    """Print ``error``'s line on stderr (when it has one) and return its exit code."""
    line = error.line()
    if line:
        print(line, file=sys.stderr, flush=True)
    return error.code


def interrupted(what_was_done: str) -> Interrupted:
    """Print ``interrupted: WHAT_WAS_DONE`` on stderr; the :class:`Interrupted` to raise."""
    print("interrupted: " + " ".join(what_was_done.split()), file=sys.stderr, flush=True)
    return Interrupted()


def warn(message: str) -> None:
    """``warning: MESSAGE`` on stderr (the command goes on)."""
    print("warning: " + " ".join(message.split()), file=sys.stderr, flush=True)


def note(message: str) -> None:
    """``note: MESSAGE`` on stderr."""
    print("note: " + " ".join(message.split()), file=sys.stderr, flush=True)


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one ``error: ...; hint: see 'PROG --help'`` line, exit 2.

    Subparsers are of the same class (argparse makes them with ``type(parent)``), so every
    subcommand's errors look alike. A message that carries its own hint keeps it.
    """

    def error(self, message: str) -> NoReturn:
        hint = None if HINT_SEPARATOR in message else f"see '{self.prog} --help'"
        text = error_line(message, hint)
        self.exit(EXIT_USAGE, text + "\n")


def with_hint(message: str, hint: str) -> str:
    """A message carrying its own hint, for ``argparse.ArgumentTypeError`` (one line)."""
    return message + HINT_SEPARATOR + hint


# --- values -------------------------------------------------------------------------------------


def duration(*, allow_zero: bool = False) -> Any:
    """An argparse ``type`` for a duration (see :func:`parse_duration`)."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, allow_zero=allow_zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                with_hint(
                    str(exc), f"write a duration such as {DURATION_EXAMPLES} (a plain number is seconds)"
                )
            ) from None

    parse.__name__ = "duration"
    return parse


def format_duration(seconds: float) -> str:
    """``30d``, ``12h``, ``15m``, ``1h30m``, ``45s``, ``1.5s``: the shortest exact form."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def port(text: str) -> int:
    """An argparse ``type`` for a TCP port: 0 to 65535 (0 picks a free one)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            with_hint(f"{text!r} is not a port number", "use 0 to 65535; 0 picks a free port")
        )
    return value


def whole_number(minimum: int) -> Any:
    """An argparse ``type`` for a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                with_hint(f"{text!r} is not a whole number", f"use a number of {minimum} or more")
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                with_hint(f"must be at least {minimum}, got {text}", f"use a number of {minimum} or more")
            )
        return value

    parse.__name__ = "whole_number"
    return parse


def positive_number(text: str) -> float:
    """An argparse ``type`` for a finite number above zero."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(with_hint(f"must be a positive number, got {text!r}", "e.g. 100"))
    return value


__all__ = [
    "DOCUMENTATION_URL",
    "DURATION_EXAMPLES",
    "DURATION_UNITS",
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_MIGRATED",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "ArgumentParser",
    "Interrupted",
    "CommandError",
    "NotMigratedError",
    "ProblemError",
    "UnreachableError",
    "UsageError",
    "whole_number",
    "duration",
    "error_line",
    "format_duration",
    "interrupted",
    "note",
    "port",
    "positive_number",
    "print_error",
    "report",
    "warn",
    "with_hint",
]
