"""bulk_method_for / bulk_args against the in-memory store and a store without bulk methods."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import PendingWrite
from guarded.bulk_forms import bulk_args, bulk_method_for
from guarded.models import PlannerEvent, StateUpdate, StoredEvent, UpdateType

from .support import event


def write(method: str, *args: Any, **kwargs: Any) -> PendingWrite:
    return PendingWrite(method, args, kwargs, None, 0, 0.0)


class SinglesOnly:
    """A store with single writes only (and a non-callable attribute named like a bulk method)."""

    save_updates = "not a method"

    async def save_event(self, event: StoredEvent) -> None: ...

    async def save_update(self, update: StateUpdate) -> None: ...


class AllBulk(SinglesOnly):
    async def save_events(self, events: list[StoredEvent]) -> None: ...

    async def save_updates(self, updates: list[StateUpdate]) -> None:  # type: ignore[override]
        ...

    async def save_planner_events(self, items: list[tuple[str, PlannerEvent]]) -> None: ...


def test_bulk_method_for_finds_only_callable_bulk_methods() -> None:
    memory = InMemoryStateStore()
    assert bulk_method_for(memory, "save_event") == "save_events"
    assert bulk_method_for(memory, "save_update") is None
    assert bulk_method_for(memory, "save_planner_event") is None
    assert bulk_method_for(SinglesOnly(), "save_event") is None
    assert bulk_method_for(SinglesOnly(), "save_update") is None
    assert bulk_method_for(AllBulk(), "save_update") == "save_updates"
    assert bulk_method_for(AllBulk(), "save_planner_event") == "save_planner_events"
    assert bulk_method_for(AllBulk(), "save_task") is None


def test_bulk_args_take_the_argument_positionally_or_by_name() -> None:
    first, second = event("t", 1), event("t", 2)
    assert bulk_args("save_event", [write("save_event", first), write("save_event", event=second)]) == (
        [first, second],
    )
    update = StateUpdate(session_id="s", task_id="k", update_type=UpdateType.PROGRESS, content={"p": 1})
    assert bulk_args("save_update", [write("save_update", update=update)]) == ([update],)

    planner = [PlannerEvent("step_complete", float(index)) for index in range(3)]
    writes = [
        write("save_planner_event", "a", planner[0]),
        write("save_planner_event", "b", event=planner[1]),
        write("save_planner_event", trace_id="c", event=planner[2]),
    ]
    assert bulk_args("save_planner_event", writes) == (
        [("a", planner[0]), ("b", planner[1]), ("c", planner[2])],
    )
    assert bulk_args("save_event", []) == ([],)


def test_bulk_args_of_upserts_follow_the_single_signature() -> None:
    assert bulk_args(
        "save_memory_state",
        [write("save_memory_state", "k1", {"a": 1}), write("save_memory_state", key="k2", state={})],
    ) == ([("k1", {"a": 1}), ("k2", {})],)
    assert bulk_args(
        "mark_binding_terminal",
        [write("mark_binding_terminal", trace_id="t", context_id=None, task_id="x")],
    ) == ([("t", None, "x")],)


def test_bulk_args_reject_unknown_methods_and_missing_arguments() -> None:
    with pytest.raises(ValueError, match="save_steering"):
        bulk_args("save_steering", [])
    with pytest.raises(TypeError, match="'event'"):
        bulk_args("save_planner_event", [write("save_planner_event", "t")])


def test_bulk_args_feed_the_in_memory_bulk_method() -> None:
    store = InMemoryStateStore()
    writes = [write("save_event", event("t", index)) for index in range(3)]

    async def run() -> list[StoredEvent]:
        bulk = bulk_method_for(store, "save_event")
        assert bulk is not None
        await getattr(store, bulk)(*bulk_args("save_event", writes))
        return list(await store.load_history("t"))

    assert [item.payload["i"] for item in asyncio.run(run())] == [0, 1, 2]
