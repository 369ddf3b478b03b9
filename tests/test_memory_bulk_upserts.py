"""Bulk upserts of the in-memory reference store: each does what the single method called once per
item in list order does, and stores nothing when one item is invalid."""

from __future__ import annotations

import inspect
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.backends.postgres import PostgresStateStore
from guarded.errors import InvalidPayloadError
from guarded.models import RemoteBinding, TaskContextSnapshot, TaskState, TaskStatus, TaskType

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SEEDS = [1, 2, 3, 4, 5, 6]
NAN = float("nan")

BULK_FORMS = {
    "save_memory_states": "save_memory_state",
    "save_tasks": "save_task",
    "save_trajectories": "save_trajectory",
    "save_remote_bindings": "save_remote_binding",
    "mark_bindings_terminal": "mark_binding_terminal",
    "save_planner_states": "save_planner_state",
}
"""Each bulk upsert and the single method it stands for."""


def task(
    task_id: str, session: str = "s", *, seconds: int = 0, priority: int = 1, **changes: Any
) -> TaskState:
    return TaskState(
        task_id=task_id,
        session_id=session,
        status=TaskStatus.RUNNING,
        task_type=TaskType.BACKGROUND,
        priority=priority,
        context_snapshot=TaskContextSnapshot(session_id=session, task_id=task_id),
        updated_at=T0 + timedelta(seconds=seconds),
        **changes,
    )


def binding(
    trace_id: str,
    context_id: str | None = None,
    *,
    router: str = "r",
    terminal: bool = False,
    **metadata: Any,
) -> RemoteBinding:
    return RemoteBinding(
        trace_id=trace_id,
        context_id=context_id,
        task_id="x",
        agent_url="https://agent",
        router_session_id=router,
        remote_skill="skill",
        is_terminal=terminal,
        metadata=metadata,
    )


async def call_single(store: InMemoryStateStore, bulk: str, item: Any) -> None:
    method = getattr(store, BULK_FORMS[bulk])
    if bulk == "mark_bindings_terminal":
        trace_id, context_id, task_id = item
        await method(trace_id=trace_id, context_id=context_id, task_id=task_id)
    elif isinstance(item, tuple):
        await method(*item)
    else:
        await method(item)


async def read_back(store: InMemoryStateStore) -> Any:
    """Everything the store's reads give for the keys these tests use (pauses are consumed)."""
    keys = [f"k{index}" for index in range(8)]
    traces = [f"tr{index}" for index in range(8)]
    sessions = ["s", "s0", "s1", "s2"]
    routers = ["r", "r0", "r1"]
    return (
        [await store.load_memory_state(key) for key in keys],
        [await store.list_tasks(session) for session in sessions],
        [await store.list_traces(session) for session in sessions],
        [await store.get_trajectory(trace, session) for trace in traces for session in sessions],
        [await store.list_bindings(router_session_id=router) for router in routers],
        [
            await store.find_binding(
                router_session_id=router, agent_url="https://agent", remote_skill="skill"
            )
            for router in routers
        ],
        [await store.load_planner_state(f"p{index}") for index in range(8)],
    )


def random_items(rng: random.Random, bulk: str, count: int) -> list[Any]:
    def one(index: int) -> Any:
        if bulk == "save_memory_states":
            return f"k{rng.randrange(8)}", {"i": index}
        if bulk == "save_tasks":
            return task(
                f"t{rng.randrange(6)}",
                rng.choice(["s0", "s1", "s2"]),
                seconds=rng.randrange(9),
                priority=index,
            )
        if bulk == "save_trajectories":
            return f"tr{rng.randrange(8)}", rng.choice(["s0", "s1"]), {"step": index}
        if bulk == "save_remote_bindings":
            return binding(
                f"tr{rng.randrange(5)}",
                rng.choice([None, "c"]),
                router=rng.choice(["r0", "r1"]),
                terminal=rng.random() < 0.2,
                i=index,
            )
        if bulk == "mark_bindings_terminal":
            return f"tr{rng.randrange(7)}", rng.choice([None, "c"]), "x"
        return f"p{rng.randrange(8)}", {"i": index}

    return [one(index) for index in range(count)]


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bulk", list(BULK_FORMS))
async def test_bulk_equals_singles(bulk: str, seed: int) -> None:
    rng = random.Random(seed)
    stores = InMemoryStateStore(), InMemoryStateStore()
    before = {name: random_items(rng, name, 8) for name in BULK_FORMS}
    batch = random_items(rng, bulk, 40)
    for store in stores:  # the same earlier state in both, written with single calls
        for name, items in before.items():
            for item in items:
                await call_single(store, name, item)
    await getattr(stores[0], bulk)(batch)
    for item in batch:
        await call_single(stores[1], bulk, item)
    assert await read_back(stores[0]) == await read_back(stores[1])


@pytest.mark.asyncio
async def test_the_last_item_of_a_key_wins() -> None:
    store = InMemoryStateStore()
    await store.save_memory_states([("k", {"v": 1}), ("j", {"v": 2}), ("k", {"v": 3})])
    assert await store.load_memory_state("k") == {"v": 3}
    await store.save_trajectories([("a", "s", {"v": 1}), ("b", "s", {"v": 2}), ("a", "s", {"v": 3})])
    assert await store.get_trajectory("a", "s") == {"v": 3}
    assert await store.list_traces("s") == ["a", "b"]
    await store.save_planner_states([("p", {"v": 1}), ("p", {"v": 2})])
    assert await store.load_planner_state("p") == {"v": 2}
    await store.save_tasks([task("t", priority=1), task("u"), task("t", priority=3)])
    assert [(item.task_id, item.priority) for item in await store.list_tasks("s")] == [("t", 3), ("u", 1)]
    await store.save_remote_bindings([binding("a", v=1), binding("b", v=2), binding("a", v=3)])
    listed = await store.list_bindings(router_session_id="r")
    assert [(item.trace_id, item.metadata) for item in listed] == [("a", {"v": 3}), ("b", {"v": 2})]
    await store.mark_bindings_terminal([("a", None, "x"), ("a", None, "x"), ("unknown", None, "x")])
    assert [item.is_terminal for item in await store.list_bindings(router_session_id="r")] == [True, False]


@pytest.mark.asyncio
async def test_bulk_pauses_get_the_ttl() -> None:
    now = [1_000.0]
    store = InMemoryStateStore(planner_state_ttl_seconds=10, clock=lambda: now[0])
    await store.save_planner_states([("p", {"v": 1}), ("q", {"v": 2})])
    assert await store.load_planner_state("p") == {"v": 1}
    now[0] += 11
    assert await store.load_planner_state("q") is None
    await store.save_planner_states([("p", {"v": 3})])  # consumed, then saved again: loadable again
    assert await store.load_planner_state("p") == {"v": 3}


BAD_ITEMS: list[tuple[str, Any, Any, str]] = [
    ("save_memory_states", ("k", {"v": 1}), ("j", {"v": NAN}), "items[1].state"),
    ("save_memory_states", ("k", {"v": 1}), ("j",), "items[1]"),
    ("save_tasks", task("a"), task("b", result=NAN), "states[1]"),
    ("save_trajectories", ("a", "s", {"v": 1}), ("b", "s", {"v": float("inf")}), "items[1].trajectory"),
    ("save_trajectories", ("a", "s", {"v": 1}), "abc", "items[1]"),
    ("save_remote_bindings", binding("a"), binding("b", v=NAN), "bindings[1]"),
    ("mark_bindings_terminal", ("a", None, "x"), ("a", None), "items[1]"),
    ("save_planner_states", ("p", {"v": 1}), ("q", {"v": NAN}), "items[1].payload"),
    ("save_planner_states", ("p", {"v": 1}), ("q", ["not an object"]), "items[1].payload"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("bulk", "good", "bad", "path"), BAD_ITEMS, ids=[f"{c[0]}-{c[3]}" for c in BAD_ITEMS]
)
async def test_a_bad_item_raises_and_nothing_is_stored(bulk: str, good: Any, bad: Any, path: str) -> None:
    store = InMemoryStateStore()
    await store.save_remote_binding(binding("a"))
    before = await read_back_without_consuming(store)
    with pytest.raises(InvalidPayloadError) as raised:
        await getattr(store, bulk)([good, bad, good])
    assert raised.value.method == bulk
    assert raised.value.path.startswith(path), raised.value.path
    assert await read_back_without_consuming(store) == before
    if raised.value.path != "items[1]":  # not a shape error: the single method refuses it too
        with pytest.raises(InvalidPayloadError):
            await call_single(store, bulk, bad)


async def read_back_without_consuming(store: InMemoryStateStore) -> Any:
    return (
        await store.load_memory_state("k"),
        await store.list_tasks("s"),
        await store.get_trajectory("a", "s"),
        await store.list_bindings(router_session_id="r"),
        dict(store._planner_state),  # reading through load_planner_state would consume
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("bulk", list(BULK_FORMS))
async def test_an_empty_list_is_a_no_op(bulk: str) -> None:
    store = InMemoryStateStore()
    await store.save_remote_binding(binding("a"))
    before = await read_back_without_consuming(store)
    await getattr(store, bulk)([])
    assert await read_back_without_consuming(store) == before


Method = Callable[..., Awaitable[None]]


@pytest.mark.parametrize("bulk", list(BULK_FORMS))
def test_both_backends_offer_the_same_bulk_forms(bulk: str) -> None:
    memory: Method = getattr(InMemoryStateStore, bulk)
    postgres: Method = getattr(PostgresStateStore, bulk)
    assert inspect.iscoroutinefunction(memory)
    assert inspect.iscoroutinefunction(postgres)
    parameters: Sequence[str] = list(inspect.signature(memory).parameters)
    assert parameters == list(inspect.signature(postgres).parameters)
    assert len(parameters) == 2  # self and the one list
    assert memory.__doc__
    assert postgres.__doc__
