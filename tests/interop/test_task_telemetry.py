"""A PenguiFlow session with ``telemetry_sink=PrometheusTaskTelemetrySink(registry=...)`` on the guarded
store produces the task metrics the Tasks dashboard reads.

PenguiFlow 3.11 emits ``TaskTelemetryEvent`` fire-and-forget (``asyncio.create_task(sink.emit(...))``)
on spawn, completion, failure, cancellation and task-group completion (spec 000 "Telemetry
Integration"). Its ``mode`` is ``foreground`` on a foreground task's spawn but ``subagent`` on its
end, ``job`` on the end of a task spawned by a tool (``spawn_reason="tool:..."``) although its spawn
says ``subagent``; a cancellation through ``handle.cancel()`` carries no ``duration_ms``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest
from penguiflow.sessions import SessionManager, StreamingSession, TaskType
from prometheus_client import CollectorRegistry

from guarded.observability.telemetry_names import TASK_DURATION, TASK_EVENTS, TASKS_IN_FLIGHT
from guarded.telemetry import PrometheusTaskTelemetrySink
from tests.support.aio import eventually
from tests.support.metrics import task_events as events

from ._session_support import answer, blocked, failing, guarded_store, settle, shut_down

SESSION = "telemetry-session"
TASK_IDS = ("fg", "bg-1", "bg-2", "job-1", "bg-fail", "bg-cancel", "g-1", "g-2")


def durations(registry: CollectorRegistry, outcome: str, task_type: str, mode: str) -> float:
    labels = {"outcome": outcome, "task_type": task_type, "mode": mode}
    return registry.get_sample_value(f"{TASK_DURATION}_count", labels) or 0.0


def in_flight(registry: CollectorRegistry, task_type: str, mode: str) -> float | None:
    return registry.get_sample_value(TASKS_IN_FLIGHT, {"task_type": task_type, "mode": mode})


def task_samples(registry: CollectorRegistry) -> Iterator[tuple[str, dict[str, str], float]]:
    prefixes = (TASK_EVENTS, TASK_DURATION, TASKS_IN_FLIGHT)
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.startswith(prefixes):
                yield sample.name, sample.labels, sample.value


def total_events(registry: CollectorRegistry) -> float:
    return sum(value for name, _, value in task_samples(registry) if name == TASK_EVENTS)


async def run_workload(session: StreamingSession, registry: CollectorRegistry) -> None:
    """One foreground turn, three background subagents (one fails), a tool-spawned job, a cancelled
    subagent and a task group of two."""
    await session.run_task(answer("hello"), task_id="fg", task_type=TaskType.FOREGROUND)
    for task_id in ("bg-1", "bg-2"):
        await session.run_task(answer(task_id), task_id=task_id, task_type=TaskType.BACKGROUND)
    await session.run_task(
        answer(3), task_id="job-1", task_type=TaskType.BACKGROUND, spawn_reason="tool:search"
    )
    with pytest.raises(RuntimeError, match="upstream 503"):
        await session.run_task(failing("upstream 503"), task_id="bg-fail", task_type=TaskType.BACKGROUND)

    started = asyncio.Event()
    await session.spawn_task(blocked(started), task_id="bg-cancel", task_type=TaskType.BACKGROUND)
    await started.wait()
    await eventually(lambda: in_flight(registry, "background", "subagent") == 1, what="bg-cancel in flight")
    assert await session.cancel_task("bg-cancel", reason="no longer needed")

    group = await session.resolve_or_create_group(group_name="fan-out")
    for task_id in ("g-1", "g-2"):
        await session.spawn_task(
            answer(task_id), task_id=task_id, task_type=TaskType.BACKGROUND, group_id=group.group_id
        )
        assert await session.add_task_to_group(group.group_id, task_id)
    assert await session.seal_group(group.group_id)
    finished, timed_out = await session.wait_for_group_completion(group.group_id, timeout_s=10)
    assert finished is not None
    assert not timed_out
    assert finished.status == "complete"


@pytest.mark.asyncio
async def test_session_task_metrics_from_the_prometheus_sink(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    registry = CollectorRegistry()
    sink = PrometheusTaskTelemetrySink(registry=registry)
    async with guarded_store(pg_dsn, schema_name, registry=registry) as store:
        manager = SessionManager(state_store=store, telemetry_sink=sink)
        session = await manager.get_or_create(SESSION)
        try:
            await run_workload(session, registry)
            # 8 spawns, 8 task ends, 1 group end; emitted from background tasks.
            await eventually(lambda: total_events(registry) == 17, what="17 task telemetry events")
            await settle(store)
        finally:
            await shut_down(store, session)
            await manager.drop(SESSION)

    assert events(registry, "task_spawned", "spawned", "foreground", "foreground") == 1
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 7
    assert events(registry, "task_completed", "completed", "foreground", "subagent") == 1
    assert events(registry, "task_completed", "completed", "background", "subagent") == 4
    assert events(registry, "task_completed", "completed", "background", "job") == 1
    assert events(registry, "task_failed", "failed", "background", "subagent") == 1
    assert events(registry, "task_cancelled", "cancelled", "background", "subagent") == 1
    assert events(registry, "task_group_completed", "completed", "background", "none") == 1

    assert durations(registry, "completed", "foreground", "subagent") == 1
    assert durations(registry, "completed", "background", "subagent") == 4
    assert durations(registry, "completed", "background", "job") == 1
    assert durations(registry, "failed", "background", "subagent") == 1
    assert durations(registry, "cancelled", "background", "subagent") == 0  # no duration_ms

    # Every task ended: in flight returns to zero under the labels each was spawned with.
    assert in_flight(registry, "foreground", "foreground") == 0
    assert in_flight(registry, "background", "subagent") == 0
    assert all(value == 0 for name, _, value in task_samples(registry) if name == TASKS_IN_FLIGHT)

    forbidden = {SESSION, *TASK_IDS}
    for name, labels, _ in task_samples(registry):
        assert not forbidden & set(labels.values()), f"{name} labelled with an id: {labels}"

    # The metrics agree with what the session persisted through the guarded store.
    rows = await raw.fetch(
        f"SELECT status, count(*) AS tasks FROM {schema_name}.task_states "
        "WHERE session_id = $1 GROUP BY status",
        SESSION,
    )
    assert {row["status"]: row["tasks"] for row in rows} == {"COMPLETE": 6, "FAILED": 1, "CANCELLED": 1}
