"""Each layer alone against a scripted inner service (tower-test's way): expect this call, answer
with that, and see what the layer makes of it. The guard's own tests (tests/guard/) check the
layers together."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg.exceptions as pg
import pytest

import guarded.backends.postgres  # noqa: F401 - registers the PostgreSQL error classifier
from guarded.backends.memory import InMemoryStateStore
from guarded.breaker import BreakerState, CircuitBreaker
from guarded.classify import CircuitOpenError
from guarded.config import BreakerConfig, RetryConfig
from guarded.errors import CallerError, InvalidPayloadError
from guarded.failure_log import FailureLog
from guarded.layers import CircuitBreakerLayer, FallbackLayer, RetryLayer, TimeoutLayer
from guarded.layers.call_check import CallCheckLayer
from guarded.outcome import Outcome
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

FAST_RETRY = RetryConfig(max_attempts=3, initial_backoff=0.001, max_backoff=0.002, jitter=0.0)


# --- timeout ------------------------------------------------------------------------------------


async def test_timeout_passes_an_answer_through() -> None:
    inner = ScriptedService().answer({"v": 1})
    setup = method_setup(attempt=1.0)
    assert await TimeoutLayer().wrap(inner, setup)(new_call(setup, "k")) == {"v": 1}
    inner.assert_done()


@pytest.mark.parametrize("swallow", [False, True], ids=["cancelled", "store swallows the cancel"])
async def test_timeout_ends_a_hung_attempt_at_its_bound(swallow: bool) -> None:
    inner = ScriptedService().hang(swallow_cancel=swallow)
    setup = method_setup(attempt=0.05, deadline=1.0)
    call = new_call(setup, "k")
    with pytest.raises(TimeoutError):
        await TimeoutLayer().wrap(inner, setup)(call)
    assert call.loop.time() - call.started < 0.05 + 0.5  # loop time: the bound plus real slack
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0, "the watchdog's cancellation is withdrawn"


async def test_timeout_lets_the_callers_cancellation_through() -> None:
    inner = ScriptedService().hang()
    setup = method_setup(attempt=5.0)
    task = asyncio.ensure_future(TimeoutLayer().wrap(inner, setup)(new_call(setup, "k")))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- retry --------------------------------------------------------------------------------------


async def test_retry_repeats_a_retryable_failure_and_notes_it() -> None:
    inner = ScriptedService().fail(ConnectionResetError("reset")).fail(pg.SerializationError("x")).answer(7)
    setup = method_setup(max_attempts=3)
    call = new_call(setup, "k")
    assert await RetryLayer(FAST_RETRY).wrap(inner, setup)(call) == 7
    assert call.attempts == 3
    assert [error for _, error, _ in call.retries or []] == [
        "ConnectionResetError",
        "asyncpg.exceptions.SerializationError",
    ]
    inner.assert_done()


@pytest.mark.parametrize(
    "error",
    [ValueError("bad"), InvalidPayloadError("nan"), TypeError("bug"), RuntimeError("unknown")],
    ids=lambda error: type(error).__name__,
)
async def test_retry_never_repeats_what_waiting_cannot_fix(error: Exception) -> None:
    inner = ScriptedService().fail(error)
    setup = method_setup(max_attempts=3)
    with pytest.raises(type(error)):
        await RetryLayer(FAST_RETRY).wrap(inner, setup)(new_call(setup, "k"))
    assert len(inner.calls) == 1


async def test_retry_repeats_a_consume_only_when_it_provably_was_not_sent() -> None:
    setup = method_setup("load_planner_state", max_attempts=3)
    sent = ScriptedService().fail(ConnectionResetError("reset after the request went out"))
    with pytest.raises(ConnectionResetError):
        await RetryLayer(FAST_RETRY).wrap(sent, setup)(new_call(setup, "token"))
    assert len(sent.calls) == 1, "a blind repeat of a consume could lose the pause"
    not_sent = ScriptedService().fail(ConnectionRefusedError("refused")).answer({"p": 1})
    assert await RetryLayer(FAST_RETRY).wrap(not_sent, setup)(new_call(setup, "token")) == {"p": 1}
    keyed = method_setup("load_planner_state", max_attempts=3, honours_idempotency_key=True)
    with_key = ScriptedService().fail(ConnectionResetError("reset")).answer({"p": 2})
    assert await RetryLayer(FAST_RETRY).wrap(with_key, keyed)(new_call(keyed, "token")) == {"p": 2}


async def test_retry_never_sleeps_past_the_deadline() -> None:
    slow_backoff = RetryConfig(max_attempts=5, initial_backoff=10.0, max_backoff=10.0, jitter=0.0)
    inner = ScriptedService().fail(ConnectionResetError("reset"))
    setup = method_setup(max_attempts=5, deadline=0.2, attempt=0.2)
    call = new_call(setup, "k")
    with pytest.raises(ConnectionResetError):
        await RetryLayer(slow_backoff).wrap(inner, setup)(call)
    assert call.loop.time() - call.started < 0.2
    assert len(inner.calls) == 1


# --- circuit breaker ----------------------------------------------------------------------------


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


# --- fallback -----------------------------------------------------------------------------------


@pytest.mark.lenient  # the production answer to a caller's fault; strict mode is tested below
@pytest.mark.parametrize(
    ("method", "error", "fallback", "outcome"),
    [
        ("load_history", ConnectionResetError("down"), [], Outcome.FALLBACK),
        ("load_memory_state", TimeoutError(), None, Outcome.TIMEOUT),
        ("list_tasks", CircuitOpenError("open"), [], Outcome.CIRCUIT_OPEN),
        ("save_memory_state", InvalidPayloadError("nan"), None, Outcome.REJECTED),
        ("load_memory_state", CallerError("wrong call"), None, Outcome.REJECTED),
    ],
)
async def test_fallback_answers_the_policys_default_and_settles_the_outcome(
    method: str, error: Exception, fallback: Any, outcome: Outcome
) -> None:
    inner = ScriptedService().fail(error)
    setup = method_setup(method)
    call = new_call(setup, "k")
    assert await FallbackLayer(FailureLog(60.0)).wrap(inner, setup)(call) == fallback
    assert (call.outcome, call.error) == (outcome, error)


@pytest.mark.lenient
async def test_fallback_logs_a_programming_error_at_error_and_raises_it_when_strict(
    caplog: pytest.LogCaptureFixture,
) -> None:
    setup = method_setup()
    caplog.set_level(logging.INFO, logger="guarded")
    lenient = FallbackLayer(FailureLog(60.0)).wrap(ScriptedService().fail(TypeError("bug here")), setup)
    assert await lenient(new_call(setup, "k")) is None
    [record] = caplog.records
    assert (record.levelno, "bug here" in record.getMessage()) == (logging.ERROR, True)
    strict = FallbackLayer(FailureLog(60.0), strict=True).wrap(
        ScriptedService().fail(TypeError("bug")), setup
    )
    with pytest.raises(TypeError):
        await strict(new_call(setup, "k"))
    outage = FallbackLayer(FailureLog(60.0), strict=True).wrap(ScriptedService().fail(TimeoutError()), setup)
    assert await outage(new_call(setup, "k")) is None, "strict mode never changes what an outage looks like"


async def test_fallback_lets_the_callers_cancellation_through() -> None:
    setup = method_setup()
    task = asyncio.ensure_future(
        FallbackLayer(FailureLog(60.0)).wrap(ScriptedService().hang(), setup)(new_call(setup))
    )
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- call check ---------------------------------------------------------------------------------


async def test_call_check_refuses_a_wrong_call_before_the_inner_service() -> None:
    inner = ScriptedService().answer(None)
    setup = method_setup("save_memory_state")
    service = CallCheckLayer(InMemoryStateStore()).wrap(inner, setup)
    with pytest.raises(CallerError, match="missing a required argument: 'state'"):
        service(new_call(setup, "k"))  # raised as the call is made: no frame of its own
    assert inner.calls == []
    assert await service(new_call(setup, "k", {"v": 1})) is None
    inner.assert_done()
