"""Task lifecycle records (spec 000, "TaskState", "TaskContextSnapshot", "StateUpdate")."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from ._time import utc_now


class TaskStatus(str, Enum):
    """Lifecycle state of a task."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class TaskType(str, Enum):
    """Whether a task blocks the session (foreground) or runs beside it (background)."""

    FOREGROUND = "FOREGROUND"
    BACKGROUND = "BACKGROUND"


class UpdateType(str, Enum):
    """Kind of a :class:`StateUpdate`."""

    THINKING = "THINKING"
    PROGRESS = "PROGRESS"
    TOOL_CALL = "TOOL_CALL"
    RESULT = "RESULT"
    ERROR = "ERROR"
    CHECKPOINT = "CHECKPOINT"
    STATUS_CHANGE = "STATUS_CHANGE"
    NOTIFICATION = "NOTIFICATION"


class MergeStrategy(str, Enum):
    """How a background task's result is merged into the session context (spec 000, "Merge Strategies")."""

    APPEND = "append"
    REPLACE = "replace"
    HUMAN_GATED = "human_gated"


class TaskContextSnapshot(BaseModel):
    """The execution context captured when a task was spawned; used for divergence detection."""

    session_id: str
    task_id: str
    trace_id: str | None = None
    spawned_from_task_id: str = "foreground"
    spawned_from_event_id: str | None = None
    spawned_at: datetime = Field(default_factory=utc_now)
    spawn_reason: str | None = None
    query: str | None = None
    propagate_on_cancel: str = "cascade"
    notify_on_complete: bool = True
    context_version: int | None = None
    context_hash: str | None = None
    llm_context: dict[str, Any] = Field(default_factory=dict)
    tool_context: dict[str, Any] = Field(default_factory=dict)
    memory: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[dict[str, Any]] = Field(default_factory=list)


@dataclass(slots=True)
class TaskState:
    """The complete state of a foreground or background task (upserted by ``save_task``)."""

    task_id: str
    session_id: str
    status: TaskStatus
    task_type: TaskType
    priority: int
    context_snapshot: TaskContextSnapshot
    trace_id: str | None = None
    result: Any | None = None
    error: str | None = None
    description: str | None = None
    progress: dict[str, Any] | None = None
    created_at: datetime = field(default_factory=utc_now)
    updated_at: datetime = field(default_factory=utc_now)

    def update_status(self, status: TaskStatus) -> None:
        """Set ``status`` and refresh ``updated_at``."""
        self.status = status
        self.updated_at = utc_now()


class StateUpdate(BaseModel):
    """A streaming progress update from a task; ``update_id`` is its idempotency key."""

    session_id: str
    task_id: str
    trace_id: str | None = None
    update_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    update_type: UpdateType
    content: Any
    step_index: int | None = None
    total_steps: int | None = None
    created_at: datetime = Field(default_factory=utc_now)
