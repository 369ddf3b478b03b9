"""Real Redis for the backend tests: one ``redis-server`` per session, a fresh key prefix per test.

The server is Debian's ``redis-server`` started by :class:`guarded.testing.redis.RedisServer` on a
free loopback port (``appendonly yes``, ``appendfsync always``). Every test gets its own prefix
(``t<hex>``): tests never see each other's keys, exactly as two tenants would not.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from redis import asyncio as redis_asyncio

from guarded.backends.redis import RedisStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.testing.redis import RedisServer
from tests.support.opened_stores import closed_after

RedisStoreFactory = Callable[..., Awaitable[RedisStateStore]]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer.started() as server:
        yield server


def new_prefix() -> str:
    return f"t{uuid.uuid4().hex[:16]}"


@pytest.fixture
def key_prefix() -> str:
    return new_prefix()


@pytest_asyncio.fixture
async def make_redis_store(redis_server: RedisServer, key_prefix: str) -> AsyncIterator[RedisStoreFactory]:
    """Open stores (under the test's prefix unless told otherwise); all are closed after the test."""

    async def connect(**options: Any) -> RedisStateStore:
        options.setdefault("prefix", key_prefix)
        options.setdefault("types", DEFAULT_TYPES)
        url = options.pop("url", redis_server.url)
        return await RedisStateStore.connect(url, **options)

    async with closed_after(connect) as make:
        yield make


@pytest_asyncio.fixture
async def store(make_redis_store: RedisStoreFactory) -> RedisStateStore:
    return await make_redis_store()


@pytest_asyncio.fixture
async def raw_redis(redis_server: RedisServer) -> AsyncIterator[redis_asyncio.Redis]:
    """A plain client of the test server, for checks behind the store's back."""
    client = redis_asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()
