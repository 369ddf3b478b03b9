"""How ``guarded`` commands lay out what they print: a rich console that measures a terminal
(and prints plain, unwrapped lines elsewhere), borderless tables, byte sizes and ages."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console


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
    """A column of :func:`print_table`: a header and, for long text, the width it is cut to when
    the table must fit a terminal."""

    header: str
    max_width: int | None = None
    justify: str = "left"


def render_table(
    columns: Sequence[Column], rows: Iterable[Sequence[object]], *, width: int | None = None
) -> str:
    """The rows under their headers, aligned, with no borders (``-`` for ``None``). ``width`` is the
    line length of a terminal it must fit: cells longer than a column's ``max_width`` end in ``…``
    and columns shrink and cut their text to fit it. Without one (output piped or to a file),
    every value is printed whole, for ``grep`` and ``awk``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 2, 0, 0), header_style=None)
    for column in columns:
        table.add_column(
            column.header,
            max_width=column.max_width if width else None,
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


def terminal_width() -> int | None:
    """The width of the terminal stdout is, ``None`` when it is not one (piped, a file)."""
    return console().width if sys.stdout.isatty() else None


def print_table(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> None:
    """Print :func:`render_table` on stdout, fitted to the terminal's width when it is one."""
    print(render_table(columns, rows, width=terminal_width()))


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


__all__ = ["Column", "console", "format_age", "format_bytes", "print_table", "render_table", "terminal_width"]
