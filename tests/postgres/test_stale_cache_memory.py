"""Once found: "49 MB held after one 100,000-event ``load_history``" through ``guard()``.

The stale cache kept the whole answer (bounded by entries only). With ``stale.max_bytes`` an
answer estimated above an eighth of the bound is not kept: what the guard holds after the call
is measured with ``tracemalloc`` (margins generous: the claim is tens of megabytes against one).
A smaller history is still kept and served when the backend fails.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from benchmarks.postgres_bench import make_events
from guarded.backends.postgres import PostgresStateStore
from guarded.config import BatchConfig, BreakerConfig, GuardConfig, RetryConfig, StaleConfig, TimeoutConfig
from guarded.guard import controller, guard
from guarded.models import StoredEvent

from .conftest import StoreFactory

EVENTS = 100_000


def _events(trace_id: str, count: int) -> list[StoredEvent]:
    """PenguiFlow-shaped runtime events, as the benchmarks make them."""
    return make_events(count, trace_id)


def _config(**stale: Any) -> GuardConfig:
    # The claim is about memory, not latency: a 100,000-event read under tracemalloc on a loaded
    # 2-core machine takes several times the production attempt timeout.
    return GuardConfig(
        timeout=TimeoutConfig(attempt=120, deadline=240, critical_deadline=240),
        retry=RetryConfig(max_attempts=1, critical_max_attempts=1),
        breaker=BreakerConfig(enabled=False),
        batching=BatchConfig(enabled=False),
        stale=StaleConfig(**stale),
    )


async def _held_after_load(store: PostgresStateStore, trace_id: str, config: GuardConfig) -> tuple[int, int]:
    """Bytes still allocated after one guarded ``load_history`` whose answer was dropped, and
    the events it answered."""
    registry = CollectorRegistry()
    guarded: Any = guard(store, registry=registry, config=config)
    await guarded.load_history("warm-up")  # opens the guard: its own allocations are not counted
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history = await guarded.load_history(trace_id)
        count = len(history)
        del history
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    await controller(guarded).aclose()
    return held, count


@pytest.mark.asyncio
async def test_one_100k_event_history_is_not_held_by_the_stale_cache(make_store: StoreFactory) -> None:
    store = await make_store()
    for start in range(0, EVENTS, 10_000):
        await store.save_events(_events("big", EVENTS)[start : start + 10_000])

    # The finding, reproduced: bounded by entries alone (a byte bound too large to matter),
    # the cache holds the whole answer.
    held_before, count = await _held_after_load(store, "big", _config(max_bytes=2**40))
    assert count == EVENTS
    assert held_before > 30_000_000, held_before

    held, count = await _held_after_load(
        await make_store(), "big", _config()
    )  # closing a guard closes its store
    assert count == EVENTS
    assert held < 2_000_000, held


@pytest.mark.asyncio
async def test_a_smaller_history_is_kept_and_served_during_an_outage(store: PostgresStateStore) -> None:
    await store.save_events(_events("small", 1_000))
    registry = CollectorRegistry()
    guarded: Any = guard(store, registry=registry, config=_config())
    history = await guarded.load_history("small")
    assert len(history) == 1_000
    held = registry.get_sample_value("guarded_stale_cache_bytes", {"store": "default"})
    assert held is not None
    assert 100_000 < held < 8 * 1024 * 1024

    await store.close()  # the backend fails from now on
    stale = await guarded.load_history("small")
    assert [event.node_id for event in stale] == [event.node_id for event in history]
    assert (
        registry.get_sample_value(
            "guarded_store_calls_total", {"store": "default", "method": "load_history", "outcome": "stale"}
        )
        == 1
    )
    await controller(guarded).aclose()
