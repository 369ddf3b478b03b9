"""The batcher's backpressure alone: slots, first-come-first-served waiters, deadlines,
cancellation and closing (guarded.batching.batcher)."""

from __future__ import annotations

import asyncio

import pytest

from guarded.batching.batcher import BatchSpace


def far() -> float:
    return asyncio.get_running_loop().time() + 60


async def turns(count: int = 3) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_free_slots_are_taken_at_once_and_never_beyond_the_capacity() -> None:
    space = BatchSpace(2)
    assert space.take_now()
    assert space.take_now()
    assert not space.take_now()
    assert space.pending == 2


@pytest.mark.asyncio
async def test_freed_slots_go_to_the_oldest_waiters_first_and_nobody_jumps_the_line() -> None:
    space = BatchSpace(1)
    assert space.take_now()
    order: list[int] = []

    async def waiter(number: int) -> None:
        assert await space.wait(far())
        order.append(number)

    tasks = [asyncio.create_task(waiter(number)) for number in range(3)]
    await turns()
    space.release(1)
    assert not space.take_now()  # the freed slot went to the first waiter, not to a newcomer
    await turns()
    assert order == [0]
    space.release(1)
    await turns()
    space.release(1)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert space.pending == 1


@pytest.mark.asyncio
async def test_a_waiter_past_its_deadline_is_refused_and_leaves_the_line() -> None:
    space = BatchSpace(1)
    assert space.take_now()
    loop = asyncio.get_running_loop()
    assert not await space.wait(loop.time() + 0.01)
    assert not space.waiters
    assert not await space.wait(loop.time() - 1)  # already past: refused without waiting
    space.release(1)
    assert space.pending == 0


@pytest.mark.asyncio
async def test_a_cancelled_waiter_gives_back_a_granted_slot_or_its_place() -> None:
    space = BatchSpace(1)
    assert space.take_now()
    granted = asyncio.create_task(space.wait(far()))
    queued = asyncio.create_task(space.wait(far()))
    await turns()
    space.release(1)  # granted to the first waiter, which is cancelled before it resumes
    granted.cancel()
    queued_behind = asyncio.create_task(space.wait(far()))
    await turns()
    assert granted.cancelled()
    # the slot the cancelled waiter was granted went on to the next one (not lost: no hang)
    assert await asyncio.wait_for(queued, timeout=10)
    queued_behind.cancel()
    await turns()
    assert not space.waiters
    assert space.pending == 1


@pytest.mark.asyncio
async def test_closing_refuses_every_waiter_and_every_later_request() -> None:
    space = BatchSpace(1)
    assert space.take_now()
    waiting = asyncio.create_task(space.wait(far()))
    await turns()
    space.close()
    assert await waiting is False
    space.release(1)
    assert not space.take_now()
    assert not await space.wait(far())
