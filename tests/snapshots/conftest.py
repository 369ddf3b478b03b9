"""The PostgreSQL suite's embedded server and per-test schema fixtures, for the round trip through
``PostgresStateStore`` (one server for the session, a fresh schema per test)."""

from __future__ import annotations

from tests.postgres.conftest import make_store, pg_dsn, pg_server, schema_name

__all__ = ["make_store", "pg_dsn", "pg_server", "schema_name"]
