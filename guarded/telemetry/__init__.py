"""PenguiFlow's task-telemetry sinks: where a session's task events go (metrics, spans, logs).

:class:`PrometheusTaskTelemetrySink`, :class:`OTelTaskTelemetrySink`,
:class:`LoggingTaskTelemetrySink`, :class:`NoOpTaskTelemetrySink`, :class:`FanOutTaskTelemetrySink`
(several at once), and :func:`guard_sink` / :class:`GuardedTaskTelemetrySink` so a failing sink
never harms its caller. :func:`read_task_event` reads an event's facts (:class:`TaskEventFacts`)
the way every sink does, for a sink of your own.

Every sink has ``async def emit(event) -> None`` and so satisfies PenguiFlow's
``penguiflow.sessions.telemetry.TaskTelemetrySink`` and :class:`guarded.models.TaskTelemetrySink`.
Each accepts PenguiFlow's ``TaskTelemetryEvent``, :class:`guarded.models.TaskTelemetryEvent`, or
any object or mapping with the same fields; bad fields are counted under ``other`` and logged,
never raised. See docs/telemetry.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fan_out import FanOutTaskTelemetrySink
from .guarded_sink import GuardedTaskTelemetrySink, guard_sink
from .logging_sink import LoggingTaskTelemetrySink
from .noop import NoOpTaskTelemetrySink
from .otel import OTelTaskTelemetrySink
from .prometheus import PrometheusTaskTelemetrySink
from .task_events import TaskEventFacts, read_task_event

if TYPE_CHECKING:
    from ..models import TaskTelemetrySink

    def _every_sink_is_a_task_telemetry_sink(
        prometheus: PrometheusTaskTelemetrySink,
        otel: OTelTaskTelemetrySink,
        logging: LoggingTaskTelemetrySink,
        noop: NoOpTaskTelemetrySink,
        fan_out: FanOutTaskTelemetrySink,
        guarded: GuardedTaskTelemetrySink,
    ) -> list[TaskTelemetrySink]:
        return [prometheus, otel, logging, noop, fan_out, guarded]


__all__ = [
    "FanOutTaskTelemetrySink",
    "GuardedTaskTelemetrySink",
    "LoggingTaskTelemetrySink",
    "NoOpTaskTelemetrySink",
    "OTelTaskTelemetrySink",
    "PrometheusTaskTelemetrySink",
    "TaskEventFacts",
    "guard_sink",
    "read_task_event",
]
