"""The local artifact fallback layer alone, over a scripted inner service (the backend's artifact
store), a real bounded in-process store and fakes of the keeper, lookups and gate.

The promise: a put the backend cannot take (an outage, not bad data) is kept in process and held
for replay (``dead_lettered``), answering a valid, content-addressed reference; one that cannot be
held (the buffer refuses it, or there is no durability) is refused (``refused``, the
``WriteNotKeptError`` raised, carrying the reference of the copy in this process as the answer
outside strict mode), never acknowledged as kept. Reads in this process see what is kept;
``delete`` removes an artifact everywhere, held puts included, ordered against a replay of it in
flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from guarded.errors import InvalidPayloadError, WriteNotKeptError
from guarded.layers.artifact_fallback import LocalArtifactFallbackLayer
from guarded.local_artifacts import InMemoryArtifactStore, artifact_id
from guarded.models import ArtifactRef
from guarded.observability.failure_log import FailureLog
from guarded.outcome import Outcome
from guarded.pipeline.call import Call
from guarded.policy_table import PolicyTable
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.ports import FakeBuffer, FakeGate, fake_ports
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

DATA = b"a chart, rendered"
ID = artifact_id(DATA)
DOWN = ConnectionResetError("artifact backend down")


class Refusals:
    """The refusal of puts no buffer holds, recorded (the guard counts and logs them)."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def __call__(self, method: str) -> WriteNotKeptError:
        self.methods.append(method)
        return WriteNotKeptError("no artifact durability: not kept", method=method)


def layer(
    buffer: FakeBuffer | None = None, gate: FakeGate | None = None, *, refusals: Refusals | None = None
) -> LocalArtifactFallbackLayer:
    ports = fake_ports(buffer=buffer, gate=gate or FakeGate()) if buffer is not None else None
    return LocalArtifactFallbackLayer(
        InMemoryArtifactStore(), FailureLog(60.0), ports, refuse_unheld=refusals or Refusals()
    )


async def run(
    fallback: LocalArtifactFallbackLayer, inner: Any, method: str, *args: Any, **kwargs: Any
) -> tuple[Any, Call]:
    setup = method_setup(method, policies=PolicyTable.for_artifact_store(), label=f"artifact_store.{method}")
    call = new_call(setup, *args, **kwargs)
    return await fallback.wrap(inner, setup)(call), call


async def test_a_put_the_backend_cannot_take_is_kept_in_process_and_held_for_replay() -> None:
    buffer = FakeBuffer()
    fallback = layer(buffer)
    ref, call = await run(fallback, ScriptedService().fail(DOWN), "put_bytes", DATA, mime_type="image/png")
    assert ref.id == ID, "the reference the backend would have answered"
    assert (call.outcome, call.error) == (Outcome.DEAD_LETTERED, DOWN)
    assert await fallback.local.get(ID) == DATA
    [held] = buffer.held
    assert (held.method, held.args, held.kwargs, held.key, held.error) == (
        "put_bytes",
        (DATA,),
        {"mime_type": "image/png"},
        ID,
        "ConnectionResetError",
    )


async def test_without_durability_a_failed_put_is_refused_and_its_copy_answers_reads_here() -> None:
    refusals = Refusals()
    fallback = layer(refusals=refusals)
    setup = method_setup("put_text", policies=PolicyTable.for_artifact_store())
    call = new_call(setup, "some text")
    with pytest.raises(WriteNotKeptError) as refused:
        await fallback.wrap(ScriptedService().fail(DOWN), setup)(call)
    assert refusals.methods == ["put_text"]  # counted and logged by the guard
    assert refused.value.__cause__ is DOWN
    ref = refused.value.answer
    assert isinstance(ref, ArtifactRef)
    assert ref.id == artifact_id(b"some text")  # what a caller outside strict mode is answered
    assert await fallback.local.get(ref.id) == b"some text"


async def test_a_put_the_buffer_refuses_is_refused_not_held() -> None:
    buffer = FakeBuffer()
    buffer.hold_error = WriteNotKeptError("the spill file is at its cap", method="put_bytes")
    fallback = layer(buffer)
    setup = method_setup("put_bytes", policies=PolicyTable.for_artifact_store())
    with pytest.raises(WriteNotKeptError) as refused:
        await fallback.wrap(ScriptedService().fail(DOWN), setup)(new_call(setup, DATA))
    assert refused.value is buffer.hold_error
    assert refused.value.answer.id == ID
    assert buffer.held == []


async def test_a_put_is_held_with_its_calls_deadline() -> None:
    buffer = FakeBuffer()
    fallback = layer(buffer)
    _, call = await run(fallback, ScriptedService().fail(DOWN), "put_bytes", DATA)
    assert buffer.deadlines == [call.deadline]


async def test_bad_data_is_raised_and_never_kept() -> None:
    buffer = FakeBuffer()
    fallback = layer(buffer)
    with pytest.raises(InvalidPayloadError):
        await run(
            fallback, ScriptedService().fail(InvalidPayloadError("meta", path="meta")), "put_bytes", DATA
        )
    assert (fallback.local.count, buffer.held) == (0, [])


async def test_a_put_the_backend_took_supersedes_a_held_put_of_the_same_content() -> None:
    buffer = FakeBuffer()
    fallback = layer(buffer)
    backend_ref = await InMemoryArtifactStore().put_bytes(DATA)
    ref, call = await run(fallback, ScriptedService().answer(backend_ref), "put_bytes", DATA)
    assert (ref, call.outcome, fallback.local.count) == (backend_ref, Outcome.OK, 0)
    [(method, key, _)] = buffer.superseded
    assert (method, key) == ("put_bytes", ID)


async def test_a_cancelled_put_is_not_kept() -> None:
    fallback = layer(FakeBuffer())
    setup = method_setup("put_bytes", policies=PolicyTable.for_artifact_store())
    task = asyncio.ensure_future(fallback.wrap(ScriptedService().hang(), setup)(new_call(setup, DATA)))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fallback.local.count == 0


async def test_reads_in_this_process_see_what_is_kept_and_the_backend_answers_the_rest() -> None:
    fallback = layer(FakeBuffer())
    await run(fallback, ScriptedService().fail(DOWN), "put_bytes", DATA)
    nothing_asked = ScriptedService()  # fails the test if the backend is asked
    assert (await run(fallback, nothing_asked, "get", ID))[0] == DATA
    assert (await run(fallback, nothing_asked, "exists", ID))[0] is True
    assert (await run(fallback, nothing_asked, "get_ref", ID))[0].id == ID
    assert (await run(fallback, ScriptedService().answer(b"remote"), "get", "other"))[0] == b"remote"
    remote = await InMemoryArtifactStore().put_bytes(b"remote")
    listed, _ = await run(fallback, ScriptedService().answer([remote]), "list")
    assert [ref.id for ref in listed] == [remote.id, ID]


async def test_delete_removes_the_artifact_everywhere_after_a_replay_of_it_in_flight() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    fallback = layer(buffer, gate)
    await run(fallback, ScriptedService().fail(DOWN), "put_bytes", DATA)
    assert len(buffer.held) == 1
    gate.replaying("put_bytes", ID)
    inner = ScriptedService().answer(False)
    task = asyncio.ensure_future(run(fallback, inner, "delete", ID))
    await settle()
    assert (buffer.taken, inner.calls) == ([], []), "the replay in flight finishes first"
    gate.replayed("put_bytes", ID)
    deleted, _ = await task
    assert deleted is True
    assert (buffer.held, fallback.local.count, gate.inside) == ([], 0, [])
    assert sorted(buffer.taken) == [("put_bytes", ID), ("put_text", ID)]
    entered = sorted(slot for what, slot, _ in gate.log if what == "enter")
    assert entered == [("put_bytes", ID), ("put_text", ID)], "no replay of either put starts meanwhile"


async def test_other_methods_are_not_wrapped() -> None:
    inner = ScriptedService()
    setup = method_setup("save_event")
    assert layer().wrap(inner, setup) is inner
