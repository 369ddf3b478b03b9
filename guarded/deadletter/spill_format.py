"""The layout of a dead-letter spill file: its tables, the columns read and written, and the SQL
fragments the reads share. Version history: see :mod:`.spill`."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 3
"""Version of the file layout this code writes; files of a newer version are refused."""
APPLICATION_ID = 0x67444C51
"""SQLite ``application_id`` of a guarded dead-letter file ("gDLQ")."""

SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE pending (
        seq INTEGER PRIMARY KEY,
        method TEXT NOT NULL,
        call TEXT NOT NULL,
        key TEXT,
        scope TEXT,
        stamp INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        enqueued_at REAL NOT NULL,
        size INTEGER NOT NULL,
        error TEXT NOT NULL
    )""",
    "CREATE INDEX pending_by_key ON pending (method, key) WHERE key IS NOT NULL",
    "CREATE INDEX pending_by_scope ON pending (method, scope) WHERE scope IS NOT NULL",
    """CREATE TABLE parked (
        seq INTEGER PRIMARY KEY,
        method TEXT NOT NULL,
        call TEXT,
        reason TEXT NOT NULL,
        parked_at REAL NOT NULL,
        size INTEGER NOT NULL,
        key TEXT,
        scope TEXT
    )""",
)

QUARANTINE_TABLE = """CREATE TABLE IF NOT EXISTS quarantine (
    qid INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    quarantined_at REAL NOT NULL,
    seq, method, call, key, scope, stamp, generation, at, size, detail
)"""
"""Rows moved aside because they cannot be read: ``source`` is the table they were in, the columns
after ``quarantined_at`` (declared without a type, so SQLite stores each value exactly as it was)
are the row's own; ``at`` is its ``enqueued_at`` or ``parked_at``, ``detail`` its ``error`` or
parking ``reason``. Added by layout 3."""
RAW_COLUMNS = ("seq", "method", "call", "key", "scope", "stamp", "generation", "at", "size", "detail")
SOURCE_COLUMNS = {
    "pending": "seq, method, call, key, scope, stamp, generation, enqueued_at, size, error",
    "parked": "seq, method, call, key, scope, NULL, NULL, parked_at, size, reason",
}

PENDING_COLUMNS = "seq, method, call, key, scope, stamp, generation, enqueued_at, size, error"
PARKED_COLUMNS = "seq, method, call, reason, parked_at, size, key, scope"
META_COLUMNS = "seq, method, key, scope, stamp, generation, size, enqueued_at"
INDEX_COLUMNS = (
    f"{META_COLUMNS}, typeof(error), CASE WHEN typeof(call) != 'text' THEN typeof(call) "
    "WHEN NOT json_valid(call) THEN 'not json' WHEN substr(ltrim(call), 1, 1) != '{' THEN 'not object' "
    "ELSE 'ok' END, CASE WHEN typeof(key) != 'text' THEN 'ok' WHEN NOT json_valid(key) THEN 'not json' "
    "WHEN json_type(key) NOT IN ('text', 'array') THEN 'not key' ELSE 'ok' END"
)
"""What the index needs of a waiting entry, and whether its other columns look readable: the type
of ``error``, whether ``call`` is a JSON object and ``key`` JSON text or a list (checked by SQLite,
without bringing the call here)."""
INDEX_COLUMNS_PLAIN = f"{META_COLUMNS}, typeof(error), 'ok', NULL"
""":data:`INDEX_COLUMNS` without SQLite's look at ``call`` and ``key`` (SQLite without JSON
functions; deletions): the key is then parsed here."""
SOURCE_NAMES = {
    "pending": (
        "seq",
        "method",
        "call",
        "key",
        "scope",
        "stamp",
        "generation",
        "enqueued_at",
        "size",
        "error",
    ),
    "parked": ("seq", "method", "call", "key", "scope", "NULL", "NULL", "parked_at", "size", "reason"),
}
SIZE_SUM = "coalesce(sum(CASE WHEN typeof(size) = 'integer' THEN size ELSE 0 END), 0)"
NUMERIC_AT = "typeof(enqueued_at) IN ('integer', 'real')"
CHUNK = 500


def has_json(db: sqlite3.Connection) -> bool:
    """Whether SQLite has its JSON functions (built in since 3.38)."""
    try:
        db.execute("SELECT json_valid('{}')").fetchone()
    except sqlite3.Error:
        return False
    return True


__all__ = [
    "APPLICATION_ID",
    "CHUNK",
    "INDEX_COLUMNS",
    "INDEX_COLUMNS_PLAIN",
    "META_COLUMNS",
    "NUMERIC_AT",
    "PARKED_COLUMNS",
    "PENDING_COLUMNS",
    "QUARANTINE_TABLE",
    "RAW_COLUMNS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SIZE_SUM",
    "SOURCE_COLUMNS",
    "SOURCE_NAMES",
    "has_json",
]
