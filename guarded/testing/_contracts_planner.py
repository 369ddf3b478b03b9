"""Contracts of planner pause state, short-term memory, trajectories and planner events."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from typing import Any

from ..errors import WriteSupersededError
from ..logical_time import logical_times, replaying
from ..models import PlannerEvent
from ._base import contract, expect_same, expect_sequence, rich_payload, show, survive, unique, violation

SAVE_PLANNER = "spec 000 'Optional Duck-Typed Methods' §4 save_planner_state"
LOAD_PLANNER = "spec 000 'Optional Duck-Typed Methods' §5 load_planner_state"
MISSING_TOKEN = f"{LOAD_PLANNER}, 'missing token semantics'"
SAVE_MEMORY = "spec 000 'Optional Duck-Typed Methods' §6 save_memory_state"
LOAD_MEMORY = "spec 000 'Optional Duck-Typed Methods' §7 load_memory_state"
MEMORY_KEYS = "optional list_memory_keys; keys are spec 003's MemoryKey.composite(), tenant:user:session"
TRAJECTORIES = "spec 000 'Optional Duck-Typed Methods' §10 Trajectory Persistence"
LIST_TRACES = "spec 001 list_traces: most recent first, by the last time a trajectory was saved"
PLANNER_EVENTS = "spec 000 'Optional Duck-Typed Methods' §11 Planner Event Persistence"
ORDERING = "spec 000 'Ordering Guarantees'"


def pause_payload(marker: str) -> dict[str, Any]:
    """The pause wire format of spec 000 §4, with values that catch lossy JSON coercion."""
    return {
        "trajectory": {"version": 1, "query": "book a flight", "steps": [], "metadata": {"marker": marker}},
        "reason": "await_input",
        "payload": {"example": True, "oauth": {"provider": "github", "scopes": ["repo", "read:org"]}},
        "constraints": None,
        "tool_context": {"tenant_id": "test", "user_id": "test"},
        "extra": rich_payload(marker),
    }


@contract(
    "planner_state.roundtrip",
    "planner_state",
    "The pause payload comes back exactly as saved (spec 000 test 6).",
)
async def planner_roundtrip(store: Any) -> None:
    token = unique("token")
    payload = pause_payload(token)
    await store.save_planner_state(token, copy.deepcopy(payload))
    loaded = await store.load_planner_state(token)
    if loaded is None:
        raise violation(
            f"load_planner_state returned None right after save_planner_state of that token ({LOAD_PLANNER})"
        )
    expect_same(
        payload,
        loaded,
        "payload",
        f"the pause payload must be stored and returned losslessly ({SAVE_PLANNER})",
    )


@contract(
    "planner_state.consume_once",
    "planner_state",
    "A pause token is consumed by its first load; the second load returns None (spec 000 test 7).",
)
async def consume_once(store: Any) -> None:
    token = unique("token")
    await store.save_planner_state(token, {"data": "value"})
    first = await store.load_planner_state(token)
    if first != {"data": "value"}:
        raise violation(
            f"the first load_planner_state returned {show(first)}, not the payload saved ({LOAD_PLANNER})"
        )
    second = await survive("the second load_planner_state", store.load_planner_state(token), MISSING_TOKEN)
    if isinstance(second, Mapping) and not second:
        raise violation(
            "the second load_planner_state of a consumed token returned {}; the spec requires None "
            f"(tokens are one-time use; {MISSING_TOKEN})"
        )
    if second is not None:
        raise violation(
            f"the second load_planner_state of a consumed token returned {show(second)}; "
            f"a token must be deleted by its first load and then read as None ({LOAD_PLANNER})"
        )


@contract(
    "planner_state.missing_token_none",
    "planner_state",
    "load_planner_state of an unknown token returns None: not {} and not an exception.",
)
async def missing_token_none(store: Any) -> None:
    loaded = await survive(
        "load_planner_state of a missing token",
        store.load_planner_state(unique("missing-token")),
        f"it MUST NOT raise for missing tokens ({LOAD_PLANNER})",
    )
    if isinstance(loaded, Mapping) and not loaded:
        raise violation(
            "load_planner_state returned {} for a missing token; the spec requires None, which ReactPlanner "
            f"treats as 'not found/expired' while {{}} ends in KeyError: 'trajectory' ({MISSING_TOKEN})"
        )
    if loaded is not None:
        raise violation(
            f"load_planner_state returned {show(loaded)} for a token never saved, not None ({MISSING_TOKEN})"
        )


@contract(
    "planner_state.save_idempotent",
    "planner_state",
    "Saving a token again is safe and the latest payload wins.",
)
async def planner_save_idempotent(store: Any) -> None:
    token = unique("token")
    rule = f"save_planner_state MUST be idempotent ({SAVE_PLANNER})"
    await store.save_planner_state(token, {"attempt": 1})
    await survive("saving the same token again", store.save_planner_state(token, {"attempt": 1}), rule)
    await survive(
        "saving the token with a new payload", store.save_planner_state(token, {"attempt": 2}), rule
    )
    loaded = await store.load_planner_state(token)
    if loaded is None:
        raise violation(f"load_planner_state returned None after the token was saved three times; {rule}")
    expect_same(
        {"attempt": 2}, loaded, "payload", f"the latest save of a token wins ({SAVE_PLANNER}: upsert)"
    )


def memory_state(marker: str) -> dict[str, Any]:
    """A memory state in the shape of spec 003 (health, turns, pending, backlog, summary)."""
    return {
        "version": 1,
        "health": "healthy",
        "summary": "The user is planning a trip to Zürich. 🚆",
        "turns": [
            {
                "user_message": "hello",
                "assistant_response": "hi — how can I help?",
                "trajectory_digest": {"tools": ["search"], "steps": 2},
                "ts": 1702857600.0,
            }
        ],
        "pending": [],
        "backlog": [],
        "config_snapshot": {"strategy": "rolling_summary", "full_zone_turns": 5},
        "extra": rich_payload(marker),
    }


@contract(
    "memory_state.roundtrip",
    "memory_state",
    "The memory state comes back exactly as saved (spec 000 test 8).",
)
async def memory_roundtrip(store: Any) -> None:
    key = f"{unique('tenant')}:user:session"
    state = memory_state(key)
    await store.save_memory_state(key, copy.deepcopy(state))
    loaded = await store.load_memory_state(key)
    if loaded is None:
        raise violation(
            f"load_memory_state returned None right after save_memory_state of the same key ({LOAD_MEMORY})"
        )
    expect_same(state, loaded, "state", f"it SHOULD return the exact state that was saved ({LOAD_MEMORY})")


@contract(
    "memory_state.missing_key_none",
    "memory_state",
    "load_memory_state of an unknown key returns None, not an exception (spec 000 test 9).",
)
async def memory_missing_key(store: Any) -> None:
    rule = f"it MUST return None if the key is not found, not raise ({LOAD_MEMORY})"
    loaded = await survive(
        "load_memory_state of a missing key",
        store.load_memory_state(f"{unique('tenant')}:nobody:nothing"),
        rule,
    )
    if loaded is not None:
        raise violation(f"load_memory_state returned {show(loaded)} for a key never saved; {rule}")


LAST_WRITE_WINS = "guarded.backend: a direct write is applied, only a replay is compared"


@contract(
    "memory_state.direct_write_applied",
    "memory_state",
    "A direct save_memory_state is applied even when its logical time is older than the stored "
    "row's (a worker whose clock is behind another's).",
)
async def memory_direct_write_applied(store: Any) -> None:
    key = f"{unique('tenant')}:user:clock"
    await store.save_memory_state(key, {"by": "a worker"})
    with logical_times((1,)):  # a worker whose clock is far behind
        await survive(
            "a direct save_memory_state older than the stored row",
            store.save_memory_state(key, {"by": "a later direct write"}),
            f"a direct write must be applied ({LAST_WRITE_WINS})",
        )
    loaded = await store.load_memory_state(key)
    if loaded != {"by": "a later direct write"}:
        raise violation(
            f"load_memory_state returned {show(loaded)} after a direct write with an older logical time; "
            f"a direct write must be applied, whatever the clocks say ({LAST_WRITE_WINS})"
        )


@contract(
    "memory_state.refused_replay_reported",
    "memory_state",
    "A replayed save_memory_state older than the stored row is either applied (a store that does not "
    "order by logical time) or left alone with WriteSupersededError raised, never dropped silently.",
)
async def memory_refused_replay_reported(store: Any) -> None:
    key = f"{unique('tenant')}:user:replay"
    await store.save_memory_state(key, {"by": "a direct write"})
    raised: WriteSupersededError | None = None
    with logical_times((1,)), replaying():
        try:
            await store.save_memory_state(key, {"by": "an older replay"})
        except WriteSupersededError as exc:
            raised = exc
    loaded = await store.load_memory_state(key)
    if raised is None and loaded == {"by": "a direct write"}:
        raise violation(
            "a replayed save_memory_state older than the stored row was left alone without raising "
            "WriteSupersededError: the guard would count a write that was not applied as delivered "
            f"({LAST_WRITE_WINS})"
        )
    if raised is not None and loaded != {"by": "a direct write"}:
        raise violation(
            f"save_memory_state raised WriteSupersededError but the key now holds {show(loaded)}; "
            f"a refused replay must leave the stored row alone ({LAST_WRITE_WINS})"
        )


@contract(
    "memory_state.latest_wins",
    "memory_state",
    "Saving a key twice replaces the state: the latest one comes back, nothing merged.",
)
async def memory_latest_wins(store: Any) -> None:
    key = f"{unique('tenant')}:user:session"
    await store.save_memory_state(key, {"version": 1, "summary": "first", "only_in_first": True})
    await store.save_memory_state(key, {"version": 1, "summary": "second", "turns": []})
    loaded = await store.load_memory_state(key)
    expect_same(
        {"version": 1, "summary": "second", "turns": []},
        loaded,
        "state",
        f"save_memory_state upserts: the latest state replaces the previous one ({SAVE_MEMORY})",
    )


@contract(
    "memory_keys.session_keys",
    "memory_keys",
    "list_memory_keys lists every memory key of the session (tenant:user:session, sorted), and no other.",
    requires=("save_memory_state",),
)
async def memory_keys_of_session(store: Any) -> None:
    session = unique("session")
    mine = sorted([f"tenant-a:user-1:{session}", f"tenant-b:user-2:{session}", f"custom:{session}"])
    others = [f"tenant-a:user-1:{session}-2", f"tenant-a:user-1:x{session}", f"tenant-a:{session}:other"]
    for key in [*mine, *others]:
        await store.save_memory_state(key, memory_state(key))
    listed = await store.list_memory_keys(session)
    expect_same(
        mine,
        list(expect_sequence(listed, "list_memory_keys", f"it returns a sequence ({MEMORY_KEYS})")),
        "keys",
        f"every key ending with ':' and the session id, sorted, and no other ({MEMORY_KEYS})",
    )
    empty = await store.list_memory_keys(unique("session"))
    if list(empty):
        raise violation(f"list_memory_keys of a session with no memory returned {show(empty)}, not []")


def trajectory(query: str, marker: str) -> Any:
    """A trajectory as PenguiFlow passes it: its ``Trajectory`` when installed, else a mapping."""
    fields: dict[str, Any] = {
        "query": query,
        "llm_context": {"marker": marker, "locale": "fr-CH"},
        "tool_context": {"tenant_id": "tenant-a", "nested": {"n": 1.5}},
        "metadata": {"marker": marker, "unicode": "ünïcode 🐧"},
    }
    try:
        cls = importlib.import_module("penguiflow.planner").Trajectory
    except (ImportError, AttributeError):
        return {**fields, "steps": []}
    return cls(**fields)


def trajectory_form(value: Any, what: str) -> Any:
    """The JSON form of a trajectory: ``serialise()`` for objects, the mapping itself otherwise."""
    serialise = getattr(value, "serialise", None)
    if callable(serialise):
        return serialise()
    if isinstance(value, Mapping):
        return dict(value)
    raise violation(
        f"{what} returned a {type(value).__name__}, neither a mapping nor a trajectory with serialise()"
    )


@contract(
    "trajectories.roundtrip",
    "trajectories",
    "A saved trajectory comes back from get_trajectory unchanged.",
)
async def trajectory_roundtrip(store: Any) -> None:
    trace, session = unique("trace"), unique("session")
    saved = trajectory("what is the weather in Zürich?", trace)
    expected = trajectory_form(saved, "the contract's own trajectory")
    await store.save_trajectory(trace, session, saved)
    loaded = await store.get_trajectory(trace, session)
    if loaded is None:
        raise violation(
            f"get_trajectory returned None right after save_trajectory of that trace ({TRAJECTORIES})"
        )
    expect_same(
        expected,
        trajectory_form(loaded, "get_trajectory"),
        "trajectory",
        f"trajectories must round-trip ({TRAJECTORIES})",
    )


@contract(
    "trajectories.upsert",
    "trajectories",
    "Saving a trace again replaces its trajectory and does not list the trace twice.",
)
async def trajectory_upsert(store: Any) -> None:
    trace, session = unique("trace"), unique("session")
    await store.save_trajectory(trace, session, trajectory("first", trace))
    latest = trajectory("second", trace)
    await store.save_trajectory(trace, session, latest)
    loaded = await store.get_trajectory(trace, session)
    if loaded is None:
        raise violation(f"get_trajectory returned None after the trace was saved twice ({TRAJECTORIES})")
    expect_same(
        trajectory_form(latest, "the contract's own trajectory"),
        trajectory_form(loaded, "get_trajectory"),
        "trajectory",
        f"the latest save_trajectory of a trace wins ({TRAJECTORIES}; save_trajectory is idempotent)",
    )
    traces = list(await store.list_traces(session))
    if traces != [trace]:
        raise violation(
            f"list_traces returned {traces} for a session with one trace saved twice; expected [{trace!r}]"
        )


@contract(
    "trajectories.session_mismatch_none",
    "trajectories",
    "get_trajectory returns None for an unknown trace and for a trace saved under another session.",
)
async def trajectory_session_mismatch(store: Any) -> None:
    trace, session = unique("trace"), unique("session")
    await store.save_trajectory(trace, session, trajectory("private", trace))
    rule = (
        f"get_trajectory MUST return None when not found or when session_id does not match ({TRAJECTORIES})"
    )
    leaked = await survive(
        "get_trajectory with another session", store.get_trajectory(trace, unique("session")), rule
    )
    if leaked is not None:
        raise violation(f"get_trajectory with a different session_id returned the trajectory; {rule}")
    missing = await survive(
        "get_trajectory of an unknown trace", store.get_trajectory(unique("trace"), session), rule
    )
    if missing is not None:
        raise violation(f"get_trajectory of a trace never saved returned {show(missing)}; {rule}")


@contract(
    "trajectories.list_traces_recent_first",
    "trajectories",
    "list_traces is most recently saved first; saving a trace again moves it to the front.",
)
async def list_traces_recent_first(store: Any) -> None:
    session = unique("session")
    names = {label: f"{session}-{label}" for label in ("t1", "t2", "t3")}
    for label, trace in names.items():
        await store.save_trajectory(trace, session, trajectory(label, trace))
    by_trace = {trace: label for label, trace in names.items()}
    found = [by_trace.get(trace, trace) for trace in await store.list_traces(session)]
    if found != ["t3", "t2", "t1"]:
        raise violation(
            f"traces saved t1, t2, t3 were listed as {found}, expected ['t3', 't2', 't1'] ({LIST_TRACES})"
        )
    await store.save_trajectory(names["t1"], session, trajectory("t1 again", names["t1"]))
    found = [by_trace.get(trace, trace) for trace in await store.list_traces(session)]
    if found != ["t1", "t3", "t2"]:
        raise violation(
            f"after t1 was saved again, list_traces returned {found}, not ['t1', 't3', 't2'] ({LIST_TRACES})"
        )


@contract(
    "trajectories.list_traces_limit",
    "trajectories",
    "list_traces(limit=n) returns the n most recent traces; an unknown session gives [].",
)
async def list_traces_limit(store: Any) -> None:
    session = unique("session")
    traces = [f"{session}-t{index}" for index in range(4)]
    for trace in traces:
        await store.save_trajectory(trace, session, trajectory("q", trace))
    found = list(await store.list_traces(session, limit=2))
    if found != [traces[3], traces[2]]:
        raise violation(
            f"list_traces(limit=2) returned {found}, expected the two most recent "
            f"{[traces[3], traces[2]]} ({LIST_TRACES})"
        )
    rule = f"list reads return [] for an unknown session ({TRAJECTORIES})"
    empty = await survive("list_traces of an unknown session", store.list_traces(unique("session")), rule)
    if list(expect_sequence(empty, "list_traces of an unknown session", rule)):
        raise violation(f"list_traces of an unknown session returned {show(empty)}; {rule}")


def planner_event(index: int, ts: float, marker: str) -> PlannerEvent:
    return PlannerEvent(
        event_type="stream_chunk",
        ts=ts,
        trajectory_step=index,
        node_name=f"tool-{index}",
        extra={"marker": marker, "seq": index},
    )


async def planner_events(store: Any, trace: str) -> list[Any]:
    result = await store.list_planner_events(trace)
    return list(expect_sequence(result, "list_planner_events", f"it returns a list ({PLANNER_EVENTS})"))


@contract(
    "planner_events.roundtrip",
    "planner_events",
    "A planner event comes back with every field intact.",
)
async def planner_event_roundtrip(store: Any) -> None:
    trace = unique("trace")
    saved = PlannerEvent(
        event_type="llm_call",
        ts=1702857601.5,
        trajectory_step=3,
        thought="Let me check the calendar — 📅",
        node_name="calendar.lookup",
        latency_ms=812.25,
        token_estimate=1234,
        error=None,
        extra=rich_payload(trace),
    )
    await store.save_planner_event(trace, saved)
    found = await planner_events(store, trace)
    if len(found) != 1:
        raise violation(
            f"list_planner_events returned {len(found)} events after one save_planner_event; expected 1"
        )
    rule = f"planner events must round-trip ({PLANNER_EVENTS})"
    for name in (
        "event_type",
        "ts",
        "trajectory_step",
        "thought",
        "node_name",
        "latency_ms",
        "token_estimate",
        "error",
    ):
        expect_same(getattr(saved, name), getattr(found[0], name), name, rule)
    expect_same(dict(saved.extra), found[0].extra, "extra", rule)


@contract(
    "planner_events.emission_order",
    "planner_events",
    "list_planner_events returns events in emission order, including events with equal ts.",
)
async def planner_event_order(store: Any) -> None:
    trace = unique("trace")
    stamps = [1.0, 2.0, 2.0, 2.0, 2.0, 3.0]
    order = [0, 4, 1, 3, 2, 5]
    for index in order:
        await store.save_planner_event(trace, planner_event(index, stamps[index], trace))
    found = [item.extra.get("seq") for item in await planner_events(store, trace)]
    if found != order:
        raise violation(
            f"planner events emitted in order {order} (four with ts 2.0) came back as {found}; "
            f"list_planner_events SHOULD preserve emission order ({PLANNER_EVENTS}; {ORDERING})"
        )


@contract(
    "planner_events.unknown_trace_empty",
    "planner_events",
    "list_planner_events of an unknown trace returns [], not an exception.",
)
async def planner_events_unknown_trace(store: Any) -> None:
    rule = f"reads return an empty list when nothing was saved ({PLANNER_EVENTS})"
    found = await survive(
        "list_planner_events of an unknown trace", store.list_planner_events(unique("trace")), rule
    )
    if list(expect_sequence(found, "list_planner_events of an unknown trace", rule)):
        raise violation(f"list_planner_events of an unknown trace returned {show(found)}; {rule}")


@contract(
    "planner_events.legacy_get_events",
    "planner_events",
    "The legacy alias get_events(trace_id) returns what list_planner_events returns.",
    requires=("get_events",),
)
async def legacy_get_events(store: Any) -> None:
    trace = unique("trace")
    for index in range(3):
        await store.save_planner_event(trace, planner_event(index, float(index), trace))
    current = [item.extra.get("seq") for item in await planner_events(store, trace)]
    legacy = [item.extra.get("seq") for item in await store.get_events(trace)]
    if legacy != current:
        raise violation(
            f"get_events returned events {legacy}, list_planner_events {current}; a legacy alias must "
            "behave like its target (spec 000 'Compatibility Adapters'; spec 001)"
        )
