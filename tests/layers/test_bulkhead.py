"""The bulkhead layer alone, in front of a scripted inner service (tower's way of testing a layer).

The promise: at most ``limit`` calls inside at once, admission first come first served, a caller
waits until its deadline leaves one attempt's time and then gets ``BulkheadTimeoutError`` without
being sent, and no permit is ever lost — whether a caller is cancelled in line, just as it was
handed a permit, or while inside.
"""

from __future__ import annotations

import asyncio

import pytest

from guarded.error_classes import ErrorClass, classify, counts_against_backend, reached_backend
from guarded.layers.bulkhead import Bulkhead, BulkheadLayer, BulkheadTimeoutError
from guarded.layers.fallback import failure_outcome
from guarded.outcome import Outcome
from guarded.pipeline.call import Call, MethodSetup, Service
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.scripted import GatedService, ScriptedService


def layered(
    limit: int, *, attempt: float = 2.0, deadline: float = 5.0, slow: float = 1.0
) -> tuple[Bulkhead, GatedService, Service, MethodSetup]:
    """A bulkhead of ``limit`` permits, the scripted service behind it, the layer's service."""
    bulkhead = Bulkhead(limit, "s")
    inner = GatedService()
    setup = method_setup(attempt=attempt, deadline=deadline)
    return bulkhead, inner, BulkheadLayer(bulkhead, slow_call_duration=slow).wrap(inner, setup), setup


@pytest.mark.asyncio
async def test_no_more_than_the_limit_is_inside_at_once() -> None:
    bulkhead, inner, service, setup = layered(2)
    names = [f"c{index}" for index in range(6)]
    tasks = [asyncio.create_task(service(new_call(setup, name))) for name in names]
    await settle()
    assert inner.entered == ["c0", "c1"]
    assert (bulkhead.in_use, bulkhead.waiting) == (2, 4)
    for name in names:
        inner.finish(name)
        await settle()
        assert inner.active <= 2
    assert await asyncio.gather(*tasks) == names
    assert inner.peak == 2
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_admission_is_first_come_first_served_and_nobody_overtakes_the_line() -> None:
    bulkhead, inner, service, setup = layered(1)
    tasks = []
    for index in range(5):
        tasks.append(asyncio.create_task(service(new_call(setup, f"c{index}"))))
        await settle()  # c0 is inside, the others line up in this order
    inner.finish("c0")
    # A newcomer arriving in the very step the permit is handed over goes to the back of the line.
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(service(new_call(setup, "late"))))
    for name in ["c1", "c2", "c3", "c4", "late"]:
        await settle()
        assert inner.entered[-1] == name
        inner.finish(name)
    await asyncio.gather(*tasks)
    assert inner.entered == ["c0", "c1", "c2", "c3", "c4", "late"]
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_a_caller_waits_until_one_attempt_is_left_then_gets_its_own_timeout_error() -> None:
    # deadline 0.4 s, attempt 0.15 s (below the slow-call duration): admitted until 0.25 s.
    bulkhead, inner, service, setup = layered(1, attempt=0.15, deadline=0.4, slow=1.0)
    holder = asyncio.create_task(service(new_call(setup, "holder")))
    await settle()
    call = new_call(setup, "waiter")
    loop = asyncio.get_running_loop()
    with pytest.raises(BulkheadTimeoutError) as raised:
        await service(call)
    waited = loop.time() - call.started
    assert 0.25 <= waited < 0.4, waited
    assert 0 < call.queued <= waited  # queued from entering the line (after the call started)
    assert "waiter" not in inner.entered  # never sent
    error = raised.value
    assert isinstance(error, TimeoutError)
    assert failure_outcome(error) is Outcome.TIMEOUT  # no new outcome label
    assert classify(error) is ErrorClass.OPERATIONAL  # not retried, held and replayed, never parked
    assert not reached_backend(error)
    # Nothing succeeded in the backend while it waited: the backend held the line up, and that
    # is evidence against it (see the next test for a line that moves).
    assert counts_against_backend(error)
    stats = bulkhead.stats("load_memory_state")
    assert stats.timeouts == 1
    assert stats.waits.count == 1
    assert bulkhead.waiting == 0
    inner.finish("holder")
    await holder
    assert bulkhead.in_use == 0


@pytest.mark.asyncio
async def test_a_timeout_in_a_line_that_moves_is_overload_and_does_not_count_against_the_backend() -> None:
    bulkhead, inner, service, setup = layered(1, attempt=0.15, deadline=0.4, slow=1.0)
    ahead = [asyncio.create_task(service(new_call(setup, f"c{index}"))) for index in range(5)]
    await settle()
    waiter = asyncio.create_task(service(new_call(setup, "waiter")))
    for index in range(3):  # calls keep completing while the waiter waits, just not enough of them
        await asyncio.sleep(0.05)
        inner.finish(f"c{index}")
    with pytest.raises(BulkheadTimeoutError) as raised:
        await waiter
    assert not counts_against_backend(raised.value)
    for index in range(5):
        inner.finish(f"c{index}")
    await asyncio.gather(*ahead, return_exceptions=True)  # the last of them may time out too
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_a_timeout_in_a_line_held_up_by_failing_calls_counts_against_the_backend() -> None:
    # Calls keep leaving the backend, each with an error: the line moves, but no call succeeds.
    bulkhead = Bulkhead(1, "s")
    setup = method_setup(attempt=0.15, deadline=0.4)

    async def failing(call: Call) -> None:
        await asyncio.sleep(0.05)
        raise ConnectionResetError("down")

    service = BulkheadLayer(bulkhead, slow_call_duration=1.0).wrap(failing, setup)
    ahead = [asyncio.create_task(service(new_call(setup, f"c{index}"))) for index in range(8)]
    await settle()
    with pytest.raises(BulkheadTimeoutError) as raised:
        await service(new_call(setup, "waiter"))
    assert counts_against_backend(raised.value)
    results = await asyncio.gather(*ahead, return_exceptions=True)
    assert {type(result) for result in results} <= {ConnectionResetError, BulkheadTimeoutError}
    assert (bulkhead.in_use, bulkhead.waiting, bulkhead.successes) == (0, 0, 0)


@pytest.mark.asyncio
async def test_a_failing_call_gives_its_permit_back_and_its_error_goes_on_unchanged() -> None:
    bulkhead = Bulkhead(1, "s")
    setup = method_setup()
    error = ConnectionResetError("down")
    inner = ScriptedService().fail(error).answer("next")
    service = BulkheadLayer(bulkhead, slow_call_duration=1.0).wrap(inner, setup)
    with pytest.raises(ConnectionResetError) as raised:
        await service(new_call(setup, "k"))
    assert raised.value is error
    assert (bulkhead.in_use, bulkhead.successes) == (0, 0)
    assert await service(new_call(setup, "k")) == "next"
    assert (bulkhead.in_use, bulkhead.successes) == (0, 1)


@pytest.mark.asyncio
async def test_a_retry_is_not_started_without_an_attempts_time_and_its_timeout_counts() -> None:
    # The attempt before it failed in the backend; the breaker sees only the call's last error.
    bulkhead, inner, service, setup = layered(2, attempt=0.15, deadline=0.4, slow=1.0)
    call = new_call(setup, "retry")
    call.attempts = 2
    await asyncio.sleep(0.3)  # 0.1 s left, less than the 0.15 s reserve: not started, permits free
    with pytest.raises(BulkheadTimeoutError) as raised:
        await service(call)
    assert counts_against_backend(raised.value)
    assert inner.entered == []
    assert bulkhead.in_use == 0
    first = new_call(setup, "first")  # a first attempt with a permit free is always admitted
    first.deadline = first.started + 0.01
    task = asyncio.create_task(service(first))
    await settle()
    assert inner.entered == ["first"]
    inner.finish("first")
    await task


@pytest.mark.asyncio
async def test_half_the_deadline_is_always_left_for_waiting() -> None:
    # A single attempt as long as the deadline (0.5 s), under the slow-call duration: the reserve
    # would leave no time to wait; it is capped at half the deadline.
    bulkhead, _, service, setup = layered(1, attempt=0.5, deadline=0.5, slow=1.0)
    holder = asyncio.create_task(service(new_call(setup, "holder")))
    await settle()
    call = new_call(setup, "waiter")
    with pytest.raises(BulkheadTimeoutError):
        await service(call)
    # Measured from the call's start (the deadline's origin), not from entering the queue.
    assert asyncio.get_running_loop().time() - call.started >= 0.25
    assert call.queued < 0.4
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_the_time_left_for_the_backend_is_at_most_the_slow_call_duration() -> None:
    # attempt 2 s, deadline 0.5 s would leave no time to wait: the reserve is capped by the
    # breaker's slow-call duration (0.1 s here), so the caller waits until 0.4 s.
    bulkhead, _, service, setup = layered(1, attempt=0.5, deadline=0.5, slow=0.1)
    holder = asyncio.create_task(service(new_call(setup, "holder")))
    await settle()
    call = new_call(setup, "waiter")
    with pytest.raises(BulkheadTimeoutError):
        await service(call)
    assert asyncio.get_running_loop().time() - call.started >= 0.4  # from the deadline's origin
    assert call.queued < 0.5
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_cancelling_a_caller_in_line_gives_its_place_back() -> None:
    bulkhead, inner, service, setup = layered(1)
    holder = asyncio.create_task(service(new_call(setup, "holder")))
    await settle()
    first = asyncio.create_task(service(new_call(setup, "first")))
    second = asyncio.create_task(service(new_call(setup, "second")))
    await settle()
    assert bulkhead.waiting == 2
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert bulkhead.waiting == 1
    inner.finish("holder")
    await settle()
    assert inner.entered == ["holder", "second"]  # the cancelled caller's turn is skipped
    inner.finish("second")
    await asyncio.gather(holder, second)
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)
    assert bulkhead.try_acquire()  # no permit leaked: a newcomer gets in at once
    bulkhead.release()


@pytest.mark.asyncio
async def test_a_caller_cancelled_just_as_it_is_handed_a_permit_passes_it_on() -> None:
    bulkhead = Bulkhead(1, "s")
    loop = asyncio.get_running_loop()
    assert bulkhead.try_acquire()
    first = asyncio.create_task(bulkhead.wait(loop, loop.time() + 5))
    second = asyncio.create_task(bulkhead.wait(loop, loop.time() + 5))
    await settle()
    bulkhead.release()  # handed to `first`, which has not resumed yet ...
    first.cancel()  # ... and gives up before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second is True
    assert (bulkhead.in_use, bulkhead.waiting) == (1, 0)
    bulkhead.release()
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_cancelling_a_call_inside_releases_its_permit() -> None:
    bulkhead, inner, service, setup = layered(1)
    inside = asyncio.create_task(service(new_call(setup, "inside")))
    waiting = asyncio.create_task(service(new_call(setup, "next")))
    await settle()
    inside.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inside
    await settle()
    assert inner.entered == ["inside", "next"]
    inner.finish("next")
    assert await waiting == "next"
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_many_cancellations_and_timeouts_leak_nothing() -> None:
    bulkhead, inner, service, setup = layered(3, attempt=0.05, deadline=0.3)
    tasks = [asyncio.create_task(service(new_call(setup, f"c{index}"))) for index in range(40)]
    await settle()
    for index, task in enumerate(tasks):
        if index % 3 == 0:
            task.cancel()
    await asyncio.sleep(0.05)
    for index in range(40):
        if index % 3 == 1:
            inner.finish(f"c{index}")
    await asyncio.sleep(0.35)  # every deadline has passed
    for index in range(40):
        inner.finish(f"c{index}")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    kinds = {type(result).__name__ for result in results}
    assert kinds <= {"str", "CancelledError", "BulkheadTimeoutError"}
    assert inner.peak <= 3
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_waits_are_recorded_on_the_call_and_in_the_statistics() -> None:
    bulkhead, inner, service, setup = layered(1)
    first_call, second_call = new_call(setup, "a"), new_call(setup, "b")
    first = asyncio.create_task(service(first_call))
    second = asyncio.create_task(service(second_call))
    await asyncio.sleep(0.05)
    inner.finish("a")
    inner.finish("b")
    await asyncio.gather(first, second)
    assert first_call.queued == 0.0
    assert second_call.queued > 0  # how long exactly depends on the loop's load
    stats = bulkhead.stats("load_memory_state")
    assert (stats.immediate, stats.waits.count, stats.timeouts) == (1, 1, 0)
    assert stats.waits.total == pytest.approx(second_call.queued)


def test_without_a_bulkhead_the_layer_does_not_wrap() -> None:
    inner = GatedService()
    assert BulkheadLayer(None, slow_call_duration=1.0).wrap(inner, method_setup()) is inner


def test_a_bulkhead_needs_a_permit() -> None:
    with pytest.raises(ValueError, match="at least one permit"):
        Bulkhead(0, "s")
