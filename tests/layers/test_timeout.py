"""The timeout layer alone: each attempt bounded by min(attempt timeout, time left before the
deadline); a store that swallows the watchdog's cancellation still times out; the caller's own
cancellation is never turned into a timeout."""

from __future__ import annotations

import asyncio

import pytest

from guarded.layers import TimeoutLayer
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio


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
