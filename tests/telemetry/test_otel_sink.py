"""OTelTaskTelemetrySink against the OpenTelemetry SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from guarded.observability import telemetry_names as names
from guarded.telemetry import OTelTaskTelemetrySink
from guarded.telemetry.otel import SPAN_EVENT_TASK

from .support import PARENT_ID, SECRET, SESSION_ID, TASK_ID, TRACE_ID, assert_no_ids_or_payload, pf_event

BOUNDED = {names.LABEL_EVENT_TYPE, names.LABEL_OUTCOME, names.LABEL_TASK_TYPE, names.LABEL_MODE}


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def metrics_by_name(reader: InMemoryMetricReader) -> dict[str, tuple[str, Any]]:
    """``name -> (unit, data)`` of every metric of the ``guarded`` scope."""
    found: dict[str, tuple[str, Any]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            assert scope_metrics.scope.name == names.OTEL_METER_NAME
            for metric in scope_metrics.metrics:
                found[metric.name] = (metric.unit or "", metric.data)
    return found


@pytest.mark.asyncio
async def test_each_event_is_a_span_event_with_ids_and_no_payload(
    meter_provider: MeterProvider, tracer_provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    sink = OTelTaskTelemetrySink(meter_provider)
    tracer = tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("agent turn"):
        await sink.emit(pf_event("task_spawned"))
        await sink.emit(pf_event("task_failed", duration_ms=1234.5))
    (span,) = exporter.get_finished_spans()
    assert [e.name for e in span.events] == [SPAN_EVENT_TASK, SPAN_EVENT_TASK]
    failed = dict(span.events[1].attributes or {})
    assert failed == {
        "penguiflow.task.event_type": "task_failed",
        "penguiflow.task.outcome": "failed",
        "penguiflow.task.type": "background",
        "penguiflow.task.mode": "subagent",
        "penguiflow.task.status": "FAILED",
        "penguiflow.task.duration_ms": 1234.5,
        "penguiflow.task_id": TASK_ID,
        "penguiflow.session_id": SESSION_ID,
        "penguiflow.trace_id": TRACE_ID,
        "penguiflow.parent_task_id": PARENT_ID,
    }
    for span_event in span.events:
        assert SECRET not in repr(dict(span_event.attributes or {}))


@pytest.mark.asyncio
async def test_metrics_carry_bounded_attributes_only(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    sink = OTelTaskTelemetrySink(meter_provider)
    await sink.emit(pf_event("task_spawned", task_id="a"))
    await sink.emit(pf_event("task_spawned", task_id="b", task_type="FOREGROUND", mode="foreground"))
    await sink.emit(pf_event("task_completed", task_id="a", mode="job", duration_ms=2500.0))
    await sink.emit(pf_event("task_completed", task_id="never-spawned-here", duration_ms=30.0))

    found = metrics_by_name(reader)
    assert set(found) == {names.OTEL_TASK_EVENTS, names.OTEL_TASK_DURATION, names.OTEL_TASKS_IN_FLIGHT}

    _, counter = found[names.OTEL_TASK_EVENTS]
    counts = {tuple(sorted(p.attributes.items())): p.value for p in counter.data_points}
    assert sum(counts.values()) == 4
    assert (
        counts[
            tuple(
                sorted(
                    {
                        "event_type": "task_completed",
                        "outcome": "completed",
                        "task_type": "background",
                        "mode": "job",
                    }.items()
                )
            )
        ]
        == 1
    )

    unit, histogram = found[names.OTEL_TASK_DURATION]
    assert unit == "s"
    points = {p.attributes["mode"]: p for p in histogram.data_points}
    assert points["job"].count == 1
    assert points["job"].sum == pytest.approx(2.5)
    assert tuple(points["job"].explicit_bounds) == names.TASK_DURATION_BUCKETS

    _, up_down = found[names.OTEL_TASKS_IN_FLIGHT]
    in_flight = {(p.attributes["task_type"], p.attributes["mode"]): p.value for p in up_down.data_points}
    assert in_flight[("background", "subagent")] == 0  # ended under its spawn labels
    assert in_flight[("foreground", "foreground")] == 1
    assert all(v >= 0 for v in in_flight.values())

    for _, data in found.values():
        for point in data.data_points:
            assert set(point.attributes) <= BOUNDED
            assert_no_ids_or_payload([str(v) for v in point.attributes.values()])


@pytest.mark.asyncio
async def test_without_a_recording_span_only_metrics_are_recorded(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    sink = OTelTaskTelemetrySink(meter_provider)
    await sink.emit(pf_event("task_completed"))
    await sink.emit(None)
    _, counter = metrics_by_name(reader)[names.OTEL_TASK_EVENTS]
    assert sum(p.value for p in counter.data_points) == 2


@pytest.mark.asyncio
async def test_sinks_of_one_meter_provider_share_instruments(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    await OTelTaskTelemetrySink(meter_provider).emit(pf_event("task_spawned"))
    await OTelTaskTelemetrySink(meter_provider).emit(pf_event("task_cancelled"))
    found = metrics_by_name(reader)
    _, counter = found[names.OTEL_TASK_EVENTS]
    assert sum(p.value for p in counter.data_points) == 2
    _, up_down = found[names.OTEL_TASKS_IN_FLIGHT]
    assert [p.value for p in up_down.data_points] == [0]
