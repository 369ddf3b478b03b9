"""The live view: statistics sampled from a real guard, and the frames and lines drawn from them."""

from __future__ import annotations

import asyncio
import io

import pytest
from prometheus_client import CollectorRegistry
from rich.console import Console

from guarded.backends.memory import InMemoryStateStore
from guarded.demo.live import LineView, LiveView, format_seconds, render_frame, status_line
from guarded.demo.status import Status, StatusSampler
from guarded.guard import controller, guard
from guarded.layers.metrics import guard_instruments
from guarded.models import StoredEvent
from tests.cli.terminal import Screen


def test_latencies_read_as_bucket_bounds() -> None:
    assert format_seconds(None) == "-"
    assert format_seconds(0.00025) == "<=250us"
    assert format_seconds(0.0025) == "<=2.5ms"
    assert format_seconds(5.0) == "<=5s"
    assert format_seconds(float("inf")) == ">15s"


@pytest.mark.asyncio
async def test_the_sampler_reads_the_guards_own_statistics() -> None:
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), name="view", registry=registry)
    clock = [0.0]
    sampler = StatusSampler(
        stats=guard_instruments(registry).stats,
        control=controller(store),
        registry=registry,
        duration=10,
        clock=lambda: clock[0],
        faults=lambda: ["database down"],
    )
    sampler.sample()
    for index in range(20):
        await store.save_event(StoredEvent("t", float(index), "node_start", "n", "i", {}))
    await store.load_planner_state("missing")
    clock[0] = 2.0
    status = sampler.sample()
    rows = {row.method: row for row in status.rows}
    assert rows["save_event"].calls == 20
    assert rows["save_event"].rate == pytest.approx(10.0)
    assert rows["save_event"].p99 is not None
    assert rows["load_planner_state"].outcomes == {"not_found": 1}
    assert status.circuit == "closed"
    assert status.faults == ["database down"]
    await controller(store).aclose()

    frame = render_frame(status, colour=False, header="demo")
    assert frame[0] == "demo"
    assert "fault now: database down" in frame
    assert any(line.startswith("save_event") for line in frame)
    assert "21 calls" in status_line(status)


def status(elapsed: float, faults: list[str], events: list[tuple[float, str]] | None = None) -> Status:
    return Status(elapsed, 10.0, "running", [], "open", 3, 1, 0, 0, faults, events or [])


@pytest.mark.asyncio
async def test_the_live_view_redraws_in_place_and_the_line_view_reports_faults() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, height=40, force_terminal=True)
    live = LiveView(out, lambda: status(1.0, []), header="demo", console=console)
    live.draw()
    live.draw()
    live.stop()
    screen = Screen(100, 40)  # what the escape codes leave on a terminal (tests/cli/test_live_view.py)
    screen.feed(out.getvalue())
    assert screen.lines()[0] == "demo"
    assert screen.count("circuit OPEN") == 1

    lines = io.StringIO()
    started = [(1.5, "kill started")]
    over = [*started, (2.5, "kill over: 12 store connections terminated")]
    states = iter([status(1.0, []), status(2.0, ["kill"], started), status(3.0, [], over)])
    view = LineView(lines, lambda: next(states), header="demo")
    view.draw()
    view.draw()
    view.draw(force=True)
    text = lines.getvalue()
    assert (
        "[   1.5s] fault: kill started\n[   2.5s] fault: kill over: 12 store connections terminated" in text
    )
    assert text.count("kill started") == 1
    assert "circuit open; dead letters 3 (parked 1)" in text
    stop = asyncio.Event()
    stop.set()
    await LineView(io.StringIO(), lambda: status(4.0, []), header="demo").run(stop)
