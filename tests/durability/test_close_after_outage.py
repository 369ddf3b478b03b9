"""Closing a guard right after an outage delivers everything (``aclose()`` uses its whole budget:
it waits out the open breaker, then sends in bulk). Default configuration; own server."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from guarded.guard import controller, guard
from guarded.layers.breaker import BreakerState
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres._outages import differences, open_store

from ._support import eventually
from ._worker import MixedLedger, describe, perform_mixed, read_back_mixed

WRITERS = 20


@pytest.mark.asyncio
async def test_closing_one_second_after_an_outage_leaves_every_acknowledged_write_in_the_database(
    server: EmbeddedPostgres, schema_name: str
) -> None:
    """20 writers of every write method through a 1.5 s outage; the guard is closed 1 s after the
    database is back, its breaker still open (``open_duration`` 10 s by default)."""
    store = guard(await open_store(server.dsn, schema_name), registry=CollectorRegistry())
    assert controller(store).config.breaker.open_duration >= 5  # still open at close
    ledger = MixedLedger()
    stop = asyncio.Event()

    async def writer(number: int) -> None:
        index = 0
        while not stop.is_set():
            await perform_mixed(store, ledger, number, index)
            index += 1
            await asyncio.sleep(0.01)

    writers = [asyncio.create_task(writer(number)) for number in range(WRITERS)]
    try:
        await eventually(lambda: ledger.calls >= 400, what="writes before the outage")
        await asyncio.to_thread(server.stop)
        down_at = ledger.calls
        await asyncio.sleep(1.5)  # the outage
        await eventually(lambda: ledger.calls >= down_at + 100, what="writes during the outage")
        await asyncio.to_thread(server.start)
        await asyncio.sleep(1.0)  # the database is back; the guard is closed one second later
    finally:
        stop.set()
        await asyncio.gather(*writers)
    breaker_at_close = controller(store).breaker.state
    await controller(store).aclose()

    assert ledger.errors == []
    found = await read_back_mixed(server.dsn, schema_name)
    problems = differences(ledger, found)
    assert not problems, describe(problems)
    # The scenario: the outage opened the breaker, and it had not let calls through yet at close.
    assert breaker_at_close in (BreakerState.OPEN, BreakerState.HALF_OPEN), breaker_at_close
