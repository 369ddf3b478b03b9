"""Under overload the guard bends: a call that cannot be admitted in time is answered as in an
outage — reads from the stale cache (or their fallback), writes committed to the spill file and
replayed once the load passes — never dropped, never parked as bad data.

One permit (``bulkhead.max_concurrent=1``) in front of a scripted backend that takes 0.1 s per
call, and a line of reads ahead (their method has time to wait: they all get in, one after the
other). The calls under test have a deadline of 0.5 s and attempts of 0.3 s: they may wait 0.25 s
(half the deadline is kept for the backend), not enough for the line ahead of them. The line
moves (calls keep succeeding), so their admission timeouts are overload, not a failing backend:
the breaker does not count them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import BatchConfig, BulkheadConfig, DeadLetterConfig, MethodConfig, StaleConfig
from guarded.guard import controller, guard
from guarded.observability import telemetry_names as names
from tests.guard.support import fast_config
from tests.support.metrics import calls

from .support import SlowStore, breaker_config, event

SLOW = 0.1
AHEAD = 6


def overloaded(tmp_path: Path) -> tuple[Any, SlowStore, CollectorRegistry]:
    backend = SlowStore(max_concurrency=100)  # the configured limit wins
    registry = CollectorRegistry()
    config = fast_config(
        attempt=0.3,
        deadline=0.5,
        breaker=breaker_config(1.0),
        bulkhead=BulkheadConfig(max_concurrent=1),
        batching=BatchConfig(),
        dead_letter=DeadLetterConfig(path=str(tmp_path / "spill.sqlite"), replay_rate=10_000),
        stale=StaleConfig(),
        methods={"load_history": MethodConfig(attempt_timeout=1.0, deadline=2.0)},
    )
    return guard(backend, registry=registry, config=config), backend, registry


async def occupy(store: Any, backend: SlowStore) -> asyncio.Future[list[Any]]:
    """Put :data:`AHEAD` slow reads in line (they may wait 1 s: each gets in and completes), so
    the next callers wait behind them."""
    backend.delay = SLOW
    ahead = asyncio.gather(*(store.load_history(f"busy-{index}") for index in range(AHEAD)))
    await asyncio.sleep(0.02)
    assert backend.active == 1
    return ahead


@pytest.mark.asyncio
async def test_reads_answer_from_the_stale_cache_when_they_cannot_be_admitted(tmp_path: Path) -> None:
    store, backend, registry = overloaded(tmp_path)
    await store.save_memory_state("m", {"turns": ["a"]})
    holder = await occupy(store, backend)
    assert await store.load_memory_state("m") == {"turns": ["a"]}  # not None: stale, not "no memory"
    assert calls(registry, "load_memory_state", "stale") == 1
    assert await store.load_memory_state("never-seen") is None  # nothing to serve: the fallback
    assert calls(registry, "load_memory_state", "timeout") == 1
    assert await holder == [[]] * AHEAD
    assert calls(registry, "load_history", "ok") == AHEAD
    assert controller(store).breaker.state.value == "closed"
    await controller(store).aclose()


@pytest.mark.asyncio
async def test_writes_that_cannot_be_admitted_are_committed_to_the_spill_file_and_replayed(
    tmp_path: Path,
) -> None:
    store, backend, registry = overloaded(tmp_path)
    await store.save_memory_state("warm", {})  # the spill file is open before the load comes
    holder = await occupy(store, backend)
    results = await asyncio.gather(
        store.save_memory_state("m", {"turns": ["b"]}),
        *(store.save_event(event("t", index)) for index in range(5)),  # one group commit
    )
    assert results == [None] * 6  # acknowledged
    assert calls(registry, "save_memory_state", "dead_lettered") == 1
    buffer = controller(store).dead_letters
    assert buffer is not None
    stats = await buffer.stats()
    assert stats.depth == 6
    assert stats.spill_available is True
    assert stats.memory_only == 0  # committed to the spill file, not only in this process
    assert stats.parked == 0
    assert stats.dropped_total == 0
    held = await buffer.entries()
    assert {entry.error for entry in held} <= {"timeout", "guarded.layers.bulkhead.BulkheadTimeoutError"}
    # Read-your-writes while the write is held.
    assert await store.load_memory_state("m") == {"turns": ["b"]}
    assert await holder == [[]] * AHEAD
    assert calls(registry, "save_event", "dead_lettered") == 5

    backend.delay = 0.0  # the load has passed
    assert await controller(store).drain(5.0) == 0
    assert await backend.load_memory_state("m") == {"turns": ["b"]}
    assert len(await backend.load_history("t")) == 5
    stats = await buffer.stats()
    assert (stats.parked_total, stats.dropped_total) == (0, 0)
    assert registry.get_sample_value(
        names.DLQ_PARKED, {"store": "default", "method": "save_memory_state"}
    ) in (None, 0)
    assert controller(store).breaker.state.value == "closed"
    await controller(store).aclose()
