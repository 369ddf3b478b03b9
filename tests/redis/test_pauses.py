"""Planner pauses on Redis: TTL, consume once, a retry with the same key answered again, unanswered
consumes recovered once, tombstones that no replay of an older save revives."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry
from redis import asyncio as redis_asyncio

from guarded.backend import next_logical_time
from guarded.backends.redis import RedisStateStore
from guarded.config import GuardConfig, RetryConfig
from guarded.errors import WriteSupersededError
from guarded.guard import guard
from guarded.logical_time import logical_times, replaying
from guarded.pipeline.idempotency import idempotency_key, unanswered_keys
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

from .conftest import RedisStoreFactory


@pytest.mark.asyncio
async def test_a_retry_with_the_same_key_gets_the_payload_again(store: RedisStateStore) -> None:
    await store.save_planner_state("tok", {"trajectory": {"steps": []}})
    with idempotency_key("call-1"):
        first = await store.load_planner_state("tok")
        retry = await store.load_planner_state("tok")  # the response of `first` was "lost"
    assert first == retry == {"trajectory": {"steps": []}}
    with idempotency_key("call-2"):
        assert await store.load_planner_state("tok") is None
    assert await store.load_planner_state("tok") is None  # no key: nobody can repeat


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
async def test_the_grace_period_ends(make_redis_store: RedisStoreFactory) -> None:
    store = await make_redis_store(consume_grace=0.3)
    await store.save_planner_state("tok", {"x": 1})
    with idempotency_key("call"):
        assert await store.load_planner_state("tok") == {"x": 1}
        await asyncio.sleep(0.45)
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_zero_grace_disables_repeats(make_redis_store: RedisStoreFactory) -> None:
    store = await make_redis_store(consume_grace=0)
    await store.save_planner_state("tok", {"x": 1})
    with idempotency_key("call"):
        assert await store.load_planner_state("tok") == {"x": 1}
        assert await store.load_planner_state("tok") is None


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
    called = next_logical_time() - 4_000_000  # called 4 s ago
    with logical_times((called,)), replaying():
        await store.save_planner_state("tok", {"x": 1})
    assert 4_000 < await raw_redis.pttl(store.keys.pause("tok")) <= 6_100
    with logical_times((called - 10_000_000,)), replaying():
        await store.save_planner_state("late", {"x": 1})  # would have expired: stores nothing
    assert await raw_redis.exists(store.keys.pause("late")) == 0


@pytest.mark.asyncio
async def test_concurrent_consumers_exactly_one_wins(make_redis_store: RedisStoreFactory) -> None:
    writer = await make_redis_store()
    readers = [await make_redis_store() for _ in range(3)]  # separate clients: real concurrency
    for round_number in range(5):
        token = f"tok-{round_number}"
        await writer.save_planner_state(token, {"round": round_number})

        async def consume(reader: RedisStateStore, key: str | None, token: str = token) -> object:
            with idempotency_key(key):
                return await reader.load_planner_state(token)

        results = await asyncio.gather(
            *(consume(readers[index % 3], None if index % 4 == 0 else f"key-{index}") for index in range(12))
        )
        assert [result for result in results if result is not None] == [{"round": round_number}]


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


@pytest.mark.asyncio
async def test_a_resume_whose_answer_was_lost_is_answered_to_the_next_resume(
    make_redis_store: RedisStoreFactory,
) -> None:
    backend = await make_redis_store()
    faulty = FaultyStore(backend, FaultPlan.always(Fault.error_after(ConnectionResetError)))
    config = GuardConfig(retry=RetryConfig(max_attempts=2, critical_max_attempts=2, initial_backoff=0.001))
    store = guard(faulty, registry=CollectorRegistry(), config=config)
    await backend.save_planner_state("tok", {"step": 1})
    assert await store.load_planner_state("tok") is None  # consumed, answer lost twice
    assert await backend.load_planner_state("tok") is None  # consumed for anyone else
    fault_injector(faulty).plan = FaultPlan()
    assert await store.load_planner_state("tok") == {"step": 1}
    assert await store.load_planner_state("tok") is None  # answered once: not again
