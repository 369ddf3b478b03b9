"""Refused payloads whose keys and values hold a secret, through every write
method of a guarded store; the secret must appear in no parked reason, no log record and no
metric, and every refused write the guard keeps must be parked with its reason.

Shared by tests/guard/test_no_payload_in_reasons.py (``InMemoryStateStore``) and
tests/postgres/test_no_payload_in_reasons.py (``PostgresStateStore`` on a real server).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from guarded.config import DeadLetterConfig, GuardConfig, LoggingConfig
from guarded.guard import controller
from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    UpdateType,
)
from tests.support.records import plain_event
from tests.support.records import plain_task as task

SECRET = "ZQX-078-05-1120"
"""The marker: it must never show up in a reason, a log record or a metric."""
SECRET_DIGITS = "780511207805112"
"""The marker as digits, for the values that are numbers."""
KEY = f"ssn={SECRET}"
SURROGATE_TEXT = f"{SECRET} \udc80"
"""Text with the marker and a lone surrogate: refused as text that cannot be stored."""
MARKERS = (SECRET, SECRET_DIGITS, "078-05-1120", "05-1120")


class Opaque:
    """A value JSON cannot carry, whose ``repr`` and ``str`` are the secret."""

    def __repr__(self) -> str:
        return f"Opaque({SECRET})"

    __str__ = __repr__


def huge_int(digits: int) -> int:
    """A positive integer of ``digits`` digits that begins with the secret's digits."""
    return int(SECRET_DIGITS) * 10 ** (digits - len(SECRET_DIGITS)) + 1


def bad_payloads() -> dict[str, dict[Any, Any]]:
    """Payloads the codec refuses; each has the secret in a key, a value, or both."""
    return {
        "nan under a secret key": {"fine": 1, KEY: math.nan},
        "infinity deep under secret keys": {"ok": {KEY: [1, {SECRET: math.inf}]}},
        "lone surrogate in a secret value": {"text": SURROGATE_TEXT},
        "lone surrogate in a secret key": {KEY + "\udc80": 1},
        "non-string secret key": {(SECRET,): 1},
        "object that prints the secret": {KEY: Opaque()},
        "5,000-digit integer": {KEY: huge_int(5_000)},
    }


def event(payload: Any, **changes: Any) -> StoredEvent:
    return plain_event(payload=payload, **changes)


def update(content: Any) -> StateUpdate:
    return StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=content)


def steering(payload: Any, event_type: Any = SteeringEventType.INJECT_CONTEXT) -> SteeringEvent:
    built = SteeringEvent(
        session_id="s", task_id="t", event_type=SteeringEventType.INJECT_CONTEXT, payload={}
    )
    return built.model_copy(update={"payload": payload, "event_type": event_type})


def binding(metadata: Any, **changes: Any) -> RemoteBinding:
    fields: dict[str, Any] = {"trace_id": "t", "context_id": None, "task_id": "k", "agent_url": "u"}
    fields.update(changes)
    return RemoteBinding(**fields, metadata=metadata)


WriteCall = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Case:
    method: str
    """The guarded method called (its ``method`` label)."""
    call: WriteCall


def cases(payload: dict[Any, Any]) -> list[Case]:
    """A refused call of every write method, each carrying ``payload``."""
    return [
        Case("save_event", lambda s: s.save_event(event(payload))),
        Case("save_events", lambda s: s.save_events([event({"ok": 1}), event(payload)])),
        Case("save_remote_binding", lambda s: s.save_remote_binding(binding(payload))),
        Case("save_remote_bindings", lambda s: s.save_remote_bindings([binding(payload)])),
        Case("save_planner_state", lambda s: s.save_planner_state("tok", payload)),
        Case("save_planner_states", lambda s: s.save_planner_states([("tok", payload)])),
        Case("save_memory_state", lambda s: s.save_memory_state("k", payload)),
        Case("save_memory_states", lambda s: s.save_memory_states([("k", payload)])),
        Case("save_task", lambda s: s.save_task(task(result=payload))),
        Case("save_tasks", lambda s: s.save_tasks([task(result=payload)])),
        Case("save_update", lambda s: s.save_update(update(payload))),
        Case("save_updates", lambda s: s.save_updates([update(payload)])),
        Case("save_task_update", lambda s: s.save_task_update(update(payload))),
        Case("save_steering", lambda s: s.save_steering(steering(payload))),
        Case("save_trajectory", lambda s: s.save_trajectory("t", "s", payload)),
        Case("save_trajectories", lambda s: s.save_trajectories([("t", "s", payload)])),
        Case(
            "save_planner_event",
            lambda s: s.save_planner_event("t", PlannerEvent("x", 1.0, 1, extra=payload)),
        ),
        Case(
            "save_planner_events",
            lambda s: s.save_planner_events([("t", PlannerEvent("x", 1.0, 1, extra=payload))]),
        ),
        Case("artifact_store.put_bytes", lambda s: s.artifact_store.put_bytes(b"x", meta=payload)),
        Case("artifact_store.put_text", lambda s: s.artifact_store.put_text("x", meta=payload)),
    ]


def id_cases() -> list[Case]:
    """Refused calls whose secret is in an id, a number or a field that is not a payload."""
    long_number = huge_int(400)  # fits an int's text, not a double precision
    return [
        Case("save_event", lambda s: s.save_event(event({"ok": 1}, kind=SURROGATE_TEXT))),
        Case("save_event", lambda s: s.save_event(event({"ok": 1}, ts=long_number))),
        Case("save_event", lambda s: s.save_event(event({"ok": 1}, trace_id=SURROGATE_TEXT))),
        Case(
            "mark_binding_terminal",
            lambda s: s.mark_binding_terminal(trace_id=SURROGATE_TEXT, context_id=None, task_id="k"),
        ),
        Case("mark_bindings_terminal", lambda s: s.mark_bindings_terminal([(SURROGATE_TEXT, None, "k")])),
        Case("save_remote_binding", lambda s: s.save_remote_binding(binding({}, agent_url=SURROGATE_TEXT))),
        Case("save_planner_state", lambda s: s.save_planner_state(SURROGATE_TEXT, {"ok": 1})),
        Case("save_memory_state", lambda s: s.save_memory_state(SURROGATE_TEXT, {"ok": 1})),
        Case("save_task", lambda s: s.save_task(task(task_id=SURROGATE_TEXT))),
        Case("save_task", lambda s: s.save_task(task(priority=huge_int(5_000)))),
        Case("save_update", lambda s: s.save_update(update(huge_int(5_000)))),
        Case("save_steering", lambda s: s.save_steering(steering({KEY: SECRET}))),  # no 'text'
        Case("save_steering", lambda s: s.save_steering(steering({"text": "t"}, event_type=SECRET))),
        Case(
            "save_steering",
            lambda s: s.save_steering(
                steering({"text": "t"}).model_copy(update={"event_id": SURROGATE_TEXT})
            ),
        ),
        Case("save_trajectory", lambda s: s.save_trajectory("t", SURROGATE_TEXT, {"ok": 1})),
        Case("save_trajectory", lambda s: s.save_trajectory("t", "s", {KEY: Opaque()})),
        Case(
            "save_planner_event",
            lambda s: s.save_planner_event("t", PlannerEvent("x", 1.0, 1, thought=SURROGATE_TEXT)),
        ),
        Case("save_planner_event", lambda s: s.save_planner_event("t", PlannerEvent("x", long_number, 1))),
        Case("artifact_store.put_text", lambda s: s.artifact_store.put_text(SURROGATE_TEXT)),
        Case("artifact_store.put_bytes", lambda s: s.artifact_store.put_bytes(b"x", filename=SURROGATE_TEXT)),
    ]


def all_cases() -> list[Case]:
    found = [case for payload in bad_payloads().values() for case in cases(payload)]
    return [*found, *id_cases()]


def guard_config(spill: str | None) -> GuardConfig:
    # Log every failure (no rate limit), so every record a refusal makes is seen.
    return GuardConfig(dead_letter=DeadLetterConfig(path=spill), logging=LoggingConfig(interval=0))


def leaks(text: str) -> list[str]:
    return [marker for marker in MARKERS if marker in text]


def record_text(record: logging.LogRecord) -> str:
    """Everything a log record carries: its message, its extra fields, its traceback."""
    formatted = logging.Formatter().format(record)
    return (
        formatted + " " + " ".join(f"{key}={value!r}" for key, value in vars(record).items() if key != "args")
    )


async def exercise(store: Any, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture) -> None:
    """Run every refused call through ``store`` (a guard); assert no secret escapes and that each
    refused write the guard keeps (a dead-lettered method's ``rejected`` call) is parked."""
    caplog.set_level(logging.DEBUG)
    guarded = controller(store)
    dead_letters = guarded.dead_letters
    assert dead_letters is not None
    kept_methods = {method for method in guarded.guarded_methods() if guarded.policy(method).dead_letter}
    problems: list[str] = []
    ran: set[str] = set()
    for case in all_cases():
        owner, _, name = case.method.rpartition(".")
        if not hasattr(getattr(store, owner) if owner else store, name):
            continue  # a bulk form this backend does not have
        ran.add(case.method)
        before = guarded.stats()
        parked_before = len(await dead_letters.parked())
        await case.call(store)  # must not throw
        await guarded.flush()
        after = guarded.stats()
        rejected = after.get((case.method, "rejected"), 0) - before.get((case.method, "rejected"), 0)
        parked = len(await dead_letters.parked()) - parked_before
        if case.method in kept_methods and rejected and parked != rejected:
            problems.append(f"{case.method}: {rejected} rejected, {parked} parked")
    assert not problems, problems
    assert {"save_event", "save_memory_state", "save_steering", "artifact_store.put_bytes"} <= ran

    parked = await dead_letters.parked()
    assert parked, "nothing was parked: the cases no longer exercise refusals"
    for write in parked:
        assert write.reason, write
        assert not leaks(write.reason), write.reason
    for record in caplog.records:
        assert not leaks(record_text(record)), record_text(record)
    exposition = generate_latest(registry).decode("utf-8", "replace")
    assert not leaks(exposition), [line for line in exposition.splitlines() if leaks(line)]
