"""Schema (tenant) names: validated once, then quoted; never interpolated unchecked.

A store's tables live in one PostgreSQL schema; ``schema=`` is the tenancy boundary (a store
on schema A never reads or writes schema B). Table names are a fixed set known to this
package; the schema name is the only identifier that comes from configuration, so it is
checked against a strict pattern *and* quoted wherever it appears in SQL.
"""

from __future__ import annotations

import re

from guarded.errors import GuardedError

SCHEMA_NAME_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""Lower-case letters, digits and underscores, starting with a letter or underscore, at most
63 characters (PostgreSQL's identifier limit). Lower case keeps the name identical whether or
not a human quotes it in ``psql``."""

RESERVED_PREFIXES = ("pg_",)
RESERVED_NAMES = frozenset({"information_schema"})

TABLES: tuple[str, ...] = (
    "flow_events",
    "remote_bindings",
    "planner_pauses",
    "memory_states",
    "task_states",
    "state_updates",
    "steering_events",
    "trajectories",
    "session_traces",
    "planner_events",
    "artifacts",
    "snapshots",
    "snapshot_lines",
    "snapshot_blobs",
    "snapshot_blob_chunks",
    "snapshot_blob_refs",
)
"""Every data table of a store's schema (the migrations table aside)."""

MIGRATIONS_TABLE = "guarded_migrations"
SEQUENCE = "guarded_seq"
"""The schema's sequence that orders "saved" events across upsert tables."""


class InvalidSchemaNameError(GuardedError, ValueError):
    """A schema name that does not match :data:`SCHEMA_NAME_PATTERN` or is reserved."""


def validate_schema_name(name: str) -> str:
    """Return ``name`` when it is an acceptable schema name, else raise :class:`InvalidSchemaNameError`."""
    if not isinstance(name, str) or not SCHEMA_NAME_PATTERN.fullmatch(name):
        raise InvalidSchemaNameError(
            f"invalid schema name {name!r}: use 1-63 lower-case letters, digits or underscores, "
            "starting with a letter or underscore"
        )
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
        raise InvalidSchemaNameError(f"schema name {name!r} is reserved by PostgreSQL")
    return name


def quote_ident(name: str) -> str:
    """Double-quote an identifier (doubling embedded quotes), as PostgreSQL's ``quote_ident``."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    """``"schema"."table"`` for a validated schema and one of this package's tables."""
    if table not in TABLES and table != MIGRATIONS_TABLE:
        raise ValueError(f"unknown table {table!r}")
    return f"{quote_ident(validate_schema_name(schema))}.{quote_ident(table)}"


def next_seq(schema: str) -> str:
    """SQL for the next value of the schema's :data:`SEQUENCE`."""
    return f"nextval('{quote_ident(validate_schema_name(schema))}.{SEQUENCE}')"


__all__ = [
    "MIGRATIONS_TABLE",
    "RESERVED_NAMES",
    "RESERVED_PREFIXES",
    "SCHEMA_NAME_PATTERN",
    "SEQUENCE",
    "TABLES",
    "InvalidSchemaNameError",
    "next_seq",
    "qualified",
    "quote_ident",
    "validate_schema_name",
]
