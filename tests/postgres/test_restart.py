"""The store recovers its pool when the server restarts between calls (own server: it gets restarted)."""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.connection import is_connection_error
from guarded.models import StoredEvent
from guarded.observability.telemetry_names import GUARDED_PG_CONNECTION_ERRORS_TOTAL
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres


@pytest.fixture(scope="module")
def restartable() -> Iterator[EmbeddedPostgres]:
    # synchronous_commit on: an acknowledged commit survives the simulated crash ("immediate" stop).
    with embedded_postgres(settings={"synchronous_commit": "on"}) as server:
        yield server


async def open_store(server: EmbeddedPostgres, registry: CollectorRegistry) -> PostgresStateStore:
    return await PostgresStateStore.connect(
        server.dsn,
        schema="restart",
        registry=registry,
        stats_interval=None,
        pool=PoolSettings(min_size=3, max_size=3, connect_timeout=5),
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_calls_after_a_restart_succeed(restartable: EmbeddedPostgres, mode: str) -> None:
    registry = CollectorRegistry()
    store = await open_store(restartable, registry)
    try:
        trace = f"restart-{mode}"
        await store.save_event(StoredEvent(trace, 1.0, "before", None, None, {}))
        restartable.restart(mode)
        # Every idle pool connection is dead now; each call below must still succeed.
        for index in range(5):
            await store.save_event(StoredEvent(trace, 2.0 + index, "after", None, None, {}))
        assert [event.kind for event in await store.load_history(trace)] == ["before"] + ["after"] * 5
        assert await store.load_planner_state("missing") is None
    finally:
        await store.close()
    errors = registry.get_sample_value(
        GUARDED_PG_CONNECTION_ERRORS_TOTAL, {"store": "postgres", "schema": "restart"}
    )
    assert errors is None or errors <= 1  # at most one statement met a dead connection; none failed


@pytest.mark.asyncio
async def test_a_call_while_the_server_is_down_fails_fast_then_recovers(
    restartable: EmbeddedPostgres,
) -> None:
    store = await open_store(restartable, CollectorRegistry())
    try:
        restartable.stop("fast")
        try:
            with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError)) as caught:
                await store.save_event(StoredEvent("down", 1.0, "k", None, None, {}))
            assert is_connection_error(caught.value) or isinstance(caught.value, OSError)
        finally:
            restartable.start()
        await store.save_event(StoredEvent("down", 2.0, "k", None, None, {}))
        assert [event.ts for event in await store.load_history("down")] == [2.0]
    finally:
        await store.close()
