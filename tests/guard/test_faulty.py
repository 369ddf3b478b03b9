"""FaultyStore: scripted and random faults over a real store, and the log tests compute with."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.error_classes import reached_backend
from guarded.errors import InvalidPayloadError
from guarded.testing import Ending, Fault, FaultInjector, FaultKind, FaultPlan, FaultyStore, fault_injector

from .support import Stopwatch, event


@pytest.mark.asyncio
async def test_error_before_does_not_reach_the_store_and_error_after_does() -> None:
    inner = InMemoryStateStore()
    plan = FaultPlan.script(
        {"save_memory_state": [Fault.error_before(ConnectionResetError), Fault.error_after()]}
    )
    faulty = FaultyStore(inner, plan)
    with pytest.raises(ConnectionResetError) as before:
        await faulty.save_memory_state("k", {"v": 1})
    assert reached_backend(before.value) is False
    assert await inner.load_memory_state("k") is None
    with pytest.raises(ConnectionResetError) as after:
        await faulty.save_memory_state("k", {"v": 2})
    assert reached_backend(after.value) is True
    assert await inner.load_memory_state("k") == {"v": 2}  # the write happened
    await faulty.save_memory_state("k", {"v": 3})  # past the script: no fault
    assert await faulty.load_memory_state("k") == {"v": 3}


@pytest.mark.asyncio
async def test_script_by_call_index_and_error_forms() -> None:
    error = ValueError("exact instance")
    plan = FaultPlan.script(
        {"load_history": {1: Fault.error_before(error), 3: Fault.error_before(lambda: KeyError("made"))}}
    )
    faulty = FaultyStore(InMemoryStateStore(), plan)
    assert await faulty.load_history("t") == []
    with pytest.raises(ValueError, match="exact instance") as raised:
        await faulty.load_history("t")
    assert raised.value is not error  # a copy per use
    assert await faulty.load_history("t") == []
    with pytest.raises(KeyError, match="made"):
        await faulty.load_history("t")
    log = fault_injector(faulty).log
    assert [(r.method, r.call_index, r.fault.kind) for r in log] == [
        ("load_history", 0, FaultKind.OK),
        ("load_history", 1, FaultKind.ERROR_BEFORE),
        ("load_history", 2, FaultKind.OK),
        ("load_history", 3, FaultKind.ERROR_BEFORE),
    ]


@pytest.mark.asyncio
async def test_sequence_counts_calls_of_every_method() -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.sequence([None, Fault.respond("canned")]))
    assert await faulty.load_history("t") == []
    assert await faulty.load_memory_state("k") == "canned"
    assert await faulty.load_memory_state("k") is None
    assert [r.index for r in fault_injector(faulty).log] == [0, 1, 2]


@pytest.mark.asyncio
async def test_delay_hang_and_release() -> None:
    faulty = FaultyStore(
        InMemoryStateStore(), FaultPlan.script({"load_history": [Fault.delay(0.03), Fault.hang()]})
    )
    with Stopwatch() as watch:
        await faulty.load_history("t")
    assert watch.elapsed >= 0.03
    injector = fault_injector(faulty)
    hung = asyncio.create_task(faulty.load_history("t"), name="hung-call")
    await asyncio.sleep(0.01)
    assert not hung.done()
    assert injector.hanging == 1
    injector.release()
    assert await hung == []
    assert injector.hanging == 0
    assert injector.records(task="hung-call")[0].fault.kind is FaultKind.HANG


@pytest.mark.asyncio
async def test_stubborn_ignores_cancellation() -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.stubborn(0.05)))
    call = asyncio.create_task(faulty.load_history("t"))
    await asyncio.sleep(0.01)
    call.cancel()
    assert await call == []  # it swallowed the cancellation and answered


@pytest.mark.asyncio
async def test_random_plans_are_reproducible_and_follow_their_rates() -> None:
    async def kinds(seed: int) -> list[FaultKind]:
        plan = FaultPlan.random(seed, error_before=0.2, error_after=0.1, delay=0.1, delay_range=(0, 0.0001))
        faulty = FaultyStore(InMemoryStateStore(), plan)
        for index in range(1000):
            with contextlib.suppress(ConnectionResetError):
                await faulty.save_event(event("t", index))
        return [record.fault.kind for record in fault_injector(faulty).log]

    first, again, other = await kinds(7), await kinds(7), await kinds(8)
    assert first == again
    assert first != other
    counts = Counter(first)
    assert 150 < counts[FaultKind.ERROR_BEFORE] < 250
    assert 60 < counts[FaultKind.ERROR_AFTER] < 140
    assert 60 < counts[FaultKind.DELAY] < 140


def test_invalid_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultPlan.random(1, error_before=0.7, hang=0.5)
    with pytest.raises(ValueError, match="errors"):
        FaultPlan.random(1, error_before=0.1, errors=())


@pytest.mark.asyncio
async def test_always_with_a_method_filter_and_swapping_plans() -> None:
    faulty = FaultyStore(
        InMemoryStateStore(), FaultPlan.always(Fault.error_before(), methods=["load_history"])
    )
    await faulty.save_event(event("t"))
    with pytest.raises(ConnectionRefusedError):
        await faulty.load_history("t")
    injector = fault_injector(faulty)
    injector.plan = FaultPlan()  # the outage is over
    assert len(await faulty.load_history("t")) == 1
    assert injector.calls("load_history") == 2
    assert injector.counts() == Counter({FaultKind.OK: 2, FaultKind.ERROR_BEFORE: 1})
    injector.reset()
    assert injector.log == []


@pytest.mark.asyncio
async def test_shared_injector_and_artifact_store() -> None:
    injector = FaultInjector(FaultPlan.always(Fault.error_before(), methods=["artifact_store.exists"]))
    first = FaultyStore(InMemoryStateStore(), injector=injector)
    second = injector.wrap(InMemoryStateStore())
    await first.load_history("t")
    await second.load_history("t")
    assert fault_injector(first) is fault_injector(second) is injector
    artifacts = first.artifact_store
    assert artifacts is first.artifact_store
    assert fault_injector(artifacts) is injector
    ref = await artifacts.put_text("hello")
    with pytest.raises(ConnectionRefusedError):
        await artifacts.exists(ref.id)
    assert artifacts.count == 1  # sync attributes pass through
    assert [r.method for r in injector.log][-2:] == ["artifact_store.put_text", "artifact_store.exists"]


def test_fault_repr_is_readable() -> None:
    assert repr(Fault.error_before(ConnectionResetError)) == "Fault.error_before(ConnectionResetError)"
    assert repr(Fault.delay(0.5)) == "Fault.delay(0.5)"
    assert repr(Fault.ok()) == "Fault.ok()"
    assert repr(Fault.respond({})) == "Fault.respond({})"


@pytest.mark.asyncio
async def test_the_log_says_how_each_call_ended() -> None:
    plan = FaultPlan.sequence(
        [
            None,
            Fault.error_before(ConnectionResetError),
            Fault.hang(),
            Fault.error_after(),
            Fault.error_before(asyncio.CancelledError),
        ]
    )
    faulty = FaultyStore(InMemoryStateStore(), plan)
    await faulty.load_history("t")
    with pytest.raises(ConnectionResetError):
        await faulty.load_history("t")
    hung = asyncio.create_task(faulty.load_history("t"))
    await asyncio.sleep(0.01)
    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    with pytest.raises(InvalidPayloadError):  # error after the call: the store refused first
        await faulty.save_memory_state("k", {"x": float("nan")})
    with pytest.raises(asyncio.CancelledError):
        await faulty.load_history("t")
    log = fault_injector(faulty).log
    assert [record.ending for record in log] == [
        Ending.RETURNED,
        Ending.RAISED,
        Ending.CANCELLED,
        Ending.RAISED,
        Ending.RAISED,
    ]
    assert isinstance(log[1].error, ConnectionResetError)
    assert isinstance(log[3].error, InvalidPayloadError)
    assert isinstance(log[4].error, asyncio.CancelledError)
    assert log[2].duration is not None
    assert log[2].duration >= 0.01
