"""The batcher's lone-write path with a scripted :class:`~guarded.batching.batcher.LoneWriter`
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

from guarded.batching.batcher import ALONE, Batcher, PendingWrite
from guarded.config import BatchConfig
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
        if not isinstance(exc, Exception):
            raise exc  # as the guard's writer does: a cancellation, or worse, is not a write's failure
        return self.failed_answer

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
        self.written.append((method, list(writes)))


def make(lone: ScriptedLone) -> Batcher:
    return Batcher(
        BatchConfig(max_delay=LONG), lone, store_name="lone", registry=CollectorRegistry(), lone=lone
    )


def offered_alone(lone: ScriptedLone) -> tuple[Batcher, PendingWrite]:
    """A batcher over ``lone`` and a group-commit write it has just answered ``ALONE`` for."""
    batcher = make(lone)
    write = event_write("t")
    write.done = asyncio.get_running_loop().create_future()
    assert batcher.offer(write) == ALONE
    return batcher, write


async def ok() -> None:
    await asyncio.sleep(0)


async def test_a_lone_write_awaits_its_own_call_and_never_reaches_the_writer() -> None:
    lone = ScriptedLone(ok)
    batcher, write = offered_alone(lone)
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
    batcher, write = offered_alone(lone)
    assert await batcher.write_alone("save_event") is Outcome.DEAD_LETTERED
    assert lone.failures == [(write, failure)]
    assert batcher.pending == 0


async def test_a_declined_lone_write_goes_through_the_writer() -> None:
    lone = ScriptedLone(None)
    batcher, write = offered_alone(lone)
    assert await batcher.write_alone("save_event") is Outcome.OK
    assert lone.written == [("save_event", [write])]


async def test_a_lone_write_abandoned_by_aclose_answers_the_owners_verdict() -> None:
    release = asyncio.Event()

    async def stalled() -> None:
        await release.wait()

    lone = ScriptedLone(stalled)
    batcher, write = offered_alone(lone)
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
    batcher, write = offered_alone(lone)
    caller = asyncio.create_task(batcher.write_alone("save_event"))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [type(exc) for _, exc in lone.failures] == [asyncio.CancelledError]
    assert batcher.drain_unwritten() == [write]
    assert batcher.pending == 0


class Boom(BaseException):
    """Neither a failure a writer answers nor a cancellation (as ``SystemExit`` is)."""


async def test_a_lone_write_ending_in_a_base_exception_leaves_the_method_free() -> None:
    calls = 0

    async def boom_once() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Boom

    lone = ScriptedLone(boom_once)
    batcher, _ = offered_alone(lone)
    with pytest.raises(Boom):
        await batcher.write_alone("save_event")
    assert batcher.pending == 0, "the write left the batcher"
    second = event_write("t", 1)
    second.done = asyncio.get_running_loop().create_future()
    assert batcher.offer(second) == ALONE, "no flush of the method is left running"
    assert await batcher.write_alone("save_event") is Outcome.OK
    await asyncio.wait_for(batcher.flush(), 5.0)


class BoomWriter:
    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
        await asyncio.sleep(0)
        raise Boom


async def test_a_flush_ending_in_a_base_exception_leaves_the_method_free() -> None:
    batcher = Batcher(
        BatchConfig(max_delay=LONG), BoomWriter(), store_name="boom", registry=CollectorRegistry()
    )
    acknowledged = [event_write("t", index) for index in range(2)]  # write-behind: acknowledged when queued
    for write in acknowledged:
        assert await batcher.submit(write, deadline=asyncio.get_running_loop().time() + LONG)
    await asyncio.wait_for(batcher.flush(), 5.0)
    assert batcher.pending == 0, "the flush's writes left the batcher"
    assert batcher.drain_unwritten() == acknowledged, (
        "acknowledged writes go back to the owner, kept at close"
    )


async def test_the_callers_of_a_flush_ending_in_a_base_exception_meet_it_instead_of_waiting() -> None:
    gate = asyncio.Event()

    class GatedBoom(ScriptedLone):
        async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
            await asyncio.sleep(0)
            raise Boom

    lone = GatedBoom(gate.wait)
    batcher, _ = offered_alone(lone)
    leader = asyncio.create_task(batcher.write_alone("save_event"))
    await asyncio.sleep(0)
    behind = [event_write("t", index) for index in (1, 2)]
    for write in behind:
        write.done = asyncio.get_running_loop().create_future()
        batcher.offer(write)
    gate.set()
    assert await leader is Outcome.OK
    for write in behind:
        assert write.done is not None
        with pytest.raises(Boom):
            await asyncio.wait_for(write.done, 5.0)
    assert batcher.pending == 0
    assert batcher.drain_unwritten() == behind, "their fate is unknown: the owner keeps them"
