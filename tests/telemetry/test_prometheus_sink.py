"""PrometheusTaskTelemetrySink against a real prometheus-client registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from guarded.observability import telemetry_names as names
from guarded.telemetry import PrometheusTaskTelemetrySink
from guarded.telemetry.in_flight import InFlightTasks

from .support import assert_no_ids_or_payload, events, in_flight, label_values, our_event, pf_event, value


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.mark.asyncio
async def test_events_are_counted_by_bounded_labels(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    await sink.emit(pf_event("task_spawned"))
    await sink.emit(pf_event("task_completed", mode="job", duration_ms=2000.0))
    await sink.emit(our_event("task_failed", task_id="t-2", mode=None, duration_ms=100.0))
    await sink.emit(pf_event("task_group_completed", mode=None))

    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 1
    assert events(registry, "task_completed", "completed", "background", "job") == 1
    assert events(registry, "task_failed", "failed", "background", "none") == 1
    assert events(registry, "task_group_completed", "completed", "background", "none") == 1


@pytest.mark.asyncio
async def test_durations_come_from_terminal_events_in_seconds(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    await sink.emit(pf_event("task_spawned", duration_ms=999.0))  # a spawn has no duration to observe
    await sink.emit(pf_event("task_completed", duration_ms=2000.0))
    await sink.emit(pf_event("task_completed", task_id="t-2", duration_ms=40.0))
    await sink.emit(pf_event("task_completed", task_id="t-3"))  # no duration: counted, not observed
    labels = {"outcome": "completed", "task_type": "background", "mode": "subagent"}
    duration = names.TASK_DURATION
    assert value(registry, f"{duration}_count", **labels) == 2
    assert value(registry, f"{duration}_sum", **labels) == pytest.approx(2.04)
    assert value(registry, f"{duration}_bucket", le="0.05", **labels) == 1
    assert value(registry, f"{duration}_bucket", le="2.5", **labels) == 2
    assert (
        value(registry, f"{duration}_count", outcome="spawned", task_type="background", mode="subagent") == 0
    )
    assert events(registry, "task_completed", "completed", "background", "subagent") == 3


@pytest.mark.asyncio
async def test_in_flight_follows_spawns_and_ends_under_the_spawn_labels(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    # PenguiFlow 3.11 spawns a foreground task with mode "foreground" and ends it with "subagent".
    await sink.emit(pf_event("task_spawned", task_id="a", task_type="FOREGROUND", mode="foreground"))
    await sink.emit(pf_event("task_spawned", task_id="b"))
    assert in_flight(registry, "foreground", "foreground") == 1
    assert in_flight(registry, "background", "subagent") == 1
    await sink.emit(pf_event("task_completed", task_id="a", task_type="FOREGROUND", mode="subagent"))
    assert in_flight(registry, "foreground", "foreground") == 0
    assert in_flight(registry, "foreground", "subagent") == 0
    await sink.emit(pf_event("task_cancelled", task_id="b", mode="job"))
    assert in_flight(registry, "background", "subagent") == 0
    assert in_flight(registry, "background", "job") == 0


@pytest.mark.asyncio
async def test_in_flight_never_goes_below_zero(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    # Tasks spawned before this process started end here.
    await sink.emit(pf_event("task_completed", task_id="old-1"))
    await sink.emit(pf_event("task_failed", task_id="old-2"))
    await sink.emit(pf_event("task_spawned", task_id="new"))
    await sink.emit(pf_event("task_completed", task_id="new"))
    await sink.emit(pf_event("task_completed", task_id="new"))  # reported twice
    await sink.emit({"event_type": "task_cancelled", "outcome": "cancelled", "task_type": "BACKGROUND"})
    for sample in next(f for f in registry.collect() if f.name == names.TASKS_IN_FLIGHT).samples:
        assert sample.value >= 0
    assert in_flight(registry, "background", "subagent") == 0


@pytest.mark.asyncio
async def test_a_spawn_reported_twice_counts_once_and_group_events_do_not_end_tasks(
    registry: CollectorRegistry,
) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    spawn = pf_event("task_spawned", task_id="g-member")
    await sink.emit(spawn)
    await sink.emit(spawn)
    await sink.emit(pf_event("task_group_completed", task_id="g-member", mode=None))
    assert in_flight(registry, "background", "subagent") == 1
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 2


@pytest.mark.asyncio
async def test_out_of_order_delivery_and_a_later_respawn(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    spawned = pf_event("task_spawned", task_id="x", created_at_s=100.0)
    ended = pf_event("task_completed", task_id="x", created_at_s=101.0)
    await sink.emit(ended)
    await sink.emit(spawned)  # created before the end: the task is not in flight
    assert in_flight(registry, "background", "subagent") == 0
    await sink.emit(pf_event("task_spawned", task_id="x", created_at_s=200.0))  # the same id, run again
    assert in_flight(registry, "background", "subagent") == 1


@pytest.mark.asyncio
async def test_sinks_on_one_registry_share_instruments(registry: CollectorRegistry) -> None:
    first = PrometheusTaskTelemetrySink(registry)
    second = PrometheusTaskTelemetrySink(registry)
    await first.emit(pf_event("task_spawned"))
    await second.emit(pf_event("task_completed"))
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 1
    assert events(registry, "task_completed", "completed", "background", "subagent") == 1
    assert in_flight(registry, "background", "subagent") == 0  # one view of the tasks in flight
    other = CollectorRegistry()
    await PrometheusTaskTelemetrySink(other).emit(pf_event("task_spawned"))
    assert events(registry, "task_spawned", "spawned", "background", "subagent") == 1
    assert events(other, "task_spawned", "spawned", "background", "subagent") == 1


@pytest.mark.asyncio
async def test_bad_events_are_counted_as_other(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    await sink.emit(None)
    await sink.emit({"event_type": "task_paused", "outcome": "paused", "task_type": 1, "mode": "warp"})
    await sink.emit(pf_event("task_completed", duration_ms=None).model_copy(update={"duration_ms": "soon"}))
    assert events(registry, "other", "other", "other", "none") == 1
    assert events(registry, "other", "other", "other", "other") == 1
    assert events(registry, "task_completed", "completed", "background", "subagent") == 1
    assert value(registry, f"{names.TASK_DURATION}_count", outcome="completed", task_type="background") == 0


@pytest.mark.asyncio
async def test_no_id_and_no_payload_in_any_label(registry: CollectorRegistry) -> None:
    sink = PrometheusTaskTelemetrySink(registry)
    for event_type in (
        "task_spawned",
        "task_completed",
        "task_failed",
        "task_cancelled",
        "task_group_failed",
    ):
        await sink.emit(pf_event(event_type, duration_ms=10.0))
        await sink.emit(our_event(event_type, duration_ms=10.0))
    labels = label_values(registry)
    assert labels
    assert_no_ids_or_payload(labels)
    for family in registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"event_type", "outcome", "task_type", "mode", "le"}


def test_the_in_flight_tracker_is_bounded() -> None:
    changes: list[tuple[tuple[str, str], int]] = []
    tasks = InFlightTasks(lambda labels, delta: changes.append((labels, delta)), max_tasks=2)
    tasks.spawned("a", ("background", "job"))
    tasks.spawned("b", ("background", "job"))
    tasks.spawned("c", ("foreground", "foreground"))
    assert len(tasks) == 2
    assert "a" not in tasks
    assert tasks.forgotten == 1
    tasks.ended("a")  # forgotten: no second decrement
    assert changes == [
        (("background", "job"), 1),
        (("background", "job"), 1),
        (("foreground", "foreground"), 1),
        (("background", "job"), -1),
    ]
    with pytest.raises(ValueError, match="max_tasks"):
        InFlightTasks(lambda labels, delta: None, max_tasks=0)
