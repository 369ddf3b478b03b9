"""A connection whose release sends nothing goes back to the pool in place, keeping the pool's rules.

asyncpg's ``Pool.release()`` runs every release in a task of its own behind ``asyncio.shield()``
(two more turns of the event loop per call). When the release sends nothing -- the store's own
statement ran to its end, no transaction is open -- the store runs the holder's release in place:
no task, and still the pool's bookkeeping: the idle timer closes a connection left unused, expired
connections are replaced, a transaction left open is rolled back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Generator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.connection import Connection

from .conftest import StoreFactory

Awaited = Coroutine[Any, Any, Any] | Generator[Any, None, Any]


class TaskCount:
    """Counts the tasks the event loop creates while installed as its task factory."""

    def __init__(self) -> None:
        self.created = 0

    def __enter__(self) -> TaskCount:
        loop = asyncio.get_running_loop()
        self._previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Awaited, **kw: Any) -> asyncio.Task[Any]:
            self.created += 1
            return asyncio.Task(coro, loop=loop, **kw)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.get_running_loop().set_task_factory(self._previous)


async def _backend_pid(store: PostgresStateStore) -> int:
    pid: int = await store._db.fetchval("SELECT pg_backend_pid()")
    return pid


async def _eventually(condition: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def store(make_store: StoreFactory) -> PostgresStateStore:
    """A store of one pooled connection, holding the memory state ``k``."""
    store = await make_store(pool=PoolSettings(min_size=1, max_size=1))
    await store.save_memory_state("k", {"v": 1})
    return store


@pytest.mark.asyncio
async def test_a_clean_call_releases_its_connection_without_a_task(store: PostgresStateStore) -> None:
    with TaskCount() as tasks:
        for _ in range(20):
            assert await store.load_memory_state("k") == {"v": 1}
    assert tasks.created == 0
    assert store.pool.get_idle_size() == 1


@pytest.mark.asyncio
async def test_a_connection_released_in_place_is_closed_when_left_idle(make_store: StoreFactory) -> None:
    store = await make_store(pool=PoolSettings(min_size=0, max_size=1, max_inactive_connection_lifetime=0.3))
    await store.save_memory_state("k", {"v": 1})
    assert store.pool.get_size() == 1

    async def closed() -> bool:
        return store.pool.get_size() == 0

    await _eventually(closed, "the idle connection was closed")
    assert await store.load_memory_state("k") == {"v": 1}  # and a new one is opened


@pytest.mark.asyncio
async def test_expired_connections_are_replaced_after_release_in_place(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    store = await make_store(pool=PoolSettings(min_size=1, max_size=1))
    before = await _backend_pid(store)
    await store.pool.expire_connections()
    after = await _backend_pid(store)
    assert after != before

    async def gone() -> bool:
        return not await raw.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", before)

    await _eventually(gone, "the expired connection was closed")


async def _delete_in_a_transaction_left_open(store: PostgresStateStore) -> str:
    """Delete every memory state in a transaction the operation leaves open; the table's name."""
    table = f'"{store.schema}".memory_states'

    async def leave_open(conn: Connection) -> None:
        await conn.execute("BEGIN")
        await conn.execute(f"DELETE FROM {table}")

    await store._db.run(leave_open)
    return table


@pytest.mark.asyncio
async def test_a_transaction_left_open_is_rolled_back_on_release(
    store: PostgresStateStore, raw: asyncpg.Connection
) -> None:
    table = await _delete_in_a_transaction_left_open(store)

    async def in_transaction(conn: Connection) -> bool:
        return conn.is_in_transaction()

    assert not await store._db.run(in_transaction)
    assert await store.load_memory_state("k") == {"v": 1}
    assert await raw.fetchval(f"SELECT count(*) FROM {table}") == 1


class PublicPool:
    """An asyncpg pool seen through its public interface only: every private attribute the release
    in place reads is missing, as in an asyncpg whose internals are not the ones it was written for."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.pool, name)


@pytest.mark.asyncio
async def test_without_asyncpg_internals_a_release_takes_the_pool_s_own_path(
    store: PostgresStateStore, raw: asyncpg.Connection
) -> None:
    pool = store.pool
    store._db._pool = PublicPool(pool)  # type: ignore[assignment]
    try:
        with TaskCount() as tasks:
            for _ in range(20):  # one connection: a release that did not give it back would hang
                assert await asyncio.wait_for(store.load_memory_state("k"), 10) == {"v": 1}
        assert tasks.created >= 20  # each release ran in the task Pool.release() starts
        assert pool.get_idle_size() == 1
        table = await _delete_in_a_transaction_left_open(store)
        assert await store.load_memory_state("k") == {"v": 1}  # rolled back on release
        assert await raw.fetchval(f"SELECT count(*) FROM {table}") == 1
    finally:
        store._db._pool = pool
