"""Retention of one day out of thirty: dropping its partition against ``DELETE``.

Two schemas hold the same :data:`DAYS` days of runtime events, :data:`EVENTS_PER_DAY` a day (grown
on the server with ``generate_series``; ``created_at`` is the event's own time): one unpartitioned,
one with ``partitioning="daily"`` (a partition per day, the past ones created before the fill).
``PostgresStateStore.cleanup()`` then enforces ``events_max_age`` with the horizon just past the end
of the oldest day, so exactly that day expires: the unpartitioned table runs its batched ``DELETE``
(then ``VACUUM``, without which the deleted rows' space is not even reusable), the partitioned one
detaches and drops the day's partition. Timed: the ``cleanup()`` call (and the ``VACUUM``); the
table's bytes (every partition's, with indexes and TOAST) before and after, to show the space
returned to the system. Target: the partition drop at least :data:`TARGET_SPEEDUP` times faster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore, RetentionPolicy
from guarded.backends.postgres.partitioning import PARTITIONED_TABLES, create_partitions, period_start

from .workload import reset_schemas

SECTION = "retention"
SCHEMA = "bench_retention"
DAYS = 30
EVENTS_PER_DAY = 100_000
TARGET_SPEEDUP = 100.0
DAY = 86_400.0


@dataclass
class Row:
    """One layout's cleanup of the oldest day."""

    layout: str
    method: str
    seconds: float
    rows_before: int
    rows_after: int
    bytes_before: int
    bytes_after: int


async def _table_bytes(conn: asyncpg.Connection, schema: str) -> int:
    """``flow_events``' bytes with every partition's, indexes and TOAST included."""
    table = f"{schema}.flow_events"
    partitions = await conn.fetchval(
        "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)", table
    )
    if partitions is not None:
        return int(partitions)
    return int(await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", table))


async def _rows(conn: asyncpg.Connection, schema: str) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {schema}.flow_events"))


async def _fill(conn: asyncpg.Connection, schema: str, first_day: float, per_day: int) -> None:
    # Seconds 100 .. 86,100 of each day: none on a day's first or last 100 seconds, so the
    # horizon one second past the oldest day's end selects exactly that day.
    await conn.execute(
        f"INSERT INTO {schema}.flow_events "
        "(trace_id, ts, kind, node_name, node_id, event_fp, payload, created_at) "
        "SELECT 'r-' || (g / 1000), t, 'node', 'n', NULL, int8send(g), '{\"i\": 1}'::json, to_timestamp(t) "
        "FROM (SELECT g, $1::float8 + (g / $2) * 86400.0 + 100 + (g % $2) * (86000.0 / $2) AS t "
        "FROM generate_series(0::bigint, $3::bigint - 1) AS g) AS rows",
        first_day,
        per_day,
        per_day * DAYS,
    )
    await conn.execute(f"VACUUM ANALYZE {schema}.flow_events")


async def _one(dsn: str, layout: str, *, per_day: int) -> Row:
    schema = f"{SCHEMA}_{layout}"
    await reset_schemas(dsn, schema)
    conn = await asyncpg.connect(dsn)
    try:
        partitioned = layout == "partitioned"
        store = await PostgresStateStore.connect(
            dsn,
            schema=schema,
            registry=CollectorRegistry(),
            stats_interval=None,
            partitioning="daily" if partitioned else None,
        )
        try:
            today = period_start("daily", time.time())
            first_day = today - (DAYS - 1) * DAY
            if partitioned:
                events = next(table for table in PARTITIONED_TABLES if table.name == "flow_events")
                await create_partitions(conn, schema, events, "daily", first_day, today)
            await _fill(conn, schema, first_day, per_day)
            rows_before, bytes_before = await _rows(conn, schema), await _table_bytes(conn, schema)
            horizon = first_day + DAY + 1.0
            store.retention = RetentionPolicy(events_max_age=time.time() - horizon)
            started = time.perf_counter()
            await store.cleanup()
            if not partitioned:
                await conn.execute(f"VACUUM {schema}.flow_events")
            seconds = time.perf_counter() - started
            rows_after, bytes_after = await _rows(conn, schema), await _table_bytes(conn, schema)
        finally:
            await store.close()
    finally:
        await conn.close()
    await reset_schemas(dsn, schema)
    method = "drop the day's partition" if partitioned else "batched DELETE + VACUUM"
    return Row(layout, method, seconds, rows_before, rows_after, bytes_before, bytes_after)


async def run(dsn: str, *, per_day: int = EVENTS_PER_DAY) -> list[Row]:
    """The unpartitioned and the partitioned schema, one after the other."""
    return [await _one(dsn, layout, per_day=per_day) for layout in ("plain", "partitioned")]


def speedup(rows: Sequence[Row]) -> float:
    by_layout = {row.layout: row for row in rows}
    return by_layout["plain"].seconds / by_layout["partitioned"].seconds


def format_report(rows: Sequence[Row]) -> str:
    per_day = (rows[0].rows_before // DAYS) if rows else 0
    header = (
        f"{'layout':<12} {'retention by':<26} {'seconds':>8} {'rows removed':>12} {'MB before':>9} "
        f"{'MB returned':>11}"
    )
    lines = [
        f"== retention: one day of {DAYS} ({per_day:,} events a day) expired by "
        "PostgresStateStore.cleanup() ==",
        "",
        header,
        "-" * len(header),
    ]
    for row in rows:
        lines.append(
            f"{row.layout:<12} {row.method:<26} {row.seconds:>8.3f} {row.rows_before - row.rows_after:>12,} "
            f"{row.bytes_before / 1e6:>9.1f} {(row.bytes_before - row.bytes_after) / 1e6:>11.1f}"
        )
    ratio = speedup(rows)
    by_layout = {row.layout: row for row in rows}
    plain, dropped = by_layout["plain"], by_layout["partitioned"]
    per_row = plain.seconds / max(1, plain.rows_before - plain.rows_after)
    crossing = TARGET_SPEEDUP * dropped.seconds / per_row
    lines += [
        "",
        f"{'met' if ratio >= TARGET_SPEEDUP else 'NOT MET':>7}  retention of one day of {DAYS} by partition "
        f"drop >= {TARGET_SPEEDUP:g}x faster than DELETE: {ratio:.1f}x",
        f"the DELETE costs {per_row * 1e6:.1f} µs per expired row, the drop "
        f"{dropped.seconds * 1000:.0f} ms whatever the day holds: {TARGET_SPEEDUP:g}x from about "
        f"{crossing:,.0f} events a day.",
        "the DELETE's rows leave dead tuples: VACUUM makes their space reusable but returns none to the "
        "system; a dropped partition's files are removed at once.",
    ]
    return "\n".join(lines)


def main() -> int:
    from guarded.testing.postgres import embedded_postgres

    with embedded_postgres() as server:
        rows = asyncio.run(run(server.dsn))
    print(format_report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
