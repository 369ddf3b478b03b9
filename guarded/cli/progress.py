"""Progress of a long ``guarded`` command on stderr (:class:`Progress`): a bar with counts and rate
on a terminal (rich), a plain line every few seconds otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from .formatting import console

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import Task, TaskID
    from rich.text import Text

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


__all__ = ["LINE_INTERVAL", "Progress"]
