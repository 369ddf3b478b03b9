"""Task telemetry records (spec 000, "Telemetry Integration")."""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from .tasks import TaskStatus, TaskType

TaskTelemetryEventType = Literal[
    "task_spawned",
    "task_completed",
    "task_failed",
    "task_cancelled",
    "task_group_completed",
    "task_group_failed",
]
TaskOutcome = Literal["spawned", "completed", "failed", "cancelled"]
TaskMode = Literal["foreground", "subagent", "job"]


class TaskTelemetryEvent(BaseModel):
    """A task lifecycle event emitted to a :class:`TaskTelemetrySink`."""

    event_type: TaskTelemetryEventType
    outcome: TaskOutcome
    session_id: str
    task_id: str
    parent_task_id: str | None = None
    trace_id: str | None = None
    task_type: TaskType
    status: TaskStatus
    mode: TaskMode | None = None
    spawn_reason: str | None = None
    duration_ms: float | None = None
    created_at_s: float = Field(default_factory=time.time)
    extra: dict[str, Any] = Field(default_factory=dict)


class TaskTelemetrySink(Protocol):
    """Receives task lifecycle events; fire-and-forget from the caller's point of view."""

    async def emit(self, event: TaskTelemetryEvent) -> None: ...
