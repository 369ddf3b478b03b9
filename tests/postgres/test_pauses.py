"""Planner pause state: TTL, and consume-once that is safe to retry with an idempotency key."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backend import current_idempotency_key, next_logical_time
from guarded.backends.postgres import PostgresStateStore
from guarded.config import GuardConfig, RetryConfig
from guarded.errors import WriteSupersededError
from guarded.guard import guard
from guarded.logical_time import logical_times, replaying
from guarded.pipeline.idempotency import idempotency_key
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

from .conftest import StoreFactory


def test_idempotency_key_context() -> None:
    assert current_idempotency_key() is None
    with idempotency_key("outer"):
        assert current_idempotency_key() == "outer"
        with idempotency_key(None):
            assert current_idempotency_key() is None
        assert current_idempotency_key() == "outer"
    assert current_idempotency_key() is None


@pytest.mark.asyncio
async def test_a_retry_with_the_same_key_gets_the_payload_again(store: PostgresStateStore) -> None:
    await store.save_planner_state("tok", {"trajectory": {"steps": []}})
    with idempotency_key("call-1"):
        first = await store.load_planner_state("tok")
        retry = await store.load_planner_state("tok")  # the response of `first` was "lost"
    assert first == retry == {"trajectory": {"steps": []}}
    with idempotency_key("call-2"):
        assert await store.load_planner_state("tok") is None
    assert await store.load_planner_state("tok") is None  # no key: nobody can repeat


@pytest.mark.asyncio
async def test_a_consume_without_key_leaves_a_tombstone_nobody_can_repeat(
    store: PostgresStateStore, raw: asyncpg.Connection
) -> None:
    saved_at = next_logical_time()
    with logical_times((saved_at,)):
        await store.save_planner_state("tok", {"x": 1})
    assert await store.load_planner_state("tok") == {"x": 1}
    with idempotency_key("late"):
        assert await store.load_planner_state("tok") is None
    row = await raw.fetchrow(
        "SELECT consumed_at IS NOT NULL AS consumed, consumer_key, logical_time "
        f'FROM "{store.schema}".planner_pauses'
    )
    assert row is not None
    assert row["consumed"]
    assert row["consumer_key"] is None
    assert row["logical_time"] > saved_at  # the consume's time
    with (
        logical_times((saved_at,)),
        replaying(),
        pytest.raises(WriteSupersededError),
    ):  # a replay of the consumed save: refused
        await store.save_planner_state("tok", {"x": 1})
    assert await store.load_planner_state("tok") is None
    await store.save_planner_state("tok", {"x": 2})  # a new save: the token is paused again
    assert await store.load_planner_state("tok") == {"x": 2}


@pytest.mark.asyncio
async def test_cleanup_keeps_a_tombstone_until_the_ttl_after_its_consume(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    store = await make_store(pause_ttl=1.0, consume_grace=0.01)
    saved_at = next_logical_time()
    with logical_times((saved_at,)):
        await store.save_planner_state("tok", {})
    await asyncio.sleep(0.5)
    with idempotency_key("k"):
        assert await store.load_planner_state("tok") == {}
    await asyncio.sleep(0.7)  # past the save's expiry, not yet the TTL after the consume
    assert (await store.cleanup()).deleted["planner_pauses"] == 0
    # A late replay of a save called before the consume and not yet expired: the tombstone refuses it.
    with logical_times((saved_at + 400_000,)), replaying(), pytest.raises(WriteSupersededError):
        await store.save_planner_state("tok", {})
    assert await store.load_planner_state("tok") is None
    await asyncio.sleep(0.5)
    assert (await store.cleanup()).deleted["planner_pauses"] == 1
    with logical_times((saved_at,)), replaying():
        await store.save_planner_state("tok", {})  # expired since its call: stores nothing
    assert await raw.fetchval(f'SELECT count(*) FROM "{store.schema}".planner_pauses') == 0


@pytest.mark.asyncio
async def test_the_grace_period_ends(make_store: StoreFactory) -> None:
    store = await make_store(consume_grace=0.3)
    await store.save_planner_state("tok", {"x": 1})
    with idempotency_key("call"):
        assert await store.load_planner_state("tok") == {"x": 1}
        await asyncio.sleep(0.45)
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_zero_grace_disables_repeats(make_store: StoreFactory) -> None:
    store = await make_store(consume_grace=0)
    await store.save_planner_state("tok", {"x": 1})
    with idempotency_key("call"):
        assert await store.load_planner_state("tok") == {"x": 1}
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_pauses_expire_after_their_ttl(make_store: StoreFactory, raw: asyncpg.Connection) -> None:
    store = await make_store(pause_ttl=5)
    table = f'"{store.schema}".planner_pauses'
    await store.save_planner_state("expiring", {"x": 1})
    await store.save_planner_state("kept", {"x": 2})
    ttl = await raw.fetchval(f"SELECT extract(epoch FROM expires_at - created_at) FROM {table} LIMIT 1")
    assert float(ttl) == pytest.approx(5, abs=0.01)
    await raw.execute(f"UPDATE {table} SET expires_at = now() - interval '1 millisecond'")  # time passes
    await store.save_planner_state("kept", {"x": 3})  # saving again restarts the TTL
    assert await store.load_planner_state("expiring") is None
    with idempotency_key("k"):
        assert await store.load_planner_state("expiring") is None
    assert await store.load_planner_state("kept") == {"x": 3}


@pytest.mark.asyncio
async def test_default_ttl_is_one_hour(store: PostgresStateStore, raw: asyncpg.Connection) -> None:
    await store.save_planner_state("tok", {})
    seconds = await raw.fetchval(
        f'SELECT extract(epoch FROM expires_at - created_at) FROM "{store.schema}".planner_pauses'
    )
    assert float(seconds) == pytest.approx(3600, abs=1)
    assert await store.load_planner_state("tok") == {}  # a stored {} is returned as saved


@pytest.mark.asyncio
async def test_saving_a_consumed_token_again_makes_it_loadable(store: PostgresStateStore) -> None:
    await store.save_planner_state("tok", {"v": 1})
    with idempotency_key("a"):
        assert await store.load_planner_state("tok") == {"v": 1}
    await store.save_planner_state("tok", {"v": 2})
    with idempotency_key("b"):
        assert await store.load_planner_state("tok") == {"v": 2}
    with idempotency_key("a"):
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_concurrent_consumers_exactly_one_wins(make_store: StoreFactory) -> None:
    writer = await make_store()
    readers = [await make_store() for _ in range(3)]  # separate pools: real concurrency
    for round_number in range(5):
        token = f"tok-{round_number}"
        await writer.save_planner_state(token, {"round": round_number})

        async def consume(reader: PostgresStateStore, key: str | None, token: str = token) -> object:
            with idempotency_key(key):
                return await reader.load_planner_state(token)

        results = await asyncio.gather(
            *(consume(readers[index % 3], None if index % 4 == 0 else f"key-{index}") for index in range(12))
        )
        assert [result for result in results if result is not None] == [{"round": round_number}]


@pytest.mark.asyncio
async def test_a_retry_racing_its_own_first_attempt_gets_the_payload(make_store: StoreFactory) -> None:
    stores = [await make_store() for _ in range(2)]
    for round_number in range(10):
        token = f"race-{round_number}"
        await stores[0].save_planner_state(token, {"round": round_number})
        with idempotency_key(f"call-{round_number}"):
            first, retry = await asyncio.gather(
                stores[0].load_planner_state(token), stores[1].load_planner_state(token)
            )
        assert first == retry == {"round": round_number}


@pytest.mark.asyncio
async def test_cleanup_removes_expired_and_spent_pauses(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    short = await make_store(pause_ttl=0.2, consume_grace=0.2)
    await short.save_planner_state("expired", {})
    await short.save_planner_state("consumed", {})
    with idempotency_key("k"):
        await short.load_planner_state("consumed")
    await asyncio.sleep(0.35)
    await (await make_store()).save_planner_state("live", {})  # default TTL: an hour
    report = await short.cleanup()
    assert report.deleted["planner_pauses"] == 2
    tokens = await raw.fetch(f'SELECT token FROM "{short.schema}".planner_pauses')
    assert [row["token"] for row in tokens] == ["live"]


@pytest.mark.asyncio
async def test_a_resume_whose_answer_was_lost_is_answered_to_the_next_resume(
    make_store: StoreFactory,
) -> None:
    """The database consumed the pause but every attempt's answer was lost: the next resume of the
    token recovers it under its own key (within ``consume_grace``); the unanswered key is never
    reused (tests/postgres/test_consume_once.py)."""
    backend = await make_store()
    faulty = FaultyStore(backend, FaultPlan.always(Fault.error_after(ConnectionResetError)))
    config = GuardConfig(retry=RetryConfig(max_attempts=2, critical_max_attempts=2, initial_backoff=0.001))
    store = guard(faulty, registry=CollectorRegistry(), config=config)
    await backend.save_planner_state("tok", {"step": 1})
    assert await store.load_planner_state("tok") is None  # consumed, answer lost twice
    assert await backend.load_planner_state("tok") is None  # consumed for anyone else

    fault_injector(faulty).plan = FaultPlan()
    assert await store.load_planner_state("tok") == {"step": 1}
    assert await store.load_planner_state("tok") is None  # answered once: not again
