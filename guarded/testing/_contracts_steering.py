"""Contracts of what a steering event keeps: its fields round-trip, its payload is stored sanitized
(strings cut to 4,096 characters), and it is stored without being validated.

The cursor and ordering contracts of the steering stream (``steering.ascending``...) are made
with those of task updates in :mod:`._contracts_sessions`.
"""

from __future__ import annotations

from typing import Any

from ..models import SteeringEvent, SteeringEventType
from ._base import contract, expect_same, plain, show, survive, unique, violation
from ._contracts_sessions import STEERING, STREAMS

SANITIZATION = "spec 000 'Steering Payload Sanitization'"


@contract(
    "steering.roundtrip",
    "steering",
    "A steering event comes back with its id, type, payload, trace and source intact (spec 000 test 12).",
)
async def steering_roundtrip(store: Any) -> None:
    session = unique("session")
    saved = SteeringEvent(
        session_id=session,
        task_id=f"{session}-task",
        event_type=SteeringEventType.INJECT_CONTEXT,
        payload={"text": "Prefer sources from 2024 — ✓", "scope": "foreground", "severity": "note"},
        trace_id=f"{session}-trace",
        source="system",
    )
    await store.save_steering(saved.model_copy(deep=True))
    found = await STREAMS[1].list(store, session)
    if len(found) != 1:
        raise violation(
            f"list_steering returned {len(found)} events after one save_steering; expected 1 ({STEERING})"
        )
    rule = f"steering events must round-trip ({STEERING})"
    for name in ("session_id", "task_id", "event_id", "trace_id", "source"):
        expect_same(getattr(saved, name), getattr(found[0], name), name, rule)
    expect_same(saved.event_type.value, plain(found[0].event_type), "event_type", rule)
    expect_same(saved.payload, found[0].payload, "payload", rule)


@contract(
    "steering.sanitized",
    "steering",
    "Steering payloads are stored sanitized: a 10,000-character string comes back cut to 4,096.",
)
async def steering_sanitized(store: Any) -> None:
    session = unique("session")
    text = "x" * 10_000
    saved = SteeringEvent(
        session_id=session,
        task_id=f"{session}-task",
        event_type=SteeringEventType.USER_MESSAGE,
        payload={"text": text},
    )
    rule = (
        "steering payloads are untrusted and persisted sanitized; strings are cut to "
        f"MAX_STEERING_STRING = 4,096 ({SANITIZATION})"
    )
    await survive("save_steering of an oversized payload", store.save_steering(saved), rule)
    found = await STREAMS[1].list(store, session)
    if len(found) != 1:
        raise violation(
            f"list_steering returned {len(found)} events after one oversized save_steering, not 1; {rule}"
        )
    stored = found[0].payload.get("text") if hasattr(found[0].payload, "get") else None
    if not isinstance(stored, str) or len(stored) != 4_096 or not text.startswith(stored):
        length = len(stored) if isinstance(stored, str) else show(stored)
        raise violation(
            f"a 10,000-character payload['text'] came back with length {length}; expected its first "
            f"4,096 characters; {rule}"
        )


@contract(
    "steering.validation",
    "steering",
    "Events PenguiFlow's reference store keeps are stored (sanitized, not validated): a PRIORITIZE with "
    "{'priority': True} and a USER_MESSAGE without 'text'.",
)
async def steering_validation(store: Any) -> None:
    session = unique("session")
    payloads = [
        (SteeringEventType.PRIORITIZE, {"priority": True}),
        (SteeringEventType.USER_MESSAGE, {"items": [1, 2]}),
    ]
    rule = (
        "PenguiFlow validates in its sessions before save_steering; its reference store sanitizes and "
        f"stores every event, so a store that validates loses events PenguiFlow keeps ({SANITIZATION})"
    )
    for event_type, payload in payloads:
        event = SteeringEvent(
            session_id=session, task_id=f"{session}-task", event_type=event_type, payload=payload
        )
        try:
            await store.save_steering(event)
        except Exception as exc:
            raise violation(
                f"save_steering of a {event_type.value} raised {type(exc).__name__}; {rule}"
            ) from exc
    found = await STREAMS[1].list(store, session)
    stored = [(item.event_type, item.payload) for item in found]
    if stored != payloads:
        raise violation(f"list_steering returned {len(found)} events, expected both, unchanged; {rule}")
