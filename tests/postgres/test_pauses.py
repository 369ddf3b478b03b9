"""Planner pause state: TTL, and consume-once that is safe to retry with an idempotency key."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from guarded.backend import current_idempotency_key, next_logical_time
from guarded.backends.postgres import PostgresStateStore
from guarded.errors import WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.pipeline.idempotency import idempotency_key

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
