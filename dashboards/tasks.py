"""The Tasks dashboard: background task lifecycle from guarded's TaskTelemetrySink.

Task metrics are labelled by event_type, outcome, task_type and mode (spec 000 "Telemetry
Integration"), not by store: tasks belong to sessions, whichever store persists them. So this
dashboard filters on ``instance`` only and breaks series down by task type and mode.
"""

from __future__ import annotations

from guarded.observability import telemetry_names as names

from . import promql as q
from .model import AlertAnnotation, Dashboard, Panel, Query, QueryVariable, Row, Threshold
from .provisioning import PROMETHEUS_NAME, PROMETHEUS_UID
from .semantics import (
    TASK_CANCELLED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_FAILURE_RATIO_ALERT,
    TASK_SPAWNED,
    TASK_TERMINAL_EVENTS,
)

UID = "guarded-tasks"
INSTANCE = "instance"
SCOPE = q.Scope((INSTANCE,))
TYPE_MODE = (names.LABEL_TASK_TYPE, names.LABEL_MODE)
EVENTS = q.counter(names.TASK_EVENTS)

_EVENT_PANELS: tuple[tuple[str, str, str], ...] = (
    (
        TASK_SPAWNED,
        "Tasks spawned per second",
        "New background tasks and subagents per second. A sudden rise can exhaust workers; a drop to "
        "zero while users are active means sessions stopped spawning work.",
    ),
    (
        TASK_COMPLETED,
        "Tasks completed per second",
        "Tasks finishing successfully. Well below the spawn rate for long means tasks pile up: compare "
        "with Tasks in flight.",
    ),
    (
        TASK_FAILED,
        "Tasks failed per second",
        "Tasks that ended in failure. Find the failing task type here, then its traces and logs; a "
        "failure burst right after a store outage points at the StateStore overview dashboard.",
    ),
    (
        TASK_CANCELLED,
        "Tasks cancelled per second",
        "Tasks cancelled by users, steering or parent tasks. A rise usually reflects user behaviour "
        "or an upstream timeout, not a task bug.",
    ),
)


def _events(*matchers: str) -> str:
    return q.sum_by(TYPE_MODE, q.rate(SCOPE.selector(EVENTS, *matchers)))


def _lifecycle_panels() -> tuple[Panel, ...]:
    any_event = q.sum_by(TYPE_MODE, SCOPE.selector(EVENTS))
    terminal = _events(q.one_of(names.LABEL_EVENT_TYPE, TASK_TERMINAL_EVENTS))
    failed = q.or_zero(_events(q.eq(names.LABEL_EVENT_TYPE, TASK_FAILED)), terminal)
    return (
        Panel(
            title="Task events per second by event type",
            description=(
                "Every task telemetry event per second, by event type (spawned, completed, failed, "
                "cancelled, task groups). The panels below break each one down by task type and mode."
            ),
            queries=(
                Query(q.sum_by((names.LABEL_EVENT_TYPE,), q.rate(SCOPE.selector(EVENTS))), "{{event_type}}"),
            ),
            unit="ops",
            width=24,
        ),
        *(
            Panel(
                title=title,
                description=description,
                queries=(
                    Query(
                        q.or_zero(_events(q.eq(names.LABEL_EVENT_TYPE, event_type)), any_event),
                        "{{task_type}} {{mode}}",
                    ),
                ),
                unit="ops",
                width=6,
            )
            for event_type, title, description in _EVENT_PANELS
        ),
        Panel(
            title="Task failure ratio",
            description=(
                "Failed tasks over all tasks that ended (completed, failed, cancelled). The task "
                "failure alert fires on this ratio. Above a few percent, find the task type here and "
                "its failures in traces and logs."
            ),
            queries=(Query(q.ratio(failed, terminal), "{{task_type}} {{mode}}"),),
            unit="percentunit",
            maximum=1,
            thresholds=(
                Threshold("yellow", TASK_FAILURE_RATIO_ALERT / 2),
                Threshold("red", TASK_FAILURE_RATIO_ALERT),
            ),
        ),
        Panel(
            title="Tasks in flight",
            description=(
                "Tasks spawned and not yet completed, failed or cancelled, per process. A steady climb "
                "means tasks hang or finish without a terminal event; a process restart drops its count."
            ),
            queries=(
                Query(
                    q.sum_by((INSTANCE, *TYPE_MODE), SCOPE.selector(names.TASKS_IN_FLIGHT)),
                    "{{task_type}} {{mode}} @ {{instance}}",
                ),
            ),
        ),
    )


def _duration_panels() -> tuple[Panel, ...]:
    buckets = SCOPE.selector(q.bucket(names.TASK_DURATION))
    by_outcome = (names.LABEL_OUTCOME,)
    return (
        Panel(
            title="Task duration by mode (p50 / p95 / p99)",
            description=(
                "How long tasks take from spawn to their end, by mode (foreground, subagent, job). "
                "Dots are exemplars linking to traces. A rising p99 for foreground tasks is what users "
                "feel first; compare with the store latency on the StateStore overview dashboard."
            ),
            queries=tuple(
                Query(
                    q.quantile(quantile, (names.LABEL_MODE,), buckets),
                    f"p{round(quantile * 100)} {{{{mode}}}}",
                    exemplar=True,
                )
                for quantile in (0.5, 0.95, 0.99)
            ),
            unit="s",
        ),
        Panel(
            title="Mean task duration by outcome",
            description=(
                "Average duration of tasks by how they ended. Failed tasks much slower than completed "
                "ones usually means they die on a timeout."
            ),
            queries=(
                Query(
                    q.ratio(
                        q.sum_by(by_outcome, q.rate(SCOPE.selector(q.histogram_sum(names.TASK_DURATION)))),
                        q.sum_by(by_outcome, q.rate(SCOPE.selector(q.histogram_count(names.TASK_DURATION)))),
                    ),
                    "{{outcome}}",
                ),
            ),
            unit="s",
        ),
    )


def dashboard() -> Dashboard:
    """The Tasks dashboard."""
    return Dashboard(
        uid=UID,
        title="guarded / Tasks",
        description="Task lifecycle: spawn, completion, failure and cancellation rates; durations.",
        tags=("guarded", "tasks", "penguiflow"),
        variables=(QueryVariable(INSTANCE, "Instance", EVENTS),),
        annotations=(
            AlertAnnotation(
                "Task alerts",
                q.firing_alerts((names.ALERT_TASK_FAILURE_RATIO,)),
                color="red",
            ),
        ),
        rows=(Row("Task lifecycle", _lifecycle_panels()), Row("Durations", _duration_panels())),
        default_datasource_uid=PROMETHEUS_UID,
        default_datasource_name=PROMETHEUS_NAME,
    )
