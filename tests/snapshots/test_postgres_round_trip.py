"""In-memory into PostgreSQL and back: capture a random session from the
in-memory store, restore it into an empty ``PostgresStateStore`` (real embedded server), capture it
there, restore that into an empty in-memory store; every read answers the same in all three, and
the two snapshots have the same content hash."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from guarded.snapshots import FileSnapshotStore, capture, restore
from tests.postgres.conftest import StoreFactory

from ._sessions import observe, populate


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [11, 12])
async def test_memory_to_postgres_and_back(tmp_path: Path, make_store: StoreFactory, seed: int) -> None:
    types = penguiflow_types()
    source = InMemoryStateStore(record_types=types)
    traces = await populate(source, random.Random(seed), "s1")
    snapshots = FileSnapshotStore(tmp_path)
    options = {"memory_keys": ["custom:s1"], "pause_tokens": ["s1-pause"]}
    async with await capture(source, session_id="s1", **options) as captured:
        first = await snapshots.save(captured)

    postgres = await make_store(types=types)
    async with await snapshots.load(first.id) as content:
        await restore(content, postgres, include_pauses=True, rollback=True)
        await restore(content, postgres, include_pauses=True, rollback=True)  # twice: the same
    expected = await observe(source, "s1", traces)
    assert await observe(postgres, "s1", traces) == expected

    async with await capture(postgres, session_id="s1", **options) as captured:
        second = await snapshots.save(captured)
    assert second.content_hash == first.content_hash
    back = InMemoryStateStore(record_types=types)
    async with await snapshots.load(second.id) as content:
        await restore(content, back, include_pauses=True, rollback=True)
    assert await observe(back, "s1", traces) == expected
    assert await back.load_planner_state("s1-pause") == {"resume": "here"}
    assert (await snapshots.diff(first.id, second.id)).empty
