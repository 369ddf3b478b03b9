"""The demo's live view fits any terminal: at 120 columns and narrower, after many redraws, what a
person sees holds the header once and one frame, no line wider than the terminal.

The output goes through :class:`tests.cli.terminal.Screen`, a small terminal emulator (auto-wrap at
the right margin, cursor movement, erasing, a screen of limited height with scrollback), so the
test sees what the escape codes leave on a real terminal rather than the codes themselves.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from guarded.demo.live import LiveView
from guarded.demo.status import MethodRow, Status

from .terminal import Screen

HEADER = (
    "guarded demo: 16 sessions + a PenguiFlow flow, faults 'default' (9), seed 1; metrics "
    "http://127.0.0.1:9464/metrics; spill file /tmp/guarded-demo-x7a0/postgres.sqlite"
)
METHODS = (
    "save_event",
    "load_history",
    "save_remote_binding",
    "save_planner_state",
    "load_planner_state",
    "save_memory_state",
    "load_memory_state",
    "save_task",
    "list_tasks",
    "save_update",
    "list_updates",
    "save_steering",
    "list_steering",
    "save_trajectory",
    "get_trajectory",
    "save_planner_event",
    "artifact_store.put_bytes",
)


def status(tick: int) -> Status:
    """A busy run: every method, a fault in progress, fault events with long descriptions."""
    rows = [
        MethodRow(
            method,
            1_000 * tick + index,
            12.5 * index * tick,
            0.0025 if index % 2 else 1.0,
            {"ok": 1_000 * tick, "dead_lettered": index % 3, "timeout": tick * (index % 5 == 0)},
        )
        for index, method in enumerate(METHODS)
    ]
    events = [
        (1.5 * k, f"restart over: the database was down for 3.0s, 41 connections terminated ({k})")
        for k in range(tick)
    ]
    return Status(
        elapsed=0.5 * tick,
        duration=30.0,
        phase="running",
        rows=rows,
        circuit="half_open" if tick % 2 else "closed",
        dead_letter_depth=1_234 * tick,
        parked=7,
        batch_pending=12,
        replayed=99 * tick,
        faults=["restart (postgres down for 3s)", "slow queries (pg_sleep 0.2s)"] if tick % 3 else [],
        events=events,
    )


def shown(width: int, height: int, frames: int = 12) -> Screen:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, force_terminal=True, color_system="standard")
    tick = [1]
    view = LiveView(out, lambda: status(tick[0]), header=HEADER, console=console)
    for tick[0] in range(1, frames + 1):
        view.draw()
    view.stop()
    screen = Screen(width, height)
    screen.feed(out.getvalue())
    return screen


@pytest.mark.parametrize("width", [200, 120, 100, 80, 60, 40])
@pytest.mark.parametrize("height", [60, 14])
def test_the_header_and_the_frame_appear_once_at_any_width(width: int, height: int) -> None:
    screen = shown(width, height)
    lines = screen.lines()
    assert screen.count("guarded demo: 16 sessions") == 1, "\n".join(lines)
    assert screen.count("fault now:") == 1, "\n".join(lines)
    assert sum(line.lstrip().startswith("method") for line in lines) == 1, "\n".join(lines)
    assert max(len(line) for line in lines) <= width
    assert any(line.startswith("save_event") for line in lines)


def test_a_wide_terminal_shows_every_column_and_a_narrow_one_the_main_ones() -> None:
    wide = shown(120, 60).lines()
    header = next(line for line in wide if line.startswith("method"))
    assert header.split() == [
        "method",
        "rate/s",
        "p99",
        "ok",
        "retried",
        "held",
        "stale",
        "failed",
        "rejected",
    ]
    narrow = shown(50, 60).lines()
    header = next(line for line in narrow if line.startswith("method"))
    assert header.split() == ["method", "rate/s", "p99", "held", "failed"]


def test_while_it_runs_the_frame_fits_the_terminals_height() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, height=14, force_terminal=True, color_system="standard")
    view = LiveView(out, lambda: status(5), header=HEADER, console=console)
    view.draw()
    view.draw()
    screen = Screen(80, 14)
    screen.feed(out.getvalue())
    visible = ["".join(row).rstrip() for row in screen.rows[screen.top : screen.top + 14]]
    assert visible[0].startswith("running")  # the top of the frame, not scrolled away
    assert screen.count("guarded demo: 16 sessions") == 1
