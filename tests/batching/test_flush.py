"""Flush policy: size, delay, order, concurrency limit, read-your-writes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import Batcher, PendingWrite
from guarded.config import BatchConfig

from .support import StoreWriter, deadline, event_write, make, settle

MARGIN = 0.05


def stamps(writes: list[PendingWrite]) -> list[int]:
    return [write.stamp for write in writes]


@pytest.mark.asyncio
async def test_a_full_batch_is_flushed_at_once_and_the_rest_waits() -> None:
    batcher, writer = make(max_batch=3)
    for index in range(5):
        assert await batcher.submit(event_write("t", index), deadline=deadline())
    await settle()

    assert [len(writes) for _, writes in writer.flushes] == [3]
    assert len(await writer.store.load_history("t")) == 3
    assert batcher.pending == 2
    await batcher.aclose()


@pytest.mark.asyncio
async def test_a_lone_write_is_flushed_once_its_delay_expires() -> None:
    batcher, writer = make(max_delay=0.05)
    started = time.perf_counter()
    assert await batcher.submit(event_write("t"), deadline=deadline())
    await asyncio.sleep(0.02)
    assert writer.flushes == []

    await asyncio.wait_for(writer.flushed.wait(), 1.0)
    elapsed = time.perf_counter() - started
    assert 0.045 <= elapsed <= 0.05 + MARGIN
    assert len(await writer.store.load_history("t")) == 1
    assert batcher.pending == 0
    await batcher.aclose()


@pytest.mark.asyncio
async def test_zero_delay_flushes_on_the_next_loop_iteration_together() -> None:
    batcher, writer = make(max_delay=0.0)
    for index in range(4):
        await batcher.submit(event_write("t", index), deadline=deadline())
    assert writer.flushes == []
    await settle()
    assert [len(writes) for _, writes in writer.flushes] == [4]
    await batcher.aclose()


@pytest.mark.asyncio
async def test_the_delay_is_counted_from_the_oldest_write_not_the_newest() -> None:
    batcher, writer = make(max_delay=0.06)
    started = time.perf_counter()
    await batcher.submit(event_write("t", 0), deadline=deadline())
    for index in range(1, 4):
        await asyncio.sleep(0.015)
        await batcher.submit(event_write("t", index), deadline=deadline())
    await asyncio.wait_for(writer.flushed.wait(), 1.0)
    assert time.perf_counter() - started <= 0.06 + MARGIN
    assert [len(writes) for _, writes in writer.flushes] == [4]
    await batcher.aclose()


@pytest.mark.asyncio
async def test_writes_of_a_method_reach_the_writer_in_submission_order() -> None:
    gate = asyncio.Event()
    batcher, writer = make(
        StoreWriter(InMemoryStateStore(), gate=gate), max_batch=4, max_concurrent_flushes=2
    )
    submitted = [event_write(f"t{index % 3}", index) for index in range(30)]
    for write in submitted:
        assert await batcher.submit(write, deadline=deadline())
    gate.set()
    await batcher.flush()

    assert stamps([write for batch in writer.started for write in batch]) == stamps(submitted)
    assert all(len(batch) <= 4 for batch in writer.started)
    assert sorted(stamps(writer.written)) == stamps(submitted)
    for trace in ("t0", "t1", "t2"):
        history = await writer.store.load_history(trace)
        assert [item.payload["i"] for item in history] == [i for i in range(30) if i % 3 == int(trace[1])]
    await batcher.aclose()


@pytest.mark.asyncio
async def test_at_most_max_concurrent_flushes_of_one_method_run_at_once() -> None:
    gate = asyncio.Event()
    batcher, writer = make(
        StoreWriter(InMemoryStateStore(), gate=gate), max_batch=2, max_concurrent_flushes=2
    )
    for index in range(10):
        await batcher.submit(event_write("t", index), deadline=deadline())
    await settle()
    assert writer.running == 2
    assert batcher.pending == 10

    gate.set()
    await batcher.flush()
    assert writer.max_running == 2
    assert len(writer.flushes) == 5
    assert batcher.pending == 0
    await batcher.aclose()


@pytest.mark.asyncio
async def test_methods_have_their_own_queues() -> None:
    seen: list[tuple[str, list[int]]] = []

    async def record(method: str, writes: Sequence[PendingWrite]) -> None:
        seen.append((method, [write.stamp for write in writes]))

    batcher = Batcher(
        BatchConfig(max_batch=2, max_delay=60), record, store_name="s", registry=CollectorRegistry()
    )
    loop = asyncio.get_running_loop()
    for stamp, method in enumerate(["save_event", "save_update", "save_event", "save_planner_event"]):
        write = PendingWrite(method, (stamp,), {}, None, stamp, loop.time())
        await batcher.submit(write, deadline=deadline())
    await settle()
    assert seen == [("save_event", [0, 2])]
    await batcher.flush()
    assert sorted(seen) == [("save_event", [0, 2]), ("save_planner_event", [3]), ("save_update", [1])]
    await batcher.aclose()


@pytest.mark.asyncio
async def test_flush_writes_everything_queued_before_it() -> None:
    batcher, writer = make(max_batch=100)
    for index in range(7):
        await batcher.submit(event_write(f"t{index}", index), deadline=deadline())
    await batcher.flush()
    assert len(writer.written) == 7
    assert batcher.pending == 0
    await batcher.aclose()


@pytest.mark.asyncio
async def test_read_your_writes_through_pending_for_scope_and_flush_scope() -> None:
    batcher, writer = make(max_batch=100)
    mine = [event_write("mine", index) for index in range(3)]
    other = event_write("other", 9)
    for write in (mine[0], other, mine[1], mine[2]):
        await batcher.submit(write, deadline=deadline())

    assert batcher.pending_for_scope("save_event", "mine") == mine
    assert batcher.pending_for_scope("save_event", "nobody") == []
    assert batcher.pending_for_scope("save_update", "mine") == []
    assert await writer.store.load_history("mine") == []

    await batcher.flush_scope("save_event", "mine")
    history = await writer.store.load_history("mine")
    assert [item.payload["i"] for item in history] == [0, 1, 2]
    assert batcher.pending_for_scope("save_event", "mine") == []
    await batcher.aclose()


@pytest.mark.asyncio
async def test_pending_for_scope_includes_writes_being_flushed() -> None:
    gate = asyncio.Event()
    batcher, _ = make(StoreWriter(InMemoryStateStore(), gate=gate), max_batch=2, max_concurrent_flushes=1)
    writes = [event_write("t", index) for index in range(5)]
    for write in writes:
        await batcher.submit(write, deadline=deadline())
    await settle()
    assert batcher.pending_for_scope("save_event", "t") == writes

    flushed = asyncio.ensure_future(batcher.flush_scope("save_event", "t"))
    await settle()
    assert not flushed.done()
    gate.set()
    await flushed
    assert batcher.pending_for_scope("save_event", "t") == []
    await batcher.aclose()


@pytest.mark.asyncio
async def test_flush_scope_does_not_wait_for_later_writes() -> None:
    batcher, writer = make(max_batch=100)
    await batcher.submit(event_write("t", 0), deadline=deadline())
    flushing = asyncio.ensure_future(batcher.flush_scope("save_event", "t"))
    await asyncio.sleep(0)
    await batcher.submit(event_write("t", 1), deadline=deadline())
    await flushing
    assert [item.payload["i"] for item in await writer.store.load_history("t")] == [0]
    assert batcher.pending == 1
    await batcher.aclose()


@pytest.mark.asyncio
async def test_flush_scope_with_nothing_pending_never_suspends() -> None:
    batcher, _ = make()
    await batcher.submit(event_write("busy"), deadline=deadline())
    for method, scope in [("save_event", "idle"), ("save_update", "busy")]:
        coroutine = batcher.flush_scope(method, scope)
        with pytest.raises(StopIteration):
            coroutine.send(None)
    await batcher.aclose()


def test_a_batcher_built_outside_a_loop_binds_to_the_loop_that_uses_it() -> None:
    batcher, writer = make(max_delay=0.0)

    async def use() -> None:
        assert await batcher.submit(event_write("t"), deadline=deadline())
        await batcher.flush()
        assert await batcher.aclose() == 0

    asyncio.run(use())
    assert len(writer.written) == 1
