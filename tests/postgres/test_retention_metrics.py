"""cleanup() retention and the backend metrics (pool, acquire wait, table samples)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore, RetentionPolicy
from guarded.backends.postgres.schema_migrations import latest_version
from guarded.backends.postgres.schema_names import TABLES
from guarded.models import (
    PlannerEvent,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    UpdateType,
)
from guarded.observability import telemetry_names as names

from .conftest import StoreFactory


async def age_rows(raw: asyncpg.Connection, schema: str, table: str, seconds: int) -> None:
    await raw.execute(
        f'UPDATE "{schema}".{table} SET created_at = now() - make_interval(secs => $1)', seconds
    )


@pytest.mark.asyncio
async def test_cleanup_enforces_max_ages(make_store: StoreFactory, raw: asyncpg.Connection) -> None:
    registry = CollectorRegistry()
    store = await make_store(
        registry=registry,
        retention=RetentionPolicy(
            events_max_age=3600,
            updates_max_age=3600,
            steering_max_age=3600,
            planner_events_max_age=3600,
            batch_size=7,
        ),
    )
    for index in range(20):
        await store.save_event(StoredEvent("t", float(index), "k", None, None, {}))
        await store.save_update(
            StateUpdate(
                session_id="s",
                task_id="t",
                update_id=f"u{index}",
                update_type=UpdateType.PROGRESS,
                content=index,
            )
        )
        await store.save_steering(
            SteeringEvent(
                session_id="s", task_id="t", event_id=f"e{index}", event_type=SteeringEventType.CANCEL
            )
        )
        await store.save_planner_event("t", PlannerEvent("x", float(index), index))
    for table in ("flow_events", "state_updates", "steering_events", "planner_events"):
        await age_rows(raw, store.schema, table, 7200)
    await store.save_event(StoredEvent("t", 99.0, "fresh", None, None, {}))
    report = await store.cleanup()
    assert report.deleted == {
        "planner_pauses": 0,
        "artifacts": 0,
        "flow_events": 20,
        "state_updates": 20,
        "steering_events": 20,
        "planner_events": 20,
    }
    assert report.total == 80
    assert "flow_events: 20" in str(report)
    assert [event.kind for event in await store.load_history("t")] == ["fresh"]
    sample = registry.get_sample_value(
        names.GUARDED_PG_CLEANUP_DELETED_ROWS_TOTAL,
        {"store": "postgres", "schema": store.schema, "table": "flow_events"},
    )
    assert sample == 20


@pytest.mark.asyncio
async def test_without_a_policy_cleanup_keeps_logs(
    store: PostgresStateStore, raw: asyncpg.Connection
) -> None:
    await store.save_event(StoredEvent("t", 1.0, "k", None, None, {}))
    await age_rows(raw, store.schema, "flow_events", 10**8)
    report = await store.cleanup()
    assert "flow_events" not in report.deleted
    assert str(report) == "nothing to clean up"
    assert len(await store.load_history("t")) == 1


def test_retention_policy_validation() -> None:
    with pytest.raises(ValueError, match="events_max_age"):
        RetentionPolicy(events_max_age=0)
    with pytest.raises(ValueError, match="batch_size"):
        RetentionPolicy(batch_size=0)


@pytest.mark.asyncio
async def test_pool_and_acquire_metrics(make_store: StoreFactory) -> None:
    registry = CollectorRegistry()
    store = await make_store(registry=registry, name="primary")
    labels = {"store": "primary", "schema": store.schema}
    await asyncio.gather(*(store.load_history("x") for _ in range(10)))
    assert (registry.get_sample_value(names.GUARDED_PG_POOL_SIZE, labels) or 0) >= 1
    assert registry.get_sample_value(names.GUARDED_PG_POOL_MAX_SIZE, labels) == 4
    assert registry.get_sample_value(names.GUARDED_PG_POOL_IN_USE, labels) == 0
    assert (registry.get_sample_value(names.GUARDED_PG_POOL_ACQUIRE_SECONDS + "_count", labels) or 0) >= 10
    assert registry.get_sample_value(names.GUARDED_PG_MIGRATION_VERSION, labels) == latest_version()
    await store.close()
    assert registry.get_sample_value(names.GUARDED_PG_POOL_SIZE, labels) is None  # removed on close


@pytest.mark.asyncio
async def test_table_samples(make_store: StoreFactory) -> None:
    registry = CollectorRegistry()
    store = await make_store(registry=registry, stats_interval=0.05)
    await store.save_events([StoredEvent("t", float(index), "k", None, None, {}) for index in range(50)])
    stats = await store.sample_table_stats()
    assert set(stats) == set(TABLES)
    assert stats["flow_events"][1] > 0
    await asyncio.sleep(0.2)  # the background sampler ran too
    labels = {"store": "postgres", "schema": store.schema}
    assert registry.get_sample_value(names.GUARDED_PG_TABLE_STATS_TIMESTAMP, labels) is not None
    size = registry.get_sample_value(names.GUARDED_PG_TABLE_SIZE_BYTES, {**labels, "table": "flow_events"})
    assert size is not None
    assert size > 0
    rows = registry.get_sample_value(names.GUARDED_PG_TABLE_ROWS, {**labels, "table": "flow_events"})
    assert rows is not None


@pytest.mark.asyncio
async def test_metrics_can_be_disabled(make_store: StoreFactory) -> None:
    registry = CollectorRegistry()
    store = await make_store(registry=registry, metrics=False)
    await store.load_history("x")
    assert list(registry.collect()) == []


def test_metric_names_follow_conventions() -> None:
    for name in names.PG_METRIC_NAMES:
        assert name.startswith("guarded_pg_")
        assert name == name.lower()
    assert names.GUARDED_PG_POOL_ACQUIRE_SECONDS.endswith("_seconds")
    assert names.GUARDED_PG_TABLE_SIZE_BYTES.endswith("_bytes")
    assert names.GUARDED_PG_CONNECTION_ERRORS_TOTAL.endswith("_total")
