"""Task telemetry as structured log records, without payload contents."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from .task_events import OTHER, read_task_event

DEFAULT_LEVELS: Mapping[str, int] = {
    "task_spawned": logging.INFO,
    "task_completed": logging.INFO,
    "task_failed": logging.ERROR,
    "task_cancelled": logging.WARNING,
    "task_group_completed": logging.INFO,
    "task_group_failed": logging.ERROR,
    OTHER: logging.WARNING,
}
"""Log level per event type, as PenguiFlow's own ``LoggingTaskTelemetrySink``; ``other`` is an
event of an unknown type."""

_MAX_VALUE_CHARS = 200


class LoggingTaskTelemetrySink:
    """A PenguiFlow ``TaskTelemetrySink`` writing one log record per event.

    Fields go in the record's ``extra`` (``event="task_telemetry"``, ``event_type``, ``outcome``,
    ``task_id``, ``session_id``, ``trace_id``, ``parent_task_id``, ``task_type``, ``mode``,
    ``status``, ``duration_ms``, ``spawn_reason``, ``extra_keys``), so a JSON formatter picks
    them up. The values of the event's ``extra`` (PenguiFlow puts the exception text of a failed
    task there, which may quote user data) are not logged, only their keys, unless listed in
    ``extra_values`` (e.g. ``("error_type",)``; logged under ``task_extra``, scalars only, strings
    truncated to 200 characters).

    Args:
        logger: where records go (``guarded.telemetry.tasks`` by default).
        levels: level per event type, overriding :data:`DEFAULT_LEVELS` entry by entry.
        extra_values: keys of ``extra`` whose values may be logged.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        levels: Mapping[str, int] | None = None,
        extra_values: Collection[str] = (),
    ) -> None:
        self._logger = logger or logging.getLogger("guarded.telemetry.tasks")
        self._levels = {**DEFAULT_LEVELS, **(levels or {})}
        self._extra_values = tuple(extra_values)

    async def emit(self, event: object) -> None:
        """Log ``event``: any task telemetry event (:func:`~guarded.telemetry.read_task_event`)."""
        self.record(event)

    def record(self, event: object) -> None:
        """What :meth:`emit` does, callable from synchronous code."""
        facts = read_task_event(event)
        level = self._levels.get(facts.event_type, logging.WARNING)
        if not self._logger.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "event": "task_telemetry",
            "event_type": facts.event_type,
            "outcome": facts.outcome,
            "task_id": facts.task_id,
            "session_id": facts.session_id,
            "trace_id": facts.trace_id,
            "parent_task_id": facts.parent_task_id,
            "task_type": facts.task_type,
            "mode": facts.mode,
            "status": facts.status,
            "duration_ms": None if facts.duration_s is None else round(facts.duration_s * 1000.0, 3),
            "spawn_reason": facts.spawn_reason,
            "extra_keys": list(facts.extra_keys),
        }
        allowed = self._allowed_extra(facts.extra)
        if allowed:
            fields["task_extra"] = allowed
        duration = "" if fields["duration_ms"] is None else f" duration_ms={fields['duration_ms']}"
        self._logger.log(
            level,
            "%s task=%s session=%s task_type=%s mode=%s%s",
            facts.event_type,
            facts.task_id,
            facts.session_id,
            facts.task_type,
            facts.mode,
            duration,
            extra=fields,
        )

    def _allowed_extra(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        allowed: dict[str, Any] = {}
        for key in self._extra_values:
            try:
                value = extra.get(key)
            except Exception:
                continue
            if isinstance(value, str):
                allowed[key] = value[:_MAX_VALUE_CHARS]
            elif isinstance(value, bool | int | float):
                allowed[key] = value
        return allowed
