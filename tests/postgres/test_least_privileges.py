"""The PostgreSQL privileges docs/security.md lists are enough to use a migrated schema.

A schema is migrated by its owner (the server's superuser here); then a role that holds only
the grants the security guide lists (CONNECT on the database, USAGE on the schema, SELECT,
INSERT, UPDATE, DELETE on its tables, USAGE on its sequences) opens the store with
``migrate=False`` and passes the whole contract suite and a cleanup. Without the sequence grant
the suite fails, so that line of the list is needed.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.testing import run_contracts
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres.conftest import SMALL_POOL

SECURITY_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "security.md"

pytestmark = pytest.mark.asyncio


def documented_grants(database: str, schema: str, role: str) -> list[str]:
    """The GRANT statements of the security guide, for this database, schema and role."""
    text = SECURITY_GUIDE.read_text(encoding="utf-8")
    statements = re.findall(r"^GRANT [^;]+;", text, flags=re.MULTILINE)
    assert len(statements) == 4, statements
    return [
        statement.replace("DATABASE agents", f'DATABASE "{database}"')
        .replace("SCHEMA agents", f'SCHEMA "{schema}"')
        .replace("agent_app", f'"{role}"')
        for statement in statements
    ]


@pytest_asyncio.fixture
async def migrated_schema_and_app_role(
    pg_server: EmbeddedPostgres,
) -> AsyncIterator[tuple[str, str, str, asyncpg.Connection]]:
    """A schema migrated by its owner, a login role with the documented grants, its DSN."""
    schema = f"priv_{uuid.uuid4().hex[:12]}"
    role = f"app_{uuid.uuid4().hex[:12]}"
    owner = await PostgresStateStore.connect(
        pg_server.dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, pool=SMALL_POOL
    )
    await owner.close()
    admin = await asyncpg.connect(pg_server.dsn)
    database = await admin.fetchval("SELECT current_database()")
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    for statement in documented_grants(database, schema, role):
        await admin.execute(statement)
    try:
        yield schema, role, f"postgresql://{role}@{pg_server.host}:{pg_server.port}/{database}", admin
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.execute(f'REVOKE ALL ON DATABASE "{database}" FROM "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


async def open_as_app(dsn: str, schema: str) -> PostgresStateStore:
    return await PostgresStateStore.connect(
        dsn,
        schema=schema,
        migrate=False,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=SMALL_POOL,
        types=DEFAULT_TYPES,
    )


async def test_the_documented_grants_are_enough_for_the_whole_protocol(
    migrated_schema_and_app_role: tuple[str, str, str, asyncpg.Connection],
) -> None:
    schema, role, dsn, admin = migrated_schema_and_app_role
    assert not await admin.fetchval("SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = $1", role)
    store = await open_as_app(dsn, schema)
    try:
        report = await run_contracts(store)
        assert not report.failed, [(result.name, result.message) for result in report.failed]
        assert not report.errors, [(result.name, result.message) for result in report.errors]
        assert len(report.passed) > 20
        await store.cleanup()
    finally:
        await store.close()


async def test_without_the_sequence_grant_the_protocol_fails(
    migrated_schema_and_app_role: tuple[str, str, str, asyncpg.Connection],
) -> None:
    schema, role, dsn, admin = migrated_schema_and_app_role
    await admin.execute(f'REVOKE USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" FROM "{role}"')
    store = await open_as_app(dsn, schema)
    try:
        report = await run_contracts(store)
        assert report.failed or report.errors, "every contract passed without USAGE on the sequences"
    finally:
        await store.close()
