"""Records the tests write: one factory of runtime events, numbered so a test can tell them apart,
and valid records with one field changed (:func:`plain_event`, :func:`plain_task`).

Each test package's events differ only in their fields' values (their base time, kind, payload),
so the packages call :func:`event` with theirs instead of building ``StoredEvent`` each its own way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from guarded.models import StoredEvent, TaskContextSnapshot, TaskState, TaskStatus, TaskType

NUMBERED: Final[Any] = object()
"""``node_id=NUMBERED`` (the default): the event's node id is ``f"n{index}"``."""

PLAIN: Final[Mapping[str, Any]] = {
    "trace_id": "t",
    "ts": 1.0,
    "kind": "k",
    "node_name": "n",
    "node_id": "i",
    "payload": {"ok": 1},
}
"""The fields of :func:`plain_event`."""


def event(
    trace_id: str | None = "t",
    index: int = 0,
    *,
    base: float = 1000.0,
    ts: float | None = None,
    kind: str = "node_end",
    node_name: str | None = "node",
    node_id: str | None = NUMBERED,
    payload: Mapping[str, Any] | None = None,
) -> StoredEvent:
    """Event number ``index`` of ``trace_id``: at ``base + index`` unless ``ts`` is given, node id
    ``f"n{index}"`` unless ``node_id`` is given, payload ``{"i": index}`` unless ``payload`` is."""
    return StoredEvent(
        trace_id,
        base + index if ts is None else ts,
        kind,
        node_name,
        f"n{index}" if node_id is NUMBERED else node_id,
        {"i": index} if payload is None else payload,
    )


def plain_event(**changes: Any) -> StoredEvent:
    """A valid event of fixed, short fields (:data:`PLAIN`) with ``changes`` applied: for tests
    of what a store makes of one field's value."""
    return StoredEvent(**{**PLAIN, **changes})


def plain_task(**changes: Any) -> TaskState:
    """A valid running background task ``"task"`` of session ``"s"`` with ``changes`` applied."""
    fields: dict[str, Any] = {
        "task_id": "task",
        "session_id": "s",
        "status": TaskStatus.RUNNING,
        "task_type": TaskType.BACKGROUND,
        "priority": 1,
        "context_snapshot": TaskContextSnapshot(session_id="s", task_id="task"),
    }
    return TaskState(**{**fields, **changes})
