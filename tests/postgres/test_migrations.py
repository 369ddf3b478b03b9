"""Versioned, forward-only migrations: applied once, reported, refused when the database is newer."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from guarded.backends.postgres import (
    PostgresStateStore,
    SchemaNotMigratedError,
    SchemaTooNewError,
)
from guarded.backends.postgres.schema_migrations import (
    advisory_lock_key,
    latest_version,
    load_migrations,
    migrate,
    status,
)
from guarded.backends.postgres.schema_names import TABLES

from .conftest import StoreFactory


def test_migrations_ship_with_the_package() -> None:
    migrations = load_migrations()
    assert [item.version for item in migrations] == list(range(1, latest_version() + 1))
    assert migrations[0].name == "initial"
    assert all(len(item.checksum) == 64 for item in migrations)


def test_advisory_lock_key_is_per_schema_and_stable() -> None:
    assert advisory_lock_key("a") == advisory_lock_key("a")
    assert advisory_lock_key("a") != advisory_lock_key("b")
    assert -(2**63) <= advisory_lock_key("tenant") < 2**63


@pytest.mark.asyncio
async def test_migrate_creates_the_schema_once(raw: asyncpg.Connection, schema_name: str) -> None:
    assert await migrate(raw, schema_name) == list(range(1, latest_version() + 1))
    assert await migrate(raw, schema_name) == []
    state = await status(raw, schema_name)
    assert state.up_to_date
    assert not state.pending
    assert not state.checksum_mismatches
    tables = await raw.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema_name)
    assert {row["tablename"] for row in tables} == {*TABLES, "guarded_migrations"}
    assert f"schema {schema_name}: version {latest_version()}" in str(state)


@pytest.mark.asyncio
async def test_status_of_an_empty_schema(raw: asyncpg.Connection, schema_name: str) -> None:
    state = await status(raw, schema_name)
    assert state.current == 0
    assert len(state.pending) == latest_version()
    assert not state.up_to_date
    assert "pending  0001_initial" in str(state)


@pytest.mark.asyncio
async def test_a_newer_database_is_refused_loudly(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str
) -> None:
    await migrate(raw, schema_name)
    future = latest_version() + 1
    await raw.execute(
        f'INSERT INTO "{schema_name}".guarded_migrations (version, name, checksum) VALUES ($1, $2, $3)',
        future,
        "from_the_future",
        "0" * 64,
    )
    with pytest.raises(SchemaTooNewError, match=rf"version {future}.*upgrade guarded"):
        await make_store()
    with pytest.raises(SchemaTooNewError):
        await make_store(migrate=False)
    with pytest.raises(SchemaTooNewError):
        await migrate(raw, schema_name)
    assert (await status(raw, schema_name)).too_new


@pytest.mark.asyncio
async def test_migrate_false_requires_an_up_to_date_schema(
    make_store: StoreFactory, schema_name: str
) -> None:
    with pytest.raises(SchemaNotMigratedError, match="guarded pg migrate"):
        await make_store(migrate=False)
    await make_store()  # migrates
    store = await make_store(migrate=False)
    assert store.schema_version == latest_version()


@pytest.mark.asyncio
async def test_checksum_mismatch_is_reported(raw: asyncpg.Connection, schema_name: str) -> None:
    await migrate(raw, schema_name)
    await raw.execute(
        f"UPDATE \"{schema_name}\".guarded_migrations SET checksum = 'edited' WHERE version = 1"
    )
    state = await status(raw, schema_name)
    assert state.checksum_mismatches == (1,)
    assert "CHECKSUM MISMATCH" in str(state)
    assert await migrate(raw, schema_name) == []  # reported, never "fixed"


@pytest.mark.asyncio
async def test_store_reports_its_migration_status(store: PostgresStateStore) -> None:
    state = await store.migration_status()
    assert state.up_to_date
    assert store.schema_version == latest_version()


@pytest.mark.asyncio
async def test_migrations_wait_for_the_advisory_lock(
    pg_dsn: str, raw: asyncpg.Connection, schema_name: str
) -> None:
    """While another session holds the schema's lock, migrate() waits instead of racing."""
    import asyncio

    await raw.execute("SELECT pg_advisory_lock($1)", advisory_lock_key(schema_name))
    other = await asyncpg.connect(pg_dsn)
    try:
        pending: Any = asyncio.ensure_future(migrate(other, schema_name))
        await asyncio.sleep(0.3)
        assert not pending.done()
        await raw.execute("SELECT pg_advisory_unlock($1)", advisory_lock_key(schema_name))
        assert await asyncio.wait_for(pending, 10) == list(range(1, latest_version() + 1))
    finally:
        await other.close()
