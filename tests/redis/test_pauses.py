"""Planner pauses on Redis: TTL, consume once, a retry with the same key answered again, unanswered
consumes recovered once, tombstones that no replay of an older save revives."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import asyncio as redis_asyncio

from guarded.backend import next_logical_time
from guarded.backends.redis import RedisStateStore
from guarded.errors import WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.pipeline.idempotency import idempotency_key, unanswered_keys

from .conftest import RedisStoreFactory


@pytest.mark.asyncio
async def test_a_consume_leaves_a_tombstone_no_replay_of_an_older_save_revives(
    store: RedisStateStore, raw_redis: redis_asyncio.Redis
) -> None:
    saved_at = next_logical_time()
    with logical_times((saved_at,)):
        await store.save_planner_state("tok", {"x": 1})
    assert await store.load_planner_state("tok") == {"x": 1}
    with idempotency_key("late"):
        assert await store.load_planner_state("tok") is None
    record = await raw_redis.hgetall(store.keys.pause("tok"))
    assert record[b"consumed"] == b"1"
    assert int(record[b"lt"]) > saved_at  # the consume's time
    assert 0 < await raw_redis.pttl(store.keys.pause("tok")) <= 3_600_000  # kept for the pause TTL
    with logical_times((saved_at,)), replaying(), pytest.raises(WriteSupersededError):
        await store.save_planner_state("tok", {"x": 1})  # a replay of the consumed save: refused
    assert await store.load_planner_state("tok") is None
    await store.save_planner_state("tok", {"x": 2})  # a new save: the token is paused again
    assert await store.load_planner_state("tok") == {"x": 2}


@pytest.mark.asyncio
async def test_a_held_consume_takes_only_the_save_it_was_for(store: RedisStateStore) -> None:
    older = next_logical_time()
    await store.save_planner_state("tok", {"v": "newer"})
    with logical_times((older,)):  # the guard's replay of a consume held for an older save
        assert await store.load_planner_state("tok") is None
    assert await store.load_planner_state("tok") == {"v": "newer"}
    with logical_times((next_logical_time(),)):  # a held consume of a token never saved
        assert await store.load_planner_state("gone") is None
    with logical_times((older,)), replaying(), pytest.raises(WriteSupersededError):
        await store.save_planner_state("gone", {"v": "revived"})  # its tombstone refuses the replay
    assert await store.load_planner_state("gone") is None


@pytest.mark.asyncio
async def test_pauses_expire_after_their_ttl(
    make_redis_store: RedisStoreFactory, raw_redis: redis_asyncio.Redis
) -> None:
    store = await make_redis_store(pause_ttl=0.3)
    await store.save_planner_state("expiring", {"x": 1})
    assert 0 < await raw_redis.pttl(store.keys.pause("expiring")) <= 300
    await asyncio.sleep(0.5)
    assert await store.load_planner_state("expiring") is None
    assert await raw_redis.exists(store.keys.pause("expiring")) == 0


@pytest.mark.asyncio
async def test_a_replayed_save_keeps_only_the_ttl_left_since_its_call(
    make_redis_store: RedisStoreFactory, raw_redis: redis_asyncio.Redis
) -> None:
    store = await make_redis_store(pause_ttl=10)
    called = time.time_ns() // 1000 - 4_000_000  # called 4 s ago by the wall clock
    with logical_times((called,)), replaying():
        await store.save_planner_state("tok", {"x": 1})
    assert 4_000 < await raw_redis.pttl(store.keys.pause("tok")) <= 6_100
    with logical_times((called - 10_000_000,)), replaying():
        await store.save_planner_state("late", {"x": 1})  # would have expired: stores nothing
    assert await raw_redis.exists(store.keys.pause("late")) == 0


@pytest.mark.asyncio
async def test_a_recovering_consume_takes_the_pause_from_an_unanswered_key(store: RedisStateStore) -> None:
    await store.save_planner_state("tok", {"step": 1})
    with idempotency_key("lost"):
        assert await store.load_planner_state("tok") == {"step": 1}  # its answer never arrived
    with idempotency_key("next"), unanswered_keys(("lost",)):
        assert await store.load_planner_state("tok") == {"step": 1}
    with idempotency_key("lost"):
        assert await store.load_planner_state("tok") is None  # moved to "next"
    with idempotency_key("next"):
        assert await store.load_planner_state("tok") == {"step": 1}  # its own retry
    with idempotency_key("third"), unanswered_keys(("lost",)):
        assert await store.load_planner_state("tok") is None
