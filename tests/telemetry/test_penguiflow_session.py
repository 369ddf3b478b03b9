"""A real PenguiFlow session (SessionManager / StreamingSession, guarded in-memory state store)
drives the sinks; the counters match the tasks it ran (spec 000, "Telemetry Integration")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from penguiflow.sessions import SessionManager, StreamingSession, TaskResult, TaskRuntime, TaskType
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import guard
from guarded.observability import telemetry_names as names
from guarded.telemetry import (
    FanOutTaskTelemetrySink,
    LoggingTaskTelemetrySink,
    OTelTaskTelemetrySink,
    PrometheusTaskTelemetrySink,
)
from tests.support.aio import eventually
from tests.support.metrics import total

from .support import SECRET, assert_no_ids_or_payload, events, in_flight, label_values, value


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


async def succeed(runtime: TaskRuntime) -> TaskResult:
    return TaskResult(payload={"answer": SECRET})


async def fail(runtime: TaskRuntime) -> Any:
    raise RuntimeError(f"tool failed on {SECRET}")


@pytest.mark.asyncio
async def test_a_session_drives_the_prometheus_sink_and_counts_match_the_tasks(
    meter_provider: MeterProvider, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "guarded.telemetry.tasks")
    registry = CollectorRegistry()
    sink = FanOutTaskTelemetrySink(
        PrometheusTaskTelemetrySink(registry),
        OTelTaskTelemetrySink(meter_provider),
        LoggingTaskTelemetrySink(),
        registry=registry,
    )
    store = guard(InMemoryStateStore(), name="sessions", registry=registry)
    manager = SessionManager(state_store=store, telemetry_sink=sink)
    session: StreamingSession = await manager.get_or_create("session-under-test")

    gate = asyncio.Event()

    async def wait_for_gate(runtime: TaskRuntime) -> TaskResult:
        await gate.wait()
        return TaskResult(payload={"answer": SECRET})

    for _ in range(3):
        await session.run_task(succeed, task_type=TaskType.FOREGROUND)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await session.run_task(fail, task_type=TaskType.FOREGROUND)
    job = await session.spawn_task(succeed, task_type=TaskType.BACKGROUND, spawn_reason="tool:search")
    blocked = await session.spawn_task(wait_for_gate, task_type=TaskType.BACKGROUND)
    doomed = await session.spawn_task(wait_for_gate, task_type=TaskType.BACKGROUND)
    assert len({job, blocked, doomed}) == 3

    await eventually(lambda: total(registry, names.TASK_EVENTS) == 5 * 2 + 3 + 1)
    # the two gated background tasks are in flight, everything else has ended
    assert in_flight(registry, "background", "subagent") == 2
    assert in_flight(registry, "foreground", "foreground") == 0

    assert await session.cancel_task(doomed, reason="user asked")
    await eventually(lambda: in_flight(registry, "background", "subagent") == 1)
    gate.set()
    await eventually(lambda: in_flight(registry, "background", "subagent") == 0)
    await eventually(lambda: total(registry, names.TASK_EVENTS) == 8 * 2)

    assert events(registry, "task_spawned", "spawned", "foreground", "foreground") == 5
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 3
    # PenguiFlow 3.11 reports the end of a foreground task with mode "subagent"
    assert events(registry, "task_completed", "completed", "foreground", "subagent") == 3
    assert events(registry, "task_failed", "failed", "foreground", "subagent") == 2
    assert events(registry, "task_completed", "completed", "background", "job") == 1
    assert events(registry, "task_completed", "completed", "background", "subagent") == 1
    assert events(registry, "task_cancelled", "cancelled", "background", "subagent") == 1
    ended_with_duration = value(
        registry,
        f"{names.TASK_DURATION}_count",
        outcome="completed",
        task_type="foreground",
        mode="subagent",
    )
    assert ended_with_duration == 3
    assert (
        value(registry, "guarded_task_sink_errors_total", sink="OTelTaskTelemetrySink", reason="error") == 0
    )
    assert_no_ids_or_payload(label_values(registry) - {"sessions"})
    assert "session-under-test" not in label_values(registry)

    data = reader.get_metrics_data()
    assert data is not None
    otel_events = sum(
        point.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == names.OTEL_TASK_EVENTS
        for point in metric.data.data_points
    )
    assert otel_events == 16
    logged = [r for r in caplog.records if r.name == "guarded.telemetry.tasks"]
    assert len(logged) == 16
    assert all(SECRET not in r.getMessage() + repr(vars(r)) for r in logged)

    await manager.drop("session-under-test")
    # the session persisted its tasks through the guarded store
    assert await store.list_tasks("session-under-test")
