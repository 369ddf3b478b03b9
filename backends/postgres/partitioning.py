"""Time-partitioned history: which tables, by what, and the partitions' upkeep.

The append-only tables can be range-partitioned by a time that is part of the write itself, so a
retried or replayed write always routes to the partition of its first write and meets its unique
key there:

================  ===============  ==================================================================
table             partition key    unique key (the write's identity, extended by the partition key)
================  ===============  ==================================================================
flow_events       ``ts``           ``(trace_id, event_fp, ts)``: ``event_fp`` already hashes ``ts``
state_updates     ``created_at``   ``(session_id, update_id, created_at)``: the update's own
                                   ``created_at`` (``StateUpdate.created_at``), stored by every save
steering_events   ``created_at``   ``(session_id, event_id, created_at)``: ``SteeringEvent.created_at``
planner_events    ``ts``           ``(trace_id, call_key, ts) WHERE call_key IS NOT NULL``
================  ===============  ==================================================================

Partitions are named ``<table>_p<YYYYMMDD>`` (their first day, UTC) and span one period (daily,
weekly from Monday, or monthly); ``<table>_default`` (the DEFAULT partition) takes any row no
range partition covers, so a write never fails for lack of a partition; ``<table>_legacy`` is a
converted table's old heap (everything before the conversion's cut-over, see
:mod:`.partition_conversion`). :func:`ensure_partitions` creates the partitions ahead of time
(moving any rows of their range out of the default partition); :func:`drop_partition` drops one
whole partition (retention, :mod:`.retention`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from guarded.errors import GuardedError

from .connection import Connection
from .schema_names import quote_ident, validate_schema_name

PERIODS = ("daily", "weekly", "monthly")
"""The partition periods a store takes (``partitioning=`` / ``GUARDED_PG_PARTITIONING``)."""

AHEAD_SECONDS = 7 * 86400.0
"""Maintenance keeps partitions created at least this far ahead of now (and one period at least)."""

LOCK_TIMEOUT = "5s"
"""``lock_timeout`` of maintenance and retention DDL: a partition created or dropped waits at most
this long for a lock (behind a long query), and never holds writers queued behind it longer; a
step that times out is retried on the next run."""


class PartitioningError(GuardedError, RuntimeError):
    """The schema's partitioning does not allow what was asked (names the command to run)."""


@dataclass(frozen=True, slots=True)
class PartitionedTable:
    """How one append-only table is partitioned."""

    name: str
    key: str
    """The partition key column (a time carried by the write)."""
    key_is_timestamp: bool
    """``timestamptz`` key (else ``double precision`` Unix seconds)."""
    unique_columns: str
    """Columns of the unique index that makes writes idempotent, including the partition key."""
    unique_where: str
    """Predicate of that unique index (``""``: none)."""
    indexes: tuple[tuple[str, str], ...]
    """The table's other indexes: (name suffix, ``[USING method] (columns)``), as migration 0001."""

    def literal(self, seconds: float) -> str:
        """SQL constant of the partition key at ``seconds`` since the Unix epoch."""
        if self.key_is_timestamp:
            moment = datetime.fromtimestamp(seconds, UTC)
            return f"'{moment.isoformat(sep=' ')}'::timestamptz"
        return f"'{seconds!r}'::float8"


PARTITIONED_TABLES: tuple[PartitionedTable, ...] = (
    PartitionedTable(
        "flow_events",
        "ts",
        False,
        "trace_id, event_fp, ts",
        "",
        (("history", "(trace_id, ts, id)"), ("created_brin", "USING brin (created_at)")),
    ),
    PartitionedTable(
        "state_updates",
        "created_at",
        True,
        "session_id, update_id, created_at",
        "",
        (
            ("cursor", "(session_id, id)"),
            ("task", "(session_id, task_id, id)"),
            ("created_brin", "USING brin (created_at)"),
        ),
    ),
    PartitionedTable(
        "steering_events",
        "created_at",
        True,
        "session_id, event_id, created_at",
        "",
        (
            ("cursor", "(session_id, id)"),
            ("task", "(session_id, task_id, id)"),
            ("created_brin", "USING brin (created_at)"),
        ),
    ),
    PartitionedTable(
        "planner_events",
        "ts",
        False,
        "trace_id, call_key, ts",
        "call_key IS NOT NULL",
        (("trace", "(trace_id, id)"), ("created_brin", "USING brin (created_at)")),
    ),
)
"""The tables that can be partitioned, in the order maintenance and conversion handle them."""


def check_period(period: str, setting: str = "partitioning") -> str:
    """``period`` when it is one of :data:`PERIODS`, else a ``ValueError`` naming ``setting``."""
    if period not in PERIODS:
        raise ValueError(f"{setting} must be one of {', '.join(PERIODS)}, got {period!r}")
    return period


def period_start(period: str, seconds: float) -> float:
    """The start (Unix seconds, UTC) of the period that holds ``seconds``."""
    moment = datetime.fromtimestamp(seconds, UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "weekly":
        day -= timedelta(days=day.weekday())
    elif period == "monthly":
        day = day.replace(day=1)
    return day.timestamp()


def next_boundary(period: str, seconds: float) -> float:
    """The first period start strictly after ``seconds``."""
    start = datetime.fromtimestamp(period_start(period, seconds), UTC)
    if period == "daily":
        following = start + timedelta(days=1)
    elif period == "weekly":
        following = start + timedelta(days=7)
    else:
        following = (start + timedelta(days=32)).replace(day=1)
    return following.timestamp()


def infer_period(width_seconds: float) -> str:
    """The period of a partition ``width_seconds`` wide (for a store that was not told one)."""
    days = width_seconds / 86400.0
    if days <= 1.5:
        return "daily"
    if days <= 7.5:
        return "weekly"
    return "monthly"


def partition_name(table: str, lower: float) -> str:
    return f"{table}_p{datetime.fromtimestamp(lower, UTC):%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def legacy_name(table: str) -> str:
    return f"{table}_legacy"


def relation(schema: str, name: str) -> str:
    """``"schema"."name"`` for a relation of the schema (a partition, whose name the catalog gave)."""
    return f"{quote_ident(validate_schema_name(schema))}.{quote_ident(name)}"


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition: its name and range in Unix seconds (``None``: unbounded / the default)."""

    name: str
    lower: float | None
    upper: float | None
    is_default: bool

    @property
    def is_range(self) -> bool:
        """A partition of one period (neither the default nor the legacy heap from ``MINVALUE``)."""
        return not self.is_default and self.lower is not None and self.upper is not None


@dataclass(frozen=True, slots=True)
class TableLayout:
    """One table as the catalog has it."""

    table: PartitionedTable
    partitioned: bool
    partitions: tuple[Partition, ...]

    @property
    def horizon(self) -> float | None:
        """The upper bound of the newest range partition: rows past it go to the default partition."""
        uppers = [item.upper for item in self.partitions if item.upper is not None and not item.is_default]
        return max(uppers) if uppers else None

    @property
    def default(self) -> Partition | None:
        return next((item for item in self.partitions if item.is_default), None)

    def newest_width(self) -> float | None:
        ranges = [item for item in self.partitions if item.is_range]
        if not ranges:
            return None
        newest = max(ranges, key=lambda item: item.upper or 0.0)
        assert newest.upper is not None
        assert newest.lower is not None
        return newest.upper - newest.lower


_LAYOUT_SQL = """
SELECT c.relname AS name, b.bound = 'DEFAULT' AS is_default,
       CASE WHEN m[1] IS NULL OR m[1] = 'MINVALUE' THEN NULL
            WHEN $2 THEN extract(epoch FROM btrim(m[1], '''')::timestamptz)::float8
            ELSE btrim(m[1], '''')::float8 END AS lower,
       CASE WHEN m[2] IS NULL OR m[2] = 'MAXVALUE' THEN NULL
            WHEN $2 THEN extract(epoch FROM btrim(m[2], '''')::timestamptz)::float8
            ELSE btrim(m[2], '''')::float8 END AS upper
FROM pg_catalog.pg_inherits i
JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound) b
LEFT JOIN LATERAL regexp_match(b.bound, 'FROM \\((.*)\\) TO \\((.*)\\)') m ON true
WHERE i.inhparent = to_regclass($1)
ORDER BY c.relname
"""


async def is_partitioned(conn: Connection, schema: str, name: str) -> bool:
    """Whether the relation ``name`` of ``schema`` is a partitioned table."""
    kind = await conn.fetchval(
        "SELECT relkind::text FROM pg_catalog.pg_class WHERE oid = to_regclass($1)", relation(schema, name)
    )
    return bool(kind == "p")


async def table_layout(
    conn: Connection, schema: str, table: PartitionedTable, *, name: str | None = None
) -> TableLayout:
    """Whether ``table`` (or the relation ``name`` built for it) is partitioned, and its partitions."""
    name = relation(schema, name or table.name)
    kind = await conn.fetchval(
        "SELECT relkind::text FROM pg_catalog.pg_class WHERE oid = to_regclass($1)", name
    )
    if kind != "p":
        return TableLayout(table, False, ())
    records = await conn.fetch(_LAYOUT_SQL, name, table.key_is_timestamp)
    return TableLayout(
        table,
        True,
        tuple(Partition(r["name"], r["lower"], r["upper"], bool(r["is_default"])) for r in records),
    )


async def schema_layout(conn: Connection, schema: str) -> tuple[TableLayout, ...]:
    """:func:`table_layout` of every table of :data:`PARTITIONED_TABLES`."""
    return tuple([await table_layout(conn, schema, table) for table in PARTITIONED_TABLES])


def maintenance_lock_key(schema: str) -> int:
    """The advisory lock that serialises partition DDL on ``schema`` (held per transaction)."""
    digest = hashlib.sha256(f"guarded.partitions:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def create_partition(
    conn: Connection, schema: str, table: PartitionedTable, lower: float, upper: float
) -> str:
    """Create the partition ``[lower, upper)`` of ``table`` in one short transaction; return its name.

    The partition is built beside the table and attached (``ATTACH PARTITION`` locks the parent
    ``SHARE UPDATE EXCLUSIVE``: writes go on); rows of its range that had landed in the default
    partition move into it in the same transaction, so none is ever in two places or none.
    """
    name = partition_name(table.name, lower)
    parent = relation(schema, table.name)
    created = relation(schema, name)
    default = relation(schema, default_name(table.name))
    low, high = table.literal(lower), table.literal(upper)
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute("SELECT pg_advisory_xact_lock($1)", maintenance_lock_key(schema))
        await conn.execute(f"CREATE TABLE {created} (LIKE {parent} INCLUDING DEFAULTS)")
        if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", default):
            await conn.execute(
                f"WITH moved AS (DELETE FROM {default} WHERE {table.key} >= {low} AND {table.key} < {high} "
                f"RETURNING *) INSERT INTO {created} SELECT * FROM moved"
            )
        await conn.execute(
            f"ALTER TABLE {parent} ATTACH PARTITION {created} FOR VALUES FROM ({low}) TO ({high})"
        )
    return name


async def create_partitions(
    conn: Connection, schema: str, table: PartitionedTable, period: str, start: float, until: float
) -> list[str]:
    """Create the partitions of ``table``, one ``period`` each, from ``start`` (a period's start)
    until they cover ``until``; return their names, oldest first."""
    names = []
    while start < until:
        end = next_boundary(period, start)
        names.append(await create_partition(conn, schema, table, start, end))
        start = end
    return names


def ahead_until(period: str, now: float, ahead: float = AHEAD_SECONDS) -> float:
    """How far ahead of ``now`` maintenance keeps partitions: ``now + ahead``, and at least to the
    end of the next period."""
    return max(now + ahead, next_boundary(period, next_boundary(period, now)))


async def ensure_partitions(
    conn: Connection, schema: str, period: str | None, *, now: float, ahead: float = AHEAD_SECONDS
) -> dict[str, list[str]]:
    """Create the partitions each partitioned table lacks up to ``now + ahead`` (and at least to the
    end of the next period); return the names created per table.

    ``period`` ``None`` takes each table's newest partition's width. A table that is not
    partitioned is skipped.
    """
    created: dict[str, list[str]] = {}
    for layout in await schema_layout(conn, schema):
        if not layout.partitioned:
            continue
        table = layout.table
        width = layout.newest_width()
        table_period = period or (infer_period(width) if width is not None else "daily")
        start = layout.horizon if layout.horizon is not None else period_start(table_period, now)
        target = ahead_until(table_period, now, ahead)
        created[table.name] = await create_partitions(conn, schema, table, table_period, start, target)
    return created


async def drop_partition(conn: Connection, schema: str, table: PartitionedTable, partition: str) -> int:
    """Detach and drop one partition in one short transaction; return the bytes it held.

    ``DETACH PARTITION`` takes the parent's ``ACCESS EXCLUSIVE`` lock for the instant of the
    catalog change (``CONCURRENTLY`` is not allowed beside a default partition); ``lock_timeout``
    bounds the wait, so a long query on the table delays the drop to the next run instead of
    queueing every write behind it.
    """
    parent = relation(schema, table.name)
    target = relation(schema, partition)
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute("SELECT pg_advisory_xact_lock($1)", maintenance_lock_key(schema))
        size = int(await conn.fetchval("SELECT pg_total_relation_size(to_regclass($1))", target) or 0)
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {target}")
        await conn.execute(f"DROP TABLE {target}")
    return size


__all__ = [
    "AHEAD_SECONDS",
    "LOCK_TIMEOUT",
    "PARTITIONED_TABLES",
    "PERIODS",
    "Partition",
    "PartitionedTable",
    "PartitioningError",
    "TableLayout",
    "ahead_until",
    "check_period",
    "create_partition",
    "create_partitions",
    "default_name",
    "drop_partition",
    "ensure_partitions",
    "infer_period",
    "is_partitioned",
    "legacy_name",
    "maintenance_lock_key",
    "next_boundary",
    "partition_name",
    "period_start",
    "relation",
    "schema_layout",
    "table_layout",
]
