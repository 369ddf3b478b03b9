"""What the dashboards count as an error is complete and agrees with the alert rules."""

from __future__ import annotations

import typing

from penguiflow.sessions.telemetry import TaskTelemetryEvent

from dashboards import alerts, semantics
from guarded.layers.breaker import BreakerState
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome


def test_every_outcome_is_an_error_a_success_or_neutral_exactly_once() -> None:
    groups = (semantics.ERROR_OUTCOMES, semantics.SUCCESS_OUTCOMES, semantics.NEUTRAL_OUTCOMES)
    classified = [outcome for group in groups for outcome in group]
    assert sorted(classified) == sorted(Outcome)
    assert Outcome.NOT_FOUND in semantics.SUCCESS_OUTCOMES
    assert set(semantics.OUTCOME_COLORS) == set(Outcome)


def test_pause_failures_exclude_not_found_and_stale() -> None:
    for failures in (semantics.PAUSE_SAVE_FAILURE_OUTCOMES, semantics.PAUSE_LOAD_FAILURE_OUTCOMES):
        assert set(failures) <= set(semantics.ERROR_OUTCOMES)
        assert Outcome.NOT_FOUND not in failures
        assert Outcome.STALE not in failures
    assert Outcome.DEAD_LETTERED in semantics.PAUSE_SAVE_FAILURE_OUTCOMES


def test_the_dashboards_draw_the_alert_rules_thresholds() -> None:
    """The outcome classes are shared (``dashboards.alerts`` imports them from ``semantics``); the
    thresholds drawn on panels must be the ones the rules use."""
    assert semantics.TASK_FAILURE_RATIO_ALERT == alerts.TASK_FAILURE_RATIO_THRESHOLD
    assert semantics.DEADLETTER_AGE_WARNING_SECONDS == alerts.DEADLETTER_AGE_WARNING_SECONDS
    assert semantics.DEADLETTER_AGE_CRITICAL_SECONDS == alerts.DEADLETTER_AGE_CRITICAL_SECONDS
    assert semantics.LATENCY_P99_ALERT_SECONDS == alerts.LATENCY_P99_THRESHOLD_SECONDS


def test_task_event_types_are_penguiflows() -> None:
    annotation = TaskTelemetryEvent.model_fields["event_type"].annotation
    assert set(semantics.TASK_EVENT_TYPES) == set(typing.get_args(annotation))


def test_circuit_codes_cover_every_breaker_state_once() -> None:
    states = [state for state, _, _ in semantics.CIRCUIT_STATE_CODES]
    codes = [code for _, code, _ in semantics.CIRCUIT_STATE_CODES]
    assert sorted(states) == sorted(BreakerState)
    assert len(set(codes)) == len(codes)


def test_memory_health_colours_cover_the_spec_states() -> None:
    assert set(semantics.MEMORY_HEALTH_COLORS) == set(names.MEMORY_HEALTH_STATES)
