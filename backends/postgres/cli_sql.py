"""``guarded pg migrate --sql``: the migrations as one SQL script, printed instead of run.

The backend's migrations are plain SQL files applied by :mod:`.migrations` (no alembic): each in
its own transaction with ``search_path`` set to the store's schema, recorded in
``guarded_migrations`` with its checksum, all under the schema's advisory lock. The script does
exactly that, so a DBA can review it and apply it through their own change process
(``psql -v ON_ERROR_STOP=1 -f migrate.sql``); ``guarded pg status`` then reads the result like any
other migrated schema. Like alembic's offline ``upgrade --sql``, it can be produced without a
database (``--from VERSION``). With ``GUARDED_PG_POOLER=transaction`` the script holds no session
state, so it can be applied through a connection pooler in transaction mode: each transaction takes
the lock itself (``pg_advisory_xact_lock``) instead of one session lock around the whole script.
"""

from __future__ import annotations

from collections.abc import Sequence

from guarded import __version__

from .schema_migrations import Migration, advisory_lock_key, latest_version, load_migrations
from .schema_names import MIGRATIONS_TABLE, quote_ident, validate_schema_name


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def migrations_after(version: int) -> tuple[Migration, ...]:
    """The migrations this code ships after ``version`` (0: all of them)."""
    return tuple(item for item in load_migrations() if item.version > version)


def migration_script(
    schema: str, pending: Sequence[Migration], *, from_version: int, transaction_scoped: bool = False
) -> str:
    """The SQL that brings ``schema`` from ``from_version`` to the latest version by applying
    ``pending`` in order, as :func:`.migrations.migrate` would (empty statements when none);
    ``transaction_scoped``: under a transaction-scoped lock in each transaction (for a pooler)."""
    validate_schema_name(schema)
    quoted = quote_ident(schema)
    key = advisory_lock_key(schema)
    names = ", ".join(f"{item.version:04d}_{item.name}" for item in pending) or "none"
    lines = [
        f"-- guarded {__version__}: migrations of schema {schema} from version {from_version} "
        f"to {latest_version()}",
        f"-- pending: {names}",
        "-- Printed by `guarded pg migrate --sql`; nothing was run. Apply with:",
        "--   psql -v ON_ERROR_STOP=1 -f THIS_FILE",
        "-- Each migration is its own transaction; the advisory lock keeps workers that migrate on",
        "-- connect from applying the same migration at the same time.",
        "",
    ]
    if not pending:
        lines.append("-- the schema is up to date: nothing to apply")
        return "\n".join(lines) + "\n"
    # Behind a transaction pooler a session lock would stay on whichever server connection took it.
    locked = [f"SELECT pg_advisory_xact_lock({key});"] if transaction_scoped else []
    lines += [
        *(["BEGIN;", *locked] if transaction_scoped else [f"SELECT pg_advisory_lock({key});"]),
        f"CREATE SCHEMA IF NOT EXISTS {quoted};",
        f"""CREATE TABLE IF NOT EXISTS {quoted}.{MIGRATIONS_TABLE} (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);""",
        *(["COMMIT;"] if transaction_scoped else []),
    ]
    for migration in pending:
        body = migration.sql.rstrip()
        lines += [
            "",
            f"-- {migration.version:04d}_{migration.name}.sql (sha256 {migration.checksum})",
            "BEGIN;",
            *locked,
            f"SET LOCAL search_path TO {quoted}, pg_catalog;",
            body if body.endswith(";") else body + "\n;",
            f"INSERT INTO {quoted}.{MIGRATIONS_TABLE} (version, name, checksum) VALUES "
            f"({migration.version}, {_literal(migration.name)}, {_literal(migration.checksum)});",
            "COMMIT;",
        ]
    if not transaction_scoped:
        lines += ["", f"SELECT pg_advisory_unlock({key});"]
    return "\n".join(lines) + "\n"


__all__ = ["migration_script", "migrations_after"]
