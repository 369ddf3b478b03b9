"""What a task telemetry event says, read defensively into bounded values.

Accepts :class:`guarded.models.TaskTelemetryEvent`, PenguiFlow's
``penguiflow.sessions.telemetry.TaskTelemetryEvent`` and any object (or mapping) with the same
fields (spec 000, "Telemetry Integration"). Reading never raises: a field that is missing, of the
wrong type or outside its known values becomes ``other`` (``none`` for a missing mode), is
logged (at most once per kind of problem per five minutes) and the event is still counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, get_args

from ..models.task_telemetry import TaskMode, TaskOutcome, TaskTelemetryEventType
from ..models.tasks import TaskStatus, TaskType
from ..observability.rate_limited_log import RateLimitedLog

EVENT_TYPES: tuple[str, ...] = get_args(TaskTelemetryEventType)
"""The event types of spec 000 and PenguiFlow 3.11."""
TASK_SPAWNED = "task_spawned"
TASK_ENDS: frozenset[str] = frozenset({"task_completed", "task_failed", "task_cancelled"})
"""Events that end a task (a task group's end is not a task's end)."""
OUTCOMES: tuple[str, ...] = get_args(TaskOutcome)
TASK_TYPES: tuple[str, ...] = tuple(task_type.value.lower() for task_type in TaskType)
"""Label values of ``task_type``: PenguiFlow's ``TaskType`` values, lower-cased."""
MODES: tuple[str, ...] = get_args(TaskMode)
STATUSES: tuple[str, ...] = tuple(status.value for status in TaskStatus)
OTHER = "other"
"""The label value of anything outside the known values (and of a missing field)."""
NO_MODE = "none"
"""The ``mode`` label value of an event without a mode."""

_MAX_ID_CHARS = 256
_MAX_REASON_CHARS = 200
_MAX_SHOWN_CHARS = 64

_problems = RateLimitedLog(interval=300.0, log=logging.getLogger("guarded.telemetry"))


@dataclass(frozen=True, slots=True)
class TaskEventFacts:
    """One event, read: bounded label values, ids (for spans and logs only) and the duration."""

    event_type: str
    outcome: str
    task_type: str
    mode: str
    duration_s: float | None = None
    """From ``duration_ms``; ``None`` when absent or not a finite non-negative number."""
    task_id: str | None = None
    session_id: str | None = None
    trace_id: str | None = None
    parent_task_id: str | None = None
    status: str | None = None
    spawn_reason: str | None = None
    """Truncated to 200 characters."""
    created_at_s: float | None = None
    """When the event was created (Unix time), when it says so."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The event's ``extra`` mapping itself; sinks export its keys, never its values."""

    @property
    def labels(self) -> tuple[str, str, str, str]:
        """``(event_type, outcome, task_type, mode)``: every value from a fixed, small set."""
        return (self.event_type, self.outcome, self.task_type, self.mode)

    @property
    def spawns_task(self) -> bool:
        return self.event_type == TASK_SPAWNED

    @property
    def ends_task(self) -> bool:
        return self.event_type in TASK_ENDS

    @property
    def is_terminal(self) -> bool:
        """A task's or a task group's end: the events whose duration is observed."""
        return self.event_type != TASK_SPAWNED and self.event_type != OTHER

    @property
    def extra_keys(self) -> tuple[str, ...]:
        """The names of the ``extra`` fields (at most 20, each at most 64 characters)."""
        return tuple(str(key)[:_MAX_SHOWN_CHARS] for key in list(self.extra)[:20])


def read_task_event(event: object) -> TaskEventFacts:
    """The facts of ``event``; never raises (see the module docstring)."""
    if isinstance(event, TaskEventFacts):
        return event
    get = _getter(event)
    extra = get("extra")
    return TaskEventFacts(
        event_type=_choice(get("event_type"), EVENT_TYPES, "event_type"),
        outcome=_choice(get("outcome"), OUTCOMES, "outcome"),
        task_type=_choice(get("task_type"), TASK_TYPES, "task_type", lower=True),
        mode=_choice(get("mode"), MODES, "mode", missing=NO_MODE),
        duration_s=_duration_seconds(get("duration_ms")),
        task_id=_identifier(get("task_id")),
        session_id=_identifier(get("session_id")),
        trace_id=_identifier(get("trace_id")),
        parent_task_id=_identifier(get("parent_task_id")),
        status=_choice(get("status"), STATUSES, "status", upper=True, missing=None),
        spawn_reason=_text(get("spawn_reason"), _MAX_REASON_CHARS),
        created_at_s=_timestamp(get("created_at_s")),
        extra=extra if isinstance(extra, Mapping) else {},
    )


def _getter(event: object) -> Any:
    if isinstance(event, Mapping):

        def from_mapping(name: str) -> Any:
            try:
                return event.get(name)
            except Exception:
                return None

        return from_mapping

    def from_attribute(name: str) -> Any:
        try:
            return getattr(event, name, None)
        except Exception:
            return None

    return from_attribute


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return value


def _choice(
    value: Any,
    allowed: tuple[str, ...],
    name: str,
    *,
    lower: bool = False,
    upper: bool = False,
    missing: str | None = OTHER,
) -> Any:
    if value is None:
        if missing == OTHER:
            _problem(name, "missing", "task telemetry event without %s: counted as %r", name, OTHER)
        return missing
    text = _plain(value)
    if not isinstance(text, str):
        _problem(
            name,
            "type",
            "task telemetry event with a %s of type %s: counted as %r",
            name,
            type(value).__name__,
            OTHER,
        )
        return OTHER
    if lower:
        text = text.lower()
    elif upper:
        text = text.upper()
    if text in allowed:
        return text
    _problem(
        name,
        "unknown",
        "task telemetry event with unknown %s %r: counted as %r",
        name,
        text[:_MAX_SHOWN_CHARS],
        OTHER,
    )
    return OTHER


def _identifier(value: Any) -> str | None:
    value = _plain(value)
    if isinstance(value, str):
        return value[:_MAX_ID_CHARS] or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _text(value: Any, limit: int) -> str | None:
    value = _plain(value)
    return value[:limit] if isinstance(value, str) and value else None


def _timestamp(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _duration_seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        milliseconds = float(value)
        if math.isfinite(milliseconds) and milliseconds >= 0:
            return milliseconds / 1000.0
    _problem(
        "duration_ms",
        "invalid",
        "task telemetry event with an invalid duration_ms (%s): duration not observed",
        type(value).__name__,
    )
    return None


def _problem(name: str, problem: str, message: str, *args: object) -> None:
    _problems.log(
        (name, problem),
        logging.WARNING,
        message,
        *args,
        extra={"event": "task_telemetry_bad_event", "field": name, "problem": problem},
    )
