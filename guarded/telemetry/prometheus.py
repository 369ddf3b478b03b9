"""Task telemetry as Prometheus metrics: events, durations and tasks in flight.

Labels are bounded (``event_type``, ``outcome``, ``task_type``, ``mode``, each from a fixed set, see
:mod:`guarded.telemetry.task_events`); task, session and trace ids never become labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..observability import telemetry_names as names
from ..observability.per_registry import PerRegistry
from .in_flight import InFlightLabels, InFlightTasks
from .task_events import read_task_event


@dataclass(frozen=True, slots=True)
class TaskInstruments:
    """The task metrics of one registry, shared by every sink that exports to it."""

    events: Counter
    duration: Histogram
    in_flight: Gauge
    tasks: InFlightTasks


def _task_instruments(registry: CollectorRegistry) -> TaskInstruments:
    in_flight = Gauge(
        names.TASKS_IN_FLIGHT,
        "Tasks spawned and not yet completed, failed or cancelled, by the labels of their spawn.",
        [names.LABEL_TASK_TYPE, names.LABEL_MODE],
        registry=registry,
        multiprocess_mode=names.gauge_multiprocess_mode(names.TASKS_IN_FLIGHT),
    )

    def adjust(labels: InFlightLabels, delta: int) -> None:
        in_flight.labels(*labels).inc(delta)

    return TaskInstruments(
        events=Counter(
            names.TASK_EVENTS,
            "PenguiFlow task telemetry events.",
            [names.LABEL_EVENT_TYPE, names.LABEL_OUTCOME, names.LABEL_TASK_TYPE, names.LABEL_MODE],
            registry=registry,
        ),
        duration=Histogram(
            names.TASK_DURATION,
            "Duration of finished tasks and task groups, from their terminal events.",
            [names.LABEL_OUTCOME, names.LABEL_TASK_TYPE, names.LABEL_MODE],
            buckets=names.TASK_DURATION_BUCKETS,
            registry=registry,
        ),
        in_flight=in_flight,
        tasks=InFlightTasks(adjust),
    )


task_instruments: PerRegistry[TaskInstruments] = PerRegistry(_task_instruments)
"""The task metrics in a registry, registered on first use."""


class PrometheusTaskTelemetrySink:
    """A PenguiFlow ``TaskTelemetrySink`` exporting ``guarded_task_events_total``,
    ``guarded_task_duration_seconds`` and ``guarded_tasks_in_flight``.

    Every sink on the same registry shares the same instruments (and the same view of the tasks
    in flight), so creating several never fails. ``emit`` never raises and never blocks.

    Example::

        from penguiflow.sessions import SessionManager

        manager = SessionManager(state_store=store, telemetry_sink=PrometheusTaskTelemetrySink())
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._instruments = task_instruments(registry)

    async def emit(self, event: object) -> None:
        """Count ``event``: any task telemetry event (:func:`~guarded.telemetry.read_task_event`)."""
        self.record(event)

    def record(self, event: object) -> None:
        """What :meth:`emit` does, callable from synchronous code."""
        facts = read_task_event(event)
        instruments = self._instruments
        instruments.events.labels(*facts.labels).inc()
        if facts.duration_s is not None and facts.is_terminal:
            instruments.duration.labels(facts.outcome, facts.task_type, facts.mode).observe(facts.duration_s)
        if facts.spawns_task:
            instruments.tasks.spawned(facts.task_id, (facts.task_type, facts.mode), facts.created_at_s)
        elif facts.ends_task:
            instruments.tasks.ended(facts.task_id, facts.created_at_s)
