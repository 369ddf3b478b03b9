"""Group commit is the default: a guarded write returns once it is committed. So a process that
never closes its guard loses nothing, and another connection sees a row as soon as ``save_event``
returned. The session server; nothing is stopped."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.guard import controller, guard
from guarded.models import StoredEvent
from tests.postgres._outages import read_back

from ._support import REPO, worker_env

EVENTS = 2_000


@pytest.mark.asyncio
async def test_a_process_that_never_closes_its_guard_leaves_every_write_in_the_database(
    pg_dsn: str, schema_name: str, state_home: Path
) -> None:
    """The README's first snippet, 2,000 ``save_event`` from 20 tasks, and ``asyncio.run`` returns
    without closing the guard (no ``async with``, no ``aclose()``)."""
    arguments = ["readme", pg_dsn, schema_name, str(EVENTS), "20"]
    process = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.durability._worker", *arguments],
        cwd=REPO,
        env=worker_env(state_home),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    assert process.stdout.split() == ["done"]

    events = (await read_back(pg_dsn, schema_name)).events
    missing = EVENTS - sum(events.values())
    assert missing == 0, f"{missing} of {EVENTS} acknowledged events are not in the database"
    assert events == {("readme", f"n{index}"): 1 for index in range(EVENTS)}


@pytest.mark.asyncio
async def test_another_connection_sees_each_event_once_save_event_returned(
    pg_dsn: str, schema_name: str
) -> None:
    tries = 1_000
    store = guard(
        await PostgresStateStore.connect(pg_dsn, schema=schema_name, registry=CollectorRegistry()),
        registry=CollectorRegistry(),
    )
    other = await asyncpg.connect(pg_dsn)
    misses: list[int] = []
    try:
        query = f'SELECT count(*) FROM "{schema_name}".flow_events WHERE trace_id = $1 AND node_id = $2'
        for index in range(tries):
            await store.save_event(StoredEvent("seen", float(index), "node_end", "node", f"n{index}", {}))
            if await other.fetchval(query, "seen", f"n{index}") != 1:
                misses.append(index)
    finally:
        await other.close()
        await controller(store).aclose()
    assert len(misses) == 0, f"{len(misses)} of {tries} events were not visible once save_event returned"
