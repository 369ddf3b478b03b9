"""Group commit, leader style: a lone writer writes its own write in its own task; one flush of a
method is in flight unless a full batch waits; the callers a batch answered rejoin one batch; an
ordered method's batches never overlap and keep call order; a failed lone write is held."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import ALONE, NO_ROOM, QUEUED, Batcher, PendingWrite
from guarded.config import BatchConfig, DeadLetterConfig, GuardConfig
from guarded.models import StateUpdate, StoredEvent, UpdateType
from guarded.outcome import Outcome

from .support import StoreWriter, deadline, event_write, make

pytestmark = pytest.mark.asyncio


def committed(write: PendingWrite) -> PendingWrite:
    write.done = asyncio.get_running_loop().create_future()
    return write


class NetworkWriter(StoreWriter):
    """A :class:`StoreWriter` whose flushes wait one loop iteration, as a round trip does."""

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
        await asyncio.sleep(0)
        await super().__call__(method, writes)


async def test_offer_says_whether_the_caller_writes_alone_joins_a_batch_or_must_wait() -> None:
    gate = asyncio.Event()
    batcher, writer = make(StoreWriter(InMemoryStateStore(), gate=gate), queue_size=2)
    first, second, third = (committed(event_write("t", index)) for index in range(3))
    assert batcher.offer(first) == ALONE
    leader = asyncio.create_task(batcher.write_alone("save_event"))
    await asyncio.sleep(0)
    assert batcher.offer(second) == QUEUED, "a flush of the method runs: the write joins the next batch"
    assert batcher.offer(third) == NO_ROOM, "queue_size reached: submit() waits for room"
    gate.set()
    await leader
    assert first.done is not None
    assert first.done.result() is Outcome.OK
    assert second.done is not None
    assert await asyncio.wait_for(second.done, 5.0) is Outcome.OK
    assert [len(writes) for _, writes in writer.flushes] == [1, 1]


async def test_a_cancelled_lone_writer_does_not_strand_the_writes_queued_behind_it() -> None:
    gate = asyncio.Event()
    batcher, writer = make(StoreWriter(InMemoryStateStore(), gate=gate))
    first, second = (committed(event_write("t", index)) for index in range(2))
    assert batcher.offer(first) == ALONE
    leader = asyncio.create_task(batcher.write_alone("save_event"))
    await asyncio.sleep(0)
    assert batcher.offer(second) == QUEUED, "a flush of the method runs: the write waits for it"
    leader.cancel()  # the lone writer's caller gives up (a client disconnects)
    with pytest.raises(asyncio.CancelledError):
        await leader
    gate.set()
    assert second.done is not None
    assert await asyncio.wait_for(second.done, 5.0) is Outcome.OK, "nothing else writes: it must go out"
    assert [len(writes) for _, writes in writer.flushes][-1:] == [1]


async def test_one_flush_in_flight_and_the_callers_it_answered_rejoin_one_batch() -> None:
    batcher, writer = make(NetworkWriter(InMemoryStateStore()), max_concurrent_flushes=4)

    async def caller(trace: str) -> None:
        for index in range(5):
            write = committed(event_write(trace, index))
            assert await batcher.submit(write, deadline=deadline())
            assert write.done is not None
            assert await write.done is Outcome.OK

    await asyncio.wait_for(asyncio.gather(*(caller(f"t{n}") for n in range(10))), 10.0)
    # The first writer goes out alone; the nine arriving meanwhile form the next batch; from then
    # on the ten callers a batch answered write again together.
    assert [len(writes) for _, writes in writer.flushes] == [1, 9, 10, 10, 10, 10]
    assert writer.max_running == 1


async def test_a_full_batch_goes_out_beside_the_running_flush() -> None:
    gate = asyncio.Event()
    batcher, writer = make(
        StoreWriter(InMemoryStateStore(), gate=gate), max_batch=4, max_concurrent_flushes=3
    )
    writes = [committed(event_write("t", index)) for index in range(9)]
    submitted = [asyncio.create_task(batcher.submit(write, deadline=deadline())) for write in writes]
    for _ in range(3):
        await asyncio.sleep(0)
    assert [len(batch) for batch in writer.started] == [1, 4, 4]
    gate.set()
    assert all(await asyncio.gather(*submitted))
    await asyncio.wait_for(asyncio.gather(*(w.done for w in writes if w.done is not None)), 5.0)
    assert len(writer.written) == 9


async def test_enough_waiting_writes_are_split_over_the_free_flushes() -> None:
    gate = asyncio.Event()
    batcher, writer = make(
        StoreWriter(InMemoryStateStore(), gate=gate),
        max_batch=100,
        max_concurrent_flushes=3,
        parallel_flush_at=4,
    )
    writes = [committed(event_write("t", index)) for index in range(16)]
    submitted = [asyncio.create_task(batcher.submit(write, deadline=deadline())) for write in writes]
    for _ in range(3):
        await asyncio.sleep(0)
    # One write went out alone; the fifteen waiting fill the two free flushes, evenly.
    assert [len(batch) for batch in writer.started] == [1, 8, 7]
    gate.set()
    assert all(await asyncio.gather(*submitted))
    await asyncio.wait_for(asyncio.gather(*(w.done for w in writes if w.done is not None)), 5.0)
    assert len(writer.written) == 16


async def test_a_hundred_callers_fall_into_cohorts_whose_flushes_overlap() -> None:
    batcher, writer = make(
        NetworkWriter(InMemoryStateStore()), max_concurrent_flushes=4, parallel_flush_at=48
    )

    async def caller(trace: str) -> None:
        for index in range(5):
            write = committed(event_write(trace, index))
            assert await batcher.submit(write, deadline=deadline())
            assert write.done is not None
            assert await write.done is Outcome.OK

    await asyncio.wait_for(asyncio.gather(*(caller(f"t{n}") for n in range(100))), 10.0)
    sizes = [len(writes) for _, writes in writer.flushes]
    assert sum(sizes) == 500
    assert sizes[:3] == [1, 50, 49], "the 99 arriving during the lone write: two cohorts"
    assert max(sizes[3:]) <= 51, "the cohorts stay apart: never one batch of all the callers"


async def test_an_ordered_method_never_overlaps_its_flushes_and_keeps_call_order() -> None:
    store = InMemoryStateStore()
    writer = NetworkWriter(store)
    batcher = Batcher(
        BatchConfig(max_batch=7, max_concurrent_flushes=4),
        writer,
        store_name="test",
        registry=CollectorRegistry(),
        ordered=["save_update"],
    )
    stamps = iter(range(10_000))

    async def caller(session: str) -> None:
        for index in range(6):
            write = PendingWrite(
                "save_update",
                (
                    StateUpdate(
                        session_id=session,
                        task_id="task",
                        update_type=UpdateType.PROGRESS,
                        content={"i": index},
                    ),
                ),
                {},
                session,
                next(stamps),
                asyncio.get_running_loop().time(),
                asyncio.get_running_loop().create_future(),
            )
            assert await batcher.submit(write, deadline=deadline())
            assert write.done is not None
            assert await write.done is Outcome.OK

    await asyncio.wait_for(asyncio.gather(*(caller(f"s{n}") for n in range(30))), 10.0)
    assert writer.max_running == 1
    written = [write.stamp for write in writer.written]
    assert written == sorted(written)
    assert len(written) == 180


class RecordingStore(InMemoryStateStore):
    """Records the task each write of events runs in (a batch of one goes out as the single write)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def save_events(self, events: Sequence[Any]) -> None:
        self.tasks.append(asyncio.current_task())
        await super().save_events(events)

    async def save_event(self, event: Any) -> None:
        self.tasks.append(asyncio.current_task())
        await super().save_event(event)


def _config(**batching: Any) -> GuardConfig:
    return GuardConfig(
        batching=BatchConfig(**batching), dead_letter=DeadLetterConfig(path=None, drain_timeout=0.1)
    )


async def test_a_lone_writers_event_is_written_in_its_own_task_before_its_call_returns() -> None:
    store = RecordingStore()
    proxy = guard(store, name="lone", config=_config(), registry=CollectorRegistry())
    try:

        async def caller() -> tuple[asyncio.Task[Any] | None, list[Any]]:
            await proxy.save_event(StoredEvent("t", 1.0, "node_end", "n", "n1", {"i": 1}))
            return asyncio.current_task(), await store.load_history("t")

        caller_task, history = await asyncio.create_task(caller())
        assert len(history) == 1, "in the backend when save_event returns"
        assert store.tasks == [caller_task], "no flush task: the caller wrote its own write"
    finally:
        await controller(proxy).aclose()


class DownStore(InMemoryStateStore):
    async def save_events(self, events: Sequence[Any]) -> None:
        raise ConnectionError("database unreachable")

    async def save_event(self, event: Any) -> None:
        raise ConnectionError("database unreachable")


async def test_a_failed_lone_write_is_held_not_lost() -> None:
    registry = CollectorRegistry()
    proxy = guard(DownStore(), name="down", config=_config(), registry=registry)
    try:
        event = StoredEvent("t", 1.0, "node_end", "n", "n1", {"i": 1})
        await proxy.save_event(event)
        buffer = controller(proxy).dead_letters
        assert buffer is not None
        assert buffer.depth == 1, "the caller returned once its write was held for replay"
        held = await buffer.pending_for_scope("save_event", "t")
        assert [args[0] for args, _ in held] == [event]
    finally:
        await controller(proxy).aclose()
