"""The watchdog cancels each armed task at its deadline (within one tick), and moves its timer only
for a deadline before the tick it is set for: every call arms one, so moving it each time (as it
did for any deadline earlier than the rounded-up wake-up) cost about 2 µs per guarded call."""

from __future__ import annotations

import asyncio

import pytest

from guarded.pipeline.watchdog import DEFAULT_TICK, Watchdog

pytestmark = pytest.mark.asyncio


async def _sleeper() -> str:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        return "cancelled"
    return "slept"


async def test_deadlines_within_the_tick_set_do_not_move_the_timer() -> None:
    loop = asyncio.get_running_loop()
    dog = Watchdog(loop)
    task = asyncio.current_task()
    assert task is not None
    base = (int(loop.time() / DEFAULT_TICK) + 200) * DEFAULT_TICK  # a tick boundary 1 s ahead
    dog.arm("first", task, base + DEFAULT_TICK * 0.1)
    timer = dog._handle
    for index in range(50):
        dog.arm(("call", index), task, base + DEFAULT_TICK * 0.1 + index * 1e-5)
        dog.disarm(("call", index))
    assert dog._handle is timer, "the timer was rescheduled for a deadline its tick already meets"
    dog.arm("earlier", task, base - 10 * DEFAULT_TICK)
    assert dog._handle is not timer, "an earlier deadline must move the timer"
    for key in ("first", "earlier"):
        dog.disarm(key)


async def test_each_armed_task_is_cancelled_at_its_deadline_within_a_tick() -> None:
    loop = asyncio.get_running_loop()
    dog = Watchdog(loop)
    now = loop.time()
    late = asyncio.ensure_future(_sleeper())
    early = asyncio.ensure_future(_sleeper())
    spared = asyncio.ensure_future(_sleeper())
    await asyncio.sleep(0)
    dog.arm("late", late, now + 0.2)  # sets the timer
    dog.arm("early", early, now + 0.05)  # an earlier tick: moves it
    dog.arm("spared", spared, now + 0.1)
    dog.disarm("spared")
    assert await early == "cancelled"
    early_at = loop.time()
    assert await late == "cancelled"
    late_at = loop.time()
    assert now + 0.05 <= early_at
    assert now + 0.2 <= late_at
    assert early_at < now + 0.2, "the early deadline waited for the late one's timer"
    assert not spared.done()
    spared.cancel()
