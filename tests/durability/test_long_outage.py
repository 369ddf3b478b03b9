"""100,000 writes during an outage with the default configuration: held in the default spill file
(beyond the in-memory caps), none dropped, all delivered once the database is back. Own server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.guard import controller, guard
from guarded.models import StoredEvent
from guarded.observability import telemetry_names as names
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres._outages import Ledger, drain_all, open_store, read_back
from tests.support.metrics import total

from ._support import pending_on_disk

WRITERS, PER_WRITER = 100, 1_000
UPSERT_EVERY = 5
"""Write ``i`` of a writer is a memory state when ``i % 5 == 4`` (20,000 upserts on 10 keys per
writer), an event otherwise (80,000, flushed in bulk)."""
MEMORY_KEYS = 10
EVENTS = WRITERS * PER_WRITER * (UPSERT_EVERY - 1) // UPSERT_EVERY


@pytest.mark.asyncio
async def test_a_hundred_thousand_writes_during_an_outage_are_all_delivered(
    server: EmbeddedPostgres, schema_name: str, state_home: Path
) -> None:
    registry = CollectorRegistry()
    store = guard(await open_store(server.dsn, schema_name), registry=registry)
    name = controller(store).name
    ledger = Ledger()

    async def writer(number: int) -> None:
        trace = f"long-{number}"
        for index in range(PER_WRITER):
            try:
                if index % UPSERT_EVERY == UPSERT_EVERY - 1:
                    key, state = f"mem-{number}-{index // UPSERT_EVERY % MEMORY_KEYS}", {"i": index}
                    await store.save_memory_state(key, state)
                    ledger.memory[key] = state
                else:
                    await store.save_event(
                        StoredEvent(trace, float(index), "node_end", "node", f"n{index}", {})
                    )
                    ledger.events[(trace, f"n{index}")] += 1
            except Exception as exc:  # a guarded store never raises
                ledger.errors.append(exc)

    closed = False
    try:
        await asyncio.to_thread(server.stop)
        await asyncio.gather(*(writer(number) for number in range(WRITERS)))
        await controller(store).flush()  # a no-op when each write waits for its commit
        assert ledger.errors == []
        assert sum(ledger.events.values()) == EVENTS
        dropped = total(registry, names.DLQ_DROPPED, name)
        assert dropped == 0, f"{dropped} acknowledged writes were dropped during the outage"
        buffer = controller(store).dead_letters
        assert buffer is not None
        # Every event, and the last state of every memory key (older held states are superseded) ...
        expected_held = EVENTS + len(ledger.memory)
        assert buffer.depth == expected_held, f"{buffer.depth} writes held, {expected_held} expected"
        # ... all in the spill file.
        assert await asyncio.to_thread(pending_on_disk, state_home) == expected_held

        await asyncio.to_thread(server.start)
        left = await drain_all(store, seconds=60)
        await controller(store).aclose()
        closed = True
    finally:
        if not closed:
            await controller(store).aclose()
    assert left == 0
    assert total(registry, names.DLQ_DROPPED, name) == 0
    found = await read_back(server.dsn, schema_name)
    assert sum(found.events.values()) == EVENTS
    assert found.events == ledger.events
    assert found.memory == ledger.memory
