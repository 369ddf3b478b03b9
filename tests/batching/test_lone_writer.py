"""The batcher's lone-write path with a scripted :class:`~guarded.durability.batch_queue.LoneWriter`
(expect this call, answer with that): the write's own call is awaited in the caller's task, its
failure goes to ``one_failed``, a write the lone writer declines goes through the writer, and
``aclose()`` abandoning a lone write in flight leaves the owner's verdict with the caller and no
slot taken."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import BatchConfig
from guarded.durability.batching import ALONE, Batcher, PendingWrite
from guarded.outcome import Outcome

from .support import LONG, event_write

pytestmark = pytest.mark.asyncio


class ScriptedLone:
    """A writer and lone writer in one: ``start_one`` answers from ``script`` (an awaitable
    factory, or ``None`` to decline), ``one_failed`` answers ``failed_answer`` and records what it
    was handed; every call of the writer itself is recorded."""

    def __init__(self, script: Any, failed_answer: Sequence[Outcome] | None = None) -> None:
        self.script = script
        self.failed_answer = failed_answer
        self.started: list[PendingWrite] = []
        self.failures: list[tuple[PendingWrite, BaseException]] = []
        self.written: list[tuple[str, list[PendingWrite]]] = []

    def start_one(self, write: PendingWrite) -> Any:
        self.started.append(write)
        return None if self.script is None else self.script()

    async def one_failed(self, write: PendingWrite, exc: BaseException) -> Sequence[Outcome] | None:
        self.failures.append((write, exc))
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        return self.failed_answer

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
        self.written.append((method, list(writes)))


def make(lone: ScriptedLone) -> Batcher:
    return Batcher(
        BatchConfig(max_delay=LONG), lone, store_name="lone", registry=CollectorRegistry(), lone=lone
    )


def committed(write: PendingWrite) -> PendingWrite:
    write.done = asyncio.get_running_loop().create_future()
    return write


async def ok() -> None:
    await asyncio.sleep(0)


async def test_a_lone_write_awaits_its_own_call_and_never_reaches_the_writer() -> None:
    lone = ScriptedLone(ok)
    batcher = make(lone)
    write = committed(event_write("t"))
    assert batcher.offer(write) == ALONE
    assert await batcher.write_alone("save_event") is Outcome.OK
    assert lone.started == [write]
    assert lone.written == []
    assert lone.failures == []
    assert batcher.pending == 0


async def test_a_failed_lone_call_is_answered_by_one_failed() -> None:
    failure = ConnectionError("database unreachable")

    async def failing() -> None:
        raise failure

    lone = ScriptedLone(failing, failed_answer=[Outcome.DEAD_LETTERED])
    batcher = make(lone)
    write = committed(event_write("t"))
    assert batcher.offer(write) == ALONE
    assert await batcher.write_alone("save_event") is Outcome.DEAD_LETTERED
    assert lone.failures == [(write, failure)]
    assert batcher.pending == 0


async def test_a_declined_lone_write_goes_through_the_writer() -> None:
    lone = ScriptedLone(None)
    batcher = make(lone)
    write = committed(event_write("t"))
    assert batcher.offer(write) == ALONE
    assert await batcher.write_alone("save_event") is Outcome.OK
    assert lone.written == [("save_event", [write])]


async def test_a_lone_write_abandoned_by_aclose_answers_the_owners_verdict() -> None:
    release = asyncio.Event()

    async def stalled() -> None:
        await release.wait()

    lone = ScriptedLone(stalled)
    batcher = make(lone)
    write = committed(event_write("t"))
    assert batcher.offer(write) == ALONE
    caller = asyncio.create_task(batcher.write_alone("save_event"))
    await asyncio.sleep(0)
    assert await batcher.aclose(timeout=0.05) == 1, "the stalled lone write is still in flight"
    assert batcher.drain_unwritten() == [write], "handed to the owner"
    assert batcher.pending == 0
    assert write.done is not None
    write.done.set_result(Outcome.DEAD_LETTERED)  # the owner kept it for replay
    release.set()  # the stalled call comes back after all
    assert await asyncio.wait_for(caller, 5.0) is Outcome.DEAD_LETTERED
    assert batcher.pending == 0, "the abandoned write's slot is not given back twice"


async def test_a_lone_writer_cancelled_in_its_call_hands_the_write_back() -> None:
    lone = ScriptedLone(lambda: asyncio.sleep(LONG))
    batcher = make(lone)
    write = committed(event_write("t"))
    assert batcher.offer(write) == ALONE
    caller = asyncio.create_task(batcher.write_alone("save_event"))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [type(exc) for _, exc in lone.failures] == [asyncio.CancelledError]
    assert batcher.drain_unwritten() == [write]
    assert batcher.pending == 0
