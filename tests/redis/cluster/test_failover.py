"""A master failover in the middle of a workload loses nothing acknowledged, on a real Redis Cluster.

The outage workload of the PostgreSQL suite (tests/postgres/_outages.py: eight concurrent workers
making every kind of write, their sessions and traces hashed over all three masters) runs through
``guard(RedisStateStore(cluster, replicas_to_ack=1))``. A quarter of the way in, a master is killed
(SIGKILL) and its replica promoted; then the killed node is started again and rejoins as the new
master's replica. Each write returned only once a replica had it (``WAIT 1``): while the slots of
the killed master were unserved, and while their new master had no replica yet, writes failed and
the guard held them; it replays them afterwards. Then the cluster holds exactly the acknowledged
writes: no append missing or doubled, every upsert at its last acknowledged value.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from guarded.backends.redis import RedisStateStore
from prometheus_client import CollectorRegistry

from guarded.guard import controller, guard
from guarded.testing.redis_cluster import RedisCluster
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

WORKERS, PER_WORKER = 8, 320
CALLS = WORKERS * PER_WORKER


@pytest.mark.asyncio
async def test_a_master_failover_in_the_middle_of_a_workload_loses_nothing_acknowledged(
    healthy_cluster: RedisCluster, key_prefix: str, tmp_path: Path
) -> None:
    cluster = healthy_cluster
    registry = CollectorRegistry()
    backend = RedisStateStore(cluster.async_client(), prefix=key_prefix, replicas_to_ack=1, owns_client=True)
    store = guard(backend, name="failover", registry=registry, config=outage_config(tmp_path / "dlq.sqlite"))
    ledger = Ledger()
    work = asyncio.create_task(run_workers(store, ledger, workers=WORKERS, per_worker=PER_WORKER, pause=0.02))

    await wait_for(reached(ledger, CALLS // 4))
    victim = cluster.master_for_slot(0)
    killed_at = ledger.calls
    await asyncio.to_thread(cluster.fail_over, victim)
    promoted_at = ledger.calls
    await asyncio.to_thread(cluster.restart, victim)  # the promoted master gets its replica back
    await work

    assert ledger.errors == []
    assert ledger.acknowledged == CALLS
    assert killed_at < CALLS // 2, "the master must be killed in the middle of the workload"
    assert promoted_at < CALLS, "the workload must go on after the promotion"
    counts = outcome_counts(registry, "failover")
    assert counts["dead_lettered"] > 0, counts  # the killed master's writes were held
    assert await drain_all(store) == 0
    await controller(store).aclose()
    await backend.close()
    assert ledger.parts() == expected_ledger(WORKERS, PER_WORKER).parts()

    reader = RedisStateStore(cluster.async_client(), prefix=key_prefix, owns_client=True)
    try:
        assert (
            differences(ledger, await read_back_through(reader, workers=WORKERS, per_worker=PER_WORKER)) == {}
        )
    finally:
        await reader.close()
