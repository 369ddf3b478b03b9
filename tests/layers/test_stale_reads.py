"""The stale-read layer alone, over a scripted inner service and fakes of the held-write lookups,
the write queue, the gate and a real stale cache.

The promise (read-your-writes and stale-if-error): a read sees the writes the guard still holds; a
read the backend fails answers the last value this process read or wrote for its key, plus what
is held, with outcome ``stale``; with nothing to serve, the failure goes on. A bug is never hidden
behind a stale value, a caller's cancellation is never answered, and a pause token is consumed
from the buffer once, never served from the cache.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.batching.batcher import PendingWrite
from guarded.error_classes import CircuitOpenError
from guarded.errors import CallerError
from guarded.layers.bulkhead import BulkheadTimeoutError
from guarded.layers.stale_reads import StaleCache, StaleReadLayer
from guarded.logical_time import WRITE_TIME_ARGUMENT
from guarded.outcome import Outcome
from guarded.pipeline.call import Call
from guarded.policy_table import PolicyTable
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.ports import FakeBuffer, FakeGate, FakeQueue, fake_ports
from tests.support.records import event
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

DOWN = ConnectionResetError("the backend is down")


def layer(
    buffer: FakeBuffer | None = None,
    queue: FakeQueue | None = None,
    gate: FakeGate | None = None,
    *,
    answer_held_pauses: bool = True,
) -> StaleReadLayer:
    cache = StaleCache(100, registry=CollectorRegistry())
    ports = fake_ports(buffer=buffer or FakeBuffer(), queue=queue, gate=gate or FakeGate())
    policies = PolicyTable.for_state_store()
    return StaleReadLayer(ports, policies, cache=cache, answer_held_pauses=answer_held_pauses)


async def run(layer_: StaleReadLayer, inner: Any, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Call]:
    """One call of ``method`` through ``layer_`` over ``inner``: its answer and the call."""
    setup = method_setup(method)
    call = new_call(setup, *args, **kwargs)
    return await layer_.wrap(inner, setup)(call), call


# --- single values (load_memory_state) -----------------------------------------------------------


async def test_a_failed_read_answers_the_last_value_read_for_its_key() -> None:
    stale = layer()
    inner = ScriptedService().answer({"v": 1}).fail(DOWN)
    assert (await run(stale, inner, "load_memory_state", "k"))[0] == {"v": 1}
    value, call = await run(stale, inner, "load_memory_state", "k")
    assert (value, call.outcome, call.error) == ({"v": 1}, Outcome.STALE, DOWN)
    with pytest.raises(ConnectionResetError):
        await run(stale, ScriptedService().fail(DOWN), "load_memory_state", "other key")


@pytest.mark.parametrize(
    "outage",
    [TimeoutError(), CircuitOpenError("open"), BulkheadTimeoutError("not admitted"), OSError("unreachable")],
    ids=lambda error: type(error).__name__,
)
async def test_every_kind_of_outage_is_answered_stale(outage: Exception) -> None:
    stale = layer()
    await run(stale, ScriptedService().answer({"v": 1}), "get_trajectory", "t", "s")
    value, call = await run(stale, ScriptedService().fail(outage), "get_trajectory", "t", "s")
    assert (value, call.outcome, call.error) == ({"v": 1}, Outcome.STALE, outage)


async def test_a_failed_read_answers_the_last_value_written_and_never_one_the_backend_refused() -> None:
    stale = layer()
    await run(stale, ScriptedService().answer(None), "save_memory_state", "k", {"v": "saved"})
    with pytest.raises(ConnectionResetError):
        await run(stale, ScriptedService().fail(DOWN), "save_memory_state", "k", {"v": "refused"})
    value, call = await run(stale, ScriptedService().fail(DOWN), "load_memory_state", "k")
    assert (value, call.outcome) == ({"v": "saved"}, Outcome.STALE)


async def test_with_nothing_to_serve_the_failure_goes_on() -> None:
    with pytest.raises(ConnectionResetError):
        await run(layer(), ScriptedService().fail(DOWN), "load_memory_state", "k")


@pytest.mark.parametrize(
    "bug",
    [TypeError("bug"), AttributeError("bug"), CallerError("wrong call")],
    ids=lambda error: type(error).__name__,
)
async def test_a_bug_is_never_hidden_behind_a_stale_value(bug: Exception) -> None:
    buffer = FakeBuffer()
    buffer.put("save_memory_state", "k", {"v": "held"}, key="k")
    stale = layer(buffer)
    await run(stale, ScriptedService().answer({"v": 1}), "load_memory_state", "k")
    with pytest.raises(type(bug)):
        await run(stale, ScriptedService().fail(bug), "load_memory_state", "k")


async def test_after_the_backend_answered_nothing_for_a_key_an_outage_serves_no_older_value() -> None:
    stale = layer()
    inner = ScriptedService().answer({"v": "before"}).answer(None).fail(DOWN)
    await run(stale, inner, "load_memory_state", "k")
    assert (await run(stale, inner, "load_memory_state", "k"))[0] is None
    with pytest.raises(ConnectionResetError):  # the last value read for the key was "none"
        await run(stale, inner, "load_memory_state", "k")


async def test_a_held_write_is_newer_than_the_backends_answer_and_than_the_cache() -> None:
    buffer = FakeBuffer()
    stale = layer(buffer)
    await run(stale, ScriptedService().answer({"v": "cached"}), "load_memory_state", "k")
    buffer.put("save_memory_state", "k", {"v": "held"}, key="k")
    value, call = await run(stale, ScriptedService().answer({"v": "old"}), "load_memory_state", "k")
    assert (value, call.outcome) == ({"v": "held"}, Outcome.OK)
    value, call = await run(stale, ScriptedService().fail(DOWN), "load_memory_state", "k")
    assert (value, call.outcome) == ({"v": "held"}, Outcome.STALE)


async def test_a_cancelled_read_is_not_answered_from_the_cache() -> None:
    stale = layer()
    await run(stale, ScriptedService().answer({"v": 1}), "load_memory_state", "k")
    setup = method_setup("load_memory_state")
    call = new_call(setup, "k")
    task = asyncio.ensure_future(stale.wrap(ScriptedService().hang(), setup)(call))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert call.outcome is Outcome.OK, "not stale"


# --- lists (load_history, list_tasks) ------------------------------------------------------------


async def test_a_history_read_flushes_the_traces_batched_writes_first() -> None:
    queue = FakeQueue()
    queue.pending.append(PendingWrite("save_event", (event("t", 1),), {}, "t", 1, 0.0, None))
    flushed_when_read: list[list[tuple[str, str]]] = []

    async def inner(call: Call) -> list[Any]:
        flushed_when_read.append(list(queue.flushed))
        return []

    await run(layer(queue=queue), inner, "load_history", "t")
    assert flushed_when_read == [[("save_event", "t")]]


async def test_a_history_read_adds_the_held_events_in_time_order() -> None:
    buffer = FakeBuffer()
    buffer.put("save_event", event("t", 1), scope="t")
    buffer.put("save_event", event("other", 5), scope="other")
    value, call = await run(
        layer(buffer), ScriptedService().answer([event("t", 0), event("t", 2)]), "load_history", "t"
    )
    assert (value, call.outcome) == ([event("t", 0), event("t", 1), event("t", 2)], Outcome.OK)


async def test_a_failed_history_read_serves_the_last_answer_with_what_is_queued_and_held() -> None:
    buffer, queue = FakeBuffer(), FakeQueue()
    stale = layer(buffer, queue)
    await run(stale, ScriptedService().answer([event("t", 0)]), "load_history", "t")
    queue.pending.append(PendingWrite("save_event", (event("t", 2),), {}, "t", 1, 0.0))
    buffer.put("save_event", event("t", 1), scope="t")
    value, call = await run(stale, ScriptedService().fail(DOWN), "load_history", "t")
    assert (value, call.outcome, call.error) == (
        [event("t", 0), event("t", 1), event("t", 2)],
        Outcome.STALE,
        DOWN,
    )
    with pytest.raises(ConnectionResetError):
        await run(stale, ScriptedService().fail(DOWN), "load_history", "never read")


async def test_a_held_task_replaces_the_backends_copy_of_it() -> None:
    buffer = FakeBuffer()
    old = SimpleNamespace(task_id="a", status="running")
    new = SimpleNamespace(task_id="a", status="done")
    buffer.put("save_task", new, key="a", scope="s1")
    other = SimpleNamespace(task_id="b", status="running")
    value, _ = await run(layer(buffer), ScriptedService().answer([old, other]), "list_tasks", "s1")
    assert value == [new, other]


# --- consume once (load_planner_state) -----------------------------------------------------------


async def test_with_no_held_pause_the_backend_answers_the_consume() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    value, call = await run(
        layer(buffer, gate=gate), ScriptedService().answer({"p": "db"}), "load_planner_state", "tok"
    )
    assert (value, call.outcome, buffer.taken, gate.inside) == ({"p": "db"}, Outcome.OK, [], [])


async def test_a_held_pause_goes_to_a_reachable_backend_first_and_the_backend_answers() -> None:
    """The backend is the truth when it can be reached: the held save is delivered to it as a
    replay (where a newer save of another worker wins), leaves the buffer, and the resume gets
    what the backend consumes."""
    buffer, gate = FakeBuffer(), FakeGate()
    buffer.put("save_planner_state", "tok", {"p": "held"}, key="tok", **{WRITE_TIME_ARGUMENT: 17})
    stale = layer(buffer, gate=gate)
    inner = ScriptedService().answer({"p": "newer, of another worker"})
    value, call = await run(stale, inner, "load_planner_state", "tok")
    assert (value, call.outcome) == ({"p": "newer, of another worker"}, Outcome.OK)
    assert buffer.replayed == [("save_planner_state", ("tok", {"p": "held"}), {WRITE_TIME_ARGUMENT: 17})]
    assert len(inner.calls) == 1
    assert (buffer.held, buffer.taken, gate.inside) == ([], [("save_planner_state", "tok")], [])


async def test_a_held_pause_is_answered_once_when_the_backend_cannot_be_reached() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    buffer.put("save_planner_state", "tok", {"p": "held"}, key="tok")
    buffer.replay_error = DOWN
    stale = layer(buffer, gate=gate)
    inner = ScriptedService().fail(DOWN)
    value, call = await run(stale, inner, "load_planner_state", "tok")
    assert (value, call.outcome, call.error) == ({"p": "held"}, Outcome.STALE, DOWN)
    assert len(inner.calls) == 1, "a copy that reached the backend is consumed as well, when it can be"
    await settle()
    assert (buffer.taken, gate.inside) == ([("save_planner_state", "tok")], [])
    [consume] = buffer.held
    assert (consume.method, consume.error) == ("load_planner_state", "consume_of_held_copy")
    with pytest.raises(ConnectionResetError):  # a second resume finds nothing held to answer
        await run(stale, ScriptedService().fail(DOWN), "load_planner_state", "tok")


async def test_a_held_pause_whose_backend_copy_cannot_be_consumed_holds_the_consume() -> None:
    buffer = FakeBuffer()
    buffer.put("save_planner_state", "tok", {"p": "held"}, key="tok", **{WRITE_TIME_ARGUMENT: 17})
    buffer.replay_error = DOWN
    value, call = await run(layer(buffer), ScriptedService().fail(DOWN), "load_planner_state", "tok")
    assert (value, call.outcome, call.error) == ({"p": "held"}, Outcome.STALE, DOWN)
    await settle()
    [consume] = buffer.held
    assert (consume.method, consume.args, consume.error) == (
        "load_planner_state",
        ("tok",),
        "consume_of_held_copy",
    )
    assert consume.kwargs[WRITE_TIME_ARGUMENT] == 17, "the consume is of that save, not of a newer one"


async def test_a_guard_that_never_answers_held_pauses_keeps_the_hold_for_its_replay() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    buffer.put("save_planner_state", "tok", {"p": "held"}, key="tok")
    buffer.replay_error = DOWN
    stale = layer(buffer, gate=gate, answer_held_pauses=False)
    with pytest.raises(ConnectionResetError):
        await run(stale, ScriptedService().fail(DOWN), "load_planner_state", "tok")
    assert ([held.method for held in buffer.held], buffer.taken, gate.inside) == (
        ["save_planner_state"],
        [],
        [],
    )


async def test_a_cancelled_consume_leaves_the_held_pause_for_the_next() -> None:
    buffer, gate = FakeBuffer(), FakeGate()
    buffer.put("save_planner_state", "tok", {"p": "held"}, key="tok")
    buffer.replay_waits = asyncio.Event()
    stale = layer(buffer, gate=gate)
    setup = method_setup("load_planner_state")
    task = asyncio.ensure_future(stale.wrap(ScriptedService(), setup)(new_call(setup, "tok")))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (buffer.taken, gate.inside) == ([], [])
    buffer.replay_waits, buffer.replay_error = None, DOWN
    value, _ = await run(stale, ScriptedService().fail(DOWN), "load_planner_state", "tok")
    assert value == {"p": "held"}


async def test_a_backend_that_answers_is_the_truth_though_the_hold_could_not_reach_it() -> None:
    """Only the held save failed to reach the backend: the backend's answer is the resume's (a
    newer save of another worker, a consume's None), and the hold waits for its replay."""
    buffer, gate = FakeBuffer(), FakeGate()
    buffer.put("save_planner_state", "tok", {"p": "held"}, key="tok")
    buffer.replay_error = DOWN
    stale = layer(buffer, gate=gate)
    for answer in ({"p": "newer, of another worker"}, None):
        value, call = await run(stale, ScriptedService().answer(answer), "load_planner_state", "tok")
        assert (value, call.outcome) == (answer, Outcome.OK)
    assert ([held.method for held in buffer.held], buffer.taken, gate.inside) == (
        ["save_planner_state"],
        [],
        [],
    )


async def test_a_pause_token_is_never_answered_from_the_cache() -> None:
    stale = layer()
    await run(stale, ScriptedService().answer(None), "save_planner_state", "tok", {"p": 1})
    with pytest.raises(ConnectionResetError):
        await run(stale, ScriptedService().fail(DOWN), "load_planner_state", "tok")


async def test_methods_without_a_merge_policy_are_not_wrapped() -> None:
    inner = ScriptedService()
    stale = layer()
    for method in ("find_binding", "list_traces", "save_event"):
        assert stale.wrap(inner, method_setup(method)) is inner


@pytest.mark.parametrize("names", [("limit",), ("task_id", "limit"), ("c", "a", "b")])
async def test_a_call_key_does_not_depend_on_the_order_of_keywords(names: tuple[str, ...]) -> None:
    """Calls that differ only in the order of their keywords share one cached answer."""
    from guarded.layers.stale_reads import _call_key

    given = {name: index for index, name in enumerate(names)}
    backwards = dict(reversed(list(given.items())))
    key = _call_key("list_updates", ("s1",), given)
    assert key == _call_key("list_updates", ("s1",), backwards)
    assert key == ("list_updates", ("s1",), tuple(sorted(given.items())))
