"""KeyGate: a replay of a held last-write-wins write never lands after a newer direct write of its
key."""

from __future__ import annotations

import asyncio

import pytest

from guarded.deadletter.gate import KeyGate

KEY = ("save_memory_state", "k1")
OTHER = ("save_memory_state", "k2")


async def started(coro: object) -> asyncio.Task[None]:
    task: asyncio.Task[None] = asyncio.ensure_future(coro)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return task


@pytest.mark.asyncio
async def test_a_direct_write_waits_for_the_replay_of_its_key_in_flight() -> None:
    gate = KeyGate()
    await gate.enter_replay(KEY, 3, earlier_process=False)
    assert gate.try_enter_direct(KEY, 7) is False
    direct = await started(gate.enter_direct(KEY, 7))
    assert not direct.done()
    assert gate.try_enter_direct(OTHER, 8) is True  # other keys are not held up
    gate.leave_replay(KEY)
    await asyncio.wait_for(direct, 1)
    gate.leave_direct(KEY, 7)
    gate.leave_direct(OTHER, 8)
    assert len(gate) == 0


@pytest.mark.asyncio
async def test_a_replay_waits_for_a_newer_direct_write_but_not_for_an_older_one() -> None:
    gate = KeyGate()
    assert gate.try_enter_direct(KEY, 2)
    await asyncio.wait_for(gate.enter_replay(KEY, 5, earlier_process=False), 1)  # 2 is older: no wait
    gate.leave_replay(KEY)

    assert gate.try_enter_direct(KEY, 9)
    replay = await started(gate.enter_replay(KEY, 5, earlier_process=False))
    assert not replay.done()
    gate.leave_direct(KEY, 2)
    await asyncio.sleep(0)
    assert not replay.done()  # 9 is still in flight
    gate.leave_direct(KEY, 9)
    await asyncio.wait_for(replay, 1)
    gate.leave_replay(KEY)
    assert len(gate) == 0


@pytest.mark.asyncio
async def test_a_write_held_by_an_earlier_process_waits_for_every_direct_write() -> None:
    gate = KeyGate()
    assert gate.try_enter_direct(KEY, 1)
    replay = await started(gate.enter_replay(KEY, 10_000, earlier_process=True))
    assert not replay.done()
    gate.leave_direct(KEY, 1)
    await asyncio.wait_for(replay, 1)
    gate.leave_replay(KEY)


@pytest.mark.asyncio
async def test_replays_of_one_key_do_not_overlap() -> None:
    gate = KeyGate()
    await gate.enter_replay(KEY, 1, earlier_process=False)
    second = await started(gate.enter_replay(KEY, 2, earlier_process=False))
    assert not second.done()
    gate.leave_replay(KEY)
    await asyncio.wait_for(second, 1)
    gate.leave_replay(KEY)
    assert len(gate) == 0


@pytest.mark.asyncio
async def test_a_cancelled_waiter_leaves_the_gate_usable() -> None:
    gate = KeyGate()
    await gate.enter_replay(KEY, 1, earlier_process=False)
    waiting = await started(gate.enter_direct(KEY, 4))
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.leave_replay(KEY)
    assert gate.try_enter_direct(KEY, 5)
    gate.leave_direct(KEY, 5)
    assert len(gate) == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("first_out", [3, 4])
async def test_two_direct_writes_of_a_key_in_flight_hold_a_replay_until_the_newer_one_ends(
    first_out: int,
) -> None:
    """A key's second direct write joins its first (the lone one is held as just its stamp): a
    replay stamped between them waits for the newer one only, whichever ends first."""
    gate = KeyGate()
    assert gate.try_enter_direct(KEY, 3)
    assert gate.try_enter_direct(KEY, 4)
    gate.leave_direct(KEY, first_out)
    replay = await started(gate.enter_replay(KEY, 3, earlier_process=False))
    assert replay.done() is (first_out == 4)
    gate.leave_direct(KEY, 7 - first_out)
    await asyncio.wait_for(replay, 1)
    gate.leave_replay(KEY)
    assert len(gate) == 0
