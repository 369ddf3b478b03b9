"""Versioned, forward-only schema migrations.

The SQL files ``sql/NNNN_name.sql`` ship inside the package. ``guarded_migrations`` in
the store's schema records which versions are applied (with a checksum of each file).
:func:`migrate` applies the pending ones in order, each in its own transaction, while holding a
PostgreSQL advisory lock derived from the schema name -- so several workers starting at once do
not race: one applies, the others wait and then find nothing to do. Behind a connection pooler
in transaction mode (``transaction_scoped=True``) nothing may outlive a transaction: each
migration's transaction takes the lock itself (``pg_advisory_xact_lock``) and lifts the timeout
with ``SET LOCAL``, then applies the first migration still pending, if any.

A database whose schema is at a *newer* version than this code knows is refused loudly with
:class:`SchemaTooNewError` (running old code against a newer schema could corrupt data); there
are no down-migrations. Checksum differences of already applied files are reported by
:func:`status` and logged, never "fixed".
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path

from guarded.errors import GuardedError

from .connection import Connection
from .schema_names import MIGRATIONS_TABLE, quote_ident, validate_schema_name

logger = logging.getLogger("guarded.backends.postgres")

_FILE_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")

MIGRATION_TIMEOUT = 3600.0
"""Client-side limit (seconds) for waiting on the migration lock and for each migration."""


class MigrationError(GuardedError, RuntimeError):
    """The schema cannot be brought to the version this code needs."""


class SchemaTooNewError(MigrationError):
    """The database schema is at a newer version than this code knows: upgrade guarded."""


class SchemaNotMigratedError(MigrationError):
    """The schema lacks migrations and the store was told not to apply them."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file: its version, name, text and SHA-256."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class AppliedMigration:
    version: int
    name: str
    checksum: str
    applied_at: datetime


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    """Where a schema stands: current and latest versions, what is pending, what differs."""

    schema: str
    current: int
    latest: int
    applied: tuple[AppliedMigration, ...]
    pending: tuple[Migration, ...]
    checksum_mismatches: tuple[int, ...]

    @property
    def up_to_date(self) -> bool:
        return self.current == self.latest

    @property
    def too_new(self) -> bool:
        return self.current > self.latest

    def __str__(self) -> str:
        lines = [f"schema {self.schema}: version {self.current}, code knows {self.latest}"]
        for item in self.applied:
            flag = "  CHECKSUM MISMATCH" if item.version in self.checksum_mismatches else ""
            lines.append(f"  applied  {item.version:04d}_{item.name}  {item.applied_at.isoformat()}{flag}")
        for migration in self.pending:
            lines.append(f"  pending  {migration.version:04d}_{migration.name}")
        if self.too_new:
            lines.append("  ERROR: the database is newer than this code; upgrade guarded")
        return "\n".join(lines)


def _migration_files() -> list[tuple[str, str]]:
    try:
        root = resources.files(__package__ or "guarded.backends.postgres") / "sql"
        return [
            (entry.name, entry.read_text("utf-8")) for entry in root.iterdir() if entry.name.endswith(".sql")
        ]
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):  # pragma: no cover - odd installs
        directory = Path(__file__).with_name("sql")
        return [(path.name, path.read_text("utf-8")) for path in directory.glob("*.sql")]


@cache
def load_migrations() -> tuple[Migration, ...]:
    """Every migration shipped with the package, in version order (1, 2, ... without gaps)."""
    migrations = []
    for file_name, sql in _migration_files():
        match = _FILE_NAME.fullmatch(file_name)
        if match is None:
            raise MigrationError(f"migration file {file_name!r} is not named NNNN_name.sql")
        migrations.append(Migration(int(match.group(1)), match.group(2), sql))
    migrations.sort(key=lambda item: item.version)
    versions = [item.version for item in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migration versions must be 1..N without gaps, found {versions}")
    return tuple(migrations)


def latest_version() -> int:
    """The newest schema version this code knows."""
    return len(load_migrations())


def advisory_lock_key(schema: str) -> int:
    """The signed 64-bit advisory lock key that serialises migrations of ``schema``."""
    digest = hashlib.sha256(f"guarded.migrations:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def _table_exists(conn: Connection, schema: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = $2)",
            schema,
            MIGRATIONS_TABLE,
        )
    )


async def _applied(conn: Connection, schema: str) -> list[AppliedMigration]:
    if not await _table_exists(conn, schema):
        return []
    rows = await conn.fetch(
        f"SELECT version, name, checksum, applied_at FROM {quote_ident(schema)}.{MIGRATIONS_TABLE} "
        "ORDER BY version"
    )
    return [AppliedMigration(row["version"], row["name"], row["checksum"], row["applied_at"]) for row in rows]


def _too_new(schema: str, current: int, latest: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"schema {schema!r} is at migration version {current}, but this version of guarded only knows "
        f"versions up to {latest}. A newer guarded has migrated this database; upgrade guarded "
        "(migrations are forward-only, there is no downgrade)."
    )


async def status(conn: Connection, schema: str) -> MigrationStatus:
    """Where ``schema`` stands relative to the migrations shipped with this code."""
    validate_schema_name(schema)
    migrations = load_migrations()
    applied = await _applied(conn, schema)
    by_version = {item.version: item for item in migrations}
    current = max((item.version for item in applied), default=0)
    mismatches = tuple(
        item.version
        for item in applied
        if item.version in by_version and by_version[item.version].checksum != item.checksum
    )
    done = {item.version for item in applied}
    return MigrationStatus(
        schema=schema,
        current=current,
        latest=len(migrations),
        applied=tuple(applied),
        pending=tuple(item for item in migrations if item.version not in done),
        checksum_mismatches=mismatches,
    )


async def migrate(conn: Connection, schema: str, *, transaction_scoped: bool = False) -> list[int]:
    """Apply the pending migrations of ``schema`` (creating it when needed); return the versions applied.

    Safe to call from many processes at once. Raises :class:`SchemaTooNewError` when the
    database is newer than this code. ``transaction_scoped``: keep the lock and the lifted timeout
    inside each migration's transaction (behind a connection pooler in transaction mode).
    """
    validate_schema_name(schema)
    latest = latest_version()
    # Fast path without the lock: nothing to do in the common case of an up-to-date schema.
    current = max((item.version for item in await _applied(conn, schema)), default=0)
    if current > latest:
        raise _too_new(schema, current, latest)
    if current == latest:
        return []
    key = advisory_lock_key(schema)
    if transaction_scoped:
        return await _migrate_transaction_scoped(conn, schema, latest, key)
    # Waiting for another worker's migration, or running a long one, must not trip the pool's
    # statement_timeout / command_timeout: both are lifted for this session while it migrates.
    await conn.execute("SET statement_timeout = 0")
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", key, timeout=MIGRATION_TIMEOUT)
        try:
            return await _migrate_locked(conn, schema, latest)
        finally:
            if not conn.is_closed():
                await conn.execute("SELECT pg_advisory_unlock($1)", key)
    finally:
        if not conn.is_closed():
            await conn.execute("RESET statement_timeout")


async def _migrate_transaction_scoped(conn: Connection, schema: str, latest: int, key: int) -> list[int]:
    applied: list[int] = []
    while True:
        async with conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 0")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", key, timeout=MIGRATION_TIMEOUT)
            current = await _prepare_locked(conn, schema, latest, warn=not applied)
            if not current.pending:
                return applied
            migration = current.pending[0]
            await _apply(conn, schema, migration)
        applied.append(migration.version)
        _log_applied(schema, migration.version)


async def _migrate_locked(conn: Connection, schema: str, latest: int) -> list[int]:
    current = await _prepare_locked(conn, schema, latest, warn=True)
    applied: list[int] = []
    for migration in current.pending:
        async with conn.transaction():
            await _apply(conn, schema, migration)
        applied.append(migration.version)
        _log_applied(schema, migration.version)
    return applied


async def _prepare_locked(conn: Connection, schema: str, latest: int, *, warn: bool) -> MigrationStatus:
    """Under the lock: the schema and its migrations table exist; where the schema stands."""
    quoted = quote_ident(schema)
    exists = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", schema
    )
    if not exists:
        await conn.execute(f"CREATE SCHEMA {quoted}")
    await conn.execute(
        f"""CREATE TABLE IF NOT EXISTS {quoted}.{MIGRATIONS_TABLE} (
            version     integer PRIMARY KEY,
            name        text NOT NULL,
            checksum    text NOT NULL,
            applied_at  timestamptz NOT NULL DEFAULT now()
        )"""
    )
    current = await status(conn, schema)
    if current.too_new:
        raise _too_new(schema, current.current, latest)
    for version in current.checksum_mismatches if warn else ():
        logger.warning(
            "guarded_migration_checksum_mismatch",
            extra={"event": "guarded_migration_checksum_mismatch", "schema": schema, "version": version},
        )
    return current


async def _apply(conn: Connection, schema: str, migration: Migration) -> None:
    """Run ``migration`` and record it (inside the caller's transaction)."""
    quoted = quote_ident(schema)
    await conn.execute(f"SET LOCAL search_path TO {quoted}, pg_catalog")
    try:
        await conn.execute(migration.sql, timeout=MIGRATION_TIMEOUT)
    except Exception as exc:
        raise MigrationError(
            f"migration {migration.version:04d}_{migration.name} failed on schema {schema!r}: {exc}"
        ) from exc
    await conn.execute(
        f"INSERT INTO {quoted}.{MIGRATIONS_TABLE} (version, name, checksum) VALUES ($1, $2, $3)",
        migration.version,
        migration.name,
        migration.checksum,
    )


def _log_applied(schema: str, version: int) -> None:
    logger.info(
        "guarded_migration_applied",
        extra={"event": "guarded_migration_applied", "schema": schema, "version": version},
    )


async def require_current(conn: Connection, schema: str) -> int:
    """The schema's version when it matches this code; raise otherwise (for ``migrate=False`` stores)."""
    state = await status(conn, schema)
    if state.too_new:
        raise _too_new(schema, state.current, state.latest)
    if not state.up_to_date:
        raise SchemaNotMigratedError(
            f"schema {schema!r} is at migration version {state.current}, this code needs {state.latest}; "
            f"run `guarded pg migrate --schema {schema}` or connect with migrate=True"
        )
    return state.current


__all__ = [
    "MIGRATION_TIMEOUT",
    "AppliedMigration",
    "Migration",
    "MigrationError",
    "MigrationStatus",
    "SchemaNotMigratedError",
    "SchemaTooNewError",
    "advisory_lock_key",
    "latest_version",
    "load_migrations",
    "migrate",
    "require_current",
    "status",
]
