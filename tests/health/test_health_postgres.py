"""``controller(store).health()`` and the probes against a real PostgreSQL: the server stopped in
the middle of a workload (degraded and ready while the spill file takes the writes; ok again once
the held writes are replayed, and every acknowledged write is in the database), the spill
directory unusable while the server is down (failing, not ready), and the store's connection pool
saturated (degraded while callers wait for a connection)."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.hybrid_store import HybridStateStore
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BreakerConfig, TimeoutConfig
from guarded.errors import WriteNotKeptError
from guarded.health import probe
from guarded.health_status import HealthStatus
from guarded.models import StoredEvent
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres
from tests.postgres._outages import (
    assert_all_kept,
    open_store,
    outage_config,
    reached,
    start_workload,
    wait_for,
)

pytestmark = pytest.mark.asyncio

WAIT = 60.0
"""Seconds a condition has to come true on a loaded two-core machine."""

BREAKER = BreakerConfig(window_size=20, minimum_calls=5, open_duration=0.5, half_open_probes=1)
"""Opens after a few failed calls; tries the server again every half second, and closes on the first
trial call that succeeds."""


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedPostgres]:
    """The module's server: its tests stop it (``synchronous_commit`` on, so a commit the store saw
    survives a fast stop)."""
    with embedded_postgres(settings={"synchronous_commit": "on"}) as server:
        yield server


@pytest.fixture
def server(own_server: EmbeddedPostgres) -> EmbeddedPostgres:
    """The module's server, running (an earlier test may have left it stopped)."""
    if not own_server.running:
        own_server.start()
    return own_server


@pytest.fixture
def schema() -> str:
    return f"h_{uuid.uuid4().hex[:16]}"


def codes(store: object) -> set[str]:
    return {reason.code for reason in controller(store).health().reasons}


def has_codes(store: object, *wanted: str) -> Callable[[], bool]:
    return lambda: set(wanted) <= codes(store)


async def until_status(store: object, status: HealthStatus) -> None:
    """Poll the guard's health until it is ``status``; fail naming the reasons it still has."""
    try:
        await wait_for(lambda: controller(store).health().status is status, WAIT)
    except AssertionError:
        raise AssertionError(f"not {status.value}: {controller(store).health().as_json()}") from None


async def test_a_stopped_database_is_degraded_and_ready_then_ok_once_the_held_writes_drain(
    server: EmbeddedPostgres, schema: str, tmp_path: Path
) -> None:
    workers, per_worker = 8, 120
    store = guard(
        await open_store(server.dsn, schema),
        name="health",
        registry=CollectorRegistry(),
        config=outage_config(tmp_path / "dlq.sqlite", breaker=BREAKER),
    )
    controls = controller(store)
    ledger, work = start_workload(store, workers=workers, per_worker=per_worker)
    try:
        await wait_for(reached(ledger, workers * per_worker // 4), WAIT)
        assert controls.health().status is HealthStatus.OK
        await asyncio.to_thread(server.stop)
        await wait_for(has_codes(store, "breaker_open", "writes_held"), WAIT)
        health = controls.health()
        assert health.status is HealthStatus.DEGRADED
        assert health.ready
        assert probe(store, "readyz")[0] == 200
        assert probe(store, "livez")[0] == 200
        assert controls.dead_letters is not None
        assert controls.dead_letters.spill_path is not None  # held in the spill file, not memory
        assert "memory_only" not in codes(store)
        held_at = ledger.acknowledged
        await wait_for(reached(ledger, ledger.calls + workers * 10), WAIT)
        assert ledger.acknowledged > held_at  # writes keep being acknowledged while it is down

        await asyncio.to_thread(server.start)
        await work
        # The guard's own replay empties the spill file; nobody calls drain().
        await wait_for(lambda: controls.dead_letters is not None and controls.dead_letters.depth == 0, WAIT)
        await until_status(store, HealthStatus.OK)
        assert probe(store, "readyz") == (200, {"status": "ok", "reasons": []})
    finally:
        if not server.running:
            server.start()
        await work
    assert ledger.errors == []
    await assert_all_kept(store, ledger, server.dsn, schema, workers=workers, per_worker=per_worker)


async def test_an_unusable_spill_directory_while_the_database_is_down_is_not_ready(
    server: EmbeddedPostgres, schema: str, tmp_path: Path
) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    store = guard(
        await open_store(server.dsn, schema),
        name="health",
        registry=CollectorRegistry(),
        config=outage_config(spill_dir / "dlq.sqlite", breaker=BREAKER),
    )
    controls = controller(store)
    try:
        await store.save_memory_state("before", {"v": 0})
        assert controls.health().status is HealthStatus.OK

        await asyncio.to_thread(server.stop)
        # The volume is gone: where the spill directory was, a file stands.
        shutil.rmtree(spill_dir)
        spill_dir.write_text("not a directory")
        refused = 0
        for index in range(30):
            try:
                await store.save_memory_state(f"k{index}", {"v": index})
            except WriteNotKeptError:
                refused += 1
            if controls.health().status is HealthStatus.FAILING:
                break
        assert refused > 0, "a write that cannot be kept is refused, never acknowledged"
        health = controls.health()
        assert health.status is HealthStatus.FAILING
        assert not health.ready
        assert {"spill_unusable"} <= codes(store)
        status, body = probe(store, "readyz")
        assert (status, body["status"]) == (503, "failing")
        assert probe(store, "livez")[0] == 200  # not dead: restarting would not bring the volume back

        spill_dir.unlink()
        spill_dir.mkdir()
        await asyncio.to_thread(server.start)
        await acknowledged(store.save_memory_state, "after", {"v": 1})  # a trial call closes the breaker
        await wait_for(lambda: controls.health().ready, WAIT)
        assert probe(store, "readyz")[0] == 200
        # Nothing needs holding: the spill file is tried again by the guard's periodic sweep
        # (every 30 s), so the guard may stay degraded (spill_unusable) until then, never failing.
        assert codes(store) <= {"spill_unusable"}
    finally:
        if spill_dir.is_file():
            spill_dir.unlink()
            spill_dir.mkdir()
        if not server.running:
            server.start()
        await controls.aclose()
    conn = await asyncpg.connect(server.dsn)
    try:
        keys = {row["key"] for row in await conn.fetch(f'SELECT key FROM "{schema}".memory_states')}
    finally:
        await conn.close()
    assert {"before", "after"} <= keys


async def acknowledged(write: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Make ``write(*args)`` until the guard acknowledges it (it refuses writes while the spill file
    is unusable, and tries the file again only every few seconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT
    while True:
        try:
            await write(*args)
            return
        except WriteNotKeptError:
            assert loop.time() < end, f"no write acknowledged within {WAIT}s"
            await asyncio.sleep(0.1)


async def hold_every_connection(pool: asyncpg.Pool) -> list[Any]:
    """Check out every connection of ``pool``, each in an open transaction."""
    held = [await pool.acquire() for _ in range(pool.get_max_size())]
    for conn in held:
        await conn.execute("BEGIN")
    return held


async def release_all(pool: asyncpg.Pool, held: list[Any]) -> None:
    for conn in held:
        await conn.execute("ROLLBACK")
        await pool.release(conn)


PATIENT = TimeoutConfig(attempt=WAIT, deadline=WAIT, critical_deadline=WAIT)
"""Deadlines longer than the test waits: a call waiting for a connection is never cut short."""


async def test_a_saturated_connection_pool_is_degraded_until_a_connection_is_free(
    server: EmbeddedPostgres, schema: str, tmp_path: Path
) -> None:
    backend = await open_store(server.dsn, schema, max_size=2)
    store = guard(
        backend,
        name="pool",
        registry=CollectorRegistry(),
        config=outage_config(tmp_path / "dlq.sqlite", timeout=PATIENT),
    )
    controls = controller(store)
    held = await hold_every_connection(backend.pool)
    try:
        assert "pool_saturated" not in codes(store)  # every connection in use, but nobody waits
        waiting = asyncio.create_task(store.load_history("trace"))
        await wait_for(has_codes(store, "pool_saturated"), WAIT)
        health = controls.health()
        assert health.status is HealthStatus.DEGRADED
        (reason,) = [reason for reason in health.reasons if reason.code == "pool_saturated"]
        assert "2 of 2 connections in use" in reason.message
        assert "1 caller waiting" in reason.message
        assert probe(store, "readyz")[0] == 200
        assert not waiting.done()
    finally:
        await release_all(backend.pool, held)
    try:
        assert await waiting == []
        await until_status(store, HealthStatus.OK)
    finally:
        await controls.aclose()


async def test_a_composed_store_reports_the_pool_of_its_part(
    server: EmbeddedPostgres, schema: str, tmp_path: Path
) -> None:
    record = await open_store(server.dsn, schema, max_size=2)
    store = guard(
        HybridStateStore(hot=InMemoryStateStore(), record=record),
        name="hybrid",
        registry=CollectorRegistry(),
        config=outage_config(tmp_path / "dlq.sqlite", timeout=PATIENT),
    )
    controls = controller(store)
    held = await hold_every_connection(record.pool)
    try:
        waiting = asyncio.create_task(
            store.save_event(StoredEvent("trace", 1.0, "node_end", "node", "n1", {}))
        )
        await wait_for(has_codes(store, "pool_saturated"), WAIT)
        health = controls.health()
        assert health.status is HealthStatus.DEGRADED
        assert [reason.message.split(":")[0] for reason in health.reasons] == ["record"]
    finally:
        await release_all(record.pool, held)
    try:
        await waiting
        await until_status(store, HealthStatus.OK)
    finally:
        await controls.aclose()
