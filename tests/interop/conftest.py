"""The real ``penguiflow`` package against ``guard(PostgresStateStore)`` on a real PostgreSQL.

The embedded server and per-test schema fixtures are the PostgreSQL suite's own (one server for
this directory, a fresh schema per test); the Redis server and per-test key prefix the Redis
suite's.
"""

from __future__ import annotations

from tests.hybrid.conftest import make_hot
from tests.postgres.conftest import make_store, pg_dsn, pg_server, raw, schema_name, store
from tests.redis.conftest import key_prefix, make_redis_store, redis_server

__all__ = [
    "key_prefix",
    "make_hot",
    "make_redis_store",
    "make_store",
    "pg_dsn",
    "pg_server",
    "raw",
    "redis_server",
    "schema_name",
    "store",
]
