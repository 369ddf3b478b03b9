"""A pooled connection is reset on release only when it may hold session state.

asyncpg's reset on release (advisory unlock, ``CLOSE ALL``, ``UNLISTEN``, ``RESET ALL``) is one
more round trip per statement. The store's own statements leave no session state, so a connection
that ran one to its end goes back without it; a connection the application borrowed from the
store's pool, and one whose statement was cancelled, still get the full reset.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.models import StoredEvent


def _reset_queries(seen: list[str]) -> list[str]:
    return [query for query in seen if "RESET ALL" in query]


async def _store(pg_dsn: str, schema_name: str, seen: list[str], **extra: Any) -> PostgresStateStore:
    async def log_queries(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda logged: seen.append(logged.query))

    settings = PoolSettings(min_size=1, max_size=1, init=log_queries, extra=extra)
    return await PostgresStateStore.connect(pg_dsn, schema=schema_name, pool=settings)


def _event(index: int) -> StoredEvent:
    return StoredEvent(
        trace_id="t", ts=float(index), kind="node_start", node_name="n", node_id="n", payload={}
    )


@pytest.mark.asyncio
async def test_the_stores_own_statements_are_released_without_a_reset(pg_dsn: str, schema_name: str) -> None:
    seen: list[str] = []
    store = await _store(pg_dsn, schema_name, seen)
    try:
        seen.clear()
        for index in range(5):
            await store.save_event(_event(index))
        await store.save_events([_event(index) for index in range(5, 40)])
        assert len(await store.load_history("t")) == 40
        await store.save_memory_state("k", {"v": 1})
        assert await store.load_memory_state("k") == {"v": 1}
        assert seen, "the query logger saw the statements"
        assert _reset_queries(seen) == []
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_borrowed_connection_is_reset_before_the_store_uses_it(pg_dsn: str, schema_name: str) -> None:
    seen: list[str] = []
    store = await _store(pg_dsn, schema_name, seen)
    try:
        seen.clear()
        async with store.pool.acquire() as conn:
            await conn.execute("SET application_name = 'borrowed'")
            await conn.execute("SELECT pg_advisory_lock(4242)")
        assert len(_reset_queries(seen)) == 1
        await store.save_event(_event(0))  # the only connection of the pool
        async with store.pool.acquire() as conn:
            assert await conn.fetchval("SHOW application_name") == "guarded"
            assert await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_cancelled_statements_connection_gets_the_full_reset(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    seen: list[str] = []
    store = await _store(pg_dsn, schema_name, seen)
    try:
        seen.clear()
        database = store._db
        sleeping = asyncio.ensure_future(database.execute("SELECT pg_sleep(30)"))
        running = (
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
        )
        for _ in range(1000):
            if await raw.fetchval(running):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the statement never started")
        sleeping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeping
        await store.save_event(_event(0))  # waits for the connection, released in the background
        assert len(_reset_queries(seen)) == 1
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_pool_with_its_own_connection_class_keeps_asyncpgs_reset(
    pg_dsn: str, schema_name: str
) -> None:
    seen: list[str] = []
    store = await _store(pg_dsn, schema_name, seen, connection_class=asyncpg.Connection)
    try:
        seen.clear()
        await store.save_event(_event(0))
        assert len(_reset_queries(seen)) == 1
    finally:
        await store.close()
