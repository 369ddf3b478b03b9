"""The fallback layer alone: every failure becomes the policy's safe default with its outcome
settled; a programming error is logged at ERROR (raised in strict mode); the caller's
cancellation passes through."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from guarded.error_classes import CircuitOpenError
from guarded.errors import CallerError, InvalidPayloadError
from guarded.layers import FallbackLayer
from guarded.observability.failure_log import FailureLog
from guarded.outcome import Outcome
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio


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


async def test_fallback_treats_a_cancellation_the_store_raised_on_its_own_as_a_failure() -> None:
    # A driver's internal future was cancelled; nobody cancelled the caller's task.
    setup = method_setup("load_history")
    call = new_call(setup, "t")
    error = asyncio.CancelledError()
    assert await FallbackLayer(FailureLog(60.0)).wrap(ScriptedService().fail(error), setup)(call) == []
    assert (call.outcome, call.error) == (Outcome.FALLBACK, error)
