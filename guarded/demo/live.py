"""The live terminal view: a frame redrawn in place on a TTY, plain status lines otherwise.

:class:`LiveView` prints the run's header once, then redraws the frame below it twice a second
with rich's ``Live``: rich lays the frame out at the terminal's width (the method table shrinks
its columns, and drops the less important ones on a narrow terminal; long lines wrap where rich
can count them), crops it to the terminal's height, and moves the cursor back over exactly the
rows it drew. A frame wider than the terminal therefore never leaves copies of itself behind.
:class:`LineView` prints one status line every few seconds and a line whenever a fault starts or
ends, for CI logs and ``--no-live``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from .status import DEGRADED_OUTCOMES, FAILED_OUTCOMES, MethodRow, Status

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
    from rich.live import Live
    from rich.table import Table

RECENT_EVENTS = 3
"""Fault events listed under the current fault in the live view."""
CIRCUIT_STYLES = {"closed": "green", "open": "red", "forced_open": "red", "half_open": "yellow"}
COLUMN_WIDTHS = {1: 0, 2: 60, 3: 96}
"""The terminal width from which the method table shows the columns of each priority: the most
important ones always, the others from 60 and 96 columns on."""


def format_seconds(value: float | None) -> str:
    """A latency for the table: ``<=250us``, ``<=2.5ms``, ``<=1s``, ``>15s`` or ``-``."""
    if value is None:
        return "-"
    if value == float("inf"):
        return ">15s"
    if value < 0.001:
        return f"<={value * 1e6:g}us"
    if value < 1:
        return f"<={value * 1e3:g}ms"
    return f"<={value:g}s"


_COLUMNS: tuple[tuple[str, int, Callable[[MethodRow], str]], ...] = (
    ("rate/s", 1, lambda row: f"{row.rate:.1f}"),
    ("p99", 1, lambda row: format_seconds(row.p99)),
    ("ok", 2, lambda row: str(row.count("ok", "not_found"))),
    ("retried", 3, lambda row: str(row.count("retried"))),
    ("held", 1, lambda row: str(row.count("dead_lettered"))),
    ("stale", 3, lambda row: str(row.count("stale"))),
    ("failed", 1, lambda row: str(row.count(*FAILED_OUTCOMES))),
    ("rejected", 2, lambda row: str(row.count("rejected"))),
)
"""The method table's numeric columns: header, priority (see :data:`COLUMN_WIDTHS`), cell."""


def _row_style(row: MethodRow) -> str:
    if row.count(*FAILED_OUTCOMES):
        return "red"
    if row.count(*DEGRADED_OUTCOMES):
        return "yellow"
    return ""


class Frame:
    """One frame of the live view as a rich renderable, laid out at the width it is given."""

    def __init__(self, status: Status) -> None:
        self.status = status

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        status = self.status
        width = options.max_width
        progress = min(1.0, status.elapsed / status.duration) if status.duration else 1.0
        top = Table.grid(padding=(0, 1), expand=True)
        top.add_column(no_wrap=True)
        top.add_column(ratio=1, min_width=4)
        top.add_column(no_wrap=False, overflow="fold")
        top.add_row(
            Text(f"{status.phase:<9} {status.elapsed:6.1f}s / {status.duration:.0f}s"),
            ProgressBar(total=1.0, completed=progress),
            Text(f"{status.calls} calls, {status.rate:,.0f}/s"),
        )
        yield top
        line = Text("circuit ")
        line.append(status.circuit.upper(), style=CIRCUIT_STYLES.get(status.circuit, "yellow"))
        line.append(
            f"   dead letters {status.dead_letter_depth} (parked {status.parked})   "
            f"batch pending {status.batch_pending}   replayed {status.replayed}"
        )
        yield line
        fault = Text("fault now: ")
        fault.append(", ".join(status.faults) or "none", style="red" if status.faults else "dim")
        yield fault
        for at, what in status.events[-RECENT_EVENTS:]:
            yield Text(f"  {at:6.1f}s  {what}", style="dim")
        yield Text("")
        yield self._methods(width)

    def _methods(self, width: int) -> Table:
        from rich.table import Table

        columns = [column for column in _COLUMNS if width >= COLUMN_WIDTHS[column[1]]]
        table = Table(box=None, pad_edge=False, padding=(0, 0, 0, 1), header_style="bold", expand=False)
        # The method column is the one that gives way on a narrow terminal (cut with "…"); the
        # numbers keep their width.
        table.add_column("method", no_wrap=False, overflow="ellipsis", min_width=6, max_width=32)
        for header, _, _ in columns:
            table.add_column(header, justify="right", no_wrap=True, overflow="ellipsis")
        for row in self.status.rows:
            table.add_row(row.method, *(cell(row) for _, _, cell in columns), style=_row_style(row))
        return table


def render_frame(status: Status, *, colour: bool, header: str = "", width: int = 120) -> list[str]:
    """The lines of one frame (the header first, when given) as ``width`` columns show them."""
    from rich.console import Console
    from rich.text import Text

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=colour,
        color_system="standard" if colour else None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    if header:
        console.print(Text(header, style="bold"))
    console.print(Frame(status))
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


def status_line(status: Status) -> str:
    """One line for logs: progress, throughput, degraded calls, circuit, buffer, faults."""
    return (
        f"[{status.elapsed:6.1f}s/{status.duration:.0f}s] {status.phase}: {status.calls} calls "
        f"({status.rate:,.0f}/s), held {status.total('dead_lettered')}, stale {status.total('stale')}, "
        f"failed {status.total(*FAILED_OUTCOMES)}, rejected {status.total('rejected')}; "
        f"circuit {status.circuit}; dead letters {status.dead_letter_depth} (parked {status.parked}); "
        f"batch pending {status.batch_pending}; fault now: {', '.join(status.faults) or 'none'}"
    )


class LiveView:
    """Prints the header once, then redraws the frame in place below it (rich ``Live``)."""

    def __init__(
        self,
        out: TextIO,
        sample: Callable[[], Status],
        *,
        header: str,
        interval: float = 0.5,
        console: Console | None = None,
    ) -> None:
        from rich.console import Console

        self._console = console or Console(file=out, highlight=False, markup=False, emoji=False)
        self._sample = sample
        self._header = header
        self._interval = interval
        self._live: Live | None = None

    def _frame(self) -> RenderableType:
        return Frame(self._sample())

    def start(self) -> None:
        """Print the header and the first frame."""
        from rich.live import Live
        from rich.text import Text

        if self._live is not None:
            return
        self._console.print(Text(self._header, style="bold"))
        self._live = Live(
            self._frame(),
            console=self._console,
            auto_refresh=False,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="ellipsis",
        )
        self._live.start(refresh=True)

    def draw(self) -> None:
        """Redraw the frame from a new sample."""
        if self._live is None:
            self.start()
            return
        self._live.update(self._frame(), refresh=True)

    def stop(self) -> None:
        """Draw the last frame and leave it on the screen."""
        if self._live is None:
            return
        self._live.update(self._frame(), refresh=True)
        self._live.stop()
        self._live = None

    async def run(self, stop: asyncio.Event) -> None:
        self.start()
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._interval)
                if not stop.is_set():
                    self.draw()
        finally:
            self.stop()


class LineView:
    """Prints a status line every ``interval`` seconds and one line per fault event."""

    def __init__(
        self, out: TextIO, sample: Callable[[], Status], *, header: str, interval: float = 2.0
    ) -> None:
        self._out = out
        self._sample = sample
        self._interval = interval
        self._printed = 0
        out.write(header + "\n")
        out.flush()

    def draw(self, *, force: bool = False) -> None:
        status = self._sample()
        for at, what in status.events[self._printed :]:
            self._out.write(f"[{at:6.1f}s] fault: {what}\n")
        self._printed = len(status.events)
        if force:
            self._out.write(status_line(status) + "\n")
        self._out.flush()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_line = loop.time()
        while not stop.is_set():
            due = loop.time() >= next_line
            self.draw(force=due)
            if due:
                next_line += self._interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
        self.draw(force=True)


__all__ = ["Frame", "LineView", "LiveView", "format_seconds", "render_frame", "status_line"]
