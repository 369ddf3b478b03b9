"""Bounded memory: full queue, FIFO waiters, deadlines, cancellation, closing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import Batcher, PendingWrite

from .support import StoreWriter, deadline, event_write, make, settle

MARGIN = 0.05


def blocked(**config: Any) -> tuple[Batcher, StoreWriter, asyncio.Event]:
    """A batcher whose writer waits for the returned event before every flush."""
    gate = asyncio.Event()
    batcher, writer = make(StoreWriter(InMemoryStateStore(), gate=gate), **config)
    return batcher, writer, gate


async def fill(batcher: Batcher, count: int, trace: str = "t") -> list[PendingWrite]:
    writes = [event_write(trace, index) for index in range(count)]
    for write in writes:
        assert await batcher.submit(write, deadline=deadline())
    return writes


@pytest.mark.asyncio
async def test_a_full_queue_makes_submitters_wait_then_refuses_at_their_deadline() -> None:
    batcher, writer, gate = blocked(queue_size=5, max_batch=2, max_concurrent_flushes=1)
    await fill(batcher, 5)
    await settle()
    assert batcher.pending == 5

    started = time.perf_counter()
    assert not await batcher.submit(event_write("late"), deadline=deadline(0.05))
    assert 0.045 <= time.perf_counter() - started <= 0.05 + MARGIN
    assert batcher.pending == 5
    assert not await batcher.submit(event_write("late"), deadline=deadline(-1.0))
    assert batcher.pending_for_scope("save_event", "late") == []

    gate.set()
    await batcher.flush()
    assert len(writer.written) == 5
    assert batcher.pending == 0
    assert await batcher.submit(event_write("later"), deadline=deadline(0.0))
    await batcher.aclose()


@pytest.mark.asyncio
async def test_waiters_are_admitted_fifo_and_pending_never_exceeds_queue_size() -> None:
    batcher, writer, gate = blocked(queue_size=4, max_batch=2, max_concurrent_flushes=1)
    await fill(batcher, 4)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, batcher.pending)
            await asyncio.sleep(0)

    watcher = asyncio.ensure_future(watch())
    admitted: list[int] = []

    async def submit(index: int) -> None:
        assert await batcher.submit(event_write("waiting", index), deadline=deadline())
        admitted.append(index)

    waiting = [asyncio.ensure_future(submit(index)) for index in range(10)]
    await settle()
    assert admitted == []
    assert not await batcher.submit(event_write("jumper"), deadline=deadline(0.01))

    gate.set()
    await asyncio.gather(*waiting)
    await batcher.flush()
    watcher.cancel()

    assert admitted == list(range(10))
    assert peak <= 4
    history = await writer.store.load_history("waiting")
    assert [item.payload["i"] for item in history] == list(range(10))
    assert batcher.pending == 0
    await batcher.aclose()


@pytest.mark.asyncio
async def test_cancelling_a_waiting_submitter_gives_its_place_to_the_next() -> None:
    batcher, writer, gate = blocked(queue_size=2, max_batch=2, max_concurrent_flushes=1)
    await fill(batcher, 2)
    cancelled = asyncio.ensure_future(batcher.submit(event_write("cancelled"), deadline=deadline()))
    patient = asyncio.ensure_future(batcher.submit(event_write("patient"), deadline=deadline()))
    await settle()
    cancelled.cancel()
    await settle()
    assert cancelled.cancelled()
    assert batcher.pending == 2

    gate.set()
    assert await patient
    await batcher.flush()
    assert batcher.pending == 0
    assert await writer.store.load_history("cancelled") == []
    assert len(await writer.store.load_history("patient")) == 1
    assert await fill(batcher, 2, "again")
    assert batcher.pending == 2
    await batcher.aclose()


@pytest.mark.asyncio
async def test_a_submitter_cancelled_right_after_being_granted_a_slot_returns_it() -> None:
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    waiting: list[asyncio.Future[bool]] = []
    written: list[str | None] = []

    async def writer(method: str, writes: Sequence[PendingWrite]) -> None:
        await gate.wait()
        written.extend(write.scope for write in writes)
        if len(written) == 1:
            loop.call_soon(waiting[0].cancel)  # runs after the slot is granted, before the waiter resumes

    batcher, _ = make(writer=writer, queue_size=1, max_batch=1, max_concurrent_flushes=1)
    assert await batcher.submit(event_write("first"), deadline=deadline())
    waiting.append(asyncio.ensure_future(batcher.submit(event_write("granted"), deadline=deadline())))
    waiting.append(asyncio.ensure_future(batcher.submit(event_write("third"), deadline=deadline())))
    await settle()
    assert batcher.pending == 1

    gate.set()
    await settle(10)
    assert waiting[0].cancelled()
    assert await waiting[1]
    await batcher.flush()
    assert written == ["first", "third"]
    assert batcher.pending == 0
    await batcher.aclose()


@pytest.mark.asyncio
async def test_aclose_writes_everything_and_then_refuses() -> None:
    batcher, writer = make(max_batch=100)
    await fill(batcher, 7)
    assert not batcher.closed
    assert await batcher.aclose() == 0
    assert batcher.closed
    assert len(writer.written) == 7
    assert batcher.pending == 0
    assert batcher.drain_unwritten() == []
    assert not await batcher.submit(event_write("t"), deadline=deadline())
    assert await batcher.aclose() == 0


@pytest.mark.asyncio
async def test_aclose_timeout_hands_back_what_was_not_written() -> None:
    batcher, writer, _gate = blocked(queue_size=10, max_batch=2, max_concurrent_flushes=1)
    writes = await fill(batcher, 5)
    waiter_batcher_full = await fill(batcher, 5, "second")
    late = asyncio.ensure_future(batcher.submit(event_write("late"), deadline=deadline()))
    await settle()

    started = time.perf_counter()
    assert await batcher.aclose(timeout=0.05) == 10
    assert time.perf_counter() - started <= 0.05 + MARGIN
    assert late.done()
    assert not late.result()

    assert batcher.pending == 0
    unwritten = batcher.drain_unwritten()
    assert [write.stamp for write in unwritten] == [write.stamp for write in writes + waiter_batcher_full]
    assert batcher.drain_unwritten() == []
    assert writer.written == []
    assert writer.running == 0
    assert not await batcher.submit(event_write("t"), deadline=deadline())


@pytest.mark.asyncio
async def test_aclose_keeps_what_was_written_before_its_timeout() -> None:
    release_after = 2
    calls = 0
    never = asyncio.Event()
    written: list[int] = []

    async def writer(method: str, writes: Sequence[PendingWrite]) -> None:
        nonlocal calls
        calls += 1
        if calls > release_after:
            await never.wait()
        written.extend(write.stamp for write in writes)

    batcher, _ = make(writer=writer, max_batch=2, max_concurrent_flushes=1)
    writes = await fill(batcher, 7)
    assert await batcher.aclose(timeout=0.05) == 3
    stamps = [write.stamp for write in writes]
    assert written == stamps[:4]
    assert [write.stamp for write in batcher.drain_unwritten()] == stamps[4:]
