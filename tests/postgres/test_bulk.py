"""Bulk writes: one statement, idempotent, ordered; planner events de-duplicated by idempotency key."""

from __future__ import annotations

from typing import Any

import pytest

from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.event_log import COPY_THRESHOLD
from guarded.models import PlannerEvent, StateUpdate, StoredEvent, UpdateType
from guarded.pipeline.idempotency import idempotency_key


@pytest.mark.asyncio
async def test_bulk_events_are_idempotent_and_ordered(store: PostgresStateStore) -> None:
    events = [
        StoredEvent("bulk", float(index % 7), "k", f"n{index}", None, {"i": index}) for index in range(2_000)
    ]
    await store.save_events(events)
    await store.save_events(events[500:1500] + events[:10])  # a replayed, overlapping batch
    await store.save_events([])
    history = await store.load_history("bulk")
    assert len(history) == 2_000
    expected = sorted(events, key=lambda event: (event.ts, int(event.payload["i"])))
    assert history == expected


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [3, COPY_THRESHOLD + 1])
async def test_duplicates_inside_a_batch_keep_the_first_position(
    store: PostgresStateStore, size: int
) -> None:
    a, b = (StoredEvent("dup", 1.0, "k", name, None, {}) for name in ("a", "b"))
    fillers = [StoredEvent("dup", 2.0, "k", f"f{index}", None, {}) for index in range(size - 3)]
    await store.save_events([a, b, a, *fillers])
    assert [event.node_name for event in await store.load_history("dup")][:2] == ["a", "b"]


@pytest.mark.asyncio
async def test_bulk_updates(store: PostgresStateStore) -> None:
    updates = [
        StateUpdate(
            session_id="s",
            task_id=f"t{index % 2}",
            update_id=f"u{index}",
            update_type=UpdateType.PROGRESS,
            content=index,
        )
        for index in range(300)
    ]
    await store.save_updates(updates)
    await store.save_updates(updates[100:200] + updates[:1])
    await store.save_update(updates[5])
    listed = await store.list_updates("s", limit=1_000)
    assert [item.update_id for item in listed] == [f"u{index}" for index in range(300)]
    assert [item.content for item in await store.list_updates("s", task_id="t1", since_id="u290")] == [
        291,
        293,
        295,
        297,
        299,
    ]


@pytest.mark.asyncio
async def test_planner_events_without_a_key_are_appended(store: PostgresStateStore) -> None:
    chunk = PlannerEvent("stream_chunk", 1.0, 1, extra={"text": "same"})
    await store.save_planner_event("t", chunk)
    await store.save_planner_event("t", chunk)  # identical chunks are legitimate
    assert await store.list_planner_events("t") == [chunk, chunk]


@pytest.mark.asyncio
async def test_planner_event_retries_under_one_key_are_stored_once(store: PostgresStateStore) -> None:
    first = PlannerEvent("a", 1.0, 1)
    batch = [
        ("t", PlannerEvent("b", 2.0, 2)),
        ("u", PlannerEvent("c", 3.0, 3)),
        ("t", PlannerEvent("d", 4.0, 4)),
    ]
    with idempotency_key("call-1"):
        await store.save_planner_event("t", first)
        await store.save_planner_event("t", first)  # the retry
    with idempotency_key("call-2"):
        await store.save_planner_events(batch)
        await store.save_planner_events(batch)  # the retry of the bulk write
    with idempotency_key("call-3"):
        await store.save_planner_event("t", first)  # another logical call: a new event
    assert [item.event_type for item in await store.list_planner_events("t")] == ["a", "b", "d", "a"]
    assert [item.event_type for item in await store.list_planner_events("u")] == ["c"]


@pytest.mark.asyncio
async def test_bulk_is_one_operation(store: PostgresStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    operations = 0
    run = store._db.run

    async def counting(operation: Any, *, repeat_safe: bool = True) -> Any:
        nonlocal operations
        operations += 1
        return await run(operation, repeat_safe=repeat_safe)

    monkeypatch.setattr(store._db, "run", counting)
    await store.save_events([StoredEvent("one", float(index), "k", None, None, {}) for index in range(100)])
    await store.save_updates(
        [
            StateUpdate(
                session_id="s", task_id="t", update_id=f"u{index}", update_type=UpdateType.PROGRESS, content=1
            )
            for index in range(100)
        ]
    )
    await store.save_planner_events([("t", PlannerEvent("x", float(index), index)) for index in range(100)])
    assert operations == 3
    assert len(await store.load_history("one")) == 100


@pytest.mark.asyncio
async def test_a_retried_bulk_falls_back_from_copy(store: PostgresStateStore) -> None:
    events = [
        StoredEvent("retry", float(index), "k", None, None, {"i": index})
        for index in range(COPY_THRESHOLD * 2)
    ]
    await store.save_events(events[: COPY_THRESHOLD + 5])  # COPY
    await store.save_events(events)  # COPY hits the stored ones: falls back to ON CONFLICT
    await store.save_events(events + events)  # duplicates inside the batch are dropped first
    assert await store.load_history("retry") == events
