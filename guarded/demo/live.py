"""The live terminal view: a redrawn ANSI table on a TTY, plain status lines otherwise.

:class:`LiveView` redraws a frame in place twice a second (cursor up, clear to the end of the
screen; no dependency beyond ANSI escapes). :class:`LineView` prints one status line every few
seconds and a line whenever a fault starts or ends, for CI logs and ``--no-live``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TextIO

from .status import DEGRADED_OUTCOMES, FAILED_OUTCOMES, MethodRow, Status

RESET, BOLD, DIM = "\x1b[0m", "\x1b[1m", "\x1b[2m"
RED, GREEN, YELLOW, CYAN = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m"
RECENT_EVENTS = 3
"""Fault events listed under the current fault in the live view."""
CIRCUIT_COLOURS = {"closed": GREEN, "open": RED, "forced_open": RED, "half_open": YELLOW}


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


def _bar(done: float, width: int = 24) -> str:
    filled = max(0, min(width, round(done * width)))
    return "#" * filled + "." * (width - filled)


def render_frame(status: Status, *, colour: bool, header: str = "") -> list[str]:
    """The lines of one frame of the live view."""

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{RESET}" if colour else text

    progress = min(1.0, status.elapsed / status.duration) if status.duration else 1.0
    circuit = paint(status.circuit.upper(), CIRCUIT_COLOURS.get(status.circuit, YELLOW))
    faults = paint(", ".join(status.faults), RED) if status.faults else paint("none", DIM)
    lines = [
        paint(header, BOLD) if header else "",
        f"{status.phase:<9} {status.elapsed:6.1f}s / {status.duration:.0f}s [{_bar(progress)}]  "
        f"{status.calls} calls, {status.rate:,.0f}/s",
        f"circuit {circuit}   dead letters {status.dead_letter_depth} (parked {status.parked})   "
        f"batch pending {status.batch_pending}   replayed {status.replayed}",
        f"fault now: {faults}",
        *(paint(f"  {at:6.1f}s  {what}", DIM) for at, what in status.events[-RECENT_EVENTS:]),
        "",
        paint(
            f"{'method':<32}{'rate/s':>8}{'p99':>10}{'ok':>8}{'retried':>8}{'held':>7}{'stale':>7}"
            f"{'failed':>7}{'rejected':>9}",
            BOLD,
        ),
    ]
    for row in status.rows:
        lines.append(_row(row, paint))
    return lines


def _row(row: MethodRow, paint: Callable[[str, str], str]) -> str:
    failed = row.count(*FAILED_OUTCOMES)
    held = row.count("dead_lettered")
    stale = row.count("stale")
    text = (
        f"{row.method:<32}{row.rate:>8.1f}{format_seconds(row.p99):>10}{row.count('ok', 'not_found'):>8}"
        f"{row.count('retried'):>8}{held:>7}{stale:>7}{failed:>7}{row.count('rejected'):>9}"
    )
    if failed:
        return paint(text, RED)
    if row.count(*DEGRADED_OUTCOMES):
        return paint(text, YELLOW)
    return text


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
    """Redraws the frame in place on a terminal."""

    def __init__(
        self, out: TextIO, sample: Callable[[], Status], *, header: str, interval: float = 0.5
    ) -> None:
        self._out = out
        self._sample = sample
        self._header = header
        self._interval = interval
        self._drawn = 0

    def draw(self) -> None:
        lines = render_frame(self._sample(), colour=True, header=self._header)
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self._out.write(up + "\x1b[J" + "\n".join(lines) + "\n")
        self._out.flush()
        self._drawn = len(lines)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.draw()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)
        self.draw()


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


__all__ = ["LineView", "LiveView", "format_seconds", "render_frame", "status_line"]
