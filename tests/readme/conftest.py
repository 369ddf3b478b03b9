"""The README tests: the PostgreSQL suite's embedded server."""

from __future__ import annotations

from tests.postgres.conftest import pg_server

__all__ = ["pg_server"]
