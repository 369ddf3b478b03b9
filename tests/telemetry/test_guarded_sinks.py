"""guard_sink and FanOutTaskTelemetrySink: a sink that raises or hangs never harms the caller or
the other sinks; the caller's cancellation still propagates."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from guarded.telemetry import (
    FanOutTaskTelemetrySink,
    NoOpTaskTelemetrySink,
    PrometheusTaskTelemetrySink,
    guard_sink,
)
from guarded.telemetry.guarded_sink import TASK_SINK_ERRORS
from tests.support.aio import eventually

from .support import SECRET, events, pf_event, value

SAFETY = 5.0
"""Upper bound on a test's waits: reaching it means the caller was held, and fails the test."""


class RaisingSink:
    def __init__(self) -> None:
        self.calls = 0

    async def emit(self, event: object) -> None:
        self.calls += 1
        raise RuntimeError(f"sink broke on {SECRET}")


class HangingSink:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def emit(self, event: object) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class StubbornSink:
    """Ignores cancellation until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finished = False

    async def emit(self, event: object) -> None:
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                continue
        self.finished = True


class SyncSink:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def emit(self, event: object) -> None:
        self.seen.append(event)


def errors(registry: CollectorRegistry, sink: str, reason: str) -> float:
    return value(registry, TASK_SINK_ERRORS, sink=sink, reason=reason)


@pytest.mark.asyncio
async def test_a_raising_sink_is_counted_and_logged_once_without_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "guarded.telemetry")
    registry = CollectorRegistry()
    inner = RaisingSink()
    sink = guard_sink(inner, registry=registry)
    for _ in range(3):
        await asyncio.wait_for(sink.emit(pf_event("task_spawned")), SAFETY)
    assert inner.calls == 3
    assert errors(registry, "RaisingSink", "error") == 3
    failures = [r for r in caplog.records if getattr(r, "event", None) == "task_telemetry_sink_failed"]
    assert len(failures) == 1
    assert "RuntimeError" in failures[0].getMessage()
    assert SECRET not in failures[0].getMessage()


@pytest.mark.asyncio
async def test_a_hanging_sink_is_cancelled_after_its_timeout() -> None:
    registry = CollectorRegistry()
    inner = HangingSink()
    sink = guard_sink(inner, timeout=0.01, name="hangs", registry=registry)
    await asyncio.wait_for(sink.emit(pf_event("task_spawned")), SAFETY)
    assert errors(registry, "hangs", "timeout") == 1
    await asyncio.wait_for(inner.cancelled.wait(), SAFETY)


@pytest.mark.asyncio
async def test_a_sink_that_ignores_cancellation_still_cannot_hold_the_caller() -> None:
    registry = CollectorRegistry()
    inner = StubbornSink()
    sink = guard_sink(inner, timeout=0.01, registry=registry)
    await asyncio.wait_for(sink.emit(pf_event("task_spawned")), SAFETY)
    assert errors(registry, "StubbornSink", "timeout") == 1
    assert sink.running == 1
    inner.release.set()
    await eventually(lambda: sink.running == 0, within=SAFETY)
    assert inner.finished


@pytest.mark.asyncio
async def test_the_callers_cancellation_propagates_and_cancels_the_emit() -> None:
    registry = CollectorRegistry()
    inner = HangingSink()
    sink = guard_sink(inner, timeout=60, registry=registry)
    caller = asyncio.create_task(sink.emit(pf_event("task_spawned")))
    await asyncio.wait_for(inner.started.wait(), SAFETY)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(inner.cancelled.wait(), SAFETY)
    assert errors(registry, "HangingSink", "timeout") == 0
    assert errors(registry, "HangingSink", "error") == 0


@pytest.mark.asyncio
async def test_synchronous_sinks_and_bad_arguments() -> None:
    inner = SyncSink()
    await guard_sink(inner, registry=CollectorRegistry()).emit("an event")
    assert inner.seen == ["an event"]
    with pytest.raises(TypeError, match="no emit"):
        guard_sink(object())
    with pytest.raises(ValueError, match="timeout"):
        guard_sink(NoOpTaskTelemetrySink(), timeout=0)
    guarded = guard_sink(NoOpTaskTelemetrySink(), registry=CollectorRegistry())
    assert guard_sink(guarded) is guarded


@pytest.mark.asyncio
async def test_fan_out_reaches_every_healthy_sink_despite_failing_and_hanging_ones() -> None:
    registry = CollectorRegistry()
    raising, hanging = RaisingSink(), HangingSink()
    fan_out = FanOutTaskTelemetrySink(
        raising, hanging, PrometheusTaskTelemetrySink(registry), timeout=0.02, registry=registry
    )
    await asyncio.wait_for(fan_out.emit(pf_event("task_spawned")), SAFETY)
    await asyncio.wait_for(fan_out.emit(pf_event("task_completed")), SAFETY)
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 1
    assert events(registry, "task_completed", "completed", "background", "subagent") == 1
    assert errors(registry, "RaisingSink", "error") == 2
    assert errors(registry, "HangingSink", "timeout") == 2
    assert errors(registry, "PrometheusTaskTelemetrySink", "error") == 0
    assert [sink.name for sink in fan_out.sinks] == [
        "RaisingSink",
        "HangingSink",
        "PrometheusTaskTelemetrySink",
    ]


@pytest.mark.asyncio
async def test_fan_out_of_nothing_or_one_sink() -> None:
    await FanOutTaskTelemetrySink().emit(pf_event("task_spawned"))
    registry = CollectorRegistry()
    await FanOutTaskTelemetrySink(PrometheusTaskTelemetrySink(registry), registry=registry).emit(
        pf_event("task_spawned")
    )
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 1
    with pytest.raises(TypeError):
        FanOutTaskTelemetrySink(NoOpTaskTelemetrySink(), "not a sink")
