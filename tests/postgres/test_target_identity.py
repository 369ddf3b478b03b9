"""The target identity a spill file records: host, port, database and schema, never credentials."""

from __future__ import annotations

import pytest

from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.target import target_identity

from .conftest import StoreFactory


def test_a_url_dsn_names_host_port_database_and_schema_without_credentials() -> None:
    found = target_identity("postgresql://alice:s3cret@db.internal:6543/agents?sslmode=require", "tenant_a")
    assert found == "postgresql://db.internal:6543/agents?schema=tenant_a"
    assert "s3cret" not in found
    assert "alice" not in found


def test_a_key_value_dsn_and_the_environment_resolve_as_libpq_does() -> None:
    assert (
        target_identity("host=/run/pg port=5433 dbname=x user=u password=p", "s")
        == "postgresql:///run/pg:5433/x?schema=s"
    )
    environ = {"PGHOST": "h", "PGUSER": "bob"}
    assert target_identity(None, "public", environ) == "postgresql://h:5432/bob?schema=public"
    assert target_identity("postgresql:///", "public", environ) == "postgresql://h:5432/bob?schema=public"


def test_two_schemas_of_one_database_are_two_targets() -> None:
    dsn = "postgresql://h/db"
    assert target_identity(dsn, "a") != target_identity(dsn, "b")


@pytest.mark.asyncio
async def test_connected_and_lazy_stores_on_one_dsn_agree(make_store: StoreFactory, pg_dsn: str) -> None:
    connected = await make_store()
    lazy = PostgresStateStore.lazy(pg_dsn, schema=connected.schema, metrics=False)
    assert connected.target_identity == lazy.target_identity == target_identity(pg_dsn, connected.schema)
    await lazy.close()
