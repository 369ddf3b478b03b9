"""Partitioned history on a real server: idempotency across partitions, rows far outside the
partitions, maintenance, retention by dropping partitions, and converting a populated schema."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded import guard
from guarded.backends.memory import InMemoryStateStore
from guarded.backends.postgres import PostgresStateStore, RetentionPolicy
from guarded.backends.postgres.factory import ConfigurationError, config_from_env
from guarded.backends.postgres.partition_conversion import STEPS, convert_schema
from guarded.backends.postgres.partitioning import (
    PARTITIONED_TABLES,
    PartitioningError,
    create_partition,
    ensure_partitions,
    next_boundary,
    period_start,
    schema_layout,
)
from guarded.codec import penguiflow_types
from guarded.models import (
    PlannerEvent,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    UpdateType,
)
from guarded.observability import telemetry_names as names
from guarded.pipeline.idempotency import idempotency_key
from guarded.testing import StateStoreContract
from tests.interop import test_differential as differential

from .conftest import StoreFactory, new_schema_name
from .test_factory_cli_penguiflow import run_cli

DAY = 86400.0
TABLES = [table.name for table in PARTITIONED_TABLES]


class TestPartitionedPostgresStore(StateStoreContract):
    """Every contract on a schema whose history tables are partitioned by day."""

    @pytest_asyncio.fixture
    async def store(self, make_store: StoreFactory) -> PostgresStateStore:
        return await make_store(partitioning="daily")


def event(ts: float, index: int = 0, trace: str = "t") -> StoredEvent:
    return StoredEvent(trace, ts, "k", "n", None, {"i": index})


def update(index: int, at: datetime, session: str = "s") -> StateUpdate:
    return StateUpdate(
        session_id=session,
        task_id="task",
        update_id=f"u{index}",
        update_type=UpdateType.PROGRESS,
        content={"i": index},
        created_at=at,
    )


def steering(index: int, at: datetime, session: str = "s") -> SteeringEvent:
    return SteeringEvent(
        session_id=session,
        task_id="task",
        event_id=f"e{index}",
        event_type=SteeringEventType.USER_MESSAGE,
        payload={"i": index},
        created_at=at,
    )


async def counts(raw: asyncpg.Connection, schema: str) -> dict[str, int]:
    return {table: await raw.fetchval(f'SELECT count(*) FROM "{schema}".{table}') for table in TABLES}


async def where(raw: asyncpg.Connection, schema: str, table: str) -> dict[str, int]:
    """Rows per partition of ``table``."""
    records = await raw.fetch(
        f'SELECT tableoid::regclass::text AS part, count(*) AS n FROM "{schema}".{table} GROUP BY 1'
    )
    return {record["part"].split(".")[-1].strip('"'): record["n"] for record in records}


@pytest.mark.asyncio
async def test_a_new_schema_is_partitioned_with_partitions_ahead(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    registry = CollectorRegistry()
    store = await make_store(partitioning="daily", registry=registry)
    async with store.pool.acquire() as conn:
        layouts = await schema_layout(conn, store.schema)
    now = time.time()
    for layout in layouts:
        assert layout.partitioned, layout.table.name
        assert layout.default is not None
        assert layout.horizon is not None
        assert layout.horizon >= now + 7 * DAY
        horizon = registry.get_sample_value(
            names.GUARDED_PG_PARTITION_HORIZON,
            {"store": "postgres", "schema": store.schema, "table": layout.table.name},
        )
        assert horizon == layout.horizon
    assert await store.maintain() == {table: [] for table in TABLES}  # nothing left to create
    await store.save_events([event(now, index) for index in range(20)])
    stats = await store.sample_table_stats()  # a partitioned table's rows and bytes are its partitions'
    assert stats["flow_events"][1] > 0


@pytest.mark.asyncio
async def test_retried_writes_are_not_duplicated_across_a_partition_boundary(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    store = await make_store(partitioning="daily")
    boundary = next_boundary("daily", time.time())
    moment = datetime.fromtimestamp(boundary, UTC)
    events = [event(boundary - 0.001, 0), event(boundary, 1), event(boundary + 0.5, 2)]
    updates = [update(0, moment - timedelta(microseconds=1)), update(1, moment)]
    steerings = [steering(0, moment - timedelta(microseconds=1)), steering(1, moment)]
    planner = [PlannerEvent("step", boundary - 0.001), PlannerEvent("step", boundary + 1)]
    for _attempt in range(2):  # the first write and its retry (or a replay of held writes)
        for item in events:
            await store.save_event(item)
        await store.save_events(events)
        for item in updates:
            await store.save_update(item)
        await store.save_updates(updates)
        for item in steerings:
            await store.save_steering(item)
        with idempotency_key("call-1"):
            await store.save_planner_events([("trace", item) for item in planner])
    assert await counts(raw, store.schema) == {
        "flow_events": 3,
        "state_updates": 2,
        "steering_events": 2,
        "planner_events": 2,
    }
    for table in TABLES:  # each write met its first copy in a partition of its own day
        assert len(await where(raw, store.schema, table)) == 2, table
    assert [item.ts for item in await store.load_history("t")] == [item.ts for item in events]
    assert [item.update_id for item in await store.list_updates("s")] == ["u0", "u1"]
    assert [item.update_id for item in await store.list_updates("s", since_id="u0")] == ["u1"]
    assert [item.event_id for item in await store.list_steering("s")] == ["e0", "e1"]


@pytest.mark.asyncio
async def test_rows_far_outside_the_partitions_are_stored_once_in_the_default_partition(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    store = await make_store(partitioning="daily")
    far = [event(1.0, 0), event(4e10, 1), event(-5.0, 2)]
    old, future = datetime(1990, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)
    for _attempt in range(2):
        await store.save_events(far)
        await store.save_update(update(0, old))
        await store.save_update(update(1, future))
        await store.save_steering(steering(0, future))
        with idempotency_key("far"):
            await store.save_planner_events([("trace", PlannerEvent("step", 3.0))])
    assert await where(raw, store.schema, "flow_events") == {"flow_events_default": 3}
    assert await where(raw, store.schema, "state_updates") == {"state_updates_default": 2}
    assert await where(raw, store.schema, "steering_events") == {"steering_events_default": 1}
    assert await where(raw, store.schema, "planner_events") == {"planner_events_default": 1}
    assert [item.ts for item in await store.load_history("t")] == [-5.0, 1.0, 4e10]
    assert [item.update_id for item in await store.list_updates("s")] == ["u0", "u1"]


@pytest.mark.asyncio
async def test_maintenance_moves_rows_out_of_the_default_partition_into_new_partitions(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    store = await make_store(partitioning="daily")
    now = time.time()
    ahead = now + 10 * DAY  # past the week the store created
    await store.save_events([event(now, 0), event(ahead, 1), event(ahead + 0.25, 2)])
    assert (await where(raw, store.schema, "flow_events")).get("flow_events_default") == 2
    async with store.pool.acquire() as conn:
        created = await ensure_partitions(conn, store.schema, "daily", now=now + 5 * DAY)
    assert len(created["flow_events"]) >= 3
    placed = await where(raw, store.schema, "flow_events")
    assert "flow_events_default" not in placed
    assert sum(placed.values()) == 3
    await store.save_events([event(ahead, 1)])  # a retry after the move is still skipped
    assert [item.ts for item in await store.load_history("t")] == [now, ahead, ahead + 0.25]


@pytest.mark.asyncio
async def test_retention_drops_whole_partitions_and_keeps_newer_rows_exact(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    registry = CollectorRegistry()
    today = period_start("daily", time.time())
    horizon = today - 3.5 * DAY  # half a day from any partition bound, whatever the time of day
    max_age = time.time() - horizon
    store = await make_store(
        partitioning="daily",
        registry=registry,
        retention=RetentionPolicy(events_max_age=max_age, updates_max_age=max_age, steering_max_age=max_age),
    )
    async with store.pool.acquire() as conn:
        for table in PARTITIONED_TABLES:
            for day in range(-6, 0):
                await create_partition(conn, store.schema, table, today + day * DAY, today + (day + 1) * DAY)
    stamps = [today + day * DAY + 3600.0 + index for day in range(-6, 1) for index in range(3)]
    await store.save_events([event(ts, index) for index, ts in enumerate(stamps)])
    await store.save_updates(
        [update(index, datetime.fromtimestamp(ts, UTC)) for index, ts in enumerate(stamps)]
    )
    kept = [ts for ts in stamps if period_start("daily", ts) + DAY > horizon]
    assert 0 < len(kept) < len(stamps)
    report = await store.cleanup()
    assert len(report.dropped["flow_events"]) == 2  # days -6 and -5 end before the horizon; -4 after it
    assert report.dropped_bytes["flow_events"] > 0
    assert [item.ts for item in await store.load_history("t")] == kept
    listed = [item.update_id for item in await store.list_updates("s", limit=0)]
    assert listed == [f"u{index}" for index, ts in enumerate(stamps) if ts in kept]
    assert [item.update_id for item in await store.list_updates("s", since_id=listed[0], limit=0)] == listed[
        1:
    ]
    labels = {"store": "postgres", "schema": store.schema, "table": "flow_events"}
    assert registry.get_sample_value(names.GUARDED_PG_PARTITIONS_DROPPED_TOTAL, labels) == 2
    assert (await store.cleanup()).dropped["flow_events"] == []


async def populate(store: PostgresStateStore, start: int, count: int, at: float) -> None:
    moment = datetime.fromtimestamp(at, UTC)
    await store.save_events(
        [event(at + index, index, trace=f"t{index % 3}") for index in range(start, start + count)]
    )
    await store.save_updates(
        [update(index, moment + timedelta(seconds=index)) for index in range(start, start + count)]
    )
    for index in range(start, start + count):
        await store.save_steering(steering(index, moment + timedelta(seconds=index)))
    with idempotency_key(f"populate-{start}"):
        await store.save_planner_events(
            [(f"t{index % 3}", PlannerEvent("step", at + index)) for index in range(start, start + count)]
        )


async def snapshot(store: PostgresStateStore) -> dict[str, Any]:
    return {
        "history": {trace: await store.load_history(trace) for trace in ("t0", "t1", "t2")},
        "planner": {trace: await store.list_planner_events(trace) for trace in ("t0", "t1", "t2")},
        "updates": await store.list_updates("s", limit=0),
        "steering": await store.list_steering("s", limit=0),
    }


@pytest.mark.asyncio
async def test_converting_a_populated_schema_keeps_every_row_and_resumes_after_each_step(
    make_store: StoreFactory, raw: asyncpg.Connection
) -> None:
    old_store = await make_store()
    now = time.time()
    await populate(old_store, 0, 40, now - 3 * DAY)
    with pytest.raises(PartitioningError, match="guarded pg partition"):
        await make_store(partitioning="daily")
    conn = raw
    schema = old_store.schema
    for step_index, step in enumerate(STEPS[:-1]):  # a run killed after each step, resumed by the next
        results = await convert_schema(conn, schema, "daily", now=now, until=step)
        assert [item.ran for item in results if item.step == step] == [True] * len(TABLES)
        assert all(not item.ran for item in results if STEPS.index(item.step) < step_index)
        await populate(old_store, 100 * (step_index + 1), 5, now - DAY)  # writes go on meanwhile
        if step == "index":  # as a build killed half-way leaves it: invalid, rebuilt by the next run
            await raw.execute(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass",
                f'"{schema}".flow_events_partition_key',
            )
            rerun = await convert_schema(conn, schema, "daily", now=now, until="index")
            assert [item.table for item in rerun if item.ran] == ["flow_events"]
    expected = await snapshot(old_store)
    before = await counts(raw, old_store.schema)
    results = await convert_schema(conn, old_store.schema, "daily", now=now)
    assert [item.step for item in results if item.ran] == ["swap"] * len(TABLES)
    assert await counts(raw, old_store.schema) == before
    assert await snapshot(old_store) == expected  # the store opened before the conversion reads on
    for table in TABLES:
        assert set(await where(raw, old_store.schema, table)) == {f"{table}_legacy"}
    legacy_indexes = await raw.fetch(
        "SELECT indexrelid::regclass::text AS name FROM pg_index WHERE indrelid = $1::regclass ORDER BY 1",
        f'"{schema}".flow_events_legacy',
    )
    assert [record["name"].split(".")[-1] for record in legacy_indexes] == [  # the attach built none
        "flow_events_created_brin",
        "flow_events_history",
        "flow_events_partition_key",
        "flow_events_pkey",
    ]
    new_store = await make_store(partitioning="daily")
    assert await snapshot(new_store) == expected
    await populate(old_store, 0, 40, now - 3 * DAY)  # retries of everything: nothing duplicated
    await populate(new_store, 500, 5, now + 3 * DAY)  # new rows go to the new partitions
    assert await counts(raw, old_store.schema) == {table: before[table] + 5 for table in TABLES}
    updates = [item.update_id for item in await new_store.list_updates("s", limit=0)]
    assert updates[-5:] == [f"u{index}" for index in range(500, 505)]  # ids continue past the old ones
    assert [item.update_id for item in await new_store.list_updates("s", since_id="u104", limit=0)] == (
        [f"u{index}" for index in range(200, 205)]
        + [f"u{index}" for index in range(300, 305)]
        + [f"u{index}" for index in range(400, 405)]
        + [f"u{index}" for index in range(500, 505)]
    )
    assert all(not item.ran for item in await convert_schema(conn, old_store.schema, "daily", now=now))


@pytest.mark.asyncio
async def test_the_partition_maintain_and_cleanup_commands(
    make_store: StoreFactory, pg_dsn: str, raw: asyncpg.Connection
) -> None:
    store = await make_store()
    await populate(store, 0, 10, time.time() - 2 * DAY)
    before = await counts(raw, store.schema)

    def cli(*argv: str) -> tuple[int, str]:
        return run_cli("pg", *argv, "--dsn", pg_dsn, "--schema", store.schema)

    code, out = await asyncio.to_thread(cli, "maintain")
    assert code == 1  # not partitioned: says which command to run
    code, out = await asyncio.to_thread(cli, "partition", "--until", "validate")
    assert code == 0
    assert "stopped after step validate" in out
    code, out = await asyncio.to_thread(cli, "partition", "--period", "weekly", "--json")
    assert code == 0
    report = json.loads(out)
    assert all(report["partitioned"].values())
    assert [item["step"] for item in report["steps"] if item["ran"]] == ["swap"] * len(TABLES)
    assert await counts(raw, store.schema) == before
    code, out = await asyncio.to_thread(cli, "maintain", "--json")
    assert code == 0
    assert json.loads(out)["created"] == {table: [] for table in TABLES}  # the conversion made them
    assert all(horizon > time.time() + 7 * DAY for horizon in json.loads(out)["horizon"].values())
    code, out = await asyncio.to_thread(cli, "cleanup", "--max-age-events", "1d", "--json")
    assert code == 0
    assert json.loads(out)["dropped_partitions"] == {"flow_events": []}  # the legacy heap ends in the future
    assert json.loads(out)["deleted"]["flow_events"] == 0  # its rows were stored just now


def test_the_partitioning_setting_is_checked_and_named() -> None:
    assert config_from_env({"GUARDED_PG_PARTITIONING": "Weekly"}).options.get("partitioning") == "weekly"
    assert "partitioning" not in config_from_env({"GUARDED_PG_PARTITIONING": "none"}).options
    with pytest.raises(
        ConfigurationError, match="GUARDED_PG_PARTITIONING must be one of daily, weekly, monthly"
    ):
        config_from_env({"GUARDED_PG_PARTITIONING": "hourly"})


@pytest.mark.asyncio
async def test_a_store_refuses_an_unknown_period_naming_the_option(make_store: StoreFactory) -> None:
    with pytest.raises(ValueError, match="partitioning must be one of daily, weekly, monthly"):
        await make_store(partitioning="hourly")


@pytest.mark.parametrize("period", ["daily", "weekly", "monthly"])
def test_periods_tile_time_without_gaps(period: str) -> None:
    start = period_start(period, datetime(2024, 2, 28, 13, tzinfo=UTC).timestamp())
    for _ in range(30):
        end = next_boundary(period, start)
        assert period_start(period, end) == end
        assert period_start(period, end - 1) == start
        start = end


@pytest.mark.asyncio
@pytest.mark.parametrize("option", ["daily", None])
async def test_an_id_saved_again_with_another_created_at_is_one_item(
    make_store: StoreFactory, raw: asyncpg.Connection, option: str | None
) -> None:
    """As on an unpartitioned table (PenguiFlow's reference: idempotent by id), a new object with
    an id already stored is skipped, even a day later; also by a store not told of the partitions."""
    partitioned = await make_store(partitioning="daily")
    store = partitioned if option else await make_store()
    moment = datetime.now(UTC)
    await store.save_update(update(0, moment))
    await store.save_update(update(0, moment + timedelta(days=1)))
    await store.save_updates([update(1, moment), update(1, moment + timedelta(days=1)), update(2, moment)])
    await store.save_steering(steering(0, moment))
    await store.save_steering(steering(0, moment - timedelta(days=1)))
    assert await counts(raw, store.schema) == {
        "flow_events": 0,
        "state_updates": 3,
        "steering_events": 1,
        "planner_events": 0,
    }
    assert [item.update_id for item in await store.list_updates("s", since_id="u0")] == ["u1", "u2"]


@pytest.mark.asyncio
async def test_random_calls_on_a_partitioned_schema_agree_with_penguiflows_reference(
    make_store: StoreFactory,
) -> None:
    """The differential suite (tests/interop/test_differential.py) with the history partitioned."""
    differences = []
    for index in range(differential.SEQUENCES):
        backend = await make_store(schema=new_schema_name(), types=penguiflow_types(), partitioning="daily")
        guarded = guard(backend, name=f"partitioned-{index}", registry=CollectorRegistry())
        stores = {"memory": InMemoryStateStore(record_types=penguiflow_types()), "postgres": guarded}
        async with guarded:
            differences += await differential.run_sequence(
                differential.BASE_SEED + index, stores, differential.ReferenceWithExceptions()
            )
    assert not differences, differential.describe(differences)
