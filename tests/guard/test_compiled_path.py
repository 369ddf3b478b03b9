"""A guarded method's layers run as steps in one coroutine, exactly as the same layers nested.

Each layer declares its step once (:mod:`guarded.pipeline.steps`); the guard runs a method's steps
in one coroutine. The promise: nothing a caller, the backend or an operator can see differs from
the same layers nested one coroutine each (the "chain", ``tests.support.layers.nested_build``).
The differential test runs the same random calls and faults through ``guard()`` twice, in one
coroutine and nested, and compares every answer, every outcome counted, every call the backend
got, and what the store holds at the end. The other tests break the turns of a call one by one: a
retry after a failed first attempt, a timed-out first attempt, a caller's cancellation, a breaker's
half-open probe, a held write's logical time, a read while something is held.
"""

from __future__ import annotations

import asyncio
import importlib
import random
from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import guard
from guarded.backend import LOGICAL_TIMES
from guarded.backends.memory import InMemoryStateStore
from guarded.guard_core import core_of
from guarded.models import StoredEvent
from guarded.observability.call_stats import call_stats
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.layers import nested_build

from .support import no_background_replay

pytestmark = [pytest.mark.asyncio, pytest.mark.lenient]

guard_module = importlib.import_module("guarded.guard_core")

SETTINGS: dict[str, Any] = {
    "timeout": {"attempt": 0.05, "deadline": 0.4, "critical_deadline": 0.4},
    "retry": {"initial_backoff": 0.001, "max_backoff": 0.002},
    "spill_path": None,
    "batching": False,
}
KEYS = ("k0", "k1", "k2")
SEQUENCES = 12
CALLS = 60


def counts(registry: CollectorRegistry, store: str) -> Counter[tuple[str, str]]:
    return Counter(call_stats(registry).counts(store))


DIFFERENTIAL_SETTINGS: dict[str, Any] = {
    **SETTINGS,
    "timeout": {"attempt": 10, "deadline": 30, "critical_deadline": 30},
}
"""No fault of the differential waits on a clock (a hang's outcome depends on how many attempts fit
before the deadline on a loaded machine): its answers depend on the faults drawn alone. Timeouts
are broken one by one below."""


def plan(seed: int) -> FaultPlan:
    return FaultPlan.random(
        seed,
        error_before=0.15,
        error_after=0.15,
        errors=(ConnectionResetError, TimeoutError, ValueError),
    )


def step(
    rng: random.Random, index: int, *, batched: bool = False
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    key = rng.choice(KEYS)
    choice = rng.randrange(8 if batched else 6)
    if choice == 6:
        return (
            "save_event",
            (StoredEvent(f"trace-{key}", float(index), "node_end", "n", "n1", {"i": index}),),
            {},
        )
    if choice == 7:
        return "load_history", (f"trace-{key}",), {}
    if choice == 0:
        return "save_memory_state", (key, {"version": index}), {}
    if choice == 1:
        return "load_memory_state", (key,), {}
    if choice == 2:
        return "save_planner_state", (f"token-{key}", {"step": index}), {}
    if choice == 3:
        return "load_planner_state", (f"token-{key}",), {}
    if choice == 4:
        return "get_trajectory", (f"trace-{key}", "session"), {}
    return "list_traces", ("session",), {}


async def run_sequence(
    seed: int, *, compiled: bool, monkeypatch: pytest.MonkeyPatch, batched: bool = False
) -> list[Any]:
    """Every answer and outcome count of one random sequence, and what the backend got and holds.
    ``batched``: events too, group-committed (one call at a time: each a lone write in its caller's
    task, so the batcher adds no timing of its own)."""
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(guard_module, "build", nested_build)
        backend = InMemoryStateStore()
        faulty = FaultyStore(backend, plan(seed))
        registry = CollectorRegistry()
        settings = {**DIFFERENTIAL_SETTINGS, "batching": batched}
        store = guard(faulty, name=f"diff-{seed}", registry=registry, **settings)
        no_background_replay(store)  # held writes are replayed by the drain at close, in order
        rng = random.Random(seed)
        seen: list[Any] = []
        async with store:
            for index in range(CALLS):
                method, args, kwargs = step(rng, index, batched=batched)
                answer = await getattr(store, method)(*args, **kwargs)
                seen.append((index, method, answer, sorted(counts(registry, f"diff-{seed}").items())))
        injector = fault_injector(faulty)
        seen.append(("backend calls", [(record.method, record.fault.kind) for record in injector.log]))
        seen.append(("held", {key: await backend.load_memory_state(key) for key in KEYS}))
        seen.append(("events", {key: await backend.load_history(f"trace-{key}") for key in KEYS}))
    return seen


@pytest.mark.parametrize("seed", range(SEQUENCES))
async def test_compiled_and_chain_answer_alike_under_random_faults(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = await run_sequence(seed, compiled=False, monkeypatch=monkeypatch)
    compiled = await run_sequence(seed, compiled=True, monkeypatch=monkeypatch)
    for expected, got in zip(chain, compiled, strict=True):
        assert got == expected, f"seed {seed}: the compiled path differs at {expected[0]}"


@pytest.mark.parametrize("seed", range(SEQUENCES))
async def test_compiled_and_chain_answer_alike_with_group_committed_events(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = await run_sequence(seed, compiled=False, monkeypatch=monkeypatch, batched=True)
    compiled = await run_sequence(seed, compiled=True, monkeypatch=monkeypatch, batched=True)
    assert any(step[1] == "save_event" for step in chain[:CALLS])
    for expected, got in zip(chain, compiled, strict=True):
        assert got == expected, f"seed {seed}: the compiled path differs at {expected[0]}"


def guarded_store(plan_: FaultPlan, **settings: Any) -> tuple[Any, InMemoryStateStore, CollectorRegistry]:
    backend = InMemoryStateStore()
    registry = CollectorRegistry()
    options = {**SETTINGS, **settings}
    store = guard(FaultyStore(backend, plan_), name="hand-over", registry=registry, **options)
    return store, backend, registry


def is_compiled(store: Any, method: str) -> bool:
    """Whether every layer of ``method`` runs in one coroutine around the backend itself."""
    core = core_of(store)
    assert core is not None
    core.method(method)
    service = core.methods[method]
    if service.__code__.co_qualname != "run_steps.<locals>.run":  # an entry that sets the call's keys first
        service = _closure(service)["service"]
    if service.__code__.co_qualname != "run_steps.<locals>.run":
        return False
    return bool(_closure(service)["inner"].__qualname__.endswith("backend"))


def _closure(function: Any) -> dict[str, Any]:
    return {
        name: cell.cell_contents
        for name, cell in zip(function.__code__.co_freevars, function.__closure__ or (), strict=True)
    }


async def test_the_success_path_is_compiled_for_reads_and_keyed_writes() -> None:
    store, _, _ = guarded_store(FaultPlan())
    assert is_compiled(store, "load_memory_state")
    assert is_compiled(store, "save_memory_state")
    assert is_compiled(store, "list_tasks")
    assert is_compiled(store, "load_planner_state"), "a consume too (one of a held pause takes the chain)"


async def test_a_user_layer_keeps_its_method_on_the_chain() -> None:
    seen: list[str] = []

    class Counting:
        def wrap(self, inner: Any, method: Any) -> Any:
            async def counted(call: Any) -> Any:
                seen.append(method.label)
                return await inner(call)

            return counted

    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), extra_layers=[Counting()], **SETTINGS)
    await store.load_memory_state("k")
    assert seen == ["load_memory_state"]
    assert not is_compiled(store, "load_memory_state")


async def test_a_failed_first_attempt_is_retried_once_not_twice() -> None:
    store, _, registry = guarded_store(
        FaultPlan.script({"load_memory_state": [Fault.error_before(ConnectionResetError)]})
    )
    await store.save_memory_state("k", {"v": 1})
    assert await store.load_memory_state("k") == {"v": 1}
    assert fault_injector(core_of(store).target).calls("load_memory_state") == 2  # type: ignore[union-attr]
    assert counts(registry, "hand-over")[("load_memory_state", "retried")] == 1


async def test_a_first_attempt_that_times_out_ends_timeout_within_the_deadline() -> None:
    store, _, registry = guarded_store(FaultPlan.always(Fault.hang(), methods=["list_traces"]))
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await store.list_traces("s") == []
    assert loop.time() - began < 0.4 + 0.3  # the deadline, with slack for a loaded machine
    assert counts(registry, "hand-over")[("list_traces", "timeout")] == 1
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0, "the watchdog's cancellations were withdrawn"


async def test_the_callers_cancellation_on_the_success_path_propagates_and_counts_cancelled() -> None:
    store, _, registry = guarded_store(
        FaultPlan.always(Fault.hang(), methods=["list_traces"]),
        timeout={"attempt": 5, "deadline": 10, "critical_deadline": 10},
        bulkhead={"max_concurrent": 4},
    )
    call = asyncio.ensure_future(store.list_traces("s"))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert counts(registry, "hand-over")[("list_traces", "cancelled")] == 1
    core = core_of(store)
    assert core is not None
    assert core.bulkhead is not None
    assert core.bulkhead.in_use == 0, "the permit was given back"


async def test_a_half_open_probe_admitted_on_the_success_path_is_judged_by_its_result() -> None:
    outage = [Fault.error_before(ConnectionRefusedError)] * 2
    store, _, _ = guarded_store(
        FaultPlan.script({"list_traces": [*outage, Fault.error_before(ValueError)]}),
        retry={"max_attempts": 1, "critical_max_attempts": 1},
        breaker={"minimum_calls": 2, "window_size": 2, "half_open_probes": 1},
    )
    breaker = core_of(store).breaker  # type: ignore[union-attr]
    await store.list_traces("s")
    await store.list_traces("s")
    assert breaker.state.value == "open"
    breaker.probe_now()
    await store.list_traces("s")  # the probe fails with bad data: not the backend's fault
    assert breaker.state.value == "half_open", "a probe whose error is ignored gives its admission back"
    await store.list_traces("s")  # the next probe succeeds
    assert breaker.state.value == "closed"


async def test_a_write_held_after_a_failed_first_attempt_keeps_the_logical_time_it_was_sent_with() -> None:
    sent: list[Any] = []

    class Recording(InMemoryStateStore):
        async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
            sent.append(LOGICAL_TIMES.get())
            raise ConnectionResetError("lost")

    registry = CollectorRegistry()
    # Closed without trying the failing store again.
    settings = {**SETTINGS, "retries": 1, "dead_letter": {"drain_timeout": 0}}
    store = guard(Recording(), name="held", registry=registry, **settings)
    async with store:
        await store.save_memory_state("k", {"v": 1})
        held = await core_of(store).durability.ports().lookups.latest_for_key("save_memory_state", "k")  # type: ignore[union-attr]
    assert counts(registry, "held")[("save_memory_state", "dead_lettered")] == 1
    assert held is not None
    assert sent
    assert sent[0] is not None
    assert held[1]["_guarded_write_time"] == sent[0][0], "the replay carries the time the write was sent with"


async def test_a_read_while_a_write_is_held_answers_the_held_write() -> None:
    store, _, _ = guarded_store(
        FaultPlan.script({"save_memory_state": [Fault.error_before(ConnectionRefusedError)] * 5}),
        retries=1,
    )
    async with store:
        await store.save_memory_state("k", {"v": "held"})
        assert await store.load_memory_state("k") == {"v": "held"}


async def test_after_the_backend_answered_nothing_an_outage_serves_no_older_value() -> None:
    store, _, registry = guarded_store(
        FaultPlan.script(
            {"load_memory_state": [None, Fault.respond(None), Fault.error_before(ConnectionRefusedError)]}
        ),
        retry={"max_attempts": 1, "critical_max_attempts": 1},
    )
    await store.save_memory_state("k", {"v": "before"})
    assert await store.load_memory_state("k") == {"v": "before"}
    assert await store.load_memory_state("k") is None  # the state is gone from the backend
    assert await store.load_memory_state("k") is None, "the outage must not bring the old state back"
    assert counts(registry, "hand-over")[("load_memory_state", "stale")] == 0
