"""Contracts of the required core (events, bindings), bulk events and conversation bindings."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ..models import RemoteBinding, StoredEvent
from ..protocol import capabilities
from ._base import contract, expect_same, expect_sequence, rich_payload, show, survive, unique, violation

SAVE_EVENT = "spec 000 'Required Methods' §1 save_event"
LOAD_HISTORY = "spec 000 'Required Methods' §2 load_history"
BINDING = "spec 000 'Required Methods' §3 save_remote_binding"
ORDERING = "spec 000 'Method Contracts & Semantics', 'Ordering Guarantees'"
IDEMPOTENCY = "spec 000 'Method Contracts & Semantics', 'Idempotency Requirements'"
BINDINGS_311 = "PenguiFlow 3.11 SupportsConversationBindings"


def event(trace_id: str | None, ts: float, label: str, **changes: Any) -> StoredEvent:
    """A stored event whose ``node_name`` is ``label``, so orderings are easy to read."""
    fields: dict[str, Any] = {
        "trace_id": trace_id,
        "ts": ts,
        "kind": "node_success",
        "node_name": label,
        "node_id": f"{label}-id",
        "payload": {"label": label},
    }
    fields.update(changes)
    return StoredEvent(**fields)


async def history(store: Any, trace_id: str) -> list[Any]:
    """``load_history`` as a list, or a violation when it is not a sequence."""
    result = await store.load_history(trace_id)
    return list(
        expect_sequence(result, f"load_history({trace_id!r})", f"it must return a sequence ({LOAD_HISTORY})")
    )


def labels(events: list[Any]) -> list[str]:
    return [str(item.node_name) for item in events]


@contract(
    "core.event_roundtrip",
    "core",
    "A saved event comes back from load_history with every field intact (spec 000 test 1).",
)
async def event_roundtrip(store: Any) -> None:
    trace = unique("trace")
    saved = event(trace, 1702857600.125, "test_node", payload={"latency_ms": 100.5, "attempt": 1})
    expected = copy.deepcopy(saved)
    await store.save_event(saved)
    loaded = await history(store, trace)
    if len(loaded) != 1:
        raise violation(f"load_history returned {len(loaded)} events after one save_event; expected 1")
    got = loaded[0]
    for name in ("trace_id", "ts", "kind", "node_name", "node_id"):
        expect_same(
            getattr(expected, name), getattr(got, name), name, f"events must round-trip ({LOAD_HISTORY})"
        )
    expect_same(dict(expected.payload), got.payload, "payload", f"events must round-trip ({LOAD_HISTORY})")


@contract(
    "core.save_event_idempotent",
    "core",
    "Saving the same event twice leaves exactly one copy in the history; distinct events are all kept.",
)
async def save_event_idempotent(store: Any) -> None:
    trace = unique("trace")
    first = event(trace, 1.0, "node", kind="test", payload={"n": 1})
    retry = dataclasses.replace(first, payload={"n": 1})
    await store.save_event(first)
    await survive(
        "saving the same event a second time",
        store.save_event(retry),
        f"save_event MUST be idempotent ({SAVE_EVENT})",
    )
    loaded = await history(store, trace)
    if len(loaded) != 1:
        raise violation(
            f"load_history returned {len(loaded)} events after the same event was saved twice; "
            f"save_event MUST be idempotent, so exactly 1 is required ({SAVE_EVENT}; {IDEMPOTENCY}: "
            "'retries can emit duplicate events'). The spec's example test tolerates 2, guarded does not."
        )
    await store.save_event(dataclasses.replace(first, payload={"n": 2}))
    loaded = await history(store, trace)
    if len(loaded) != 2:
        raise violation(
            f"load_history returned {len(loaded)} events after saving two events that differ only in "
            "payload; deduplication must key on the whole event (trace, ts, kind, node, payload), not drop "
            f"distinct events ({SAVE_EVENT})"
        )


@contract(
    "core.history_ascending_ts",
    "core",
    "load_history returns events in ascending ts order whatever the save order (spec 000 test 3).",
)
async def history_ascending_ts(store: Any) -> None:
    trace = unique("trace")
    for index, ts in enumerate([3.0, 1.0, 2.0]):
        await store.save_event(event(trace, ts, f"node_{index}", kind="test", payload={}))
    timestamps = [item.ts for item in await history(store, trace)]
    if timestamps != [1.0, 2.0, 3.0]:
        raise violation(
            f"events saved with ts 3.0, 1.0, 2.0 came back with ts {timestamps}; "
            f"load_history MUST return events in ascending ts order ({LOAD_HISTORY}; {ORDERING})"
        )


@contract(
    "core.history_same_ts_insertion_order",
    "core",
    "Events with equal ts come back in insertion order, the same on every read.",
)
async def history_same_ts_insertion_order(store: Any) -> None:
    trace = unique("trace")
    inserted = [("n2", 5.0), ("n0", 1.0), ("n9", 5.0), ("n1", 1.0), ("n5", 5.0), ("n3", 1.0)]
    for label, ts in inserted:
        await store.save_event(event(trace, ts, label))
    expected = [label for label, ts in inserted if ts == 1.0] + [label for label, ts in inserted if ts == 5.0]
    first = labels(await history(store, trace))
    if first != expected:
        raise violation(
            f"events came back as {first}, inserted as {[label for label, _ in inserted]} (ts 5,1,5,1,5,1); "
            f"expected {expected}: ascending ts, ties broken by insertion order "
            f"({ORDERING}: 'secondary ordering by insertion ID')"
        )
    second = labels(await history(store, trace))
    if second != first:
        raise violation(
            f"two reads of one trace returned different orders: {first} then {second} ({ORDERING})"
        )


@contract(
    "core.history_unknown_trace_empty",
    "core",
    "load_history of an unknown trace returns an empty sequence, not an exception (spec 000 test 2).",
)
async def history_unknown_trace_empty(store: Any) -> None:
    rule = f"it MUST return an empty sequence for an unknown trace, not raise ({LOAD_HISTORY})"
    result = await survive("load_history of an unknown trace", store.load_history(unique("missing")), rule)
    found = expect_sequence(result, "load_history of an unknown trace", rule)
    if len(found) != 0:
        raise violation(
            f"load_history of a never-used trace returned {len(found)} events: {show(list(found))}"
        )


@contract(
    "core.global_event_accepted",
    "core",
    "save_event accepts trace_id=None (global events).",
)
async def global_event_accepted(store: Any) -> None:
    saved = event(None, 1.0, unique("global"), kind="trace_cancel_drop")
    await survive(
        "save_event with trace_id=None",
        store.save_event(saved),
        f"stores SHOULD accept global events, e.g. under the sentinel '__global__' ({SAVE_EVENT})",
    )


@contract(
    "core.unknown_kind_accepted",
    "core",
    "Event kinds are an open set: a never-seen kind is stored and returned verbatim.",
)
async def unknown_kind_accepted(store: Any) -> None:
    trace = unique("trace")
    kind = f"vendor.{unique('kind')}.custom_event"
    rule = (
        "backends MUST accept novel/unknown kinds and persist them as opaque strings (spec 000 'Event Types')"
    )
    await survive(
        f"save_event with kind={kind!r}", store.save_event(event(trace, 1.0, "node", kind=kind)), rule
    )
    loaded = await history(store, trace)
    if [item.kind for item in loaded] != [kind]:
        raise violation(
            f"load_history returned kinds {[item.kind for item in loaded]}, expected [{kind!r}]; {rule}"
        )


@contract(
    "core.payload_fidelity",
    "core",
    "A nested payload with unicode, NUL, floats, ints, nulls and empty containers round-trips exactly.",
)
async def payload_fidelity(store: Any) -> None:
    trace = unique("trace")
    payload = rich_payload(trace)
    await store.save_event(event(trace, 2.5, "node", payload=copy.deepcopy(payload)))
    loaded = await history(store, trace)
    if len(loaded) != 1:
        raise violation(f"load_history returned {len(loaded)} events after one save_event; expected 1")
    expect_same(
        payload,
        loaded[0].payload,
        "payload",
        f"event payloads are replayed from storage and must round-trip exactly ({LOAD_HISTORY})",
    )


@contract(
    "core.binding_upsert",
    "core",
    "Saving a binding twice, then with a new agent_url, leaves one binding with the new url.",
)
async def binding_upsert(store: Any) -> None:
    router_session = unique("router-session")
    binding = RemoteBinding(
        trace_id=unique("trace"),
        context_id=unique("ctx"),
        task_id=unique("task"),
        agent_url="http://worker-a:8080",
        router_session_id=router_session,
        remote_skill="contract-skill",
    )
    rule = f"save_remote_binding MUST be idempotent and SHOULD upsert on its key ({BINDING})"
    await store.save_remote_binding(binding)
    await survive(
        "saving the same binding again", store.save_remote_binding(dataclasses.replace(binding)), rule
    )
    moved = dataclasses.replace(binding, agent_url="http://worker-b:8080")
    await survive("saving the binding with a new agent_url", store.save_remote_binding(moved), rule)
    if "conversation_bindings" not in capabilities(store):
        return
    found = list(await store.list_bindings(router_session_id=router_session))
    urls = [item.agent_url for item in found]
    if urls != [moved.agent_url]:
        raise violation(
            f"after saving one binding twice and then with agent_url {moved.agent_url!r}, list_bindings "
            f"returned agent_urls {urls}; {rule}"
        )


@contract(
    "bulk_events.idempotent",
    "bulk_events",
    "save_events ignores duplicates, within a batch and across batches and save_event, like save_event.",
)
async def bulk_idempotent(store: Any) -> None:
    trace = unique("trace")
    first, second, third = (event(trace, float(index), f"n{index}") for index in range(3))
    rule = f"save_events has save_event's idempotency ({SAVE_EVENT})"
    await survive(
        "save_events with a duplicate inside the batch", store.save_events([first, second, second]), rule
    )
    await survive("save_events repeating saved events", store.save_events([first, second, third]), rule)
    await survive("save_event of an event saved in bulk", store.save_event(dataclasses.replace(third)), rule)
    await survive("save_events with an empty batch", store.save_events([]), rule)
    found = sorted(labels(await history(store, trace)))
    if found != ["n0", "n1", "n2"]:
        raise violation(
            f"three distinct events saved repeatedly came back as {found}, expected each once; {rule}"
        )


@contract(
    "bulk_events.ordered",
    "bulk_events",
    "Events saved in bulk are ordered like save_event's: ascending ts, ties in batch order.",
)
async def bulk_ordered(store: Any) -> None:
    trace = unique("trace")
    await store.save_events(
        [event(trace, 3.0, "a"), event(trace, 1.0, "b"), event(trace, 3.0, "c"), event(trace, 1.0, "d")]
    )
    await store.save_event(event(trace, 2.0, "e"))
    await store.save_events([event(trace, 1.0, "f")])
    found = labels(await history(store, trace))
    expected = ["b", "d", "f", "e", "a", "c"]
    if found != expected:
        raise violation(
            f"events came back as {found}, expected {expected} (ascending ts, equal ts in the order saved); "
            f"bulk writes must not change ordering ({ORDERING})"
        )


def conversation_binding(router_session: str, label: str, **changes: Any) -> RemoteBinding:
    """A binding in ``router_session`` whose ``task_id`` ends with ``label``."""
    fields: dict[str, Any] = {
        "trace_id": f"{router_session}-trace-{label}",
        "context_id": f"{router_session}-ctx-{label}",
        "task_id": f"{router_session}-task-{label}",
        "agent_url": "http://agent.example:9000",
        "router_session_id": router_session,
        "remote_skill": "search",
    }
    fields.update(changes)
    return RemoteBinding(**fields)


async def find(store: Any, router_session: str, **scope: Any) -> Any:
    return await store.find_binding(
        router_session_id=router_session,
        agent_url="http://agent.example:9000",
        remote_skill="search",
        **scope,
    )


def task_of(binding: Any) -> str | None:
    return None if binding is None else str(binding.task_id).rsplit("-", 1)[-1]


@contract(
    "conversation_bindings.find_latest",
    "conversation_bindings",
    "find_binding returns the most recently saved non-terminal binding with those coordinates.",
)
async def find_latest(store: Any) -> None:
    router_session = unique("router-session")
    await store.save_remote_binding(conversation_binding(router_session, "old"))
    await store.save_remote_binding(conversation_binding(router_session, "new", last_remote_task_id="r-1"))
    found = await find(store, router_session)
    if task_of(found) != "new":
        raise violation(
            f"find_binding returned the binding of task {task_of(found)!r} after bindings 'old' then 'new' "
            f"were saved; it must return the latest non-terminal binding ({BINDINGS_311}.find_binding)"
        )
    other = await store.find_binding(
        router_session_id=router_session, agent_url="http://agent.example:9000", remote_skill="other-skill"
    )
    if other is not None:
        raise violation(
            f"find_binding for a remote_skill never bound returned task {task_of(other)!r}; expected None"
        )


@contract(
    "conversation_bindings.terminal_hidden",
    "conversation_bindings",
    "After mark_binding_terminal, find_binding skips that binding (None when no other is left).",
)
async def terminal_hidden(store: Any) -> None:
    router_session = unique("router-session")
    old = conversation_binding(router_session, "old")
    new = conversation_binding(router_session, "new")
    await store.save_remote_binding(old)
    await store.save_remote_binding(new)
    rule = f"terminal bindings are never reused for follow-up turns ({BINDINGS_311}.mark_binding_terminal)"
    await store.mark_binding_terminal(trace_id=new.trace_id, context_id=new.context_id, task_id=new.task_id)
    found = await find(store, router_session)
    if task_of(found) != "old":
        raise violation(
            f"with 'new' marked terminal and 'old' still open, find_binding returned {task_of(found)!r}, "
            f"expected 'old'; {rule}"
        )
    await store.mark_binding_terminal(trace_id=old.trace_id, context_id=old.context_id, task_id=old.task_id)
    found = await find(store, router_session)
    if found is not None:
        raise violation(
            f"with every binding marked terminal, find_binding returned {task_of(found)!r}, not None; {rule}"
        )
    listed = {
        task_of(item): item.is_terminal
        for item in await store.list_bindings(router_session_id=router_session)
    }
    if listed != {"old": True, "new": True}:
        raise violation(
            f"list_bindings reported is_terminal {listed} after both were marked terminal; {rule}"
        )


@contract(
    "conversation_bindings.list_by_router_session",
    "conversation_bindings",
    "list_bindings returns exactly the bindings of one router session, fields intact; [] when none.",
)
async def list_by_router_session(store: Any) -> None:
    router_session, other_session = unique("router-session"), unique("router-session")
    first = conversation_binding(
        router_session,
        "one",
        tenant_id="tenant-a",
        user_id="user-a",
        last_remote_task_id="remote-7",
        metadata={"attempt": 2, "note": "ünïcode"},
    )
    await store.save_remote_binding(first)
    await store.save_remote_binding(conversation_binding(router_session, "two", remote_skill="summarise"))
    await store.save_remote_binding(conversation_binding(other_session, "three"))
    listed = list(await store.list_bindings(router_session_id=router_session))
    found = sorted(str(task_of(item)) for item in listed)
    if found != ["one", "two"]:
        raise violation(
            f"list_bindings(router_session_id=...) returned tasks {found}, expected ['one', 'two']"
        )
    [got] = [item for item in listed if task_of(item) == "one"]
    rule = f"bindings must round-trip ({BINDINGS_311}; spec 000 'RemoteBinding')"
    for name in (
        "trace_id",
        "context_id",
        "agent_url",
        "router_session_id",
        "remote_skill",
        "tenant_id",
        "user_id",
    ):
        expect_same(getattr(first, name), getattr(got, name), name, rule)
    expect_same(first.last_remote_task_id, got.last_remote_task_id, "last_remote_task_id", rule)
    expect_same(first.is_terminal, got.is_terminal, "is_terminal", rule)
    expect_same(dict(first.metadata), got.metadata, "metadata", rule)
    empty = list(await store.list_bindings(router_session_id=unique("router-session")))
    if empty:
        raise violation(
            f"list_bindings of an unknown router session returned {len(empty)} bindings; expected []"
        )


@contract(
    "conversation_bindings.tenant_scoped",
    "conversation_bindings",
    "find_binding never returns another tenant's or user's binding.",
)
async def tenant_scoped(store: Any) -> None:
    router_session = unique("router-session")
    await store.save_remote_binding(
        conversation_binding(router_session, "scoped", tenant_id="tenant-a", user_id="user-a")
    )
    rule = (
        "bindings are scoped by (tenant_id, user_id) (spec 001 'Session isolation and tenancy'; "
        + BINDINGS_311
        + ")"
    )
    found = await find(store, router_session, tenant_id="tenant-a", user_id="user-a")
    if task_of(found) != "scoped":
        raise violation(
            f"find_binding with the binding's own tenant and user returned {task_of(found)!r}; {rule}"
        )
    for scope in (
        {"tenant_id": "tenant-b", "user_id": "user-a"},
        {"tenant_id": "tenant-a", "user_id": "user-b"},
        {},
    ):
        leaked = await find(store, router_session, **scope)
        if leaked is not None:
            raise violation(
                f"find_binding with {scope or 'no tenant/user'} returned tenant-a/user-a's binding; {rule}"
            )


@contract(
    "conversation_bindings.mark_unknown_noop",
    "conversation_bindings",
    "mark_binding_terminal of an unknown binding is a no-op, not an error.",
)
async def mark_unknown_noop(store: Any) -> None:
    await survive(
        "mark_binding_terminal of an unknown binding",
        store.mark_binding_terminal(trace_id=unique("trace"), context_id=None, task_id=unique("task")),
        f"it is a no-op for an unknown binding ({BINDINGS_311})",
    )
