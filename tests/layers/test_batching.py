"""The batching layer alone, over a fake write queue and keeper: the inner service is never
called for a batched write (a :class:`ScriptedService` with no answers fails the test if it is).

The promise: with group commit a caller returns only once the batch holding its write is
committed, with that write's outcome (``ok``, ``dead_lettered``; bad data raises); with
write-behind it returns once the write is queued; a queue with no room in time dead-letters the
write instead of dropping it; an alias is queued under its target's name; the durable parts are
open before the first write.
"""

from __future__ import annotations

import asyncio

import pytest

from guarded.batching.batching_layer import BatchingLayer
from guarded.errors import WriteRefusedError
from guarded.outcome import Outcome
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.ports import FakeBuffer, FakeQueue, Opening, fake_ports
from tests.support.records import event
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio


def layer(
    queue: FakeQueue, buffer: FakeBuffer | None = None, opening: Opening | None = None
) -> BatchingLayer:
    return BatchingLayer(fake_ports(queue=queue, buffer=buffer or FakeBuffer(), opening=opening))


async def test_a_group_commit_caller_returns_only_once_its_batch_is_committed() -> None:
    queue, opening = FakeQueue(settle=None), Opening()
    setup = method_setup("save_event")
    call = new_call(setup, event("t", 1))
    task = asyncio.ensure_future(layer(queue, opening=opening).wrap(ScriptedService(), setup)(call))
    await settle()
    assert not task.done(), "acknowledged before the batch was written"
    [(write, deadline)] = queue.submitted
    assert (write.method, write.args, write.scope, deadline) == (
        "save_event",
        (event("t", 1),),
        "t",
        call.deadline,
    )
    assert opening.opened == 1
    write.settle(Outcome.OK)
    assert await task is None
    assert call.outcome is Outcome.OK


async def test_a_write_held_by_its_batch_is_acknowledged_as_dead_lettered() -> None:
    setup = method_setup("save_event")
    call = new_call(setup, event("t"))
    assert await layer(FakeQueue(settle=Outcome.DEAD_LETTERED)).wrap(ScriptedService(), setup)(call) is None
    assert call.outcome is Outcome.DEAD_LETTERED


async def test_a_write_its_batch_refused_as_bad_data_raises() -> None:
    setup = method_setup("save_event")
    with pytest.raises(WriteRefusedError, match="parked"):
        await layer(FakeQueue(settle=Outcome.REJECTED)).wrap(ScriptedService(), setup)(
            new_call(setup, event("t"))
        )


async def test_write_behind_acknowledges_at_enqueue() -> None:
    queue = FakeQueue(settle=None)
    setup = method_setup("save_event", ack="enqueue")
    call = new_call(setup, event("t"))
    assert await layer(queue).wrap(ScriptedService(), setup)(call) is None
    [(write, _)] = queue.submitted
    assert (write.done, call.outcome) == (None, Outcome.OK)


@pytest.mark.parametrize(("keeps", "outcome"), [(True, Outcome.DEAD_LETTERED), (False, Outcome.REJECTED)])
async def test_a_write_the_queue_has_no_room_for_is_dead_lettered_not_dropped(
    keeps: bool, outcome: Outcome
) -> None:
    buffer = FakeBuffer(keeps=keeps)
    setup = method_setup("save_event")
    call = new_call(setup, event("t", 3))
    assert await layer(FakeQueue(room=False), buffer).wrap(ScriptedService(), setup)(call) is None
    assert call.outcome is outcome
    if keeps:
        [held] = buffer.held
        assert (held.method, held.args, held.scope, held.error) == (
            "save_event",
            (event("t", 3),),
            "t",
            "queue_full",
        )


async def test_an_alias_is_queued_under_its_targets_name() -> None:
    queue = FakeQueue()
    setup = method_setup("save_task_update")
    assert setup.policy.alias_of == "save_update"
    update = type("Update", (), {"session_id": "s1", "task_id": "a", "trace_id": None})()
    await layer(queue).wrap(ScriptedService(), setup)(new_call(setup, update))
    [(write, _)] = queue.submitted
    assert (write.method, write.scope) == ("save_update", "s1")


async def test_a_cancelled_caller_waiting_for_its_batch_gets_its_cancellation() -> None:
    queue = FakeQueue(settle=None)
    setup = method_setup("save_event")
    task = asyncio.ensure_future(layer(queue).wrap(ScriptedService(), setup)(new_call(setup, event("t"))))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [(write, _)] = queue.submitted
    write.settle(Outcome.OK)  # the batch commits later: nobody waits, nothing breaks


async def test_only_the_writes_the_queue_takes_are_wrapped() -> None:
    inner = ScriptedService()
    batching = layer(FakeQueue())
    for method in ("save_memory_state", "load_history", "save_steering", "save_events"):
        assert batching.wrap(inner, method_setup(method)) is inner
    assert BatchingLayer(fake_ports(buffer=FakeBuffer())).wrap(inner, method_setup("save_event")) is inner
