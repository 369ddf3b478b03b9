"""The PostgreSQL snapshot store's rows tampered with, as the file store's files are in
``test_hostile_snapshots``: each refused with the ``SnapshotError`` naming its cause, the target
store unchanged, an oversized row refused without being fetched (real embedded PostgreSQL)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from guarded.backends.memory import InMemoryStateStore
from guarded.backends.postgres import PostgresSnapshotStore
from guarded.codec import penguiflow_types
from guarded.snapshots import SnapshotError, capture, restore
from guarded.snapshots.snapshot_errors import (
    BlobMismatchError,
    InvalidSnapshotIdError,
    SectionMismatchError,
    SnapshotTooLargeError,
)
from tests.postgres.conftest import SMALL_POOL

from ._sessions import observe, populate


class Stored:
    def __init__(self, store: PostgresSnapshotStore, conn: asyncpg.Connection, schema: str) -> None:
        self.store = store
        self.conn = conn
        self.schema = schema
        self.id = ""
        self.traces: list[str] = []

    def table(self, name: str) -> str:
        return f'"{self.schema}".{name}'

    async def refused(self, error: type[SnapshotError], *words: str) -> SnapshotError:
        """Restore into an empty store: refused with ``error`` naming ``words``, nothing written."""
        target = InMemoryStateStore(record_types=penguiflow_types())
        before = await observe(target, "s1", self.traces)
        with pytest.raises(error) as raised:
            async with await self.store.load(self.id) as content:
                await restore(content, target)
        for word in words:
            assert word in str(raised.value)
        assert await observe(target, "s1", self.traces) == before
        return raised.value


@pytest_asyncio.fixture
async def stored(pg_dsn: str, schema_name: str) -> AsyncIterator[Stored]:
    store = await PostgresSnapshotStore.connect(pg_dsn, schema=schema_name, pool=SMALL_POOL)
    conn = await asyncpg.connect(pg_dsn)
    world = Stored(store, conn, schema_name)
    source = InMemoryStateStore(record_types=penguiflow_types())
    world.traces = await populate(source, random.Random(3), "s1", events=60)
    async with await capture(source, session_id="s1", memory_keys=["custom:s1"]) as captured:
        world.id = (await store.save(captured)).id
    yield world
    await conn.close()
    await store.close()


async def _row(world: Stored, section: str) -> Any:
    return await world.conn.fetchval(
        f"SELECT lines FROM {world.table('snapshot_lines')} WHERE snapshot_id = $1 AND section = $2 "
        "AND batch = 0",
        world.id,
        section,
    )


async def _set_row(world: Stored, section: str, data: bytes) -> None:
    await world.conn.execute(
        f"UPDATE {world.table('snapshot_lines')} SET lines = $3 WHERE snapshot_id = $1 AND section = $2 "
        "AND batch = 0",
        world.id,
        section,
        data,
    )


@pytest.mark.asyncio
async def test_an_intact_snapshot_restores(stored: Stored) -> None:
    target = InMemoryStateStore(record_types=penguiflow_types())
    async with await stored.store.load(stored.id) as content:
        report = await restore(content, target)
    assert report.written["memory"] == 2
    assert await target.load_memory_state("custom:s1") == {"x": 1}


@pytest.mark.asyncio
async def test_a_tampered_row_is_refused_before_anything_is_written(stored: Stored) -> None:
    data = bytes(await _row(stored, "memory"))
    assert b'"x":1' in data
    await _set_row(stored, "memory", data.replace(b'"x":1', b'"x":6'))
    error = await stored.refused(SectionMismatchError, "memory", "hash")
    assert isinstance(error, SectionMismatchError)
    assert error.section == "memory"


@pytest.mark.asyncio
async def test_a_row_with_a_line_more_is_refused(stored: Stored) -> None:
    data = bytes(await _row(stored, "tasks"))
    await _set_row(stored, "tasks", data + b"\n" + data.split(b"\n")[0])
    await stored.refused(SectionMismatchError, "tasks", "records")


@pytest.mark.asyncio
async def test_an_oversized_row_is_refused_unfetched(stored: Stored) -> None:
    await stored.conn.execute(
        f"UPDATE {stored.table('snapshot_lines')} SET lines = lines || decode(repeat('61', 20 << 20), 'hex') "
        "WHERE snapshot_id = $1 AND section = 'events' AND batch = 0",
        stored.id,
    )
    await stored.refused(SnapshotTooLargeError, "events", "refused unread")


@pytest.mark.asyncio
async def test_a_tampered_blob_chunk_is_refused_before_anything_is_written(stored: Stored) -> None:
    digest = await stored.conn.fetchval(f"SELECT digest FROM {stored.table('snapshot_blob_chunks')} LIMIT 1")
    await stored.conn.execute(
        f"UPDATE {stored.table('snapshot_blob_chunks')} SET data = data || '\\x00'::bytea WHERE digest = $1",
        digest,
    )
    await stored.refused(BlobMismatchError, digest)


@pytest.mark.asyncio
async def test_an_oversized_blob_chunk_is_refused_unfetched(stored: Stored) -> None:
    digest = await stored.conn.fetchval(f"SELECT digest FROM {stored.table('snapshot_blob_chunks')} LIMIT 1")
    await stored.conn.execute(
        f"UPDATE {stored.table('snapshot_blob_chunks')} SET data = decode(repeat('00', 3 << 20), 'hex') "
        "WHERE digest = $1",
        digest,
    )
    await stored.refused(SnapshotTooLargeError, digest, "refused unread")


@pytest.mark.parametrize("snapshot_id", ["x" * 5000, "../x", ""])
@pytest.mark.asyncio
async def test_an_invalid_id_is_a_snapshot_error_at_every_method(stored: Stored, snapshot_id: str) -> None:
    store = stored.store
    for call in (
        lambda: store.load(snapshot_id),
        lambda: store.get(snapshot_id),
        lambda: store.delete(snapshot_id),
        lambda: store.tag(snapshot_id, ["t"]),
        lambda: store.untag(snapshot_id, ["t"]),
        lambda: store.lineage(snapshot_id),
        lambda: store.diff(stored.id, snapshot_id),
    ):
        with pytest.raises(InvalidSnapshotIdError):
            await call()
    assert (await store.get(stored.id)).id == stored.id
