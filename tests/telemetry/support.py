"""Events, readers and waits shared by the telemetry tests."""

from __future__ import annotations

from typing import Any

from penguiflow.sessions import TaskStatus as PFTaskStatus
from penguiflow.sessions import TaskTelemetryEvent as PFTaskTelemetryEvent
from penguiflow.sessions import TaskType as PFTaskType
from prometheus_client import CollectorRegistry

from guarded.models import TaskStatus, TaskTelemetryEvent, TaskType
from guarded.observability import telemetry_names as names
from tests.support.metrics import sample as value
from tests.support.metrics import task_events as events  # noqa: F401 - shared, re-exported

SECRET = "s3cr3t-PAYLOAD-77a1"
"""Put in the events' ``extra`` (payload); must never reach a metric, a span or a log record."""
TASK_ID = "task-id-0001"
SESSION_ID = "session-id-0002"
TRACE_ID = "trace-id-0003"
PARENT_ID = "parent-id-0004"
IDS = (TASK_ID, SESSION_ID, TRACE_ID, PARENT_ID)

_OUTCOME = {
    "task_spawned": "spawned",
    "task_completed": "completed",
    "task_failed": "failed",
    "task_cancelled": "cancelled",
    "task_group_completed": "completed",
    "task_group_failed": "failed",
}
_STATUS = {
    "spawned": "PENDING",
    "completed": "COMPLETE",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
}


def pf_event(event_type: str, **fields: Any) -> PFTaskTelemetryEvent:
    """A real PenguiFlow event, with ids and secret-bearing ``extra`` by default."""
    outcome = fields.pop("outcome", _OUTCOME[event_type])
    values: dict[str, Any] = {
        "event_type": event_type,
        "outcome": outcome,
        "session_id": SESSION_ID,
        "task_id": TASK_ID,
        "parent_task_id": PARENT_ID,
        "trace_id": TRACE_ID,
        "task_type": PFTaskType.BACKGROUND,
        "status": PFTaskStatus(_STATUS[outcome]),
        "mode": "subagent",
        "spawn_reason": "tool:web_search",
        "extra": {"error": f"boom {SECRET}", "error_type": "RuntimeError"},
    }
    values.update(fields)
    return PFTaskTelemetryEvent(**values)


def our_event(event_type: str, **fields: Any) -> TaskTelemetryEvent:
    """The same event as :func:`pf_event`, as guarded's own model."""
    values = pf_event(event_type, **fields).model_dump()
    values["task_type"] = TaskType(values["task_type"].value)
    values["status"] = TaskStatus(values["status"].value)
    return TaskTelemetryEvent(**values)


def in_flight(registry: CollectorRegistry, task_type: str, mode: str) -> float:
    return value(registry, names.TASKS_IN_FLIGHT, task_type=task_type, mode=mode)


def label_values(registry: CollectorRegistry) -> set[str]:
    """Every label value of every sample the registry exports."""
    found: set[str] = set()
    for family in registry.collect():
        for sample in family.samples:
            found.update(sample.labels.values())
    return found


def assert_no_ids_or_payload(texts: set[str] | list[str]) -> None:
    for text in texts:
        assert SECRET not in text
        for identifier in IDS:
            assert identifier not in text
