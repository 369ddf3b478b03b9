"""The circuit breaker layer alone: failures of the backend open it, then calls are refused without
reaching the inner service; the caller's own faults are not counted."""

from __future__ import annotations

import pytest

from guarded.breaker import BreakerState, CircuitBreaker
from guarded.classify import CircuitOpenError
from guarded.config import BreakerConfig
from guarded.errors import CallerError
from guarded.layers import CircuitBreakerLayer
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
