"""Fault schedules of ``guarded demo``: named ones, the spec language, and refusals."""

from __future__ import annotations

import itertools
import re

import pytest

from guarded.demo.schedule import (
    DEFAULT_DURATIONS,
    DEFAULT_SCHEDULE_SECONDS,
    NAMED_SCHEDULES,
    FaultKind,
    PlannedFault,
    ScheduleError,
    effective_schedule,
    parse_schedule,
)


def test_a_spec_gives_seconds_or_percentages_ordered_by_start() -> None:
    faults = parse_schedule("restart@40%:3s,kill@2:1,slow@25%,bad@5.5s", 20)
    assert faults == [
        PlannedFault(FaultKind.KILL, 2.0, 1.0),
        PlannedFault(FaultKind.SLOW, 5.0, DEFAULT_DURATIONS[FaultKind.SLOW]),
        PlannedFault(FaultKind.BAD, 5.5, 0.0),
        PlannedFault(FaultKind.RESTART, 8.0, 3.0),
    ]


def test_none_is_empty_and_every_named_schedule_fits_the_default_run() -> None:
    assert parse_schedule("none", 30) == []
    for name in NAMED_SCHEDULES:
        for fault in parse_schedule(name, 30):
            assert 0 <= fault.at <= fault.ends <= 30


def test_the_default_schedule_has_every_kind_but_crash() -> None:
    kinds = {fault.kind for fault in parse_schedule("default", 30)}
    assert kinds == set(FaultKind) - {FaultKind.CRASH}


@pytest.mark.parametrize("seconds", [1, 3, 10, 29.9])
def test_a_short_run_gets_the_quick_schedule_one_fault_at_a_time(seconds: float) -> None:
    """``guarded demo --duration 10`` runs the default schedule's kinds, scaled to fit, none overlapping."""
    assert effective_schedule("default", seconds) == "quick"
    faults = parse_schedule("default", seconds)
    assert faults == parse_schedule("quick", seconds)
    assert {fault.kind for fault in faults} == set(FaultKind) - {FaultKind.CRASH}
    for earlier, later in itertools.pairwise(faults):
        assert earlier.ends < later.at, (earlier, later)
    assert faults[-1].ends <= seconds


def test_a_run_of_the_default_length_or_longer_keeps_the_default_schedule() -> None:
    for seconds in (DEFAULT_SCHEDULE_SECONDS, 300):
        assert effective_schedule("default", seconds) == "default"
        assert parse_schedule("default", seconds) != parse_schedule("quick", seconds)
    assert effective_schedule("restart-only", 5) == "restart-only"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("explode@1", "unknown fault kind 'explode'"),
        ("restart", "is not KIND@START[:DURATION]"),
        ("kill@soon", "start 'soon' is not seconds"),
        ("kill@1:forever", "duration 'forever' is not seconds"),
        ("restart@9:3", "ends at 12.0s, after the run (10s)"),
        ("load-only", "after the run"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(spec: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        parse_schedule(spec, 10 if spec != "load-only" else 3)
