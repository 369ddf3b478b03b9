"""The differential round trip with snapshots kept in PostgreSQL: a random session captured from the
in-memory store is saved into the ``PostgresSnapshotStore`` of a ``PostgresStateStore``'s schema
(through the guard), restored into that state store, captured there and restored into an empty
in-memory store; every read answers the same in all three and the two snapshots hold one state."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from guarded import guard
from guarded.backends.memory import InMemoryStateStore
from guarded.backends.postgres import PostgresSnapshotStore
from guarded.codec import penguiflow_types
from guarded.snapshots import capture, restore
from tests.postgres.conftest import StoreFactory

from ._sessions import observe, populate


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [21, 22])
async def test_memory_to_postgres_and_back_with_postgres_snapshots(
    make_store: StoreFactory, seed: int
) -> None:
    types = penguiflow_types()
    source = InMemoryStateStore(record_types=types)
    traces = await populate(source, random.Random(seed), "s1")
    postgres = await make_store(types=types)
    snapshots = guard(PostgresSnapshotStore.of(postgres), registry=CollectorRegistry())
    options = {"memory_keys": ["custom:s1"], "pause_tokens": ["s1-pause"]}
    async with await capture(source, session_id="s1", **options) as captured:
        first = await snapshots.save(captured)

    async with await snapshots.load(first.id) as content:
        await restore(content, postgres, include_pauses=True, rollback=True)
        await restore(content, postgres, include_pauses=True, rollback=True)  # twice: the same
    expected = await observe(source, "s1", traces)
    assert await observe(postgres, "s1", traces) == expected

    async with await capture(postgres, session_id="s1", parent=first, **options) as captured:
        second = await snapshots.save(captured)
    assert second.content_hash == first.content_hash
    assert [s.id for s in await snapshots.lineage(second.id)] == [second.id, first.id]
    back = InMemoryStateStore(record_types=types)
    async with await snapshots.load(second.id) as content:
        await restore(content, back, include_pauses=True, rollback=True)
    assert await observe(back, "s1", traces) == expected
    assert await back.load_planner_state("s1-pause") == {"resume": "here"}
    assert (await snapshots.diff(first.id, second.id)).empty
