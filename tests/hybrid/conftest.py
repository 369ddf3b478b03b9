"""Real parts for the hybrid store's tests: the PostgreSQL suite's embedded server (a fresh schema
per test) as the record store, the Redis suite's ``redis-server`` (a fresh key prefix per test) as
the hot store; and a server of each kind of this suite's own, which the outage tests stop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.redis import RedisStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.config import (
    BatchConfig,
    BreakerConfig,
    DeadLetterConfig,
    GuardConfig,
    RetryConfig,
    TimeoutConfig,
)
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres
from guarded.testing.redis import RedisServer
from tests.postgres.conftest import make_store, new_schema_name, pg_dsn, pg_server, schema_name
from tests.redis.conftest import new_prefix, redis_server

HotFactory = Callable[..., Awaitable[Any]]


@pytest_asyncio.fixture
async def make_hot(redis_server: RedisServer) -> AsyncIterator[HotFactory]:
    """Open Redis stores (each under a key prefix of its own, on ``url``: the shared server unless
    told otherwise); all are closed after the test."""
    opened: list[RedisStateStore] = []

    async def make(**options: Any) -> RedisStateStore:
        options.setdefault("prefix", new_prefix())
        options.setdefault("types", DEFAULT_TYPES)
        options.setdefault("socket_timeout", 2.0)
        url = options.pop("url", redis_server.url)
        store = await RedisStateStore.connect(url, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture(scope="session")
def outage_redis() -> Iterator[RedisServer]:
    """A Redis server the outage tests stop or SIGSTOP."""
    with RedisServer.started() as server:
        yield server


@pytest.fixture
def hot_server(outage_redis: RedisServer) -> Iterator[RedisServer]:
    """The outage Redis server, running (and not stopped) after the test whatever happened."""
    yield outage_redis
    outage_redis.resume()
    if not outage_redis.running:
        outage_redis.restart()


@pytest.fixture(scope="session")
def outage_pg() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server the outage tests stop (the shared one stays up for everyone else)."""
    with embedded_postgres() as server:
        yield server


@pytest.fixture
def record_server(outage_pg: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """The outage server, running again after the test whatever happened."""
    yield outage_pg
    if not outage_pg.running:
        outage_pg.start()


FAST_POOL = PoolSettings(min_size=1, max_size=4, connect_timeout=2.0, command_timeout=5.0)
"""A pool that gives up on a stopped server quickly."""


async def record_store(dsn: str, **options: Any) -> PostgresStateStore:
    """A PostgreSQL store on a fresh schema of ``dsn`` (close it after the test)."""
    options.setdefault("registry", CollectorRegistry())
    options.setdefault("stats_interval", None)
    options.setdefault("pool", FAST_POOL)
    options.setdefault("types", DEFAULT_TYPES)
    return await PostgresStateStore.connect(dsn, schema=new_schema_name(), **options)


def outage_config(spill: Path | None) -> GuardConfig:
    """Deadlines short enough that an outage shows within seconds; a breaker that opens after ten
    failed calls and probes again soon; everything held replayed at once."""
    return GuardConfig(
        timeout=TimeoutConfig(attempt=0.5, deadline=1.0, critical_deadline=2.0),
        retry=RetryConfig(initial_backoff=0.01, max_backoff=0.05, jitter=0.01),
        breaker=BreakerConfig(window_size=20, minimum_calls=10, open_duration=0.5),
        batching=BatchConfig(max_delay=0.005),
        dead_letter=DeadLetterConfig(
            path=None if spill is None else str(spill), replay_rate=1_000_000, drain_timeout=30
        ),
    )


__all__ = [
    "hot_server",
    "make_hot",
    "make_store",
    "outage_pg",
    "outage_redis",
    "pg_dsn",
    "pg_server",
    "record_server",
    "redis_server",
    "schema_name",
]


async def forget_hot(hot: Any) -> None:
    """Make the hot store lose everything it holds, behind the hybrid's back (a TTL that expired,
    a Redis restarted without its data)."""
    client = hot.client
    keys = [key async for key in client.scan_iter(match=f"{hot.prefix}:*", count=1000)]
    if keys:
        await client.delete(*keys)
