"""The circuit breaker layer alone: failures of the backend open it, then calls are refused without
reaching the inner service; the caller's own faults are not counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from guarded.config import BreakerConfig
from guarded.error_classes import CircuitOpenError
from guarded.errors import CallerError
from guarded.layers import CircuitBreakerLayer
from guarded.layers.breaker import BreakerState, CircuitBreaker
from guarded.layers.bulkhead import BulkheadTimeoutError
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio


async def test_breaker_opens_on_failures_then_refuses_without_calling() -> None:
    breaker = CircuitBreaker(BreakerConfig(window_size=4, minimum_calls=4, failure_rate_threshold=0.5))
    inner = ScriptedService()
    for _ in range(4):
        inner.fail(ConnectionResetError("down"))
    setup = method_setup()
    service = CircuitBreakerLayer(breaker).wrap(inner, setup)
    for _ in range(4):
        with pytest.raises(ConnectionResetError):
            await service(new_call(setup, "k"))
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpenError):
        await service(new_call(setup, "k"))
    assert len(inner.calls) == 4
    inner.assert_done()


async def test_breaker_does_not_count_the_callers_faults() -> None:
    breaker = CircuitBreaker(BreakerConfig(window_size=4, minimum_calls=4, failure_rate_threshold=0.5))
    inner = ScriptedService()
    for error in (ValueError("bad data"), TypeError("bug"), CallerError("wrong call"), AttributeError("bug")):
        inner.fail(error)
    setup = method_setup()
    service = CircuitBreakerLayer(breaker).wrap(inner, setup)
    for _ in range(4):
        with pytest.raises(Exception):  # noqa: B017, PT011 - each its own type
            await service(new_call(setup, "k"))
    assert breaker.state is BreakerState.CLOSED


def tripping_breaker(**fields: Any) -> CircuitBreaker:
    """Four calls decide: half of them failing or slow (over 50 ms) opens it."""
    config = {"window_size": 4, "minimum_calls": 4, "failure_rate_threshold": 0.5} | fields
    return CircuitBreaker(BreakerConfig(slow_call_rate_threshold=0.5, slow_call_duration=0.05, **config))


@pytest.mark.parametrize(
    "queued", [True, False], ids=["waited in the bulkhead's line", "slow in the backend"]
)
async def test_breaker_leaves_time_waited_in_the_bulkheads_line_out_of_a_calls_duration(queued: bool) -> None:
    breaker = tripping_breaker()
    inner = ScriptedService()
    setup = method_setup()
    service = CircuitBreakerLayer(breaker).wrap(inner, setup)
    for _ in range(4):
        inner.answer(None)
        call = new_call(setup, "k")
        call.started -= 0.1  # the call began 100 ms ago ...
        if queued:
            call.queued = 0.1  # ... and spent them waiting for admission, not in the backend
        await service(call)
    assert breaker.state is (BreakerState.CLOSED if queued else BreakerState.OPEN)


@pytest.mark.parametrize("evidence", [False, True], ids=["overload", "a stuck backend"])
async def test_breaker_counts_a_bulkhead_admission_timeout_only_as_evidence_against_the_backend(
    evidence: bool,
) -> None:
    breaker = tripping_breaker()
    inner = ScriptedService()
    setup = method_setup()
    service = CircuitBreakerLayer(breaker).wrap(inner, setup)
    for _ in range(4):
        inner.fail(BulkheadTimeoutError("not admitted", counts_against_backend=evidence))
        with pytest.raises(BulkheadTimeoutError):
            await service(new_call(setup, "k"))
    assert breaker.state is (BreakerState.OPEN if evidence else BreakerState.CLOSED)


async def test_breaker_gets_back_the_probe_of_a_cancelled_call() -> None:
    now = [0.0]
    config = BreakerConfig(window_size=4, minimum_calls=4, open_duration=1.0, half_open_probes=1)
    breaker = CircuitBreaker(config, clock=lambda: now[0])
    inner = ScriptedService()
    setup = method_setup()
    service = CircuitBreakerLayer(breaker).wrap(inner, setup)
    for _ in range(4):
        inner.fail(ConnectionResetError("down"))
        with pytest.raises(ConnectionResetError):
            await service(new_call(setup, "k"))
    now[0] = 2.0  # the breaker's wait is over: one probe may go
    assert breaker.state is BreakerState.HALF_OPEN
    inner.hang().answer("the backend is back")
    probe = asyncio.ensure_future(service(new_call(setup, "k")))
    await settle()
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert await service(new_call(setup, "k")) == "the backend is back", "the probe was not lost"
    assert breaker.state is BreakerState.CLOSED
    inner.assert_done()
