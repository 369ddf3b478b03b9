"""What the dashboards (and alert rules) count as an error, a pause failure or a finished task.

One place for these decisions so a panel and an alert on the same thing always agree; they are
explained to operators in ``docs/dashboards.md``.
"""

from __future__ import annotations

from guarded.layers.breaker import BreakerState
from guarded.outcome import Outcome

ERROR_OUTCOMES: tuple[Outcome, ...] = (
    Outcome.TIMEOUT,
    Outcome.CIRCUIT_OPEN,
    Outcome.FALLBACK,
    Outcome.STALE,
    Outcome.DEAD_LETTERED,
    Outcome.REJECTED,
    Outcome.REFUSED,
)
"""Calls the backend did not serve: the caller got a fallback, a stale value, a write parked for
replay, a refusal of bad data or a write that could not be kept. These make up the error rate and
the error budget."""

SUCCESS_OUTCOMES: tuple[Outcome, ...] = (Outcome.OK, Outcome.RETRIED, Outcome.NOT_FOUND)
"""Calls the backend served; ``not_found`` is an answer ("no such key", an expired pause token),
not a failure."""

NEUTRAL_OUTCOMES: tuple[Outcome, ...] = (Outcome.CANCELLED,)
"""The caller cancelled: neither the backend's success nor its failure."""

SAVE_PAUSE_METHOD = "save_planner_state"
LOAD_PAUSE_METHOD = "load_planner_state"
PAUSE_METHODS: tuple[str, ...] = (SAVE_PAUSE_METHOD, LOAD_PAUSE_METHOD)
"""The planner pause/resume calls; spec 002 asks operators to watch their failures because a
failed save or load breaks human-in-the-loop and OAuth flows."""

PAUSE_SAVE_FAILURE_OUTCOMES: tuple[Outcome, ...] = tuple(o for o in ERROR_OUTCOMES if o is not Outcome.STALE)
"""A pause save that did not reach the database. ``dead_lettered`` counts: the pause is kept on
this host only, so a resume handled by another worker does not find it (spec 002)."""

PAUSE_LOAD_FAILURE_OUTCOMES: tuple[Outcome, ...] = tuple(
    o for o in ERROR_OUTCOMES if o not in (Outcome.STALE, Outcome.DEAD_LETTERED)
)
"""A pause load answered "nothing" because the store failed. ``stale`` is not a failure (the pause
came from this process's dead-letter buffer and the resume went on), nor is ``not_found`` (the
token expired or was consumed)."""

OUTCOME_COLORS: dict[Outcome, str] = {
    Outcome.OK: "green",
    Outcome.RETRIED: "light-green",
    Outcome.NOT_FOUND: "blue",
    Outcome.CANCELLED: "text",
    Outcome.STALE: "yellow",
    Outcome.DEAD_LETTERED: "orange",
    Outcome.TIMEOUT: "red",
    Outcome.FALLBACK: "dark-red",
    Outcome.CIRCUIT_OPEN: "purple",
    Outcome.REJECTED: "semi-dark-red",
    Outcome.REFUSED: "dark-purple",
}
"""Fixed colours per outcome: greens served, blue answered "nothing there", warm colours failed."""

CIRCUIT_STATE_CODES: tuple[tuple[BreakerState, int, str], ...] = (
    (BreakerState.CLOSED, 0, "green"),
    (BreakerState.HALF_OPEN, 1, "yellow"),
    (BreakerState.OPEN, 2, "red"),
    (BreakerState.FORCED_OPEN, 3, "purple"),
    (BreakerState.DISABLED, 4, "text"),
)
"""The number each breaker state is drawn as on the circuit state timeline, and its colour."""

MEMORY_HEALTH_COLORS: dict[str, str] = {
    "healthy": "green",
    "recovering": "blue",
    "retry": "yellow",
    "degraded": "red",
}
"""Colours of the memory health states of spec 003 (``MEMORY_HEALTH_STATES``)."""

# TaskTelemetryEvent.event_type values (spec 000 "Telemetry Integration").
TASK_SPAWNED = "task_spawned"
TASK_COMPLETED = "task_completed"
TASK_FAILED = "task_failed"
TASK_CANCELLED = "task_cancelled"
TASK_GROUP_COMPLETED = "task_group_completed"
TASK_GROUP_FAILED = "task_group_failed"
TASK_EVENT_TYPES: tuple[str, ...] = (
    TASK_SPAWNED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_CANCELLED,
    TASK_GROUP_COMPLETED,
    TASK_GROUP_FAILED,
)
TASK_TERMINAL_EVENTS: tuple[str, ...] = (TASK_COMPLETED, TASK_FAILED, TASK_CANCELLED)
"""The events that end a task; the task failure ratio is failed over these."""

# Thresholds drawn on panels; they are those of the alert rules (dashboards/alerts.py).
TASK_FAILURE_RATIO_ALERT = 0.10
DEADLETTER_AGE_WARNING_SECONDS = 15 * 60
DEADLETTER_AGE_CRITICAL_SECONDS = 60 * 60
PARTITION_HORIZON_ALERT_SECONDS = 3 * 86400
"""A partitioned table's newest partition ending closer than this warns (partitions are kept a week
ahead): the Postgres dashboard draws it on the horizon panel."""
LATENCY_P99_ALERT_SECONDS = 1.0
REDIS_MEMORY_ALERT_RATIO = 0.9
"""A Redis node's ``used_memory`` over its ``maxmemory`` above which GuardedRedisMemoryNearMax
fires (and the dashboard's memory panel turns red)."""
