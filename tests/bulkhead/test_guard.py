"""The bulkhead inside guard(): sizing, configuration, the breaker and the timeout around it,
the guard's own calls, metrics.

The backends are scripted (:class:`~tests.bulkhead.support.SlowStore`: every call takes a fixed
time in the backend). Waits are long compared with the slow-call durations used, and limits on
elapsed time leave room for a loaded two-core machine.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from guarded.backend import MAX_CONCURRENCY
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, BulkheadConfig, DeadLetterConfig, GuardConfig, MethodConfig
from guarded.guard import controller, guard
from guarded.layers.breaker import BreakerState
from guarded.layers.bulkhead import Bulkhead
from guarded.observability import telemetry_names as names
from tests.guard.support import fast_config
from tests.support.metrics import calls, outcome_counts, retries

from .support import SlowStore, breaker_config, event


def guarded(backend: Any, registry: CollectorRegistry | None = None, **config: Any) -> Any:
    return guard(backend, registry=registry or CollectorRegistry(), config=fast_config(**config))


def bulkhead_of(store: Any) -> Bulkhead:
    found = controller(store).bulkhead
    assert found is not None
    return found


# --- sizing and configuration ------------------------------------------------------------------------


def test_the_limit_is_what_the_backend_declares() -> None:
    store = guarded(SlowStore(max_concurrency=7))
    assert MAX_CONCURRENCY == "max_concurrency"
    assert bulkhead_of(store).limit == 7


def test_the_configured_limit_wins_over_the_backend() -> None:
    store = guarded(SlowStore(max_concurrency=7), bulkhead=BulkheadConfig(max_concurrent=3))
    assert bulkhead_of(store).limit == 3
    unlimited_backend = guarded(InMemoryStateStore(), bulkhead=BulkheadConfig(max_concurrent=2))
    assert bulkhead_of(unlimited_backend).limit == 2


def test_no_bulkhead_when_the_backend_says_nothing_or_it_is_disabled() -> None:
    assert controller(guarded(InMemoryStateStore())).bulkhead is None
    assert controller(guarded(SlowStore(max_concurrency=None))).bulkhead is None
    disabled = BulkheadConfig(enabled=False, max_concurrent=4)
    assert controller(guarded(SlowStore(max_concurrency=7), bulkhead=disabled)).bulkhead is None
    assert GuardConfig().bulkhead == BulkheadConfig(enabled=True, max_concurrent=None)


@pytest.mark.parametrize("nonsense", [0, -1, -100])
def test_a_limit_below_one_is_refused_with_a_clear_error(nonsense: int) -> None:
    with pytest.raises(ValidationError, match=r"bulkhead.max_concurrent must be at least 1"):
        GuardConfig(bulkhead={"max_concurrent": nonsense})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"bulkhead.max_concurrent must be at least 1"):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), bulkhead={"max_concurrent": nonsense})


@pytest.mark.parametrize(
    ("declared", "error"), [(0, ValueError), (-2, ValueError), ("10", TypeError), (True, TypeError)]
)
def test_a_backend_declaring_nonsense_is_refused_when_guarded(
    declared: object, error: type[Exception]
) -> None:
    backend = SlowStore()
    backend.max_concurrency = declared  # type: ignore[assignment]
    with pytest.raises(error, match="max_concurrency"):
        guarded(backend)


@pytest.mark.asyncio
async def test_an_unlimited_guard_has_no_bulkhead_in_its_chain() -> None:
    # The zero-overhead path: no layer, no statistics, no metrics.
    registry = CollectorRegistry()
    store = guarded(InMemoryStateStore(), registry)
    await store.save_memory_state("k", {"v": 1})
    assert await store.load_memory_state("k") == {"v": 1}
    assert registry.get_sample_value(names.BULKHEAD_LIMIT, {"store": "default"}) is None


# --- the limit holds for every call, the guard's own included -----------------------------------------


@pytest.mark.asyncio
async def test_public_calls_flushes_and_replays_share_the_limit() -> None:
    backend = SlowStore(delay=0.01, max_concurrency=2)
    store = guarded(
        backend,
        deadline=5.0,
        attempt=2.0,
        batching=BatchConfig(max_concurrent_flushes=4),
        dead_letter=DeadLetterConfig(path=None),
    )
    backend.down = True
    await asyncio.gather(*(store.save_memory_state(f"held{index}", {"i": index}) for index in range(20)))
    buffer = controller(store).dead_letters
    assert buffer is not None
    assert buffer.depth == 20
    backend.down = False
    backend.peak = 0
    writes = [store.save_event(event(f"t{index % 5}", index)) for index in range(60)]  # flushed in bulk
    writes += [store.save_memory_state(f"k{index}", {"i": index}) for index in range(30)]
    reads = [store.load_memory_state(f"k{index}") for index in range(30)]
    await asyncio.gather(controller(store).drain(5.0), *writes, *reads)  # the replay runs alongside
    assert backend.peak == 2
    assert buffer.depth == 0
    assert bulkhead_of(store).in_use == 0
    history = 0
    for index in range(5):
        history += len(await store.load_history(f"t{index}"))
    assert history == 60
    await controller(store).aclose()


# --- the breaker measures the backend only ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_queueing_for_a_slow_but_healthy_backend_never_opens_the_breaker() -> None:
    # 60 callers, 2 at a time, 50 ms each: the last waits about 1.5 s, far over the 0.2 s
    # slow-call duration. Without the bulkhead (waiting inside the measured time) it opens.
    backend = SlowStore(delay=0.05, max_concurrency=2)
    registry = CollectorRegistry()
    store = guarded(backend, registry, attempt=1.0, deadline=10.0, breaker=breaker_config(0.2))
    transitions: list[tuple[BreakerState, BreakerState]] = []
    controller(store).breaker.add_listener(lambda old, new: transitions.append((old, new)))
    await asyncio.gather(*(store.load_memory_state(f"k{index}") for index in range(60)))
    assert transitions == []
    assert controller(store).breaker.state is BreakerState.CLOSED
    assert outcome_counts(registry) == {"not_found": 60}
    assert backend.peak == 2
    stats = bulkhead_of(store).stats("load_memory_state")
    assert stats.waits.count >= 50
    assert stats.waits.total / stats.waits.count > 0.2  # they did queue, on average longer than "slow"


@pytest.mark.asyncio
async def test_the_same_calls_without_a_bulkhead_open_the_breaker() -> None:
    # The control of the test above: the promise is about the bulkhead, not a lenient breaker.
    backend = SlowStore(delay=0.05, max_concurrency=2)
    lock = asyncio.Semaphore(2)  # the backend's own pool: callers wait inside the measured time
    original = backend.load_memory_state

    async def pooled(key: str) -> Any:
        async with lock:
            return await original(key)

    backend.load_memory_state = pooled  # type: ignore[method-assign]
    store = guarded(
        backend,
        attempt=1.0,
        deadline=10.0,
        breaker=breaker_config(0.2),
        bulkhead=BulkheadConfig(enabled=False),
    )
    await asyncio.gather(*(store.load_memory_state(f"k{index}") for index in range(60)))
    assert controller(store).breaker.state is BreakerState.OPEN


@pytest.mark.asyncio
async def test_a_truly_slow_backend_still_opens_the_breaker() -> None:
    backend = SlowStore(delay=0.3, max_concurrency=4)
    store = guarded(backend, attempt=1.0, deadline=10.0, breaker=breaker_config(0.2))
    await asyncio.gather(*(store.load_memory_state(f"k{index}") for index in range(8)))
    assert controller(store).breaker.state is BreakerState.OPEN


@pytest.mark.asyncio
async def test_admission_timeouts_are_neither_retried_nor_counted_by_the_breaker() -> None:
    # One call at a time, 100 ms each; with a deadline of 0.5 s a caller may wait 0.25 s (half the
    # deadline is kept for the backend): two or three of the 20 callers get in, the others time
    # out in a line that moves (calls succeed meanwhile) — overload, not a failing backend.
    backend = SlowStore(delay=0.1, max_concurrency=1)
    registry = CollectorRegistry()
    store = guarded(backend, registry, attempt=0.4, deadline=0.5, breaker=breaker_config(1.0))
    results = await asyncio.gather(*(store.load_memory_state(f"k{index}") for index in range(20)))
    assert results == [None] * 20
    timed_out = calls(registry, "load_memory_state", "timeout")
    admitted = calls(registry, "load_memory_state", "not_found")
    assert timed_out + admitted == 20
    assert timed_out >= 15
    assert backend.calls == admitted  # nothing else was sent
    assert retries(registry, "load_memory_state") == 0
    assert controller(store).breaker.state is BreakerState.CLOSED  # 15 or more "failures" of 20
    assert bulkhead_of(store).stats("load_memory_state").timeouts == timed_out


@pytest.mark.asyncio
async def test_admission_timeouts_behind_a_stalled_backend_open_the_breaker() -> None:
    # The line does not move at all: nothing succeeds in the backend while callers wait. That is
    # the backend's doing (a stalled server), and the breaker hears of it at once.
    backend = SlowStore(delay=30.0, max_concurrency=2)
    registry = CollectorRegistry()
    store = guarded(backend, registry, attempt=0.2, deadline=0.5, breaker=breaker_config(1.0))
    await asyncio.gather(*(store.load_memory_state(f"k{index}") for index in range(12)))
    assert controller(store).breaker.state is BreakerState.OPEN
    assert calls(registry, "load_memory_state", "timeout") == 12


# --- the attempt timeout starts at admission -------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_attempt_is_timed_from_its_admission_not_from_the_start_of_the_call() -> None:
    # 150 ms in the backend, 250 ms per attempt: the second caller waits 150 ms in line, then
    # gets its whole attempt (timed from the call's start it would time out after 100 ms).
    backend = SlowStore(delay=0.15, max_concurrency=1)
    registry = CollectorRegistry()
    store = guarded(backend, registry, attempt=0.25, deadline=2.0, max_attempts=1)
    await asyncio.gather(store.load_memory_state("a"), store.load_memory_state("b"))
    assert calls(registry, "load_memory_state", "not_found") == 2
    assert outcome_counts(registry) == {"not_found": 2}


@pytest.mark.asyncio
async def test_a_per_method_attempt_timeout_sets_that_methods_reserve() -> None:
    backend = SlowStore(delay=0.3, max_concurrency=1)
    registry = CollectorRegistry()
    methods = {"load_memory_state": MethodConfig(attempt_timeout=0.05, deadline=0.5)}
    store = guarded(
        backend, registry, attempt=1.0, deadline=2.0, methods=methods, breaker=breaker_config(10.0)
    )
    loop = asyncio.get_running_loop()
    holder = asyncio.create_task(store.save_memory_state("k", {"v": 1}))
    await asyncio.sleep(0.01)
    began = loop.time()
    assert await store.load_memory_state("k") is None  # waits until 0.45 s, then times out in line
    assert 0.44 <= loop.time() - began <= 0.5 + 0.2
    assert calls(registry, "load_memory_state", "timeout") == 1
    await holder


# --- metrics ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_queue_depth_permits_wait_time_and_timeouts_are_exported() -> None:
    # Wide margins for a loaded machine: the waiters give up at 0.6 s (half the deadline left),
    # well before the holders leave the backend (0.8 s), well before their attempt timeout (1.1 s).
    backend = SlowStore(delay=0.8, max_concurrency=2)
    registry = CollectorRegistry()
    config = fast_config(attempt=1.1, deadline=1.2, max_attempts=1)
    store = guard(backend, name="primary", registry=registry, config=config)
    tasks = [asyncio.create_task(store.load_memory_state(f"k{index}")) for index in range(6)]
    await asyncio.sleep(0.05)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"store": "primary", **labels})

    assert sample(names.BULKHEAD_LIMIT) == 2
    assert sample(names.BULKHEAD_IN_USE) == 2
    assert sample(names.BULKHEAD_QUEUE_DEPTH) == 4
    await asyncio.gather(*tasks)  # the 4 waiters time out at 0.6 s
    assert sample(names.BULKHEAD_QUEUE_DEPTH) == 0
    assert sample(names.BULKHEAD_IN_USE) == 0
    method = {"method": "load_memory_state"}
    assert sample(names.BULKHEAD_TIMEOUTS, **method) == 4
    assert sample(names.BULKHEAD_WAIT + "_count", **method) == 6  # 2 admitted at once, 4 waits
    assert sample(names.BULKHEAD_WAIT + "_bucket", le="0.0001", **method) == 2
    assert (sample(names.BULKHEAD_WAIT + "_sum", **method) or 0) >= 4 * 0.5
    assert calls(registry, "load_memory_state", "timeout", store="primary") == 4


def test_metric_names_follow_the_conventions() -> None:
    for name in (names.BULKHEAD_LIMIT, names.BULKHEAD_IN_USE, names.BULKHEAD_QUEUE_DEPTH):
        assert name.startswith("guarded_bulkhead_")
    assert names.BULKHEAD_WAIT.endswith("_seconds")
    assert names.BULKHEAD_TIMEOUTS.endswith("_total")
