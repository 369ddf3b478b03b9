"""Deadlines hold on a server that accepts connections but never answers.

Every PostgreSQL process is SIGSTOPped: connections, statements, cancel requests and resets all
hang without an error. Each guarded call must still return (or fail) within its deadline, calls
waiting for a pool connection included, and ``aclose()`` within ``dead_letter.drain_timeout``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.postgres import PostgresStateStore
from backends.postgres.connection import PoolSettings
from guarded.config import DeadLetterConfig, GuardConfig, TimeoutConfig
from guarded.guard import guard
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres
from tests.durability._support import Stall, thaw
from tests.postgres._outages import two_rounds_then_close, write_call

DEADLINE = 1.0
DRAIN = 1.0
SLACK = 0.75
"""A loaded 2-core machine: the event loop itself may run this late. A full garbage collection of
the whole suite's heap (about 600,000 objects) stops the process for 0.7 s at rest and more under
load; the stall the deadline cuts lasts until the test resumes the server, seconds later."""


@pytest.fixture(scope="module")
def stalled_server() -> Iterator[EmbeddedPostgres]:
    with embedded_postgres() as own:
        try:
            yield own
        finally:
            thaw(own)


def calls() -> list[tuple[str, Callable[[Any], Awaitable[Any]]]]:
    made: list[tuple[str, Callable[[Any], Awaitable[Any]]]] = []
    for worker in range(3):
        for index in range(8):
            kind, call, _ = write_call(worker, index)
            made.append((kind, call))
        made.append(("load_memory_state", lambda store, w=worker: store.load_memory_state(f"mem-{w}")))
        made.append(("load_history", lambda store, w=worker: store.load_history(f"trace-{w}")))
        made.append(("load_planner_state", lambda store, w=worker: store.load_planner_state(f"tok-{w}")))
        made.append(("list_tasks", lambda store, w=worker: store.list_tasks(f"sess-{w}")))
    return made


@pytest.mark.asyncio
async def test_every_call_keeps_its_deadline_on_a_stalled_server(
    stalled_server: EmbeddedPostgres, schema_name: str, tmp_path: Path
) -> None:
    backend = await PostgresStateStore.connect(
        stalled_server.dsn,
        schema=schema_name,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(min_size=1, max_size=4),
    )
    config = GuardConfig(
        timeout=TimeoutConfig(attempt=0.5, deadline=DEADLINE, critical_deadline=DEADLINE),
        dead_letter=DeadLetterConfig(path=str(tmp_path / "spill.db"), drain_timeout=DRAIN),
    )
    store = guard(backend, config=config, registry=CollectorRegistry())
    # Warm up: the pool has its connection, the schema is there.
    await store.save_memory_state("warm", {"x": 1})
    stall = Stall(stalled_server)
    try:
        stall.stop()
        durations, closed_in = await two_rounds_then_close(store, calls())
    finally:
        stall.resume()
    longest = max(took for _, took, _ in durations)
    print(f"longest call {longest:.3f}s, aclose() {closed_in:.3f}s")
    late = [(kind, round(took, 3), outcome) for kind, took, outcome in durations if took > DEADLINE + SLACK]
    assert not late, f"over the {DEADLINE}s deadline: {late}"
    # The drain's budget, then at most half a second for the store's own close.
    assert closed_in <= DRAIN + 0.5 + SLACK, f"aclose() took {closed_in:.3f}s"
