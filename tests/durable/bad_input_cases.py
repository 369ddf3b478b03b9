"""The bad inputs every store refuses before any I/O: ``(name, call, method, path)``, where
``call(store)`` makes a call with a value JSON (or the store) cannot carry, ``method`` and ``path``
are what the :class:`~guarded.errors.InvalidPayloadError` names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    TaskContextSnapshot,
    UpdateType,
)
from tests.support.records import plain_event as event
from tests.support.records import plain_task as task

NAN = float("nan")
SURROGATE = "bad \udc80 text"


class Opaque:
    """An object JSON cannot serialise."""


Call = Callable[[Any], Awaitable[Any]]


def untyped(store: Any) -> Any:
    """The store without static types, to pass it arguments of the wrong type on purpose."""
    return store


CASES: list[tuple[str, Call, str, str]] = [
    (
        "nan payload",
        lambda s: s.save_event(event(payload={"x": NAN})),
        "save_event",
        "event.payload[key #0 (str)]",
    ),
    ("inf ts", lambda s: s.save_event(event(ts=float("inf"))), "save_event", "event.ts"),
    ("huge int ts", lambda s: s.save_event(event(ts=10**400)), "save_event", "event.ts"),
    ("str ts", lambda s: s.save_event(event(ts="1.0")), "save_event", "event.ts"),
    ("surrogate kind", lambda s: s.save_event(event(kind=SURROGATE)), "save_event", "event.kind"),
    (
        "object in payload",
        lambda s: s.save_event(event(payload={"a": [1, Opaque()]})),
        "save_event",
        "event.payload[key #0 (str)][1]",
    ),
    (
        "int key",
        lambda s: s.save_event(event(payload={"a": {1: "x"}})),
        "save_event",
        "event.payload[key #0 (str)][key #0 (int)]",
    ),
    ("payload not a mapping", lambda s: s.save_event(event(payload=[1])), "save_event", "event.payload"),
    ("int trace id", lambda s: s.save_event(event(trace_id=7)), "save_event", "event.trace_id"),
    (
        "bulk: second event bad",
        lambda s: s.save_events([event(), event(payload={"x": {"y": NAN}})]),
        "save_events",
        "events[1].payload[key #0 (str)][key #0 (str)]",
    ),
    (
        "binding metadata",
        lambda s: s.save_remote_binding(RemoteBinding("t", None, "k", "u", metadata={"m": Opaque()})),
        "save_remote_binding",
        "binding.metadata[key #0 (str)]",
    ),
    (
        "pause payload set",
        lambda s: s.save_planner_state("tok", {"s": {1, 2}}),
        "save_planner_state",
        "payload[key #0 (str)]",
    ),
    ("pause token not str", lambda s: untyped(s).save_planner_state(5, {}), "save_planner_state", "token"),
    ("pause token surrogate", lambda s: s.load_planner_state(SURROGATE), "load_planner_state", "token"),
    (
        "memory key surrogate",
        lambda s: s.save_memory_state("k", {SURROGATE: 1}),
        "save_memory_state",
        "state[key #0 (str)]",
    ),
    (
        "task result nan",
        lambda s: s.save_task(task(result={"r": NAN})),
        "save_task",
        "state.result[key #0 (str)]",
    ),
    (
        "task snapshot object",
        lambda s: s.save_task(
            task(
                context_snapshot=TaskContextSnapshot(
                    session_id="s", task_id="task", llm_context={"o": Opaque()}
                )
            )
        ),
        "save_task",
        "state.context_snapshot.llm_context[key #0 (str)]",
    ),
    (
        "update content nan",
        lambda s: s.save_update(
            StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=NAN)
        ),
        "save_update",
        "update.content",
    ),
    (
        "bulk updates",
        lambda s: s.save_updates(
            [
                StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=1),
                StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=[Opaque()]),
            ]
        ),
        "save_updates",
        "updates[1].content[0]",
    ),
    (
        "steering id surrogate",
        lambda s: s.save_steering(
            SteeringEvent(
                session_id="s",
                task_id="t",
                event_id=SURROGATE,
                event_type=SteeringEventType.CANCEL,
            )
        ),
        "save_steering",
        "event.event_id",
    ),
    (
        "trajectory nan",
        lambda s: s.save_trajectory("t", "s", {"steps": [NAN]}),
        "save_trajectory",
        "trajectory[key #0 (str)][0]",
    ),
    (
        "trajectory object",
        lambda s: s.save_trajectory("t", "s", Opaque()),
        "save_trajectory",
        "trajectory",
    ),
    (
        "planner event extra",
        lambda s: s.save_planner_event("t", PlannerEvent("x", 1.0, 1, extra={"e": NAN})),
        "save_planner_event",
        "event.extra[key #0 (str)]",
    ),
    (
        "bulk planner events",
        lambda s: s.save_planner_events([("t", PlannerEvent("x", 1.0, 1)), ("t", PlannerEvent("x", NAN, 1))]),
        "save_planner_events",
        "items[1].event.ts",
    ),
    ("history trace not str", lambda s: untyped(s).load_history(None), "load_history", "trace_id"),
    ("updates limit not int", lambda s: untyped(s).list_updates("s", limit="5"), "list_updates", "limit"),
    (
        "steering since_id not str",
        lambda s: untyped(s).list_steering("s", since_id=3),
        "list_steering",
        "since_id",
    ),
    ("traces limit bool", lambda s: s.list_traces("s", limit=True), "list_traces", "limit"),
    (
        "find_binding tenant",
        lambda s: untyped(s).find_binding(
            router_session_id="r", agent_url="u", remote_skill="k", tenant_id=1
        ),
        "find_binding",
        "tenant_id",
    ),
]
