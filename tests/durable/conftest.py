"""Tests that hold for every durable store, run once per store: ``store`` and ``make_durable_store``
are parametrised over PostgreSQL and Redis. The servers and the per-test schema and key prefix
are the PostgreSQL and Redis suites' own fixtures."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio

from tests.postgres.conftest import StoreFactory, make_store, pg_dsn, pg_server, schema_name
from tests.redis.conftest import RedisStoreFactory, key_prefix, make_redis_store, redis_server

DURABLE_STORES = ("postgres", "redis")


@pytest.fixture(params=DURABLE_STORES)
def make_durable_store(
    request: pytest.FixtureRequest, make_store: StoreFactory, make_redis_store: RedisStoreFactory
) -> StoreFactory | RedisStoreFactory:
    """Open stores of the parameter's backend (options every durable store takes:
    ``pause_ttl``, ``consume_grace``)."""
    return make_store if request.param == "postgres" else make_redis_store


@pytest_asyncio.fixture
async def store(make_durable_store: Any) -> Any:
    return await make_durable_store()


__all__ = [
    "key_prefix",
    "make_durable_store",
    "make_redis_store",
    "make_store",
    "pg_dsn",
    "pg_server",
    "redis_server",
    "schema_name",
    "store",
]
