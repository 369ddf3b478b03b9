"""Read replicas against a real streaming replica (``pg_basebackup -R`` of the test server).

The promises: a write and then a read of the same trace never miss the write, however far the
replica lags; reads of other traces are answered by the replica while it is current enough; a
pause consume never reaches the replica; a replica that stops answering costs no failed call and
no call beyond its deadline, and is used again once it answers. Where a read was answered is shown
by what it returns (a row the primary has and the paused replica has not) and by the replica's own
statistics, not only by the store's routing counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded.backend import MUST_BE_CURRENT, read_must_be_current
from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.factory import ConfigurationError, config_from_env
from guarded.codec import DEFAULT_TYPES
from guarded.config import DeadLetterConfig, GuardConfig, TimeoutConfig
from guarded.guard import controller, guard
from guarded.models import StoredEvent
from guarded.observability import telemetry_names as names
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres.conftest import SMALL_POOL

MAX_LAG = 30.0
"""Generous: a replica paused for a whole test stays in use (its lag is measured, not exceeded)."""
CHECK_INTERVAL = 0.2
READ_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def replica(pg_server: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """One streaming replica of the session's server for the whole module."""
    standby = pg_server.start_replica()
    try:
        yield standby
    finally:
        standby.destroy()


@pytest_asyncio.fixture
async def replica_conn(replica: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(replica.dsn)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            await conn.execute("SELECT pg_wal_replay_resume()")
        await conn.close()


@pytest_asyncio.fixture
async def make_replicated(
    pg_server: EmbeddedPostgres, replica: EmbeddedPostgres, schema_name: str
) -> AsyncIterator[Callable[..., Awaitable[PostgresStateStore]]]:
    opened: list[PostgresStateStore] = []

    async def make(**options: Any) -> PostgresStateStore:
        options.setdefault("schema", schema_name)
        options.setdefault("registry", CollectorRegistry())
        options.setdefault("stats_interval", None)
        options.setdefault("pool", SMALL_POOL)
        options.setdefault("types", DEFAULT_TYPES)
        options.setdefault("replica_dsn", replica.dsn)
        options.setdefault("replica_max_lag", MAX_LAG)
        options.setdefault("replica_check_interval", CHECK_INTERVAL)
        options.setdefault("replica_read_timeout", READ_TIMEOUT)
        store = await PostgresStateStore.connect(pg_server.dsn, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


async def until(condition: Callable[[], Awaitable[bool]], *, within: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {within}s: {what}")
        await asyncio.sleep(0.05)


async def replica_in_use(store: PostgresStateStore) -> None:
    async def in_use() -> bool:
        return all(status.in_use for status in await store.check_replicas())

    await until(in_use, what="the replica in use")


def event(trace: str, index: int) -> StoredEvent:
    return StoredEvent(trace, float(index), "node_end", "node", f"n{index}", {"i": index})


def reads(store: PostgresStateStore, registry: CollectorRegistry, target: str) -> float:
    labels = {"store": store.name, "schema": store.schema, "target": target}
    return registry.get_sample_value(names.GUARDED_PG_READS_TOTAL, labels) or 0.0


async def scans(conn: asyncpg.Connection, schema: str, table: str) -> int:
    """Scans of ``table`` the server behind ``conn`` ran itself (a standby counts its own reads)."""
    value = await conn.fetchval(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
        "WHERE schemaname = $1 AND relname = $2",
        schema,
        table,
    )
    return int(value or 0)


@pytest.mark.asyncio
async def test_a_write_is_read_back_however_far_the_replica_lags(
    make_replicated: Callable[..., Awaitable[PostgresStateStore]],
    replica_conn: asyncpg.Connection,
    raw: asyncpg.Connection,
) -> None:
    registry = CollectorRegistry()
    store = await make_replicated(registry=registry)
    await replica_in_use(store)
    await replica_conn.execute("SELECT pg_wal_replay_pause()")
    # Another process's write, made after replay stopped: only the primary has it.
    other = f"other-{uuid.uuid4().hex[:8]}"
    await raw.execute(
        f"INSERT INTO {store.schema}.flow_events (trace_id, ts, kind, event_fp, payload) "
        "VALUES ($1, 1.0, 'k', '\\x00'::bytea, '{}')",
        other,
    )
    tries = 10_000
    guarded = guard(store, name="replicated", registry=CollectorRegistry())
    for index in range(tries):
        trace = f"rw-{index}"
        await guarded.save_event(event(trace, index))
        history = await guarded.load_history(trace)
        assert [item.node_id for item in history] == [f"n{index}"], f"try {index} missed its own write"
    assert await guarded.list_planner_events("rw-0") == []
    # The replica really lags: it has none of these writes.
    assert (
        await replica_conn.fetchval(
            f"SELECT count(*) FROM {store.schema}.flow_events WHERE trace_id = 'rw-0'"
        )
        == 0
    )
    # A trace this store did not write is read from the (lagging, but within its limit) replica.
    before = reads(store, registry, "replica0")
    assert await store.load_history(other) == []
    assert reads(store, registry, "replica0") == before + 1
    assert reads(store, registry, "primary") >= tries
    await replica_conn.execute("SELECT pg_wal_replay_resume()")
    await until(
        lambda: _has_rows(store, other), what="the replica replays the other process's write and serves it"
    )
    await controller(guarded).aclose()


async def _has_rows(store: PostgresStateStore, trace: str) -> bool:
    return len(await store.load_history(trace)) == 1


@pytest.mark.asyncio
async def test_reads_of_other_traces_are_answered_by_the_replica(
    make_replicated: Callable[..., Awaitable[PostgresStateStore]], replica_conn: asyncpg.Connection
) -> None:
    registry = CollectorRegistry()
    store = await make_replicated(registry=registry)
    for index in range(5):
        await store.save_event(event("older", index))
    await replica_in_use(store)  # its checks now find it past those writes
    scanned = await scans(replica_conn, store.schema, "flow_events")
    for _ in range(20):
        assert len(await store.load_history("older")) == 5
    assert reads(store, registry, "replica0") == 20

    async def replica_scanned() -> bool:
        return await scans(replica_conn, store.schema, "flow_events") >= scanned + 20

    await until(replica_scanned, what="the replica's own statistics count the reads")


@pytest.mark.asyncio
async def test_a_pause_consume_never_reaches_the_replica(
    make_replicated: Callable[..., Awaitable[PostgresStateStore]],
    replica_conn: asyncpg.Connection,
    raw: asyncpg.Connection,
) -> None:
    registry = CollectorRegistry()
    store = await make_replicated(registry=registry)
    for index in range(10):
        await store.save_planner_state(f"tok-{index}", {"i": index})
    await store.save_event(event("seen", 0))
    await replica_in_use(store)
    pauses_on_replica = await scans(replica_conn, store.schema, "planner_pauses")
    events_on_replica = await scans(replica_conn, store.schema, "flow_events")
    pauses_on_primary = await scans(raw, store.schema, "planner_pauses")
    for index in range(10):
        assert await store.load_planner_state(f"tok-{index}") == {"i": index}
        assert await store.load_planner_state(f"tok-{index}") is None
        assert len(await store.load_history("seen")) == 1

    async def reported() -> bool:  # the replica's statistics are flushed now and then
        return await scans(replica_conn, store.schema, "flow_events") >= events_on_replica + 10

    await until(reported, what="the replica reports the history reads it answered")
    assert await scans(replica_conn, store.schema, "planner_pauses") == pauses_on_replica
    await until(
        lambda: _scanned(raw, store.schema, "planner_pauses", pauses_on_primary + 20),
        what="the primary answered every consume",
    )


async def _scanned(conn: asyncpg.Connection, schema: str, table: str, least: int) -> bool:
    return await scans(conn, schema, table) >= least


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["frozen", "stopped"])
async def test_a_replica_that_stops_answering_costs_no_failed_call(
    how: str,
    make_replicated: Callable[..., Awaitable[PostgresStateStore]],
    replica: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    registry = CollectorRegistry()
    backend = await make_replicated(registry=registry)
    for index in range(3):
        await backend.save_event(event("steady", index))
    await replica_in_use(backend)
    deadline = 2.0
    store = guard(
        backend,
        config=GuardConfig(
            timeout=TimeoutConfig(attempt=deadline, deadline=deadline),
            dead_letter=DeadLetterConfig(path=str(tmp_path / "spill.db")),
        ),
        registry=registry,
    )
    outcomes: list[tuple[str, float]] = []
    stop = asyncio.Event()

    async def reader(worker: int) -> None:
        index = 0
        while not stop.is_set():
            started = time.monotonic()
            history = await store.load_history("steady")
            outcomes.append(
                ("ok" if len(history) == 3 else f"got {len(history)}", time.monotonic() - started)
            )
            await store.save_event(event(f"mine-{worker}", index))
            mine = await store.load_history(f"mine-{worker}")
            outcomes.append(("ok" if len(mine) == index + 1 else f"mine {len(mine)}", 0.0))
            index += 1

    readers = [asyncio.create_task(reader(worker)) for worker in range(4)]
    try:
        await asyncio.sleep(0.3)
        if how == "frozen":
            replica.freeze()
        else:
            replica.stop("immediate")
        await asyncio.sleep(2.0)
    finally:
        stop.set()
        await asyncio.gather(*readers)
        if how == "frozen":
            replica.thaw()
        else:
            replica.start()
    bad = [outcome for outcome in outcomes if outcome[0] != "ok"]
    assert not bad, bad[:5]
    slowest = max(took for _, took in outcomes)
    assert slowest < deadline, f"a read took {slowest:.2f}s"
    not_ok = {key: count for key, count in controller(store).stats().items() if key[1] != "ok"}
    assert not not_ok, not_ok
    skipped = registry.get_sample_value(
        names.GUARDED_PG_REPLICA_SKIPPED_TOTAL,
        {"store": backend.name, "schema": backend.schema, "replica": "replica0", "reason": "unreachable"},
    )
    assert skipped is not None
    assert skipped >= 1
    await replica_in_use(backend)  # tried again, and used again once it answers
    await controller(store).aclose()


@pytest.mark.asyncio
async def test_a_replica_dsn_that_names_a_primary_is_left_out(
    make_replicated: Callable[..., Awaitable[PostgresStateStore]], pg_server: EmbeddedPostgres
) -> None:
    registry = CollectorRegistry()
    store = await make_replicated(registry=registry, replica_dsn=[pg_server.dsn])
    (status,) = await store.check_replicas()
    assert (status.in_use, status.reason) == (False, "not_replica")
    await store.load_history("x")
    assert reads(store, registry, "primary") == 1


@pytest.mark.asyncio
async def test_reads_marked_current_go_to_the_primary(
    make_replicated: Callable[..., Awaitable[PostgresStateStore]],
) -> None:
    registry = CollectorRegistry()
    store = await make_replicated(registry=registry)
    await store.save_event(event("old", 0))
    await replica_in_use(store)
    token = MUST_BE_CURRENT.set(True)
    try:
        assert read_must_be_current()
        await store.load_history("old")
    finally:
        MUST_BE_CURRENT.reset(token)
    await store.load_history("old")
    assert (reads(store, registry, "primary"), reads(store, registry, "replica0")) == (1, 1)


def test_replica_settings_are_checked_and_name_themselves() -> None:
    with pytest.raises(TypeError, match="replica_dsn"):
        PostgresStateStore.lazy("postgresql://x/y", replica_dsn=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replica_max_lag"):
        PostgresStateStore.lazy("postgresql://x/y", replica_dsn="postgresql://r/y", replica_max_lag=-1)
    config = config_from_env(
        {
            "GUARDED_PG_REPLICA_DSN": "postgresql://r1/db, postgresql://r2/db",
            "GUARDED_PG_REPLICA_MAX_LAG": "5s",
        }
    )
    assert config.options["replica_dsn"] == ("postgresql://r1/db", "postgresql://r2/db")
    assert config.options["replica_max_lag"] == 5.0
    with pytest.raises(ConfigurationError, match="GUARDED_PG_REPLICA_READ_TIMEOUT"):
        config_from_env({"GUARDED_PG_REPLICA_READ_TIMEOUT": "soon"})
