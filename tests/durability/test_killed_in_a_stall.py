"""SIGKILL of the guarded process while the server is stalled: the next process on the same spill
path delivers every write the killed one acknowledged, exactly once. Own server (it is stalled)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.guard import guard
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres._outages import drain_all, open_store

from ._support import Stall, Worker, eventually
from ._worker import describe, landed_differences, read_back_mixed

WRITERS = 16


@pytest.mark.asyncio
async def test_writes_acknowledged_before_a_kill_in_a_stalled_server_all_land_once(
    server: EmbeddedPostgres, schema_name: str, state_home: Path, tmp_path: Path
) -> None:
    """The worker (default spill path under the test's ``XDG_STATE_HOME``, short timeouts) writes
    every method from 16 writers; the server is stalled (SIGSTOP of the postmaster and its children),
    the worker keeps acknowledging (held in its spill file), and 3 s into the stall it is killed. Then
    the server resumes and a new process (this one) opens a guard with the default configuration on
    the same state directory and drains."""
    arguments = ["ack", "--dsn", server.dsn, "--schema", schema_name, "--writers", str(WRITERS)]
    worker = Worker(
        [*arguments, "--pause", "0.005", "--fast"], state_home=state_home, log=tmp_path / "worker.log"
    )
    stall = Stall(server)
    try:
        await eventually(lambda: worker.acked >= 300 or worker.exited(), what="writes before the stall")
        assert not worker.exited(), worker.stderr()
        stall.stop()
        stalled_at = worker.acked
        await asyncio.sleep(3.0)  # 3 s into the stall ...
        # ... and with writes acknowledged during it (dead-lettered: only in the spill file).
        await eventually(lambda: worker.acked >= stalled_at + 2 * WRITERS, what="writes during the stall")
        worker.kill()
    finally:
        worker.kill()
        stall.resume()
    assert worker.errors == []
    acked, at_most = worker.ledgers(range(WRITERS))
    assert acked.calls >= stalled_at + 2 * WRITERS

    async with guard(await open_store(server.dsn, schema_name), registry=CollectorRegistry()) as store:
        left = await drain_all(store, seconds=60)
    assert left == 0
    found = await read_back_mixed(server.dsn, schema_name)
    problems = landed_differences(acked, at_most, found)
    assert not problems, describe(problems)
