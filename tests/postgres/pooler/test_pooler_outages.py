"""PgBouncer itself fails in the middle of a workload: nothing acknowledged is lost, no call hangs.

Each test has a PgBouncer of its own in front of the session's server, and writers going through
``guard(PostgresStateStore, pooler="transaction")`` to it, with the ledger and checks of
tests/postgres/test_outages.py:

* restarted (SIGTERM, every client connection dropped, then started again on the same port)
  while 20 writers write: every acknowledged write is stored exactly once after the drain;
* stalled (SIGSTOP: connections are accepted by the kernel, nothing answers): every call returns
  within its deadline, as on a stalled server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.config import DeadLetterConfig, GuardConfig, TimeoutConfig
from guarded.guard import guard
from guarded.testing.pgbouncer import PgBouncer, pgbouncer
from guarded.testing.postgres import EmbeddedPostgres
from tests.support.metrics import outcome_counts as outcomes

from .._outages import (
    assert_all_kept,
    outage_config,
    pool_settings,
    reached,
    start_workload,
    two_rounds_then_close,
    wait_for,
)
from ..test_stalled_deadlines import DEADLINE, DRAIN, SLACK, calls


@pytest.fixture
def own_bouncer(pg_server: EmbeddedPostgres) -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own: it gets restarted or stalled."""
    with pgbouncer(pg_server) as bouncer:
        yield bouncer


async def pooled_store(bouncer: PgBouncer, schema: str, pool: PoolSettings) -> PostgresStateStore:
    return await PostgresStateStore.connect(
        bouncer.dsn,
        schema=schema,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=pool,
        pooler="transaction",
    )


@pytest.mark.asyncio
async def test_a_pgbouncer_restart_in_the_middle_of_a_workload_loses_nothing(
    own_bouncer: PgBouncer, direct_dsn: str, schema_name: str, tmp_path: Path
) -> None:
    workers, per_worker = 20, 120
    calls_made = workers * per_worker
    registry = CollectorRegistry()
    store = guard(
        await pooled_store(own_bouncer, schema_name, pool_settings()),
        name="restart",
        registry=registry,
        config=outage_config(tmp_path / "dlq.sqlite"),
    )
    ledger, work = start_workload(store, workers=workers, per_worker=per_worker)

    await wait_for(reached(ledger, calls_made // 3))
    await asyncio.to_thread(own_bouncer.stop)
    down_at = ledger.calls
    assert down_at < calls_made // 2, "the restart must come in the middle of the workload"
    await wait_for(reached(ledger, down_at + calls_made // 10))  # calls made while it is down
    await asyncio.to_thread(own_bouncer.start)
    await work

    assert ledger.errors == []
    assert ledger.acknowledged == calls_made
    counts = outcomes(registry, "restart")
    assert sum(counts.values()) == calls_made
    assert counts["dead_lettered"] > 0  # the restart was felt ...
    assert set(counts) <= {"ok", "retried", "dead_lettered"}

    # ... and every held write replayed through the new PgBouncer
    await assert_all_kept(store, ledger, direct_dsn, schema_name, workers=workers, per_worker=per_worker)


@pytest.mark.asyncio
async def test_every_call_keeps_its_deadline_through_a_stalled_pgbouncer(
    own_bouncer: PgBouncer, schema_name: str, tmp_path: Path
) -> None:
    backend = await pooled_store(own_bouncer, schema_name, PoolSettings(min_size=1, max_size=4))
    config = GuardConfig(
        timeout=TimeoutConfig(attempt=0.5, deadline=DEADLINE, critical_deadline=DEADLINE),
        dead_letter=DeadLetterConfig(path=str(tmp_path / "spill.db"), drain_timeout=DRAIN),
    )
    store = guard(backend, config=config, registry=CollectorRegistry())
    await store.save_memory_state("warm", {"x": 1})  # the pool has its connection, the schema is there
    own_bouncer.stall()
    try:
        durations, closed_in = await two_rounds_then_close(store, calls())
    finally:
        own_bouncer.resume()
    assert max(took for _, took, _ in durations) > DEADLINE / 2, "the stall was not felt"
    late = [(kind, round(took, 3), outcome) for kind, took, outcome in durations if took > DEADLINE + SLACK]
    assert not late, f"over the {DEADLINE}s deadline: {late}"
    assert closed_in <= DRAIN + 0.5 + SLACK, f"aclose() took {closed_in:.3f}s"
