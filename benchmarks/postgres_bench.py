"""PostgresStateStore against raw asyncpg on the same server, tables and rows.

Every "raw" baseline does the least a hand-written store must do for the same result, on an
identical copy of the table (``CREATE TABLE ... (LIKE ... INCLUDING ALL)``: same columns,
indexes and defaults), so the ratio is the price of the store: strict validation, the NUL
escape, fingerprints, record objects.

* **bulk insert**: ``save_events`` (batches of 1,000) against ``COPY`` of the same rows built
  with the store's own encoding (:func:`~guarded.backends.postgres.event_log.encode_events`, timed
  in). A second row shows ``COPY`` of rows built in advance (database time only).

Every protocol method one call at a time, through the guard and against raw asyncpg running the
same SQL, is :mod:`benchmarks.postgres_protocol`.
* **load_history** of 10,000 events against a raw ``SELECT`` of the same columns, its payloads
  decoded with ``json.loads`` (and, for reference, asyncpg's ``json`` type codec, and the fetch
  alone with payloads left as text).
* **pause save + consume** against ``INSERT ... ON CONFLICT`` + ``DELETE ... RETURNING``.

Times are medians of ``repeats`` runs after a warm-up.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.event_log import encode_events
from guarded.models import StoredEvent
from guarded.pipeline.idempotency import idempotency_key

from .side_by_side import Row, medians
from .workload import reset_schemas

SECTION = "postgres"
SCHEMA = "bench"
RAW = "bench_raw"
COLUMNS = ("trace_id", "ts", "kind", "node_name", "node_id", "event_fp", "payload")


def runtime_event(index: int, trace_id: str | None = "bench-trace") -> StoredEvent:
    """An event shaped like PenguiFlow's runtime events (spec 000 "Payload Structure")."""
    ts = 1_702_857_600.0 + index * 0.001
    return StoredEvent(
        trace_id=trace_id,
        ts=ts,
        kind="node_success",
        node_name="llm_node",
        node_id=f"llm_node_{index % 97}",
        payload={
            "ts": ts,
            "event": "node_success",
            "node_name": "llm_node",
            "node_id": f"llm_node_{index % 97}",
            "trace_id": trace_id,
            "latency_ms": 1523.45 + index,
            "q_depth_in": 0,
            "q_depth_out": 2,
            "q_depth_total": 2,
            "outgoing": 3,
            "queue_maxsize": 1000,
            "attempt": 1,
            "trace_inflight": 5,
            "trace_cancelled": False,
        },
    )


def make_events(count: int, trace_id: str = "bench-trace") -> list[StoredEvent]:
    """``count`` of :func:`runtime_event`, indexed from 0."""
    return [runtime_event(index, trace_id) for index in range(count)]


async def run(dsn: str, *, repeats: int = 7, events: int = 10_000) -> list[Row]:
    """Run every Postgres benchmark against ``dsn`` and return the rows (schemas ``bench*`` are reset)."""
    await reset_schemas(dsn, SCHEMA, RAW)
    store = await PostgresStateStore.connect(
        dsn,
        schema=SCHEMA,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(min_size=2, max_size=2, command_timeout=120),
    )
    raw = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert raw is not None
    proxy = guard(store, name="bench-postgres", registry=CollectorRegistry())
    try:
        await raw.execute(
            f"CREATE SCHEMA {RAW}; "
            f"CREATE TABLE {RAW}.flow_events (LIKE {SCHEMA}.flow_events INCLUDING ALL); "
            f"CREATE TABLE {RAW}.planner_pauses (LIKE {SCHEMA}.planner_pauses INCLUDING ALL)"
        )
        rows = await _bulk(store, proxy, raw, events, repeats)
        rows += await _history(store, proxy, raw, dsn, events, repeats)
        rows += await _pauses(store, proxy, raw, repeats)
        return rows
    finally:
        await controller(proxy).aclose()
        await raw.close()
        await store.close()


async def _truncate(raw: asyncpg.Pool) -> None:
    await raw.execute(f"TRUNCATE {SCHEMA}.flow_events; TRUNCATE {RAW}.flow_events")


async def _bulk(
    store: PostgresStateStore, proxy: Any, raw: asyncpg.Pool, count: int, repeats: int
) -> list[Row]:
    events = make_events(count)
    prebuilt = encode_events(events)

    async def ours() -> None:
        for start in range(0, count, 1_000):
            await store.save_events(events[start : start + 1_000])

    async def guarded() -> None:
        for start in range(0, count, 1_000):
            await proxy.save_events(events[start : start + 1_000])

    async def copy_rows(records: list[tuple[Any, ...]]) -> None:
        async with raw.acquire() as conn:
            await conn.copy_records_to_table("flow_events", schema_name=RAW, columns=COLUMNS, records=records)

    async def raw_copy_encoded() -> None:
        await copy_rows(encode_events(events))

    async def raw_copy_prebuilt() -> None:
        await copy_rows(prebuilt)

    times = await medians(
        {"ours": ours, "guard": guarded, "encoded": raw_copy_encoded, "prebuilt": raw_copy_prebuilt},
        repeats=repeats,
        setup=lambda: _truncate(raw),
    )
    name = f"bulk insert {count:,} events"
    return [
        Row(
            SECTION,
            f"{name}, guard(store)",
            times["guard"],
            times["encoded"],
            "COPY, rows by the store's encode_events",
            0.8,
            higher_is_better=True,
        ),
        Row(
            SECTION,
            f"{name}, bare store",
            times["ours"],
            times["encoded"],
            "COPY, rows by the store's encode_events",
            0.8,
            higher_is_better=True,
        ),
        Row(
            SECTION,
            f"{name}, bare store",
            times["ours"],
            times["prebuilt"],
            "COPY, rows prebuilt (db only)",
            higher_is_better=True,
        ),
    ]


async def _history(
    store: PostgresStateStore, proxy: Any, raw: asyncpg.Pool, dsn: str, count: int, repeats: int
) -> list[Row]:
    await _truncate(raw)
    await store.save_events(make_events(count))
    select = (
        f"SELECT ts, kind, node_name, node_id, payload FROM {SCHEMA}.flow_events "
        "WHERE trace_id = $1 ORDER BY ts, id"
    )

    async def ours() -> None:
        loaded = await store.load_history("bench-trace")
        assert len(loaded) == count

    async def guarded() -> None:
        loaded = await proxy.load_history("bench-trace")
        assert len(loaded) == count

    async def raw_select_loads() -> None:
        records = await raw.fetch(select, "bench-trace")
        [json.loads(record[4]) for record in records]

    async def raw_fetch_only() -> None:
        await raw.fetch(select, "bench-trace")

    codec_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, init=_json_codec)
    assert codec_pool is not None

    async def raw_select_codec() -> None:
        await codec_pool.fetch(select, "bench-trace")

    try:
        times = await medians(
            {
                "ours": ours,
                "guard": guarded,
                "loads": raw_select_loads,
                "codec": raw_select_codec,
                "fetch": raw_fetch_only,
            },
            repeats=repeats,
        )
    finally:
        await codec_pool.close()
    name = f"load_history {count:,} events"
    return [
        Row(
            SECTION,
            f"{name}, guard(store)",
            times["guard"],
            times["loads"],
            "SELECT + json.loads per row",
            1.5,
        ),
        Row(
            SECTION, f"{name}, bare store", times["ours"], times["loads"], "SELECT + json.loads per row", 1.5
        ),
        Row(SECTION, f"{name}, bare store", times["ours"], times["codec"], "SELECT, asyncpg json codec"),
        Row(SECTION, f"{name}, bare store", times["ours"], times["fetch"], "SELECT, payloads left as text"),
    ]


async def _json_codec(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _pauses(store: PostgresStateStore, proxy: Any, raw: asyncpg.Pool, repeats: int) -> list[Row]:
    payload = {
        "trajectory": {
            "version": 1,
            "query": "book a flight",
            "steps": [{"thought": "search", "n": i} for i in range(5)],
        },
        "reason": "await_input",
        "payload": {"oauth": {"provider": "github", "scopes": ["repo"]}},
        "constraints": None,
        "tool_context": {"tenant_id": "t", "user_id": "u"},
    }
    rounds = 100
    save = (
        f"INSERT INTO {RAW}.planner_pauses (token, payload, expires_at) "
        "VALUES ($1, $2, now() + interval '1 hour') "
        "ON CONFLICT (token) DO UPDATE SET payload = EXCLUDED.payload, expires_at = EXCLUDED.expires_at"
    )
    take = f"DELETE FROM {RAW}.planner_pauses WHERE token = $1 AND expires_at > now() RETURNING payload"

    async def ours() -> None:
        for index in range(rounds):
            await store.save_planner_state(f"tok-{index}", payload)
            assert await store.load_planner_state(f"tok-{index}") is not None

    async def guarded() -> None:
        for index in range(rounds):
            await proxy.save_planner_state(f"tok-{index}", payload)
            assert await proxy.load_planner_state(f"tok-{index}") is not None

    async def ours_keyed() -> None:
        for index in range(rounds):
            await store.save_planner_state(f"tok-{index}", payload)
            with idempotency_key(f"call-{index}"):
                assert await store.load_planner_state(f"tok-{index}") is not None

    async def raw_round_trips() -> None:
        for index in range(rounds):
            await raw.execute(save, f"tok-{index}", json.dumps(payload))
            text = await raw.fetchval(take, f"tok-{index}")
            assert json.loads(text) is not None

    times = await medians(
        {"ours": ours, "guard": guarded, "keyed": ours_keyed, "raw": raw_round_trips}, repeats=repeats
    )
    per_round = {name: seconds / rounds for name, seconds in times.items()}
    baseline = "asyncpg INSERT + DELETE RETURNING"
    return [
        Row(SECTION, "pause save + consume, guard(store)", per_round["guard"], per_round["raw"], baseline),
        Row(SECTION, "pause save + consume, bare store", per_round["ours"], per_round["raw"], baseline),
        Row(
            SECTION, "pause save + consume (idempotency key)", per_round["keyed"], per_round["raw"], baseline
        ),
    ]


__all__ = ["SECTION", "make_events", "run"]
