"""Group commit: a write's caller waits for the batch holding it; a lone writer goes out at once;
writes arriving during a flush form the next batch; each caller learns its own write's outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import Batcher, PendingWrite
from guarded.outcome import Outcome

from .support import StoreWriter, deadline, event_write, make, settle

pytestmark = pytest.mark.asyncio


def committed(write: PendingWrite) -> PendingWrite:
    """``write`` as the guard submits it under group commit: with a future for its outcome."""
    loop = asyncio.get_running_loop()
    return PendingWrite(
        write.method,
        write.args,
        write.kwargs,
        write.scope,
        write.stamp,
        write.queued_at,
        loop.create_future(),
    )


def submitting(batcher: Batcher, write: PendingWrite) -> asyncio.Task[bool]:
    """Submit ``write`` in a task of its own: a lone group-commit write is flushed in its caller's
    task, so ``submit`` returns only once it is written."""
    return asyncio.create_task(batcher.submit(write, deadline=deadline()))


class ScriptedWriter:
    """Holds every flush until released; answers each write's outcome from ``outcome_of``."""

    def __init__(self) -> None:
        self.batches: list[list[PendingWrite]] = []
        self.release = asyncio.Event()
        self.outcome_of: dict[int, Outcome] = {}

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> list[Outcome]:
        self.batches.append(list(writes))
        await self.release.wait()
        return [self.outcome_of.get(write.stamp, Outcome.OK) for write in writes]


async def test_a_lone_write_goes_out_without_waiting_for_size_or_delay() -> None:
    batcher, writer = make(max_delay=3600.0)  # a write-behind queue would wait an hour
    write = committed(event_write("t"))
    assert await batcher.submit(write, deadline=deadline())
    assert write.done is not None
    assert write.done.done(), "written in the caller's own task: no flush task, no loop iteration"
    assert write.done.result() is Outcome.OK
    assert [w.stamp for w in writer.written] == [write.stamp]


async def test_the_caller_is_answered_only_after_its_batch_is_written() -> None:
    writer = ScriptedWriter()
    batcher, _ = make(writer)
    write = committed(event_write("t"))
    submitted = submitting(batcher, write)
    await settle()
    assert writer.batches == [[write]]
    assert write.done is not None
    assert not write.done.done()
    assert not submitted.done()
    writer.release.set()
    assert await asyncio.wait_for(write.done, 5.0) is Outcome.OK
    assert await submitted


async def test_writes_arriving_during_a_flush_form_the_next_batch() -> None:
    writer = ScriptedWriter()
    batcher, _ = make(writer, max_concurrent_flushes=1)
    first = committed(event_write("t", 0))
    submitted = [submitting(batcher, first)]
    await settle()
    later = [committed(event_write("t", index)) for index in range(1, 51)]
    submitted.extend(submitting(batcher, write) for write in later)
    await settle()
    assert len(writer.batches) == 1, "the second batch waits for the first flush"
    writer.release.set()
    await asyncio.wait_for(asyncio.gather(*(w.done for w in [first, *later] if w.done)), 5.0)
    assert all(await asyncio.gather(*submitted))
    assert [len(batch) for batch in writer.batches] == [1, 50]


class NetworkWriter(StoreWriter):
    """A :class:`StoreWriter` whose flushes wait for I/O, as a database round trip does."""

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
        await asyncio.sleep(0)
        await super().__call__(method, writes)


async def test_concurrent_writers_share_batches() -> None:
    batcher, writer = make(NetworkWriter(InMemoryStateStore()), max_concurrent_flushes=2)
    writes = [committed(event_write("t", index)) for index in range(200)]

    async def one(write: PendingWrite) -> Outcome:
        await batcher.submit(write, deadline=deadline())
        assert write.done is not None
        return await write.done

    outcomes = await asyncio.wait_for(asyncio.gather(*(one(write) for write in writes)), 10.0)
    assert set(outcomes) == {Outcome.OK}
    assert len(writer.written) == 200
    assert len(writer.flushes) < 20, "200 concurrent writers share a handful of bulk writes"


async def test_each_caller_gets_its_own_writes_outcome() -> None:
    writer = ScriptedWriter()
    batcher, _ = make(writer)
    writes = [committed(event_write("t", index)) for index in range(3)]
    writer.outcome_of = {writes[1].stamp: Outcome.DEAD_LETTERED, writes[2].stamp: Outcome.REJECTED}
    submitted = [submitting(batcher, write) for write in writes]
    await settle()
    writer.release.set()
    assert all(await asyncio.gather(*submitted))
    outcomes = [await asyncio.wait_for(w.done, 5.0) for w in writes if w.done is not None]
    assert outcomes == [Outcome.OK, Outcome.DEAD_LETTERED, Outcome.REJECTED]


async def test_a_writer_that_raises_tells_its_callers_their_writes_were_not_kept() -> None:
    async def broken(method: str, writes: Sequence[PendingWrite]) -> None:
        raise RuntimeError("bug in the writer")

    batcher, _ = make(broken)
    write = committed(event_write("t"))
    await batcher.submit(write, deadline=deadline())
    assert write.done is not None
    assert await asyncio.wait_for(write.done, 5.0) is Outcome.FALLBACK
    assert batcher.failed == 1


async def test_a_cancelled_caller_does_not_take_its_write_out_of_the_batch() -> None:
    writer = ScriptedWriter()
    batcher, _ = make(writer)
    write = committed(event_write("t"))

    async def caller() -> Outcome:
        await batcher.submit(write, deadline=deadline())
        assert write.done is not None
        return await write.done

    task = asyncio.create_task(caller())
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    writer.release.set()
    await batcher.flush()
    assert writer.batches == [[write]]
    assert batcher.pending == 0


async def test_write_behind_writes_are_counted_as_acknowledged_pending_group_commit_ones_not() -> None:
    writer = ScriptedWriter()
    batcher, _ = make(writer)
    submitted = submitting(batcher, committed(event_write("t", 0)))
    await batcher.submit(event_write("u", 1), deadline=deadline())  # write-behind: acknowledged now
    await settle()
    assert batcher.acknowledged_pending == 1
    writer.release.set()
    await batcher.flush()
    assert await submitted
    assert batcher.acknowledged_pending == 0
