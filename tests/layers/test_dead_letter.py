"""The dead-letter layer alone, over a scripted inner service and fakes of the keeper and the
direct-write gate.

The promise: a write that finally fails on an outage is acknowledged (``dead_lettered``, the
caller returns normally) and held with its key, scope, call-order stamp and logical time; bad data
and bugs are parked and raised, never held; a hold the buffer refuses is not acknowledged; a
successful direct write supersedes older held writes of its key, and runs with the key's gate
entered, so no replay of the key overlaps it. A cancelled caller is not acknowledged.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from guarded.deadletter.dead_letter_layer import DeadLetterLayer
from guarded.error_classes import CircuitOpenError, error_type
from guarded.errors import CallerError, InvalidPayloadError
from guarded.logical_time import WRITE_TIME_ARGUMENT
from guarded.observability.failure_log import FailureLog
from guarded.outcome import Outcome
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.ports import FakeBuffer, FakeGate, FakeQueue, Opening, fake_ports
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

MEMORY = ("save_memory_state", "k")
"""The gate slot of ``save_memory_state("k", ...)``."""


def layer(
    buffer: FakeBuffer,
    gate: FakeGate | None = None,
    *,
    queue: FakeQueue | None = None,
    opening: Opening | None = None,
) -> DeadLetterLayer:
    ports = fake_ports(buffer=buffer, gate=gate or FakeGate(), queue=queue, opening=opening)
    return DeadLetterLayer(ports, FailureLog(60.0))


async def test_a_successful_write_runs_inside_its_keys_gate_and_supersedes_older_held_writes() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    seen_inside: list[list[object]] = []

    async def inner(call: object) -> str:
        seen_inside.append(list(gate.inside))
        return "written"

    setup = method_setup("save_memory_state")
    service = layer(buffer, gate).wrap(inner, setup)
    call = new_call(setup, "k", {"v": 1})
    assert await service(call) == "written"
    assert seen_inside == [[MEMORY]], "no replay of the key may run while the direct write does"
    [(_, _, stamp)] = buffer.superseded
    assert buffer.superseded == [("save_memory_state", "k", stamp)]
    assert gate.log == [("enter", MEMORY, stamp), ("leave", MEMORY, stamp)]
    assert (call.outcome, call.error, buffer.held) == (Outcome.OK, None, [])


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError("reset"), TimeoutError(), OSError("unreachable"), CircuitOpenError("open")],
    ids=lambda error: type(error).__name__,
)
async def test_an_outage_is_acknowledged_and_the_write_held_with_its_key_and_logical_time(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    buffer = FakeBuffer()
    inner = ScriptedService().fail(error)
    setup = method_setup("save_memory_state")
    call = new_call(setup, "k", {"v": 1})
    caplog.set_level(logging.WARNING, logger="guarded")
    assert await layer(buffer).wrap(inner, setup)(call) is None
    assert (call.outcome, call.error) == (Outcome.DEAD_LETTERED, error)
    [held] = buffer.held
    assert (held.method, held.args, held.key, held.error) == (
        "save_memory_state",
        ("k", {"v": 1}),
        "k",
        error_type(error),
    )
    assert isinstance(held.kwargs[WRITE_TIME_ARGUMENT], int), "the replay must carry the call's time"
    assert buffer.superseded == [], "a failed write supersedes nothing"
    assert [getattr(record, "outcome", None) for record in caplog.records] == ["dead_lettered"]


async def test_held_writes_carry_their_call_order_and_increasing_logical_times() -> None:
    buffer = FakeBuffer()
    inner = ScriptedService().fail(ConnectionResetError()).fail(ConnectionResetError())
    setup = method_setup("save_memory_state")
    service = layer(buffer).wrap(inner, setup)
    await service(new_call(setup, "k", {"v": 1}))
    await service(new_call(setup, "k", {"v": 2}))
    first, second = buffer.held
    assert first.stamp < second.stamp
    assert first.kwargs[WRITE_TIME_ARGUMENT] < second.kwargs[WRITE_TIME_ARGUMENT]


async def test_an_append_is_held_by_its_scope_without_a_key() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    inner = ScriptedService().fail(ConnectionResetError())
    setup = method_setup("save_steering")
    event = type("Steer", (), {"session_id": "session-1", "task_id": "t", "trace_id": None})()
    call = new_call(setup, event)
    assert await layer(buffer, gate).wrap(inner, setup)(call) is None
    [held] = buffer.held
    assert (held.key, held.scope, call.outcome) == (None, "session-1", Outcome.DEAD_LETTERED)
    assert gate.log == [], "an append has no key to order against replays"
    assert WRITE_TIME_ARGUMENT not in held.kwargs, "only upserts carry a logical time"


@pytest.mark.parametrize(
    "error",
    [InvalidPayloadError("nan", path="state"), TypeError("bug"), CallerError("wrong call")],
    ids=lambda error: type(error).__name__,
)
async def test_what_no_wait_fixes_is_parked_and_raised_never_held(error: Exception) -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    inner = ScriptedService().fail(error)
    setup = method_setup("save_memory_state")
    call = new_call(setup, "k", {"v": 1})
    with pytest.raises(type(error)):
        await layer(buffer, gate).wrap(inner, setup)(call)
    assert [(method, args, raised) for method, args, _, raised in buffer.parked] == [
        ("save_memory_state", ("k", {"v": 1}), error)
    ]
    assert buffer.held == []
    assert gate.inside == [], "the gate is left whatever happens"


async def test_a_write_the_buffer_refuses_is_not_acknowledged() -> None:
    buffer = FakeBuffer(keeps=False)
    error = ConnectionResetError("down")
    setup = method_setup("save_memory_state")
    call = new_call(setup, "k", {"v": 1})
    with pytest.raises(ConnectionResetError):
        await layer(buffer).wrap(ScriptedService().fail(error), setup)(call)
    assert call.outcome is not Outcome.DEAD_LETTERED


async def test_a_write_waits_for_a_replay_of_its_key_in_flight() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    inner = ScriptedService().answer(None)
    setup = method_setup("save_memory_state")
    gate.replaying("save_memory_state", "k")
    task = asyncio.ensure_future(layer(buffer, gate).wrap(inner, setup)(new_call(setup, "k", {"v": 2})))
    await settle()
    assert inner.calls == [], "the replay of an older value of the key is still running"
    gate.replayed("save_memory_state", "k")
    await task
    assert len(inner.calls) == 1
    assert gate.inside == []


async def test_a_cancelled_caller_is_not_acknowledged_nor_held_and_leaves_the_gate() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    setup = method_setup("save_memory_state")
    task = asyncio.ensure_future(
        layer(buffer, gate).wrap(ScriptedService().hang(), setup)(new_call(setup, "k", {}))
    )
    await settle()
    assert gate.inside == [MEMORY]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (buffer.held, buffer.parked, gate.inside) == ([], [], [])


async def test_the_durable_parts_are_opened_once_before_the_first_write() -> None:
    opening = Opening()
    inner = ScriptedService().answer(None).answer(None)
    setup = method_setup("save_memory_state")
    service = layer(FakeBuffer(), opening=opening).wrap(inner, setup)
    await service(new_call(setup, "k", {}))
    await service(new_call(setup, "k", {}))
    assert opening.opened == 1


async def test_only_unbatched_dead_letter_writes_are_wrapped() -> None:
    inner = ScriptedService()
    with_queue = layer(FakeBuffer(), queue=FakeQueue())
    assert with_queue.wrap(inner, method_setup("save_event")) is inner, "the queue's owner holds batches"
    assert with_queue.wrap(inner, method_setup("load_memory_state")) is inner
    assert with_queue.wrap(inner, method_setup("save_memory_state")) is not inner
    without_buffer = DeadLetterLayer(fake_ports(gate=FakeGate()), FailureLog(60.0))
    assert without_buffer.wrap(inner, method_setup("save_memory_state")) is inner
