"""Reading task telemetry events of every origin into bounded values (spec 000, "Telemetry Integration")."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest

from guarded.telemetry import read_task_event
from guarded.telemetry.task_events import NO_MODE, OTHER

from .support import PARENT_ID, SESSION_ID, TASK_ID, TRACE_ID, our_event, pf_event


def test_penguiflow_and_guarded_events_read_alike() -> None:
    for event_type in ("task_spawned", "task_completed", "task_failed", "task_cancelled"):
        theirs = read_task_event(pf_event(event_type, duration_ms=1500.0, created_at_s=5.0))
        ours = read_task_event(our_event(event_type, duration_ms=1500.0, created_at_s=5.0))
        assert theirs == ours
        assert theirs.event_type == event_type
        assert theirs.task_type == "background"
        assert theirs.mode == "subagent"
        assert theirs.duration_s == 1.5
        assert (theirs.task_id, theirs.session_id, theirs.trace_id, theirs.parent_task_id) == (
            TASK_ID,
            SESSION_ID,
            TRACE_ID,
            PARENT_ID,
        )


@dataclass
class DuckEvent:
    event_type: Any = "task_completed"
    outcome: Any = "completed"
    task_id: Any = "t-1"
    session_id: Any = "s-1"
    task_type: Any = "FOREGROUND"
    status: Any = "complete"
    mode: Any = None
    duration_ms: Any = 250
    created_at_s: Any = 10.0


def test_any_object_or_mapping_with_the_fields_is_read() -> None:
    duck = read_task_event(DuckEvent())
    assert duck.labels == ("task_completed", "completed", "foreground", NO_MODE)
    assert duck.duration_s == 0.25
    assert duck.status == "COMPLETE"
    mapping = read_task_event(
        {"event_type": "task_spawned", "outcome": "spawned", "task_type": "background", "mode": "job"}
    )
    assert mapping.labels == ("task_spawned", "spawned", "background", "job")


def test_unknown_event_type_is_other_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "guarded.telemetry")
    for _ in range(3):
        facts = read_task_event(DuckEvent(event_type="task_paused"))
        assert facts.event_type == OTHER
        assert not facts.is_terminal
        assert not facts.ends_task
    warnings = [r for r in caplog.records if getattr(r, "field", None) == "event_type"]
    assert len(warnings) == 1
    assert "task_paused" in warnings[0].getMessage()


@pytest.mark.parametrize(
    "bad",
    [
        None,
        42,
        "task_completed",
        object(),
        DuckEvent(event_type=7, outcome=["x"], task_type=3.5, mode="turbo", task_id=None, session_id={}),
        DuckEvent(task_type="sidegrade", status=12, duration_ms="12"),
        DuckEvent(duration_ms=float("nan")),
        DuckEvent(duration_ms=-5),
        DuckEvent(duration_ms=True),
        {"event_type": None, "extra": "not a mapping"},
    ],
)
def test_bad_events_never_raise_and_keep_labels_bounded(bad: object) -> None:
    facts = read_task_event(bad)
    assert facts.event_type in {"task_completed", OTHER}
    assert facts.outcome in {"completed", OTHER}
    assert facts.task_type in {"foreground", "background", OTHER}
    assert facts.mode in {"foreground", "subagent", "job", NO_MODE, OTHER}
    assert facts.duration_s is None or facts.duration_s >= 0
    assert facts.task_id is None or isinstance(facts.task_id, str)
    assert facts.session_id is None or isinstance(facts.session_id, str)
    assert isinstance(dict(facts.extra), dict)


def test_invalid_durations_are_dropped_not_guessed() -> None:
    for duration in ("12", float("inf"), float("nan"), -1.0, True):
        assert read_task_event(DuckEvent(duration_ms=duration)).duration_s is None
    assert read_task_event(DuckEvent(duration_ms=0)).duration_s == 0.0


class Exploding:
    """An event whose attributes raise when read."""

    @property
    def event_type(self) -> str:
        raise RuntimeError("broken property")

    outcome = "failed"
    task_type = "BACKGROUND"


def test_fields_that_raise_when_read_count_as_missing() -> None:
    facts = read_task_event(Exploding())
    assert facts.labels == (OTHER, "failed", "background", NO_MODE)


def test_non_string_ids_are_not_invented() -> None:
    facts = read_task_event(DuckEvent(task_id=123, session_id=b"bytes"))
    assert facts.task_id == "123"
    assert facts.session_id is None
