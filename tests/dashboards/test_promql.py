"""Every dashboard expression is valid PromQL, and the non-obvious ones compute what their panel
says, evaluated by Prometheus' engine (``promtool``) on synthetic series."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards import build, promql
from guarded.layers.breaker import BreakerState
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome

from .promtool import Sample, evaluation_failure, syntax_errors
from .support import dashboards_by_uid, raw_expressions

OVERVIEW = "guarded-store-overview"
TASKS = "guarded-tasks"
POSTGRES = "guarded-postgres"
CALLS = promql.counter(names.CALLS)
PROCESS = 'instance="worker-1:9464", store="primary"'


def _expressions() -> list[tuple[str, str]]:
    found = []
    for dashboard in build.all_dashboards():
        variables = build.variable_names(dashboard)
        found += [(where, build.expand(expr, variables)) for where, expr in raw_expressions(dashboard)]
    return found


def test_every_expression_parses(tmp_path: Path) -> None:
    expressions = _expressions()
    assert len(expressions) > 50
    errors = syntax_errors(expressions, tmp_path)
    assert not errors, "promtool rejects:\n" + "\n".join(errors)


def test_the_syntax_check_names_what_it_rejects(tmp_path: Path) -> None:
    errors = syntax_errors(
        [("fine", "sum(up)"), ("broken", 'sum by (store (up{store=~".+"})'), ("unexpanded", "rate(up[$x])")],
        tmp_path,
    )
    assert len(errors) == 2
    assert errors[0].startswith("broken:")
    assert "parse error" in errors[0]
    assert errors[1].startswith("unexpanded:")


def _expect(
    tmp_path: Path, series: dict[str, str], uid: str, title: str, expected: list[Sample], index: int = 0
) -> None:
    expr = build.panel_queries(dashboards_by_uid()[uid], rate_interval="5m")
    chosen = [query for name, query in expr if name == title][index]
    failure = evaluation_failure(series, chosen, 10, expected, tmp_path)
    assert failure is None, f"{title}: {chosen}\n{failure}"


def _calls(method: str, outcome: Outcome) -> str:
    return f'{CALLS}{{{PROCESS}, method="{method}", outcome="{outcome.value}"}}'


def test_circuit_state_timeline_draws_the_current_state_as_its_code(tmp_path: Path) -> None:
    series = {
        f'{names.CIRCUIT_STATE}{{{PROCESS}, state="{state.value}"}}': "1x10"
        if state is BreakerState.OPEN
        else "0x10"
        for state in BreakerState
    }
    series |= {
        f'{names.CIRCUIT_STATE}{{instance="worker-2:9464", store="primary", state="{state.value}"}}': (
            "1x10" if state is BreakerState.HALF_OPEN else "0x10"
        )
        for state in BreakerState
    }
    _expect(
        tmp_path,
        series,
        OVERVIEW,
        "Circuit state",
        [
            ('{instance="worker-1:9464", store="primary"}', 2),
            ('{instance="worker-2:9464", store="primary"}', 1),
        ],
    )


def test_error_ratio_counts_error_outcomes_only_and_shows_zero_for_healthy_methods(tmp_path: Path) -> None:
    series = {
        _calls("save_event", Outcome.OK): "0+2x10",
        _calls("save_event", Outcome.RETRIED): "0+1x10",
        _calls("save_event", Outcome.TIMEOUT): "0+1x10",
        _calls("load_history", Outcome.OK): "0+3x10",
        _calls("load_history", Outcome.CANCELLED): "0+1x10",
        _calls("get_trajectory", Outcome.NOT_FOUND): "0+4x10",
    }
    _expect(
        tmp_path,
        series,
        OVERVIEW,
        "Error ratio by method",
        [
            ('{store="primary", method="save_event"}', 0.25),
            ('{store="primary", method="load_history"}', 0),
            ('{store="primary", method="get_trajectory"}', 0),
        ],
    )


def test_pause_failures_leave_out_not_found_and_stale_loads(tmp_path: Path) -> None:
    series = {
        _calls("save_planner_state", Outcome.OK): "0+5x10",
        _calls("save_planner_state", Outcome.DEAD_LETTERED): "0+1x10",
        _calls("load_planner_state", Outcome.OK): "0+5x10",
        _calls("load_planner_state", Outcome.NOT_FOUND): "0+3x10",
        _calls("load_planner_state", Outcome.STALE): "0+2x10",
    }
    _expect(
        tmp_path,
        series,
        OVERVIEW,
        "Pause save / load failures",
        [
            ('{store="primary", method="save_planner_state"}', 5),
            ('{store="primary", method="load_planner_state"}', 0),
        ],
    )


def test_pause_load_timeouts_are_failures(tmp_path: Path) -> None:
    series = {
        _calls("load_planner_state", Outcome.NOT_FOUND): "0+3x10",
        _calls("load_planner_state", Outcome.TIMEOUT): "0+1x10",
    }
    _expect(
        tmp_path,
        series,
        OVERVIEW,
        "Pause save / load failures",
        [('{store="primary", method="load_planner_state"}', 5)],
    )


def test_dropped_writes_draw_zero_before_the_first_drop(tmp_path: Path) -> None:
    series = {f"{names.DLQ_DEPTH}{{{PROCESS}}}": "3x10"}
    _expect(tmp_path, series, OVERVIEW, "Dropped writes (data loss)", [('{store="primary"}', 0)])
    series[f'{names.DLQ_DROPPED}{{{PROCESS}, method="save_event", reason="disk_full"}}'] = "0+2x10"
    _expect(
        tmp_path,
        series,
        OVERVIEW,
        "Dropped writes (data loss)",
        [('{store="primary"}', 0), ('{store="primary", method="save_event", reason="disk_full"}', 10)],
    )


def test_task_failure_ratio_is_failed_over_ended_tasks(tmp_path: Path) -> None:
    labels = 'instance="worker-1:9464", task_type="background", mode="job"'

    def events(event_type: str, outcome: str) -> str:
        return f'{names.TASK_EVENTS}{{{labels}, event_type="{event_type}", outcome="{outcome}"}}'

    series = {
        events("task_spawned", "spawned"): "0+9x10",
        events("task_completed", "completed"): "0+2x10",
        events("task_failed", "failed"): "0+1x10",
        events("task_cancelled", "cancelled"): "0+1x10",
    }
    _expect(tmp_path, series, TASKS, "Task failure ratio", [('{task_type="background", mode="job"}', 0.25)])
    _expect(
        tmp_path, series, TASKS, "Tasks failed per second", [('{task_type="background", mode="job"}', 1 / 60)]
    )


def test_pool_utilisation_is_in_use_over_maximum(tmp_path: Path) -> None:
    labels = 'instance="worker-1:9464", store="primary", schema="tenant_a"'
    series = {
        f"{names.GUARDED_PG_POOL_IN_USE}{{{labels}}}": "3x10",
        f"{names.GUARDED_PG_POOL_MAX_SIZE}{{{labels}}}": "4x10",
    }
    _expect(tmp_path, series, POSTGRES, "Pool utilisation", [(f"{{{labels}}}", 0.75)])


@pytest.mark.parametrize("quantile_index", [0, 2])
def test_latency_quantiles_come_from_the_call_histogram(tmp_path: Path, quantile_index: int) -> None:
    bucket = promql.bucket(names.CALL_DURATION)
    method = 'method="load_memory_state", outcome="ok"'
    series = {
        f'{bucket}{{{PROCESS}, {method}, le="0.01"}}': "0+10x10",
        f'{bucket}{{{PROCESS}, {method}, le="0.1"}}': "0+10x10",
        f'{bucket}{{{PROCESS}, {method}, le="+Inf"}}': "0+10x10",
    }
    title = ("p50 latency by method", "p95 latency by method", "p99 latency by method")[quantile_index]
    expected = (0.005, 0.0095, 0.0099)[quantile_index]
    _expect(tmp_path, series, OVERVIEW, title, [('{store="primary", method="load_memory_state"}', expected)])
