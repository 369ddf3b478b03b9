"""The command-line tests: the PostgreSQL suite's embedded server and per-test schema fixtures."""

from __future__ import annotations

from tests.postgres.conftest import pg_dsn, pg_server, raw, schema_name

__all__ = ["pg_dsn", "pg_server", "raw", "schema_name"]
