"""What every ``guarded`` subcommand shares: exit codes, one-line errors, durations, progress, tables.

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

Long operations report progress on stderr through :class:`Progress`: a bar with counts and rate
on a terminal (rich), a plain line every few seconds otherwise (logs, CI, pipes).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from ..durations import DURATION_EXAMPLES, DURATION_UNITS, parse_duration

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import Task, TaskID
    from rich.text import Text

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


# --- output -------------------------------------------------------------------------------------


def console(stream: TextIO | None = None, *, stderr: bool = False) -> Console:
    """A rich console on ``stream`` (default: the current ``sys.stdout``/``sys.stderr``).

    On a terminal it measures the terminal; otherwise it prints plain text without colours and
    never wraps (logs and pipes get whole lines for grep)."""
    from rich.console import Console

    target = stream or (sys.stderr if stderr else sys.stdout)
    found = Console(file=target, stderr=stderr, highlight=False, markup=False, emoji=False)
    if found.is_terminal:
        return found
    return Console(
        file=target,
        stderr=stderr,
        highlight=False,
        markup=False,
        emoji=False,
        width=100_000,
        color_system=None,
    )


@dataclass(frozen=True, slots=True)
class Column:
    """A column of :func:`print_table`: a header and, for long text, the width it is cut to."""

    header: str
    max_width: int | None = None
    justify: str = "left"


def render_table(
    columns: Sequence[Column], rows: Iterable[Sequence[object]], *, width: int | None = None
) -> str:
    """The rows under their headers, aligned, with no borders (``-`` for ``None``); cells longer
    than a column's ``max_width`` end in ``…``. ``width`` (default: unlimited) is the line length
    it must fit: columns shrink and cut their text to fit it."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 2, 0, 0), header_style=None)
    for column in columns:
        table.add_column(
            column.header,
            max_width=column.max_width,
            no_wrap=True,
            overflow="ellipsis",
            justify=column.justify,  # type: ignore[arg-type]
        )
    for row in rows:
        table.add_row(*("-" if value is None else str(value).replace("\n", " ") for value in row))
    buffer = io.StringIO()
    Console(
        file=buffer, width=width or 100_000, color_system=None, highlight=False, markup=False, emoji=False
    ).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def print_table(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> None:
    """Print :func:`render_table` on stdout, fitted to the terminal's width when it is one."""
    width = None
    if sys.stdout.isatty():
        width = console().width
    print(render_table(columns, rows, width=width))


def format_bytes(count: float) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.1 GiB``, ``2.0 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def format_age(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h20m``, ``4d02h``: an age for a table cell."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


# --- progress -----------------------------------------------------------------------------------

LINE_INTERVAL = 2.0
"""Seconds between progress lines when stderr is not a terminal."""


def _rate(done: float, seconds: float) -> str:
    return f"{done / seconds:,.0f}/s" if seconds > 0 else "-/s"


class Progress:
    """Progress of one long operation on stderr: counts, rate and elapsed time.

    On a terminal, a rich progress bar redrawn in place. Otherwise (a log, a pipe) a line every
    :data:`LINE_INTERVAL` seconds while it advances and, once it has printed one, a line when it
    ends: an operation shorter than the interval prints nothing.
    ``what`` names the operation (``replay``), ``unit`` what is counted (``writes``).
    """

    def __init__(
        self,
        what: str,
        *,
        total: int | None,
        unit: str,
        stream: TextIO | None = None,
        interval: float | None = None,
        live: bool | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.done = 0
        self._stream = stream or sys.stderr
        self._interval = LINE_INTERVAL if interval is None else interval
        self._live = self._stream.isatty() if live is None else live
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._detail = ""
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._closed = False
        self._printed = False

    # -- numbers

    @property
    def elapsed(self) -> float:
        return max(0.0, float(self._clock() - self._started))

    @property
    def rate(self) -> float:
        elapsed = self.elapsed
        return self.done / elapsed if elapsed > 0 else 0.0

    def summary(self) -> str:
        """``1,234 of 5,000 writes in 2.5s (494/s)``."""
        of = f" of {self.total:,}" if self.total is not None else ""
        elapsed = self.elapsed
        return f"{self.done:,}{of} {self.unit} in {elapsed:.1f}s ({_rate(self.done, elapsed)})"

    # -- lifecycle

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        self._started = self._last_line = self._clock()
        if self._live:
            self._bar = self._make_bar()
            self._task = self._bar.add_task(self.what, total=self.total, detail="")
            self._bar.start()

    def advance(self, count: int = 1, *, detail: str | None = None) -> None:
        """``count`` more done (and what is being worked on now, shown beside the bar)."""
        self.done += count
        if detail is not None:
            self._detail = detail
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, detail=self._detail)
        elif not self._live and self._clock() - self._last_line >= self._interval:
            self._line()

    def set_total(self, total: int | None) -> None:
        self.total = total
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, total=total)

    def close(self) -> None:
        """Stop the bar, or print the closing line."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            if self._task is not None:
                self._bar.update(self._task, completed=self.done, detail=self._detail)
            self._bar.stop()
        elif self._printed:
            self._line(final=True)

    # -- drawing

    def _line(self, *, final: bool = False) -> None:
        self._last_line = self._clock()
        self._printed = True
        percent = f" ({self.done / self.total:.0%})" if self.total else ""
        of = f" of {self.total:,}" if self.total is not None else ""
        detail = f"; {self._detail}" if self._detail else ""
        state = "done: " if final else ""
        print(
            f"{self.what}: {state}{self.done:,}{of} {self.unit}{percent}, {_rate(self.done, self.elapsed)}, "
            f"{self.elapsed:.1f}s{detail}",
            file=self._stream,
            flush=True,
        )

    def _make_bar(self) -> RichProgress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress
        from rich.text import Text

        unit = self.unit

        class RateColumn(ProgressColumn):
            """Items per second (rich's own speed column counts bytes)."""

            def render(self, task: Task) -> Text:
                speed = task.finished_speed or task.speed
                return Text("-/s" if speed is None else f"{speed:,.0f} {unit}/s")

        return RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console(self._stream, stderr=True),
            transient=False,
            refresh_per_second=4,
        )


__all__ = [
    "DURATION_EXAMPLES",
    "DURATION_UNITS",
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_MIGRATED",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "LINE_INTERVAL",
    "ArgumentParser",
    "Interrupted",
    "Column",
    "CommandError",
    "NotMigratedError",
    "ProblemError",
    "Progress",
    "UnreachableError",
    "UsageError",
    "console",
    "whole_number",
    "duration",
    "error_line",
    "format_age",
    "format_bytes",
    "format_duration",
    "interrupted",
    "note",
    "port",
    "positive_number",
    "print_error",
    "print_table",
    "render_table",
    "report",
    "warn",
    "with_hint",
]
