"""Task telemetry sinks for PenguiFlow, and the memory health tracker.

Every sink has ``async def emit(event) -> None`` and so satisfies PenguiFlow's
``penguiflow.sessions.telemetry.TaskTelemetrySink`` and :class:`guarded.models.TaskTelemetrySink`.
Each accepts PenguiFlow's ``TaskTelemetryEvent``, :class:`guarded.models.TaskTelemetryEvent`, or
any object or mapping with the same fields; bad fields are counted under ``other`` and logged,
never raised. See docs/telemetry.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import TaskEventFacts, read_task_event
from .fan_out import FanOutTaskTelemetrySink
from .guarded_sink import GuardedTaskTelemetrySink, guard_sink
from .logging_sink import LoggingTaskTelemetrySink
from .memory_health import MemoryHealthTracker, memory_health_tracker
from .noop import NoOpTaskTelemetrySink
from .otel import OTelTaskTelemetrySink
from .prometheus import PrometheusTaskTelemetrySink

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
    "MemoryHealthTracker",
    "NoOpTaskTelemetrySink",
    "OTelTaskTelemetrySink",
    "PrometheusTaskTelemetrySink",
    "TaskEventFacts",
    "guard_sink",
    "memory_health_tracker",
    "read_task_event",
]
