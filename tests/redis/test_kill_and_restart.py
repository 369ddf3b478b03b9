"""A ``kill -9`` of the Redis server and its restart in the middle of a workload lose nothing
acknowledged (own server: it gets killed).

The outage workload of the PostgreSQL suite (tests/postgres/_outages.py: twelve concurrent
workers making every kind of write) runs through ``guard(RedisStateStore)``; the server is
SIGKILLed a third of the way in and restarted a while later, on its data directory
(``appendfsync always``: what it acknowledged is on disk). The guard holds what failed and replays
it; afterwards Redis holds exactly the acknowledged writes: no append missing or doubled, every
upsert at its last acknowledged value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from guarded.backends.redis import RedisStateStore
from guarded.testing.redis import RedisServer
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from guarded.guard import controller, guard
from tests.postgres._outages import (
    Ledger,
    differences,
    drain_all,
    expected_ledger,
    outage_config,
    run_workers,
)
from tests.postgres.test_outages import reached, wait_for
from tests.redis._acknowledged import read_back_through
from tests.support.metrics import outcome_counts

WORKERS, PER_WORKER = 12, 160
CALLS = WORKERS * PER_WORKER


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer.started() as server:
        yield server


@pytest.mark.asyncio
async def test_a_kill_9_and_restart_in_the_middle_of_a_workload_lose_nothing_acknowledged(
    own_server: RedisServer, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    backend = RedisStateStore(Redis.from_url(own_server.url), prefix="restart", owns_client=True)
    store = guard(backend, name="restart", registry=registry, config=outage_config(tmp_path / "dlq.sqlite"))
    ledger = Ledger()
    work = asyncio.create_task(run_workers(store, ledger, workers=WORKERS, per_worker=PER_WORKER, pause=0.01))

    await wait_for(reached(ledger, CALLS // 3))
    await asyncio.to_thread(own_server.kill)
    down_at = ledger.calls
    assert down_at < CALLS // 2, "the kill must come in the middle of the workload"
    await wait_for(reached(ledger, down_at + CALLS // 10))
    await asyncio.to_thread(own_server.restart)
    up_at = ledger.calls
    await work

    assert ledger.errors == []
    assert ledger.acknowledged == CALLS
    assert up_at < CALLS, "the workload must go on after the restart"
    counts = outcome_counts(registry, "restart")
    assert counts["dead_lettered"] > 0, counts
    assert await drain_all(store) == 0
    await controller(store).aclose()
    await backend.close()
    assert ledger.parts() == expected_ledger(WORKERS, PER_WORKER).parts()

    reader = RedisStateStore(Redis.from_url(own_server.url), prefix="restart", owns_client=True)
    try:
        assert (
            differences(ledger, await read_back_through(reader, workers=WORKERS, per_worker=PER_WORKER)) == {}
        )
    finally:
        await reader.close()
