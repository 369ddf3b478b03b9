"""The backend tests behind a real PgBouncer in transaction mode.

One PgBouncer per session (:mod:`guarded.testing.pgbouncer`), in front of the session's embedded
server, with PgBouncer's defaults where a client meets them (``pool_mode = transaction``, no
``ignore_startup_parameters``). Here ``pg_dsn`` reaches the server through it and ``make_store``
opens stores with ``pooler="transaction"`` (a test asks for another mode by passing ``pooler``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from guarded.backends.postgres import PostgresStateStore
from guarded.testing.pgbouncer import PgBouncer, pgbouncer
from guarded.testing.postgres import EmbeddedPostgres

from ..conftest import StoreFactory


@pytest.fixture(scope="session")
def pg_bouncer(pg_server: EmbeddedPostgres) -> Iterator[PgBouncer]:
    with pgbouncer(pg_server) as bouncer:
        yield bouncer


@pytest.fixture
def pg_dsn(pg_bouncer: PgBouncer) -> str:
    return pg_bouncer.dsn


@pytest.fixture
def direct_dsn(pg_server: EmbeddedPostgres) -> str:
    """The server itself, not through the pooler (for checks behind the store's back)."""
    return pg_server.dsn


@pytest_asyncio.fixture
async def make_store(make_store: StoreFactory) -> StoreFactory:
    async def make(**options: Any) -> PostgresStateStore:
        options.setdefault("pooler", "transaction")
        return await make_store(**options)

    return make


@pytest_asyncio.fixture
async def raw(direct_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection straight to the server, for checks behind the store's back."""
    conn = await asyncpg.connect(direct_dsn)
    yield conn
    await conn.close()


@pytest.fixture(autouse=True)
def pooler_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes the tests start (workers, the command line) are configured for the pooler too."""
    monkeypatch.setenv("GUARDED_PG_POOLER", "transaction")
