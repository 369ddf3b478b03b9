"""The identity of the database a store writes to, without credentials.

A dead-letter spill file records it, so held writes are only ever replayed into the database and
schema they were written for (docs/durability.md "One target per file"). It is worked out from the
DSN and the standard ``PG*`` environment variables the way libpq resolves them, so every process
configured alike agrees on it without a connection.
"""

from __future__ import annotations

import getpass
import os
import shlex
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

_DEFAULT_PORT = "5432"


def _key_value(dsn: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for word in shlex.split(dsn):
        name, sep, value = word.partition("=")
        if sep:
            found[name.strip()] = value.strip()
    return found


def _from_url(dsn: str) -> dict[str, str]:
    parts = urlsplit(dsn)
    found: dict[str, str] = {}
    if parts.hostname:
        found["host"] = parts.hostname
    try:
        if parts.port is not None:
            found["port"] = str(parts.port)
    except ValueError:
        pass
    if parts.username:
        found["user"] = unquote(parts.username)
    database = unquote(parts.path.lstrip("/"))
    if database:
        found["dbname"] = database
    for pair in parts.query.split("&"):
        name, sep, value = pair.partition("=")
        if sep and name in ("host", "port", "dbname", "user") and name not in found:
            found[name] = unquote(value)
    return found


def target_identity(dsn: str | None, schema: str, environ: Mapping[str, str] = os.environ) -> str:
    """``postgresql://HOST:PORT/DATABASE?schema=SCHEMA`` for ``dsn`` (``None``: the ``PG*``
    variables), as libpq resolves it; never a user's password."""
    given: dict[str, str] = {}
    if dsn:
        given = _from_url(dsn) if "://" in dsn else _key_value(dsn)
    host = given.get("host") or environ.get("PGHOST") or "localhost"
    port = given.get("port") or environ.get("PGPORT") or _DEFAULT_PORT
    user = given.get("user") or environ.get("PGUSER") or _os_user()
    database = given.get("dbname") or given.get("database") or environ.get("PGDATABASE") or user
    return f"postgresql://{host}:{port}/{database}?schema={schema}"


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "postgres"


__all__ = ["target_identity"]
