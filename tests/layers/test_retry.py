"""The retry layer alone: only retryable failures of repeat-safe calls are repeated, a consume
only when it provably was not sent, and backoff never sleeps past the deadline."""

from __future__ import annotations

import asyncio

import asyncpg.exceptions as pg
import pytest

import guarded.backends.postgres  # noqa: F401 - registers the PostgreSQL error classifier
from guarded.config import RetryConfig
from guarded.errors import InvalidPayloadError
from guarded.layers import RetryLayer
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio


FAST_RETRY = RetryConfig(max_attempts=3, initial_backoff=0.001, max_backoff=0.002, jitter=0.0)


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


async def test_retry_lets_a_cancellation_during_its_backoff_through_without_another_attempt() -> None:
    slow_backoff = RetryConfig(max_attempts=3, initial_backoff=10.0, max_backoff=10.0, jitter=0.0)
    inner = ScriptedService().fail(ConnectionResetError("reset"))
    setup = method_setup(max_attempts=3, deadline=60.0, attempt=1.0)
    task = asyncio.ensure_future(RetryLayer(slow_backoff).wrap(inner, setup)(new_call(setup, "k")))
    await settle()
    assert len(inner.calls) == 1  # backing off now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(inner.calls) == 1
