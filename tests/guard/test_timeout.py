"""Timeouts and cancellation: bounded calls, the caller's cancellation always wins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import MethodConfig, RetryConfig
from guarded.guard import guard
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.broken_stores import MinimalStore
from tests.support.metrics import calls, outcome_counts

from .support import ATTEMPT, DEADLINE, MARGIN, Stopwatch, event, fast_config


def hanging(**config: Any) -> tuple[Any, Any, CollectorRegistry]:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.hang()))
    return guard(faulty, registry=registry, config=fast_config(**config)), faulty, registry


@pytest.mark.asyncio
async def test_hanging_store_returns_the_fallback_by_the_deadline() -> None:
    store, faulty, registry = hanging()
    with Stopwatch() as watch:
        assert await store.load_history("t1") == []
    assert watch.elapsed <= DEADLINE + MARGIN
    assert watch.elapsed >= ATTEMPT
    assert calls(registry, "load_history", "timeout") == 1
    assert fault_injector(faulty).hanging == 0  # every hung attempt was cancelled


@pytest.mark.asyncio
async def test_each_attempt_is_bounded_and_a_retry_can_still_succeed() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.script({"save_event": [Fault.hang(), Fault.hang()]}))
    store = guard(faulty, registry=registry, config=fast_config(attempt=0.03, deadline=0.5))
    with Stopwatch() as watch:
        await store.save_event(event("t1"))
    assert 0.06 <= watch.elapsed <= 0.06 + MARGIN + 0.02
    assert calls(registry, "save_event", "retried") == 1
    assert len(await store.load_history("t1")) == 1


@pytest.mark.asyncio
async def test_a_short_deadline_is_kept_while_a_long_one_is_pending() -> None:
    # The watchdog must wake up for the earliest deadline, not the first one armed.
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.hang()))
    config = fast_config(methods={"list_tasks": MethodConfig(attempt_timeout=3.0, deadline=3.0)})
    store = guard(faulty, registry=registry, config=config)
    slow = asyncio.create_task(store.list_tasks("s1"))
    await asyncio.sleep(0.005)
    with Stopwatch() as watch:
        assert await store.load_history("t1") == []
    assert watch.elapsed <= DEADLINE + MARGIN
    assert not slow.done()
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow


@pytest.mark.asyncio
async def test_caller_cancellation_propagates() -> None:
    store, faulty, registry = hanging(attempt=1.0, deadline=1.0)
    call = asyncio.create_task(store.load_history("t1"))
    await asyncio.sleep(0.02)
    assert call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert outcome_counts(registry) == {"cancelled": 1}
    assert fault_injector(faulty).calls("load_history") == 1  # never retried
    assert fault_injector(faulty).hanging == 0


@pytest.mark.asyncio
async def test_cancellation_during_backoff_propagates() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    config = fast_config(deadline=2.0, retry=RetryConfig(initial_backoff=0.5, max_backoff=0.5, jitter=0))
    store = guard(faulty, registry=registry, config=config)
    call = asyncio.create_task(store.load_history("t1"))
    await asyncio.sleep(0.02)  # the first attempt failed; the call sleeps before retrying
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert fault_injector(faulty).calls("load_history") == 1
    assert calls(registry, "load_history", "cancelled") == 1


@pytest.mark.asyncio
async def test_cancellation_at_the_moment_the_attempt_times_out_propagates() -> None:
    # Both the watchdog and the caller cancel the task: the caller's cancellation must win.
    for offset in (-0.004, -0.002, 0.0, 0.002, 0.004, 0.006):
        store, _, registry = hanging(attempt=0.03, deadline=0.03)
        loop = asyncio.get_running_loop()
        call = asyncio.create_task(store.load_history("t1"))
        await asyncio.sleep(0)
        started = loop.time()
        await asyncio.sleep(max(0.0, 0.03 + offset - (loop.time() - started)))
        cancelled = call.cancel()
        try:
            result = await call
        except asyncio.CancelledError:
            assert cancelled
            assert outcome_counts(registry) == {"cancelled": 1}
        else:
            assert not cancelled  # it had already finished with its fallback
            assert result == []
            assert outcome_counts(registry) == {"timeout": 1}


@pytest.mark.asyncio
async def test_a_store_that_swallows_cancellation_still_times_out() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.stubborn(0.08)))
    store = guard(faulty, registry=registry, config=fast_config(attempt=0.02, deadline=0.02, max_attempts=1))
    with Stopwatch() as watch:
        assert await store.load_history("t1") == []
    assert watch.elapsed >= 0.08  # it cannot be interrupted ...
    assert calls(registry, "load_history", "timeout") == 1  # ... but its answer came too late
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


class TurnsCancellationIntoErrors(MinimalStore):
    """A driver that reports its interrupted I/O as a connection error."""

    async def load_history(self, trace_id: str) -> Any:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ConnectionResetError("connection interrupted") from None
        return []


@pytest.mark.asyncio
async def test_the_watchdogs_cancellation_is_withdrawn_whatever_the_store_raises() -> None:
    registry = CollectorRegistry()
    store = guard(
        TurnsCancellationIntoErrors(), registry=registry, config=fast_config(attempt=0.02, deadline=0.02)
    )
    task = asyncio.current_task()
    assert task is not None
    results: list[Any] = []

    async def guarded_call_then_wait() -> None:
        async with asyncio.timeout(0.3):  # the caller's own timeout must keep working afterwards
            results.append(await store.load_history("t1"))
            results.append(task.cancelling())
            await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        await guarded_call_then_wait()
    assert results == [[], 0]
    assert calls(registry, "load_history", "timeout") == 1


@pytest.mark.asyncio
async def test_callers_own_timeout_around_a_guarded_call() -> None:
    store, _, registry = hanging(attempt=1.0, deadline=1.0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.03):
            await store.load_history("t1")
    assert outcome_counts(registry) == {"cancelled": 1}


@pytest.mark.asyncio
async def test_guard_timeout_inside_the_callers_timeout() -> None:
    store, _, registry = hanging()
    async with asyncio.timeout(5):
        assert await store.load_history("t1") == []
        assert await store.load_memory_state("k") is None
    assert outcome_counts(registry) == {"timeout": 2}


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_propagate(error: type[BaseException]) -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(error)))
    store = guard(faulty, registry=registry, config=fast_config())

    async def main() -> None:
        await store.load_history("t1")

    with pytest.raises(error):
        asyncio.run(main())
    assert fault_injector(faulty).calls("load_history") == 1
