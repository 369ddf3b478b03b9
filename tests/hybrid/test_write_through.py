"""Memory written through to the record store: record first, read from the hot store, falling back
to the record store when the hot store has no entry."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.hybrid_store import HOT, RECORD, HybridStateStore
from guarded.errors import WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.testing.postgres import EmbeddedPostgres
from guarded.testing.redis import RedisServer
from tests.postgres.conftest import StoreFactory, new_schema_name
from tests.redis.conftest import new_prefix

from .conftest import HotFactory, forget_hot, record_store

KEY = "acme:u1:s1"


async def guarded_hybrid(
    make_hot: HotFactory, make_store: StoreFactory, *, write_through: bool = True
) -> Any:
    hybrid = HybridStateStore(
        hot=await make_hot(), record=await make_store(), memory_write_through=write_through
    )
    return guard(hybrid, registry=CollectorRegistry(), spill_path=None, strict=True)


def parts(store: Any) -> tuple[Any, Any]:
    """The two stores behind a guarded hybrid."""
    control = controller(store)
    return control.parts[HOT].store, control.parts[RECORD].store


@pytest.mark.asyncio
async def test_a_memory_state_is_in_both_stores(make_hot: HotFactory, make_store: StoreFactory) -> None:
    store = await guarded_hybrid(make_hot, make_store)
    async with store:
        await store.save_memory_state(KEY, {"turns": 1})
        await store.save_memory_states([(KEY, {"turns": 2}), ("acme:u1:s2", {"turns": 3})])
        hot, record = parts(store)
        for part in (hot, record):
            assert await part.load_memory_state(KEY) == {"turns": 2}
            assert await part.load_memory_state("acme:u1:s2") == {"turns": 3}
        assert await store.list_memory_keys("s2") == ["acme:u1:s2"]


@pytest.mark.asyncio
async def test_a_read_falls_back_to_the_record_when_the_hot_store_lost_the_entry(
    make_hot: HotFactory, make_store: StoreFactory
) -> None:
    store = await guarded_hybrid(make_hot, make_store)
    async with store:
        await store.save_memory_state(KEY, {"turns": 1})
        hot, _ = parts(store)
        await forget_hot(hot)  # a TTL expired, Redis lost it
        assert await hot.load_memory_state(KEY) is None
        assert await store.load_memory_state(KEY) == {"turns": 1}
        assert await store.list_memory_keys("s1") == [KEY]
        assert await store.load_memory_state("acme:u1:never") is None


@pytest.mark.asyncio
async def test_without_write_through_memory_lives_in_the_hot_store_only(
    make_hot: HotFactory, make_store: StoreFactory
) -> None:
    store = await guarded_hybrid(make_hot, make_store, write_through=False)
    async with store:
        await store.save_memory_state(KEY, {"turns": 1})
        hot, record = parts(store)
        assert await record.load_memory_state(KEY) is None
        await forget_hot(hot)
        assert await store.load_memory_state(KEY) is None


@pytest.mark.asyncio
async def test_both_copies_order_a_replay_by_the_calls_logical_time(
    make_hot: HotFactory, make_store: StoreFactory
) -> None:
    store = await guarded_hybrid(make_hot, make_store)
    async with store:
        await store.save_memory_state(KEY, {"by": "a direct write"})
        # A write replayed from long ago (a held write, a snapshot restored) loses in both copies.
        with logical_times((1,)), replaying(), pytest.raises(WriteSupersededError):
            await store.save_memory_state(KEY, {"by": "an old replay"})
        hot, record = parts(store)
        assert (
            await hot.load_memory_state(KEY)
            == await record.load_memory_state(KEY)
            == {"by": "a direct write"}
        )


@pytest.mark.asyncio
async def test_the_record_is_written_first_so_the_hot_copy_is_never_the_newer(
    record_server: EmbeddedPostgres, make_hot: HotFactory
) -> None:
    """Without a guard a failed record write raises before the hot store is written: the hot copy
    is never newer than the durable one, so a read that falls back never goes back in time."""
    record = await record_store(record_server.dsn)
    hot = await make_hot()
    hybrid = HybridStateStore(hot=hot, record=record, memory_write_through=True)
    try:
        await hybrid.save_memory_state(KEY, {"turns": 1})
        record_server.stop()
        with pytest.raises(ConnectionRefusedError):
            await hybrid.save_memory_state(KEY, {"turns": 2})
        assert await hot.load_memory_state(KEY) == {"turns": 1}
        assert await hybrid.load_memory_state(KEY) == {"turns": 1}
    finally:
        record_server.start()
        await hybrid.aclose()


@pytest.mark.asyncio
async def test_a_read_falls_back_to_the_record_when_the_hot_store_is_down(
    hot_server: RedisServer, make_hot: HotFactory, make_store: StoreFactory
) -> None:
    prefix, schema = new_prefix(), new_schema_name()
    writer = guard(
        HybridStateStore(
            hot=await make_hot(url=hot_server.url, prefix=prefix),
            record=await make_store(schema=schema),
            memory_write_through=True,
        ),
        name="writer",
        registry=CollectorRegistry(),
        spill_path=None,
    )
    async with writer:
        await writer.save_memory_state(KEY, {"turns": 1})
    hot = await make_hot(url=hot_server.url, prefix=prefix, socket_timeout=0.5)
    unguarded = HybridStateStore(
        hot=await make_hot(url=hot_server.url, prefix=prefix, socket_timeout=0.5),
        record=await make_store(schema=schema),
        memory_write_through=True,
    )
    record = await make_store(schema=schema)
    hot_server.pause()  # SIGSTOP: every call to it hangs until its attempt times out
    # Another guard (as another process would): it never saw the state, so nothing stale to serve.
    reader = guard(
        HybridStateStore(hot=hot, record=record, memory_write_through=True),
        name="reader",
        registry=CollectorRegistry(),
        spill_path=None,
        timeout={"attempt": 0.5, "deadline": 1.0},
    )
    async with reader:
        assert await reader.load_memory_state(KEY) == {"turns": 1}
        hot_outcomes = {outcome for (method, outcome) in controller(reader).parts[HOT].stats()}
        assert hot_outcomes & {"timeout", "fallback", "circuit_open"}, controller(reader).parts[HOT].stats()
    # Unguarded, the hot store's failure itself sends the read to the record store.
    assert await unguarded.load_memory_state(KEY) == {"turns": 1}
    hot_server.resume()
