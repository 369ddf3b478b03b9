"""``load_history`` as the event log grows: p50/p99 of reading one trace's history through
``guard(PostgresStateStore)`` while ``flow_events`` holds 10,000, 1,000,000 and 10,000,000 events.

The table is grown in place between the sizes by one ``INSERT ... SELECT FROM generate_series``
on the server (traces of 1,000 events, timestamps spread over the last 30 days, so a partitioned
table spreads them over its partitions), then analysed. The probes are :data:`PROBES` traces of
:data:`PROBE_EVENTS` events each, written through the store itself before the first size; each
size reads them :data:`READS` times in turn. Target: p50 at the largest size within 1.5x of the
p50 at the smallest (a read costs what its trace holds, not what the table holds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.partitioning import PARTITIONED_TABLES, create_partitions, period_start
from guarded.models import StoredEvent

from .workload import reset_schemas

SECTION = "history"
SCHEMA = "bench_history"
SIZES = (10_000, 1_000_000, 10_000_000)
LAYOUTS = {"plain": {}, "daily": {"partitioning": "daily"}}
"""Table layouts measured: unpartitioned, and a partition per day (30 of them hold the rows)."""
DAYS = 30
PROBES = 10
PROBE_EVENTS = 100
READS = 300
FLAT_WITHIN = 1.5
DAY = 86_400.0


@dataclass
class Row:
    """``load_history`` latency with the table at one size."""

    layout: str
    events: int
    p50_ms: float
    p99_ms: float
    fill_seconds: float


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _grow(conn: asyncpg.Connection, schema: str, start: int, stop: int, now: float) -> None:
    await conn.execute(
        f"INSERT INTO {schema}.flow_events (trace_id, ts, kind, node_name, node_id, event_fp, payload) "
        f"SELECT 'bulk-' || (g / 1000), $3::float8 - (g % ({DAYS} * 86400)), 'node', 'n', NULL, "
        "int8send(g), '{\"i\": 1}'::json FROM generate_series($1::bigint, $2::bigint - 1) AS g",
        start,
        stop,
        now,
    )
    await conn.execute(f"ANALYZE {schema}.flow_events")


async def run(
    dsn: str,
    *,
    sizes: Sequence[int] = SIZES,
    reads: int = READS,
    layout: str = "plain",
    store_options: Mapping[str, Any] | None = None,
) -> list[Row]:
    """Grow the table through ``sizes`` and time the probes' reads at each; ``store_options`` go
    to :meth:`PostgresStateStore.connect` (``layout`` names them in the table)."""
    schema = f"{SCHEMA}_{layout}"
    await reset_schemas(dsn, schema)
    store = await PostgresStateStore.connect(
        dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, **dict(store_options or {})
    )
    proxy = guard(store, name="history", registry=CollectorRegistry())
    now = time.time()
    if (store_options or {}).get("partitioning") == "daily":
        # The past days' partitions (the store keeps only today's and the week ahead).
        events = next(table for table in PARTITIONED_TABLES if table.name == "flow_events")
        today = period_start("daily", now)
        ddl = await asyncpg.connect(dsn)
        try:
            await create_partitions(ddl, schema, events, "daily", today - DAYS * DAY, today)
        finally:
            await ddl.close()
    probes = [f"probe-{index}" for index in range(PROBES)]
    for trace in probes:
        await proxy.save_events(
            [
                StoredEvent(trace, now - DAY + step, "node", "n", None, {"step": step})
                for step in range(PROBE_EVENTS)
            ]
        )
    await controller(proxy).flush()
    rows: list[Row] = []
    conn = await asyncpg.connect(dsn)
    try:
        held = 0
        for size in sizes:
            started = time.perf_counter()
            await _grow(conn, schema, held, size, now)
            filled = time.perf_counter() - started
            held = size
            for trace in probes:  # warm the cache, check the answer
                history = await proxy.load_history(trace)
                if len(history) != PROBE_EVENTS:
                    raise RuntimeError(f"{trace}: {len(history)} events read, {PROBE_EVENTS} written")
            timings: list[float] = []
            for index in range(reads):
                began = time.perf_counter()
                await proxy.load_history(probes[index % PROBES])
                timings.append((time.perf_counter() - began) * 1000)
            rows.append(Row(layout, size, _percentile(timings, 0.5), _percentile(timings, 0.99), filled))
    finally:
        await conn.close()
        await controller(proxy).aclose()
        await store.close()
        await reset_schemas(dsn, schema)
    return rows


def verdicts(rows: Sequence[Row]) -> list[tuple[str, bool]]:
    """Per layout: whether p50 at its largest size is within :data:`FLAT_WITHIN` of its smallest."""
    found = []
    for layout in dict.fromkeys(row.layout for row in rows):
        mine = sorted((row for row in rows if row.layout == layout), key=lambda row: row.events)
        ratio = mine[-1].p50_ms / mine[0].p50_ms
        text = (
            f"load_history p50 flat within {FLAT_WITHIN}x from {mine[0].events:,} to {mine[-1].events:,} "
            f"events ({layout}): {ratio:.2f}x ({mine[0].p50_ms:.2f} -> {mine[-1].p50_ms:.2f} ms)"
        )
        found.append((text, ratio <= FLAT_WITHIN))
    return found


def format_report(rows: Sequence[Row]) -> str:
    header = f"{'layout':<12} {'events in table':>15} {'p50 ms':>8} {'p99 ms':>8} {'fill s':>7}"
    lines = [
        f"== history: load_history of a {PROBE_EVENTS}-event trace through guard(PostgresStateStore) as "
        "flow_events grows ==",
        "",
        header,
        "-" * len(header),
    ]
    for row in rows:
        lines.append(
            f"{row.layout:<12} {row.events:>15,} {row.p50_ms:>8.2f} {row.p99_ms:>8.2f} "
            f"{row.fill_seconds:>7.1f}"
        )
    lines.append("")
    for text, met in verdicts(rows):
        lines.append(f"{'met' if met else 'NOT MET':>7}  {text}")
    return "\n".join(lines)


def main() -> int:
    from guarded.testing.postgres import embedded_postgres

    with embedded_postgres() as server:
        rows = [
            row
            for layout, options in LAYOUTS.items()
            for row in asyncio.run(run(server.dsn, layout=layout, store_options=options))
        ]
    print(format_report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
