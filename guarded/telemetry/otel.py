"""Task telemetry for OpenTelemetry: a span event on the current span, and metrics.

The span event carries the task's ids (task, session, trace, parent task), which belong on spans;
the metrics carry only the bounded attributes ``event_type``, ``outcome``, ``task_type`` and
``mode``. Neither carries the event's ``extra`` contents nor its spawn reason.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, MeterProvider, UpDownCounter
from opentelemetry.util.types import AttributeValue

from ..observability import telemetry_names as names
from .in_flight import InFlightLabels, InFlightTasks
from .task_events import TaskEventFacts, read_task_event

SPAN_EVENT_TASK = names.SPAN_EVENT_TASK
SPAN_ATTR_EVENT_TYPE = "penguiflow.task.event_type"
SPAN_ATTR_OUTCOME = "penguiflow.task.outcome"
SPAN_ATTR_TASK_TYPE = "penguiflow.task.type"
SPAN_ATTR_MODE = "penguiflow.task.mode"
SPAN_ATTR_STATUS = "penguiflow.task.status"
SPAN_ATTR_DURATION_MS = "penguiflow.task.duration_ms"
SPAN_ATTR_TASK_ID = "penguiflow.task_id"
SPAN_ATTR_SESSION_ID = "penguiflow.session_id"
SPAN_ATTR_TRACE_ID = "penguiflow.trace_id"
"""The same id attribute names as the guard's store-call spans."""
SPAN_ATTR_PARENT_TASK_ID = "penguiflow.parent_task_id"


@dataclass(frozen=True, slots=True)
class OTelTaskInstruments:
    """The task instruments of one meter provider, shared by every sink that records to it."""

    events: Counter
    duration: Histogram
    in_flight: UpDownCounter
    tasks: InFlightTasks


_by_provider: weakref.WeakKeyDictionary[MeterProvider, OTelTaskInstruments] = weakref.WeakKeyDictionary()


def otel_task_instruments(meter_provider: MeterProvider | None = None) -> OTelTaskInstruments:
    """The task instruments of ``meter_provider`` (the global one by default), created on first use."""
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    try:
        found = _by_provider.get(provider)
    except TypeError:  # a provider that cannot be weakly referenced: instruments per sink
        found = None
    if found is not None:
        return found
    meter = provider.get_meter(names.OTEL_METER_NAME)
    in_flight = meter.create_up_down_counter(
        names.OTEL_TASKS_IN_FLIGHT,
        unit="{task}",
        description="Tasks spawned and not yet completed, failed or cancelled, by the labels of their spawn.",
    )

    def adjust(labels: InFlightLabels, delta: int) -> None:
        in_flight.add(delta, {names.LABEL_TASK_TYPE: labels[0], names.LABEL_MODE: labels[1]})

    found = OTelTaskInstruments(
        events=meter.create_counter(
            names.OTEL_TASK_EVENTS, unit="{event}", description="PenguiFlow task telemetry events."
        ),
        duration=meter.create_histogram(
            names.OTEL_TASK_DURATION,
            unit="s",
            description="Duration of finished tasks and task groups, from their terminal events.",
            explicit_bucket_boundaries_advisory=list(names.TASK_DURATION_BUCKETS),
        ),
        in_flight=in_flight,
        tasks=InFlightTasks(adjust),
    )
    with contextlib.suppress(TypeError):
        _by_provider[provider] = found
    return found


def span_event_attributes(facts: TaskEventFacts) -> dict[str, AttributeValue]:
    """The attributes of the span event for ``facts``: ids allowed, payload never."""
    attributes: dict[str, AttributeValue] = {
        SPAN_ATTR_EVENT_TYPE: facts.event_type,
        SPAN_ATTR_OUTCOME: facts.outcome,
        SPAN_ATTR_TASK_TYPE: facts.task_type,
        SPAN_ATTR_MODE: facts.mode,
    }
    for key, value in (
        (SPAN_ATTR_TASK_ID, facts.task_id),
        (SPAN_ATTR_SESSION_ID, facts.session_id),
        (SPAN_ATTR_TRACE_ID, facts.trace_id),
        (SPAN_ATTR_PARENT_TASK_ID, facts.parent_task_id),
        (SPAN_ATTR_STATUS, facts.status),
    ):
        if value is not None:
            attributes[key] = value
    if facts.duration_s is not None:
        attributes[SPAN_ATTR_DURATION_MS] = facts.duration_s * 1000.0
    return attributes


class OTelTaskTelemetrySink:
    """A PenguiFlow ``TaskTelemetrySink`` for OpenTelemetry.

    Each event becomes a ``penguiflow.task`` event on the span current when it is emitted
    (PenguiFlow emits from a task created where the task changed state, so that is the span of
    the code that spawned, finished or cancelled it); with no recording span, only the metrics
    are recorded. Metrics (meter ``guarded``): ``guarded.task.events`` counter,
    ``guarded.task.duration`` histogram in seconds, ``guarded.task.in_flight`` up-down counter.
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        self._instruments = otel_task_instruments(meter_provider)

    async def emit(self, event: object) -> None:
        """Record ``event``: any task telemetry event (:func:`~guarded.telemetry.read_task_event`)."""
        self.record(event)

    def record(self, event: object) -> None:
        """What :meth:`emit` does, callable from synchronous code."""
        facts = read_task_event(event)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(SPAN_EVENT_TASK, attributes=span_event_attributes(facts))
        instruments = self._instruments
        instruments.events.add(
            1,
            {
                names.LABEL_EVENT_TYPE: facts.event_type,
                names.LABEL_OUTCOME: facts.outcome,
                names.LABEL_TASK_TYPE: facts.task_type,
                names.LABEL_MODE: facts.mode,
            },
        )
        if facts.duration_s is not None and facts.is_terminal:
            instruments.duration.record(
                facts.duration_s,
                {
                    names.LABEL_OUTCOME: facts.outcome,
                    names.LABEL_TASK_TYPE: facts.task_type,
                    names.LABEL_MODE: facts.mode,
                },
            )
        if facts.spawns_task:
            instruments.tasks.spawned(facts.task_id, (facts.task_type, facts.mode), facts.created_at_s)
        elif facts.ends_task:
            instruments.tasks.ended(facts.task_id, facts.created_at_s)
