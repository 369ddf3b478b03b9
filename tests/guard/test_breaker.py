"""The circuit breaker: the pure state machine on a fake clock, then through guard()."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import BreakerConfig
from guarded.guard import controller, guard
from guarded.layers.breaker import BreakerState, CircuitBreaker
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import calls

from .support import Stopwatch, fast_config

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def breaker(clock: Clock, **fields: object) -> CircuitBreaker:
    settings: dict[str, object] = {
        "window": "count",
        "window_size": 10,
        "minimum_calls": 4,
        "failure_rate_threshold": 0.5,
        "slow_call_rate_threshold": 0.5,
        "slow_call_duration": 1.0,
        "open_duration": 5.0,
        "half_open_probes": 2,
    }
    settings.update(fields)
    return CircuitBreaker(BreakerConfig.model_validate(settings), clock=clock)


def run(b: CircuitBreaker, *results: str, duration: float = 0.01) -> None:
    """Admit and record one call per result: "ok", "fail", "slow", "slow-fail"."""
    for result in results:
        ticket = b.allow()
        assert ticket is not None, f"refused in state {b.state}"
        b.record(ticket, failed="fail" in result, duration=5.0 if "slow" in result else duration)


def test_failure_rate_trips_once_minimum_calls_are_recorded() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "fail", "fail", "fail")
    assert b.state is CLOSED  # 100% failures, but only 3 of the 4 minimum calls
    run(b, "fail")
    assert b.state is OPEN
    assert b.allow() is None


def test_failure_rate_below_threshold_stays_closed() -> None:
    b = breaker(Clock())
    run(b, *["ok", "ok", "fail"] * 4)  # 33% < 50%
    assert b.state is CLOSED
    assert math.isclose(b.failure_rate, 4 / 10)  # the window keeps the last 10 calls
    run(b, "fail")  # the oldest failure leaves the window: still 4 of 10
    assert b.state is CLOSED
    run(b, "fail")  # 5 of 10
    assert b.state is OPEN


def test_failure_rate_exactly_at_threshold_trips() -> None:
    b = breaker(Clock())
    run(b, "ok", "ok", "fail")
    assert b.state is CLOSED
    run(b, "fail")  # 2 of 4 = 50%
    assert b.state is OPEN


def test_slow_call_rate_trips_without_failures() -> None:
    b = breaker(Clock())
    run(b, "ok", "slow", "slow")
    assert b.state is CLOSED
    run(b, "slow")  # 3 of 4 slow
    assert b.state is OPEN


def test_minimum_calls_never_exceeds_a_count_window() -> None:
    b = breaker(Clock(), window_size=3, minimum_calls=10)
    run(b, "fail", "fail", "fail")
    assert b.state is OPEN


def test_open_then_half_open_after_open_duration() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "fail", "fail", "fail", "fail")
    clock.advance(4.9)
    assert b.state is OPEN
    assert b.allow() is None
    clock.advance(0.1)
    assert b.state is HALF_OPEN
    first, second = b.allow(), b.allow()
    assert first is not None
    assert second is not None
    assert b.allow() is None  # only half_open_probes calls at a time


def test_successful_probes_close_with_a_fresh_window() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "fail", "fail", "fail", "fail")
    clock.advance(5)
    run(b, "ok")
    assert b.state is HALF_OPEN
    run(b, "ok")
    assert b.state is CLOSED
    run(b, "fail", "fail", "fail")  # the old failures are forgotten
    assert b.state is CLOSED


def test_failed_probes_reopen_for_another_open_duration() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "fail", "fail", "fail", "fail")
    clock.advance(5)
    run(b, "ok", "fail")  # 1 of 2 probes failed: 50% >= threshold
    assert b.state is OPEN
    clock.advance(4.9)
    assert b.allow() is None
    clock.advance(0.1)
    assert b.state is HALF_OPEN


def test_slow_probes_reopen() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "slow", "slow", "slow", "slow")
    assert b.state is OPEN
    clock.advance(5)
    run(b, "slow", "slow")
    assert b.state is OPEN


def test_released_probe_frees_its_slot() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "fail", "fail", "fail", "fail")
    clock.advance(5)
    first, second = b.allow(), b.allow()
    assert first is not None
    assert second is not None
    assert b.allow() is None
    b.release(first)  # cancelled: no result
    third = b.allow()
    assert third is not None
    b.record(second, failed=False, duration=0.01)
    b.record(third, failed=False, duration=0.01)
    assert b.state is CLOSED


def test_forced_open_disabled_and_reset() -> None:
    clock = Clock()
    b = breaker(clock)
    b.force_open()
    assert b.state is BreakerState.FORCED_OPEN
    clock.advance(3600)
    assert b.allow() is None
    assert b.state is BreakerState.FORCED_OPEN

    b.disable()
    assert b.state is BreakerState.DISABLED
    run(b, *["fail"] * 20, duration=5.0)
    assert b.state is BreakerState.DISABLED  # records nothing

    b.reset()
    assert b.state is CLOSED
    assert b.failure_rate == 0.0
    run(b, "fail", "fail", "fail")
    assert b.state is CLOSED


def test_disabled_by_configuration() -> None:
    b = CircuitBreaker(BreakerConfig(enabled=False), clock=Clock())
    assert b.state is BreakerState.DISABLED
    run(b, *["fail"] * 100)
    assert b.state is BreakerState.DISABLED


def test_time_window_forgets_old_calls() -> None:
    clock = Clock()
    b = breaker(clock, window="time", window_size=10)
    run(b, "fail", "fail", "fail")
    clock.advance(11)
    run(b, "fail")  # the three earlier failures left the window: 1 call < minimum
    assert b.state is CLOSED
    assert b.failure_rate == 1.0
    clock.advance(5)
    run(b, "ok", "ok")
    assert b.state is CLOSED
    run(b, "fail")  # 2 of 4 within the last 10 seconds
    assert b.state is OPEN


def test_time_window_counts_calls_within_the_window() -> None:
    clock = Clock()
    b = breaker(clock, window="time", window_size=10)
    for _ in range(3):
        run(b, "fail")
        clock.advance(3)
    run(b, "fail")  # calls at 0, 3, 6, 9: all within 10 s
    assert b.state is OPEN


def test_stale_tickets_are_ignored() -> None:
    clock = Clock()
    b = breaker(clock)
    stale = b.allow()
    assert stale is not None
    run(b, "fail", "fail", "fail", "fail")
    clock.advance(5)
    probe = b.allow()
    assert probe is not None
    assert b.state is HALF_OPEN
    b.record(stale, failed=True, duration=9.0)  # admitted while closed: not a probe result
    b.release(stale)
    assert b.state is HALF_OPEN
    second = b.allow()
    assert second is not None
    assert b.allow() is None  # the stale ticket neither used nor freed a probe slot
    b.record(probe, failed=False, duration=0.01)
    b.record(second, failed=False, duration=0.01)
    assert b.state is CLOSED


def test_listeners_see_every_transition() -> None:
    clock = Clock()
    b = breaker(clock)
    seen: list[tuple[str, str]] = []
    b.add_listener(lambda old, new: seen.append((old.value, new.value)))
    run(b, "fail", "fail", "fail", "fail")
    clock.advance(5)
    run(b, "ok", "ok")
    b.force_open()
    b.reset()
    assert seen == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
        ("closed", "forced_open"),
        ("forced_open", "closed"),
    ]


# --- through guard() ------------------------------------------------------------------------------


def tripping_breaker(**fields: object) -> BreakerConfig:
    settings: dict[str, object] = {
        "window_size": 4,
        "minimum_calls": 4,
        "failure_rate_threshold": 0.5,
        "slow_call_duration": 0.5,
        "open_duration": 60.0,
        "half_open_probes": 1,
    }
    settings.update(fields)
    return BreakerConfig.model_validate(settings)


@pytest.mark.asyncio
async def test_open_breaker_returns_fallbacks_at_once_without_touching_the_store() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.hang()))
    store = guard(
        faulty, registry=registry, config=fast_config(breaker=tripping_breaker(), deadline=5, attempt=5)
    )
    controller(store).breaker.force_open()
    with Stopwatch() as watch:
        history = await store.load_history("t1")
        memory = await store.load_memory_state("k")
        tasks = await store.list_tasks("s1")
        await store.save_memory_state("k", {"a": 1})
    assert (history, memory, tasks) == ([], None, [])
    assert watch.elapsed < 0.02
    assert fault_injector(faulty).log == []
    for method in ("load_history", "load_memory_state", "list_tasks", "save_memory_state"):
        assert calls(registry, method, "circuit_open") == 1


@pytest.mark.asyncio
async def test_failures_trip_the_breaker_then_calls_are_refused() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    store = guard(
        faulty, name="db", registry=registry, config=fast_config(breaker=tripping_breaker(), max_attempts=1)
    )
    for _ in range(4):
        assert await store.load_history("t1") == []
    assert controller(store).breaker.state is OPEN
    assert await store.load_history("t1") == []
    assert fault_injector(faulty).calls("load_history") == 4
    assert calls(registry, "load_history", "fallback", store="db") == 4
    assert calls(registry, "load_history", "circuit_open", store="db") == 1
    assert registry.get_sample_value("guarded_circuit_state", {"store": "db", "state": "open"}) == 1
    assert registry.get_sample_value("guarded_circuit_state", {"store": "db", "state": "closed"}) == 0
    transitions = {"store": "db", "from_state": "closed", "to_state": "open"}
    assert registry.get_sample_value("guarded_circuit_transitions_total", transitions) == 1


@pytest.mark.asyncio
async def test_the_state_gauge_shows_half_open_once_the_wait_is_over_even_without_calls() -> None:
    """An idle process must not read "open" forever after an outage (the circuit-open alert)."""
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    config = fast_config(breaker=tripping_breaker(open_duration=0.05), max_attempts=1)
    store = guard(faulty, name="db", registry=registry, config=config)
    for _ in range(4):
        await store.load_history("t1")
    assert registry.get_sample_value("guarded_circuit_state", {"store": "db", "state": "open"}) == 1
    await asyncio.sleep(0.1)
    assert registry.get_sample_value("guarded_circuit_state", {"store": "db", "state": "open"}) == 0
    assert registry.get_sample_value("guarded_circuit_state", {"store": "db", "state": "half_open"}) == 1


@pytest.mark.asyncio
async def test_slow_calls_trip_the_breaker() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.delay(0.02)))
    config = fast_config(breaker=tripping_breaker(slow_call_duration=0.01, slow_call_rate_threshold=0.75))
    store = guard(faulty, registry=registry, config=config)
    for _ in range(4):
        assert await store.load_history("t1") == []
    assert calls(registry, "load_history", "ok") == 4  # slow, but successful
    assert controller(store).breaker.state is OPEN
    await store.load_history("t1")
    assert calls(registry, "load_history", "circuit_open") == 1
    assert fault_injector(faulty).calls("load_history") == 4


@pytest.mark.asyncio
async def test_half_open_probe_goes_to_the_store_and_closes() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(
        InMemoryStateStore(), FaultPlan.sequence([Fault.error_before(ConnectionResetError)] * 4)
    )
    config = fast_config(breaker=tripping_breaker(open_duration=0.05), max_attempts=1)
    store = guard(faulty, registry=registry, config=config)
    for _ in range(4):
        await store.load_history("t1")
    assert controller(store).breaker.state is OPEN
    await asyncio.sleep(0.06)
    assert await store.load_history("t1") == []  # the probe: a real call, now succeeding
    assert calls(registry, "load_history", "ok") == 1
    assert controller(store).breaker.state is CLOSED
    assert fault_injector(faulty).calls("load_history") == 5


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_rejected_payloads_do_not_count_against_the_backend() -> None:
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry, config=fast_config(breaker=tripping_breaker()))
    for _ in range(10):
        assert await store.save_memory_state("k", {"bad": float("nan")}) is None
    assert calls(registry, "save_memory_state", "rejected") == 10
    assert controller(store).breaker.state is CLOSED


@pytest.mark.asyncio
async def test_guarded_artifact_store_shares_the_breaker() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.hang()))
    store = guard(faulty, registry=registry, config=fast_config(breaker=tripping_breaker()))
    controller(store).breaker.force_open()
    assert await store.artifact_store.exists("x") is False
    assert calls(registry, "artifact_store.exists", "circuit_open") == 1
    assert fault_injector(faulty).log == []


def test_a_success_that_reaches_minimum_calls_trips_when_the_rate_is_over() -> None:
    clock = Clock()
    b = breaker(clock)
    run(b, "fail", "fail", "fail")
    assert b.state is CLOSED
    run(b, "ok")  # the 4th call is a success, but 3 of 4 failed: 75% >= 50%
    assert b.state is OPEN
