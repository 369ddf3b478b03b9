"""Every method of the protocol runs on a real Redis Cluster without ``CROSSSLOT``, and a caller's
id never moves a key or matches another's.

Every protocol method, every bulk form and every artifact method is called on the raw store (no
guard to hide an error) with ids spread over every master, ids holding ``{``, ``}``, ``*`` and the
other characters Redis gives a meaning to among them; each call's result is compared with our
in-memory store's for the same calls (itself compared with PenguiFlow's reference in
tests/interop). A bulk call mixes ids of different slots. Afterwards every key of the store has
exactly one hash tag, and the keys of the calls are spread over all three masters.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel

from guarded.backend import BULK_FORMS
from guarded.backends.memory import InMemoryStateStore
from guarded.backends.redis import RedisStateStore
from guarded.models import (
    ArtifactScope,
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)
from guarded.protocol import protocol_signatures
from guarded.testing.redis_cluster import RedisCluster

IDS = (
    "plain",
    "a{b}c",
    "{b}",
    "}{",
    "{",
    "}",
    "*",
    "x*y",
    "[ab]?",
    "back\\slash",
    "with:colon",
    "with space",
    "ünï",
    *(f"spread-{index}" for index in range(12)),
)
"""Ids of sessions, traces, tokens, tasks and memory keys: ``a{b}c`` and ``{b}`` would share a
slot if an id's braces made the hash tag; ``*`` and ``[ab]?`` would match others as a pattern."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SINGLE_FORMS = {bulk: single for single, bulk in BULK_FORMS.items()}
ARTIFACT_METHODS = ("put_bytes", "put_text", "get", "get_ref", "exists", "list", "delete")


def plain(value: Any) -> Any:
    """A comparable form: models and dataclasses as dicts, enums as values, sequences as lists."""
    if isinstance(value, BaseModel):
        return plain(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


class Both:
    """Makes each call on the Redis store and on the in-memory store and compares the results."""

    def __init__(self, redis_store: Any, memory_store: Any) -> None:
        self.stores = (redis_store, memory_store)
        self.called: set[str] = set()
        self.differences: list[str] = []

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.called.add(method)
        results = [await self._call_on(store, method, args, kwargs) for store in self.stores]
        if plain(results[0]) != plain(results[1]):
            self.differences.append(
                f"{method}{args!r}{kwargs!r}: redis {results[0]!r}, memory {results[1]!r}"
            )
        return results[0]

    @staticmethod
    async def _call_on(store: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if hasattr(store, method):
            return await getattr(store, method)(*args, **kwargs)
        single = SINGLE_FORMS[method]  # a bulk form the in-memory store lacks: item by item
        for item in args[0]:
            await getattr(store, single)(*(item if isinstance(item, tuple) else (item,)))
        return None


def task(task_id: str, session: str, priority: int) -> TaskState:
    return TaskState(
        task_id=task_id,
        session_id=session,
        status=TaskStatus.RUNNING,
        task_type=TaskType.BACKGROUND,
        priority=priority,
        context_snapshot=TaskContextSnapshot(session_id=session, task_id=task_id),
        created_at=T0,
        updated_at=T0 + timedelta(seconds=priority),
    )


def binding(trace: str, session: str, context: str | None) -> RemoteBinding:
    return RemoteBinding(
        trace_id=trace,
        context_id=context,
        task_id=f"remote-{trace}",
        agent_url="http://agent",
        router_session_id=session,
        remote_skill="skill",
        tenant_id="acme",
        user_id="u",
    )


async def exercise(both: Both, ids: tuple[str, ...]) -> None:
    call = both.call
    other = ids[::-1]
    for index, (one, two) in enumerate(zip(ids, other, strict=True)):
        await call("save_event", StoredEvent(one, 1.0, "node_end", "node", f"n-{two}", {"id": one}))
        await call("save_planner_state", one, {"token": one})
        await call("save_memory_state", f"tenant:{two}:{one}", {"turns": [one]})
        await call("save_task", task(one, two, index))
        update = StateUpdate(
            session_id=one,
            task_id=two,
            update_id=f"u-{two}",
            update_type=UpdateType.PROGRESS,
            content={"i": index},
        )
        await call("save_update", update)
        await call(
            "save_task_update",
            StateUpdate(
                session_id=one, task_id=one, update_id=f"v-{two}", update_type=UpdateType.RESULT, content=one
            ),
        )
        steering = SteeringEvent(
            session_id=one,
            task_id=two,
            event_id=f"e-{two}",
            event_type=SteeringEventType.USER_MESSAGE,
            payload={"text": two},
        )
        await call("save_steering", steering)
        await call("save_trajectory", one, two, {"steps": [one]})
        await call("save_planner_event", one, PlannerEvent("step", float(index), index, extra={"id": two}))
        await call("save_remote_binding", binding(one, two, None if index % 2 else two))

    # Bulk forms: each call mixes ids hashed to different slots.
    await call("save_events", [StoredEvent(one, 2.0, "bulk", None, f"b-{one}", {}) for one in ids])
    await call("save_planner_states", [(f"bulk-{one}", {"bulk": one}) for one in ids])
    await call("save_memory_states", [(f"t:u:{one}", {"bulk": one}) for one in ids])
    await call("save_tasks", [task(f"bulk-{one}", two, 7) for one, two in zip(ids, other, strict=True)])
    await call(
        "save_updates",
        [
            StateUpdate(
                session_id=one, task_id=one, update_id="bulk", update_type=UpdateType.PROGRESS, content=1
            )
            for one in ids
        ],
    )
    await call("save_trajectories", [(f"bulk-{one}", one, {"bulk": one}) for one in ids])
    await call("save_planner_events", [(one, PlannerEvent("bulk", 99.0, None)) for one in ids])
    await call(
        "save_remote_bindings",
        [binding(f"bulk-{one}", two, one) for one, two in zip(ids, other, strict=True)],
    )
    await call("mark_bindings_terminal", [(f"bulk-{one}", one, f"remote-bulk-{one}") for one in ids[::2]])

    for one, two in zip(ids, other, strict=True):
        await call("load_history", one)
        await call("load_planner_state", one)
        await call("load_planner_state", one)  # consumed once
        await call("load_planner_state", f"bulk-{one}")
        await call("load_memory_state", f"tenant:{two}:{one}")
        await call("load_memory_state", f"t:u:{one}")
        await call("list_memory_keys", one)
        await call("list_tasks", two)
        await call("list_updates", one)
        await call("list_updates", one, task_id=two, since_id=None, limit=0)
        await call("list_task_updates", one, since_id=f"u-{two}")
        await call("list_steering", one, task_id=two)
        await call("get_trajectory", one, two)
        await call("get_trajectory", f"bulk-{one}", one)
        await call("list_traces", two)
        await call("list_traces", one, limit=3)
        await call("list_planner_events", one)
        await call("get_events", one)
        await call("list_bindings", router_session_id=two)
        await call("find_binding", router_session_id=two, agent_url="http://agent", remote_skill="skill")
        await call(
            "find_binding",
            router_session_id=two,
            agent_url="http://agent",
            remote_skill="skill",
            tenant_id="acme",
            user_id="u",
        )
        await call("mark_binding_terminal", trace_id=one, context_id=None, task_id=f"remote-{one}")
        await call("list_bindings", router_session_id=two)


async def exercise_artifacts(store: RedisStateStore, ids: tuple[str, ...]) -> set[str]:
    """Every artifact method with scopes of every id; returns the methods called."""
    artifacts = store.artifact_store
    assert artifacts is not None
    refs = []
    for one in ids:
        scope = ArtifactScope(tenant_id="acme", session_id=one, trace_id=one)
        refs.append(
            await artifacts.put_bytes(one.encode(), scope=scope, namespace=one, filename=f"{one}.bin")
        )
        refs.append(await artifacts.put_text(f"text {one}", scope=scope, namespace=one))
    for one, ref in zip([one for one in ids for _ in range(2)], refs, strict=True):
        assert await artifacts.exists(ref.id)
        assert (await artifacts.get_ref(ref.id)) == ref
        assert (await artifacts.get(ref.id)) in (one.encode(), f"text {one}".encode())
        assert [found.id for found in await artifacts.list(scope=ArtifactScope(session_id=one))] != []
    listed = {found.id for found in await artifacts.list()}
    assert {ref.id for ref in refs} <= listed
    for ref in refs:
        assert await artifacts.delete(ref.id)
        assert not await artifacts.exists(ref.id)
    return set(ARTIFACT_METHODS)


def keys_by_master(cluster: RedisCluster, prefix: str) -> dict[int, list[str]]:
    """Every key under ``prefix``, by the port of the master holding it (``SCAN`` of each master:
    the pattern is the test's prefix, never an id)."""
    found: dict[int, list[str]] = {}
    for master in cluster.masters():
        with master.client() as client:
            found[master.port] = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    return found


@pytest_asyncio.fixture
async def redis_store(cluster: RedisCluster, key_prefix: str) -> AsyncIterator[RedisStateStore]:
    store = RedisStateStore(cluster.async_client(), prefix=key_prefix, owns_client=True)
    yield store
    await store.close()


@pytest.mark.asyncio
async def test_every_method_runs_on_the_cluster_with_ids_of_every_slot_and_shape(
    redis_store: RedisStateStore, cluster: RedisCluster, key_prefix: str
) -> None:
    both = Both(redis_store, InMemoryStateStore())
    await exercise(both, IDS)
    called = both.called | await exercise_artifacts(redis_store, IDS)

    assert both.differences == []
    bulk_forms = {form for form in BULK_FORMS.values() if hasattr(redis_store, form)}
    assert set(protocol_signatures()) | bulk_forms <= called, "a method of the protocol was not called"

    keys = keys_by_master(cluster, key_prefix)
    assert all(keys.values()), f"the calls' keys are not spread over every master: {keys}"
    every_key = [key for held in keys.values() for key in held]
    assert [key for key in every_key if key.count("{") != 1 or key.count("}") != 1] == []
    assert [key for key in every_key if "*" in key or " " in key] == []
