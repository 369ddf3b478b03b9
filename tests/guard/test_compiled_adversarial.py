"""Adversarial tests of the layers run as steps in one coroutine (:mod:`guarded.pipeline.steps`):
each runs a scenario through ``guard()`` so, and with the same layers nested one coroutine each
(``tests.support.layers.nested_build``, "the chain"), and requires that nothing a caller, the
backend or an operator can observe differs (answers, outcome counts, the buffer, the breaker, the
bulkhead's permits, the watchdog, the logical-time contextvar)."""

from __future__ import annotations

import asyncio
import importlib
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backend import LOGICAL_TIMES
from guarded.backends.memory import InMemoryStateStore
from guarded.guard_core import core_of
from guarded.layers.breaker import BreakerState
from guarded.models import StoredEvent
from guarded.observability.call_stats import call_stats
from tests.support.layers import nested_build

from .support import no_background_replay

pytestmark = [pytest.mark.asyncio, pytest.mark.lenient]

guard_module = importlib.import_module("guarded.guard_core")

SETTINGS: dict[str, Any] = {
    "timeout": {"attempt": 0.5, "deadline": 2.0, "critical_deadline": 2.0},
    "retry": {"initial_backoff": 0.001, "max_backoff": 0.002},
    "spill_path": None,
    "batching": False,
}

Scenario = Callable[[], Awaitable[Any]]


@contextmanager
def chain_only(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(guard_module, "build", nested_build)
        yield


def counts(registry: CollectorRegistry, store: str) -> Counter[tuple[str, str]]:
    return Counter(call_stats(registry).counts(store))


async def both(
    scenario: Callable[[bool], Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    """What ``scenario`` observed on the chain alone, and compiled."""
    with chain_only(False, monkeypatch):
        chain = await scenario(False)
    with chain_only(True, monkeypatch):
        compiled = await scenario(True)
    return chain, compiled


# --- a read racing a write that gets held --------------------------------------------------------


class Gated(InMemoryStateStore):
    """Reads take their answer, then wait for ``gate``; saves fail while ``saves_fail``; every
    call fails while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.saves_fail = False
        self.down = False

    async def load_memory_state(self, key: str) -> Any:
        answer = await super().load_memory_state(key)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionRefusedError("down")
        return answer

    async def save_memory_state(self, key: str, state: Any) -> None:
        if self.saves_fail or self.down:
            raise ConnectionRefusedError("down")
        await super().save_memory_state(key, state)

    async def load_history(self, trace_id: str) -> Any:
        answer = await super().load_history(trace_id)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionRefusedError("down")
        return answer

    async def save_event(self, event: StoredEvent) -> None:
        if self.saves_fail or self.down:
            raise ConnectionRefusedError("down")
        await super().save_event(event)


async def test_a_read_in_flight_while_a_write_gets_held_answers_and_caches_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read that took the success path while nothing was held, whose backend answer comes back
    after a write of its key was held meanwhile: the chain answers the held (newer) write and keeps
    it in the stale cache; an outage after that write was replayed must never serve the older
    value the read got from the backend (never older over newer)."""

    async def scenario(compiled: bool) -> Any:
        backend = Gated()
        registry = CollectorRegistry()
        store = guard(backend, name="race", registry=registry, **{**SETTINGS, "retries": 1})
        async with store:
            await store.save_memory_state("k", {"v": 1})
            backend.gate = asyncio.Event()
            backend.saves_fail = True
            reader = asyncio.ensure_future(store.load_memory_state("k"))
            await asyncio.sleep(0.01)  # the read has its answer, {"v": 1}, and waits
            await store.save_memory_state("k", {"v": 2})  # held
            backend.gate.set()
            during = await reader
            backend.gate = None
            backend.saves_fail = False
            left = await controller(store).drain(2.0)  # {"v": 2} replayed
            in_backend = await InMemoryStateStore.load_memory_state(backend, "k")
            backend.down = True
            outage = await store.load_memory_state("k")
            backend.down = False
        return during, left, in_backend, outage, sorted(counts(registry, "race").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert chain[3] == {"v": 2}, chain
    assert compiled == chain


async def test_a_list_read_in_flight_while_a_write_of_its_scope_gets_held_merges_it_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same race for a list read (read-your-writes): the chain merges the write held while the
    backend answered, and caches the merged list; so must the success path."""

    def event(ts: float) -> StoredEvent:
        return StoredEvent("t", ts, "node_end", "n", f"e{ts}", {})

    async def scenario(compiled: bool) -> Any:
        backend = Gated()
        registry = CollectorRegistry()
        store = guard(backend, name="race-list", registry=registry, **{**SETTINGS, "retries": 1})
        async with store:
            await store.save_event(event(1.0))
            backend.gate = asyncio.Event()
            backend.saves_fail = True
            reader = asyncio.ensure_future(store.load_history("t"))
            await asyncio.sleep(0.01)
            await store.save_event(event(2.0))  # held
            backend.gate.set()
            during = await reader
            backend.gate = None
            backend.down = True
            outage = await store.load_history("t")
            backend.down = backend.saves_fail = False
        return during, outage, sorted(counts(registry, "race-list").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert len(chain[0]) == 2, chain
    assert compiled == chain


# --- the caller's cancellation during an async ``after`` hook -------------------------------------


class CancelledOnReturn(InMemoryStateStore):
    """Saves fail while ``saves_fail``; a save made while ``cancel_on_return`` succeeds and the
    caller's task is cancelled as it returns (it sees the cancellation at its next wait: the
    dead-letter layer's supersede of the key's older held write). It stands for a database (it
    keeps its data across processes), so held writes go to the spill file and a supersede waits
    for it."""

    durable_across_processes = True

    def __init__(self) -> None:
        super().__init__()
        self.saves_fail = False
        self.cancel_on_return = False

    async def save_memory_state(self, key: str, state: Any) -> None:
        if self.saves_fail:
            raise ConnectionRefusedError("down")
        await super().save_memory_state(key, state)
        if self.cancel_on_return:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()


async def test_a_cancellation_during_the_supersede_after_the_write_is_counted_cancelled_as_the_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    async def scenario(compiled: bool) -> Any:
        backend = CancelledOnReturn()
        registry = CollectorRegistry()
        options = {**SETTINGS, "retries": 1, "spill_path": str(tmp_path / f"dlq-{compiled}.sqlite")}
        store = guard(backend, name="cancel-after", registry=registry, **options)
        async with store:
            backend.saves_fail = True
            await store.save_memory_state("k", {"v": 1})  # held: the next write of k supersedes it
            backend.saves_fail = False
            backend.cancel_on_return = True
            call = asyncio.ensure_future(store.save_memory_state("k", {"v": 2}))
            with pytest.raises(asyncio.CancelledError):
                await call
            backend.cancel_on_return = False
            core = core_of(store)
            assert core is not None
            held = controller(store).dead_letters
            assert held is not None
            observed = (
                sorted(counts(registry, "cancel-after").items()),
                LOGICAL_TIMES.get(),
                len(held.gate),
                core.breaker.state.value,
                await InMemoryStateStore.load_memory_state(backend, "k"),
            )
        return observed

    chain, compiled = await both(scenario, monkeypatch)
    assert ("save_memory_state", "cancelled") in dict(chain[0]), chain
    assert compiled == chain


# --- an ``after`` hook's failure in strict mode -------------------------------------------------


class NoneForLists(InMemoryStateStore):
    """A store whose history read answers ``None`` (a bug of the store's: a list was due)."""

    async def load_history(self, trace_id: str) -> Any:
        await super().load_history(trace_id)
        return None


async def test_a_failing_after_hook_in_strict_mode_raises_and_is_counted_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        store = guard(NoneForLists(), name="strict-after", registry=registry, strict=True, **SETTINGS)
        async with store:
            with pytest.raises(TypeError) as raised:
                await store.load_history("t")
        return type(raised.value), sorted(counts(registry, "strict-after").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert chain[1] == [(("load_history", "rejected"), 1)], chain
    assert compiled == chain


# --- tracing switched on while a call is in flight ----------------------------------------------


class FailsOnceAfterGate(InMemoryStateStore):
    """The first history read waits for ``gate``, then fails (retryable); the others answer."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.calls = 0

    async def load_history(self, trace_id: str) -> Any:
        self.calls += 1
        if self.calls == 1:
            await self.gate.wait()
            raise ConnectionResetError("reset")
        return await super().load_history(trace_id)


async def test_tracing_switched_on_during_a_call_records_spans_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call begun while nothing could record has no span on the chain, even when tracing is
    switched on (a tracer provider set, ALWAYS_ON) before its first attempt fails; the success
    path must not start one when it hands the call over."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    async def scenario(compiled: bool) -> Any:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        backend = FailsOnceAfterGate()
        registry = CollectorRegistry()
        with monkeypatch.context() as patch:
            patch.setattr(trace, "_TRACER_PROVIDER", None)
            store = guard(backend, name="tracing-on", registry=registry, **SETTINGS)
            async with store:
                call = asyncio.ensure_future(store.load_history("t"))
                await asyncio.sleep(0.01)  # the first attempt is in the backend
                patch.setattr(trace, "_TRACER_PROVIDER", provider)
                backend.gate.set()
                first = await call
                second = await store.load_history("t")
        spans = [
            (span.name, dict(span.attributes or {}), [event.name for event in span.events])
            for span in exporter.get_finished_spans()
        ]
        return first, second, spans, sorted(counts(registry, "tracing-on").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert len(chain[2]) == 1, chain
    assert compiled == chain


# --- many tasks on few keys: faults, cancellations, a saturated bulkhead --------------------------


class Yielding(InMemoryStateStore):
    """Each call lets the loop run a few times first (how many depends on its arguments), so
    concurrent calls interleave without any clock in the way."""

    async def _turns(self, *args: Any) -> None:
        for _ in range(len(repr(args)) % 4):
            await asyncio.sleep(0)

    async def save_memory_state(self, key: str, state: Any) -> None:
        await self._turns(key, state)
        await super().save_memory_state(key, state)

    async def load_memory_state(self, key: str) -> Any:
        await self._turns(key)
        return await super().load_memory_state(key)

    async def save_event(self, event: StoredEvent) -> None:
        await self._turns(event.node_id)
        await super().save_event(event)

    async def load_history(self, trace_id: str) -> Any:
        await self._turns(trace_id, 1)
        return await super().load_history(trace_id)


DETERMINISTIC_RETRY = {"initial_backoff": 0.0, "max_backoff": 0.0, "jitter": 0.0}
"""A retry waits one turn of the loop, no clock time: two runs of the same concurrent calls (and
cancellations counted in turns) interleave alike, however loaded the machine."""

CONCURRENT_SETTINGS: dict[str, Any] = {
    **SETTINGS,
    "retry": DETERMINISTIC_RETRY,
    "timeout": {"attempt": 5.0, "deadline": 10.0, "critical_deadline": 10.0},
    "retries": 1,
    "bulkhead": {"max_concurrent": 2},
    "breaker": {"minimum_calls": 1000, "window_size": 1000},
}


async def run_concurrently(seed: int, **settings: Any) -> Any:
    import random

    from guarded.testing import FaultPlan, FaultyStore, fault_injector

    rng = random.Random(seed)
    backend = Yielding()
    faulty = FaultyStore(
        backend,
        FaultPlan.random(
            seed,
            error_before=0.15,
            error_after=0.1,
            errors=(ConnectionResetError, ValueError, TypeError, asyncio.CancelledError),
        ),
    )
    registry = CollectorRegistry()
    store = guard(faulty, name=f"many-{seed}", registry=registry, **{**CONCURRENT_SETTINGS, **settings})
    no_background_replay(store)

    def call(index: int) -> Awaitable[Any]:
        key = rng.choice(("k0", "k1"))
        choice = rng.randrange(4)
        if choice == 0:
            return store.save_memory_state(key, {"v": index})
        if choice == 1:
            return store.load_memory_state(key)
        if choice == 2:
            return store.save_event(StoredEvent(key, float(index), "node_end", "n", f"e{index}", {}))
        return store.load_history(key)

    async def cancel_after(task: asyncio.Future[Any], turns: int) -> None:
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()

    async with store:
        tasks = [asyncio.ensure_future(call(index)) for index in range(40)]
        cancellers = [
            asyncio.ensure_future(cancel_after(task, rng.randrange(8)))
            for task in tasks
            if rng.random() < 0.25
        ]
        answers = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*cancellers)
        core = core_of(store)
        assert core is not None
        assert core.bulkhead is not None
        held = controller(store).dead_letters
        assert held is not None
        observed = [
            [type(answer).__name__ if isinstance(answer, BaseException) else answer for answer in answers],
            sorted(counts(registry, f"many-{seed}").items()),
            core.bulkhead.in_use,
            core.bulkhead.waiting,
            LOGICAL_TIMES.get(),
            len(held.gate),
            core.breaker.state.value,
            [(record.method, record.fault.kind, record.ending) for record in fault_injector(faulty).log],
            {key: await InMemoryStateStore.load_memory_state(backend, key) for key in ("k0", "k1")},
            sorted((entry.method, entry.key, entry.error) for entry in await held.entries()),
        ]
    return observed


@pytest.mark.parametrize("seed", range(6))
async def test_many_concurrent_calls_with_faults_and_cancellations_end_as_on_the_chain(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain, compiled = await both(lambda compiled: run_concurrently(seed), monkeypatch)
    assert chain[2:4] == [0, 0], "no permit leaked, nobody left waiting"
    assert chain[4] is None, "the logical time is unset"
    for index, (expected, got) in enumerate(zip(chain, compiled, strict=True)):
        assert got == expected, f"seed {seed}: item {index} differs"


# --- odd calls: keywords, wrong types, missing or extra arguments ---------------------------------

ODD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("save_memory_state", (), {"key": "k", "state": {"v": 1}}),
    ("load_memory_state", (), {"key": "k"}),
    ("load_memory_state", ("k",), {"key": "k"}),
    ("load_memory_state", (), {}),
    ("load_memory_state", (["unhashable"],), {}),
    ("save_memory_state", (["unhashable"], {"v": 1}), {}),
    ("save_memory_state", ("k", {"v": 1}, "extra"), {}),
    ("save_memory_state", ("k",), {"state": {"v": 2}, "bogus": 1}),
    ("load_history", (), {"trace_id": "t"}),
    ("load_history", (7,), {}),
    ("load_history", (None,), {}),
    ("list_traces", (), {"session_id": "s"}),
    ("list_traces", ({"not": "a session"},), {}),
    ("save_event", ("not an event",), {}),
    ("get_trajectory", ("t", "s"), {}),
    ("get_trajectory", (), {"trace_id": "t", "session_id": "s"}),
    ("load_memory_state", ("k",), {}),
]


@pytest.mark.parametrize("strict", [False, True])
async def test_odd_calls_end_as_on_the_chain(strict: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        store = guard(InMemoryStateStore(), name="odd", registry=registry, strict=strict, **SETTINGS)
        seen: list[Any] = []
        async with store:
            for method, args, kwargs in ODD_CALLS:
                try:
                    answer = await getattr(store, method)(*args, **kwargs)
                except Exception as exc:  # strict mode: the caller's bug raised
                    answer = ("raised", type(exc).__name__)
                seen.append((method, answer, LOGICAL_TIMES.get()))
            seen.append(sorted(counts(registry, "odd").items()))
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert any(item[1] == ("raised", "CallerError") for item in chain[:-1]) is strict
    assert compiled == chain


# --- a call the chain refuses after the success path's attempt failed ---------------------------


class Record:
    """A task record by its fields (duck-typed: the call check accepts it)."""

    def __init__(self, task: Any) -> None:
        import dataclasses

        for field in dataclasses.fields(task):
            setattr(self, field.name, getattr(task, field.name))


class SpoilsOnFailure(InMemoryStateStore):
    """A store whose failing save leaves the caller's record unreadable (an ORM object expired by
    the rollback: its fields are gone)."""

    async def save_task(self, state: Any) -> None:
        if isinstance(state, Record) and state.task_id == "spoilt":
            del state.priority
            raise ConnectionResetError("rolled back")
        await super().save_task(state)


async def test_a_call_refused_by_the_chain_after_a_failed_attempt_gives_back_what_its_hooks_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chain checks the call again when it takes it over; one it refuses then never reaches the
    dead-letter or breaker layer that would adopt the success path's key slot, logical time and
    breaker admission: they must still be given back (else the key's replays wait for ever, the
    logical time stays set in the caller's context, a half-open breaker keeps a probe in flight)."""
    from tests.support.records import plain_task

    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        store = guard(
            SpoilsOnFailure(),
            name="refused",
            registry=registry,
            **{**SETTINGS, "retries": 1},
            breaker={"minimum_calls": 1, "window_size": 1, "half_open_probes": 1},
        )
        core = core_of(store)
        assert core is not None
        async with store:
            held = controller(store).dead_letters
            assert held is not None
            core.breaker._transition(BreakerState.HALF_OPEN)  # one probe admitted
            await store.save_task(Record(plain_task(task_id="spoilt")))
            after = (LOGICAL_TIMES.get(), len(held.gate), core.breaker.state.value)
            if core.breaker.state.value == "open":
                core.breaker.probe_now()
            await store.save_task(plain_task(task_id="next"))
        return after, sorted(counts(registry, "refused").items())

    chain, compiled = await both(scenario, monkeypatch)
    for seen in (chain, compiled):
        logical_time, gate, _ = seen[0]
        assert logical_time is None, seen
        assert gate == 0, seen
        assert (("save_task", "circuit_open"), 1) not in seen[1], seen


# --- BaseExceptions from the backend, a store that swallows the watchdog's cancellation ----------


class Doom(BaseException):
    """A BaseException of the store's own (neither an Exception nor a cancellation)."""


def raising(error: BaseException) -> type[InMemoryStateStore]:
    class Raising(InMemoryStateStore):
        async def save_memory_state(self, key: str, state: Any) -> None:
            raise error

        async def load_memory_state(self, key: str) -> Any:
            raise error

    return Raising


@pytest.mark.parametrize(
    "error",
    [KeyboardInterrupt(), SystemExit(3), Doom(), asyncio.CancelledError(), GeneratorExit()],
    ids=lambda error: type(error).__name__,
)
async def test_a_base_exception_of_the_store_ends_the_call_as_on_the_chain(
    error: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        store = guard(
            raising(error)(),
            name="base",
            registry=registry,
            **SETTINGS,
            dead_letter={"drain_timeout": 0.1},
            bulkhead={"max_concurrent": 1},
            breaker={"minimum_calls": 1, "window_size": 2, "half_open_probes": 1},
        )
        core = core_of(store)
        assert core is not None
        assert core.bulkhead is not None
        seen: list[Any] = []
        async with store:
            held = controller(store).dead_letters
            assert held is not None
            for half_open in (False, True):
                if half_open:
                    core.breaker._transition(BreakerState.HALF_OPEN)
                for method, args in (("save_memory_state", ("k", {"v": 1})), ("load_memory_state", ("k",))):
                    try:
                        answer: Any = await getattr(store, method)(*args)
                    except BaseException as exc:  # what reached the caller is compared
                        answer = type(exc).__name__
                    task = asyncio.current_task()
                    assert task is not None
                    seen.append(
                        (
                            method,
                            answer,
                            LOGICAL_TIMES.get(),
                            len(held.gate),
                            core.bulkhead.in_use,
                            core.breaker.state.value,
                            core.breaker._probes_in_flight,
                            task.cancelling(),
                        )
                    )
            seen.append(sorted(counts(registry, "base").items()))
            seen.append(sorted((entry.method, entry.key, entry.error) for entry in await held.entries()))
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert compiled == chain


async def test_a_store_that_swallows_the_watchdogs_cancellation_times_out_as_on_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        faulty = FaultyStore(
            InMemoryStateStore(),
            FaultPlan.script(
                {
                    "load_memory_state": [Fault.stubborn(0.08), None],
                    "save_memory_state": [None, Fault.stubborn(0.08), Fault.stubborn(0.08)],
                }
            ),
        )
        store = guard(
            faulty,
            name="stubborn",
            registry=registry,
            **{**SETTINGS, "timeout": {"attempt": 0.03, "deadline": 1.0, "critical_deadline": 1.0}},
            bulkhead={"max_concurrent": 2},
        )
        core = core_of(store)
        assert core is not None
        assert core.bulkhead is not None
        task = asyncio.current_task()
        assert task is not None
        seen: list[Any] = []
        async with store:
            seen.append(await store.save_memory_state("k", {"v": 1}))
            seen.append(await store.load_memory_state("k"))
            seen.append(await store.save_memory_state("k", {"v": 2}))
            seen.append((task.cancelling(), core.bulkhead.in_use, LOGICAL_TIMES.get()))
            seen.append(sorted(counts(registry, "stubborn").items()))
        seen.append([(r.method, r.fault.kind, r.ending) for r in fault_injector(faulty).log])
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert chain[3] == (0, 0, None), chain
    assert compiled == chain


# --- a replay of a held write racing a direct write of its key -----------------------------------


class Holding(InMemoryStateStore):
    """A memory-state store without logical times (the last write that arrives wins: only the
    guard's key gate keeps a replay from landing over a newer write). Saves of a value in
    ``failing`` fail; a save of a value in ``hold_values`` waits for ``hold`` (and says so with
    ``holding``); every save that reaches the store is logged."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[int] = set()
        self.hold = asyncio.Event()
        self.holding = asyncio.Event()
        self.hold_values: set[int] = set()
        self.written: list[Any] = []
        self.values: dict[str, Any] = {}

    async def save_memory_state(self, key: str, state: Any) -> None:
        if state["v"] in self.failing:
            raise ConnectionResetError("down")
        if state["v"] in self.hold_values:
            self.holding.set()
            await self.hold.wait()
        self.written.append(state["v"])
        self.values[key] = state

    async def load_memory_state(self, key: str) -> Any:
        return self.values.get(key)


@pytest.mark.parametrize("first", ["replay", "direct"])
async def test_a_replay_racing_a_direct_write_of_its_key_never_lands_older_over_newer(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held write of ``k`` is replayed (by the guard's own replay, through ``run_internal``)
    while a newer direct write of ``k`` on the success path is in the store, or the direct write
    comes while the replay is in the store: the key gate orders them as on the chain."""

    async def scenario(compiled: bool) -> Any:
        backend = Holding()
        registry = CollectorRegistry()
        store = guard(backend, name="replay-race", registry=registry, **{**SETTINGS, "retries": 1})
        async with store:
            held = controller(store).dead_letters
            assert held is not None
            backend.failing = {1}
            await store.save_memory_state("k", {"v": 1})  # held
            if first == "replay":
                backend.hold_values = {1}
                backend.failing = set()
                await store.load_memory_state("other")  # the backend answers: the replay starts
                await asyncio.wait_for(backend.holding.wait(), 2.0)  # v1's replay in the store
                direct = asyncio.ensure_future(store.save_memory_state("k", {"v": 2}))
            else:
                backend.hold_values = {2}
                direct = asyncio.ensure_future(store.save_memory_state("k", {"v": 2}))
                await asyncio.wait_for(backend.holding.wait(), 2.0)  # v2 in the store
                backend.failing = set()
            await asyncio.sleep(0.1)  # the other one has its chance to go
            backend.hold.set()
            await direct
            for _ in range(200):  # the replay ends (written, or superseded by v2)
                if not held.depth:
                    break
                await asyncio.sleep(0.01)
            seen = (
                backend.written,
                held.depth,
                backend.values.get("k"),
                await store.load_memory_state("k"),
                LOGICAL_TIMES.get(),
                len(held.gate),
                sorted(counts(registry, "replay-race").items()),
            )
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert chain[2] == {"v": 2}, chain
    assert compiled == chain


# --- a half-open breaker admitting several probes at once ---------------------------------------


@pytest.mark.parametrize("seed", range(4))
async def test_concurrent_half_open_probes_are_judged_as_on_the_chain(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from guarded.testing import FaultPlan, FaultyStore, fault_injector

    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        faulty = FaultyStore(
            Yielding(),
            FaultPlan.random(seed, error_before=0.3, errors=(ConnectionResetError, ValueError)),
        )
        store = guard(
            faulty,
            name="probes",
            registry=registry,
            # No clock in the way (as CONCURRENT_SETTINGS): the two runs must interleave alike, and
            # a 0.5 s attempt timeout can fire in one run and not the other on a loaded machine.
            **{
                **SETTINGS,
                "retries": 1,
                "retry": DETERMINISTIC_RETRY,
                "timeout": CONCURRENT_SETTINGS["timeout"],
            },
            bulkhead={"max_concurrent": 2},
            breaker={"minimum_calls": 2, "window_size": 4, "half_open_probes": 3},
        )
        no_background_replay(store)
        core = core_of(store)
        assert core is not None
        assert core.bulkhead is not None
        seen: list[Any] = []
        async with store:
            for round_ in range(4):
                core.breaker._transition(BreakerState.HALF_OPEN)
                calls = [
                    store.load_memory_state(f"k{index % 2}")
                    if index % 3
                    else store.save_memory_state(f"k{index % 2}", {"v": index})
                    for index in range(7)
                ]
                answers = await asyncio.gather(*calls)
                seen.append(
                    (
                        round_,
                        answers,
                        core.breaker.state.value,
                        core.breaker._probes_in_flight,
                        list(core.breaker._probe_results),
                        core.bulkhead.in_use,
                    )
                )
            seen.append(sorted(counts(registry, "probes").items()))
            seen.append([(r.method, r.fault.kind, r.ending) for r in fault_injector(faulty).log])
            held = controller(store).dead_letters
            assert held is not None
            seen.append(sorted((entry.method, entry.key, entry.error) for entry in await held.entries()))
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert compiled == chain


# --- ``after`` hooks that fail on odd values ------------------------------------------------------


class Touchy:
    """A value the guard's bookkeeping chokes on: comparing, hashing or sizing it raises."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing")

    def __hash__(self) -> int:
        raise RuntimeError("no hashing")

    def __sizeof__(self) -> int:
        raise RuntimeError("no sizing")

    def __len__(self) -> int:
        raise RuntimeError("no length")

    def __iter__(self) -> Any:
        raise RuntimeError("no iterating")


class KeepsAnything(InMemoryStateStore):
    """Keeps memory states as they are (no encoding), so odd values come back from reads."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[Any, Any] = {}

    async def save_memory_state(self, key: str, state: Any) -> None:
        self.kept[key] = state

    async def load_memory_state(self, key: str) -> Any:
        return self.kept.get(key)

    async def load_history(self, trace_id: str) -> Any:
        return self.kept.get(("history", trace_id), [])


@pytest.mark.parametrize("strict", [False, True])
async def test_after_hooks_failing_on_odd_values_end_as_on_the_chain(
    strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd_states: list[Any] = [
        {"x": Touchy()},
        {"x": Touchy()},  # the second write of the key compares with the first
        {"health": Touchy()},
        {"health": "degraded", "x": [Touchy()]},
        Touchy(),
    ]

    async def scenario(compiled: bool) -> Any:
        registry = CollectorRegistry()
        backend = KeepsAnything()
        store = guard(backend, name="odd-after", registry=registry, strict=strict, **SETTINGS)
        seen: list[Any] = []
        async with store:
            held = controller(store).dead_letters
            assert held is not None
            for index, state in enumerate(odd_states):
                for method, args in (("save_memory_state", ("k", state)), ("load_memory_state", ("k",))):
                    try:
                        answer = await getattr(store, method)(*args)
                    except Exception as exc:  # strict mode
                        answer = ("raised", type(exc).__name__)
                    same = answer is state or answer
                    seen.append((index, method, same, LOGICAL_TIMES.get(), len(held.gate)))
            backend.kept[("history", "t")] = Touchy()
            try:
                seen.append(await store.load_history("t"))
            except Exception as exc:  # strict mode
                seen.append(("raised", type(exc).__name__))
            seen.append(sorted(counts(registry, "odd-after").items()))
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert (("save_memory_state", "fallback"), 4) in chain[-1], "the bookkeeping failed after the write"
    assert compiled == chain


# --- the caller's cancellation at every turn of a call --------------------------------------------


async def test_a_cancellation_at_any_turn_of_a_call_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A write whose key has an older write held (its supersede waits for the spill file) and a
    read, each cancelled after 0, 1, 2, ... turns of the loop: before, in and after the store,
    in the supersede. Whatever turn the cancellation lands on, the call is counted once, no permit,
    key slot, breaker probe or logical time is left behind, and the task's cancellation count is
    back to 0 once it is withdrawn, compiled as on the chain."""

    async def scenario(compiled: bool) -> Any:
        backend = CancelledOnReturn()
        registry = CollectorRegistry()
        options = {**SETTINGS, "retries": 1, "spill_path": str(tmp_path / f"turns-{compiled}.sqlite")}
        store = guard(backend, name="turns", registry=registry, bulkhead={"max_concurrent": 1}, **options)
        core = core_of(store)
        assert core is not None
        assert core.bulkhead is not None
        endings: list[str] = []
        async with store:
            held = controller(store).dead_letters
            assert held is not None
            for turns in range(1, 15):  # (at 0 the call never starts: nothing to count)
                for method in ("save_memory_state", "load_memory_state"):
                    backend.saves_fail = True
                    await store.save_memory_state("k", {"v": -turns})  # held: the next write supersedes it
                    backend.saves_fail = False
                    core.breaker._transition(BreakerState.HALF_OPEN if turns % 2 else BreakerState.CLOSED)
                    args = ("k", {"v": turns}) if method == "save_memory_state" else ("k",)

                    async def call(method: str = method, args: tuple[Any, ...] = args) -> Any:
                        return await getattr(store, method)(*args)

                    task = asyncio.ensure_future(call())
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        endings.append("cancelled")
                    else:
                        endings.append("answered")
                    assert LOGICAL_TIMES.get() is None
                    assert len(held.gate) == 0, (turns, method)
                    assert core.bulkhead.in_use == 0, (turns, method)
                    assert core.breaker._probes_in_flight == 0, (turns, method)
            total = sum(counts(registry, "turns").values())
        return endings, total

    chain, compiled = await both(scenario, monkeypatch)
    assert chain[1] == 14 * 2 * 2, "every call counted once"
    assert "cancelled" in chain[0]
    assert compiled[1] == chain[1]
    assert "cancelled" in compiled[0]


@pytest.mark.parametrize("seed", range(4))
async def test_many_concurrent_calls_with_batching_and_a_spill_file_leave_nothing_behind(
    seed: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The same with batched events and a spill file: the batcher's timing makes two runs differ
    (even two on the chain), so what is compared is what must hold whatever the timing."""

    async def scenario(compiled: bool) -> Any:
        path = str(tmp_path / f"many-{compiled}.sqlite")
        return await run_concurrently(seed, batching=True, spill_path=path)

    for seen in await both(scenario, monkeypatch):
        answers, outcomes, in_use, waiting, logical_time, gate = seen[:6]
        assert (in_use, waiting, logical_time, gate) == (0, 0, None, 0), seen
        assert all(a in (None, "CancelledError") or isinstance(a, list | dict) for a in answers)
        assert 0 < sum(count for _, count in outcomes) <= 40


# --- the guard's own calls (flushes, replays): ``run_internal`` ----------------------------------


async def test_the_guards_own_calls_fail_and_succeed_as_on_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

    faults = [
        None,
        Fault.error_before(ConnectionResetError),
        Fault.error_before(ConnectionResetError),
        Fault.error_before(ValueError),
        Fault.hang(),
        Fault.hang(),
        Fault.stubborn(0.06),
        Fault.stubborn(0.06),
        Fault.error_after(TypeError),
        Fault.error_before(asyncio.CancelledError),
        Fault.error_before(KeyboardInterrupt),
        None,
    ]

    async def scenario(compiled: bool) -> Any:
        faulty = FaultyStore(InMemoryStateStore(), FaultPlan.script({"save_memory_state": faults}))
        store = guard(
            faulty,
            name="internal",
            registry=CollectorRegistry(),
            **{**SETTINGS, "timeout": {"attempt": 0.03, "deadline": 0.2, "critical_deadline": 0.2}},
            bulkhead={"max_concurrent": 1},
            breaker={"minimum_calls": 4, "window_size": 4},
        )
        core = core_of(store)
        assert core is not None
        assert core.bulkhead is not None
        task = asyncio.current_task()
        assert task is not None
        seen: list[Any] = []
        for index in range(len(faults) + 2):
            try:
                answer: Any = await core.run_internal("save_memory_state", ("k", {"v": index}), {})
            except BaseException as exc:  # the guard's own calls raise: what they raise is compared
                answer = type(exc).__name__
            seen.append(
                (
                    index,
                    answer,
                    core.breaker.state.value,
                    core.bulkhead.in_use,
                    task.cancelling(),
                    LOGICAL_TIMES.get(),
                )
            )
        seen.append([(r.method, r.fault.kind, r.ending) for r in fault_injector(faulty).log])
        return seen

    chain, compiled = await both(scenario, monkeypatch)
    assert compiled == chain


# --- a write the store fails with a CancelledError of its own ------------------------------------


class CancelsItsOwnSaves(InMemoryStateStore):
    """A store whose driver cancels an internal future while ``broken``: its save raises
    ``CancelledError`` though nobody cancelled the caller."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    async def save_memory_state(self, key: str, state: Any) -> None:
        if self.broken:
            raise asyncio.CancelledError()
        await super().save_memory_state(key, state)


async def test_a_write_the_store_fails_with_its_own_cancelled_error_is_held_not_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fallback layer treats a CancelledError the store raised on its own as a failure, and
    answers the write normally: so the write must be held and replayed, as any failed write is
    (it was dropped: outcome ``fallback``, nothing held, the state never written)."""

    async def scenario(compiled: bool) -> Any:
        backend = CancelsItsOwnSaves()
        registry = CollectorRegistry()
        store = guard(backend, name="own-cancel", registry=registry, **{**SETTINGS, "retries": 1})
        async with store:
            answer = await store.save_memory_state("k", {"v": 1})
            held = controller(store).dead_letters
            assert held is not None
            depth = held.depth
            backend.broken = False
            left = await controller(store).drain(2.0)
            written = await InMemoryStateStore.load_memory_state(backend, "k")
        outcomes = sorted(counts(registry, "own-cancel").items())
        return answer, depth, left, written, LOGICAL_TIMES.get(), outcomes

    chain, compiled = await both(scenario, monkeypatch)
    assert chain == (None, 1, 0, {"v": 1}, None, [(("save_memory_state", "dead_lettered"), 1)])
    assert compiled == chain


class CancelsItsOwnEventSaves(InMemoryStateStore):
    """The same for batched events: the bulk and the single write raise ``CancelledError``."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    async def save_events(self, events: Any) -> None:
        if self.broken:
            raise asyncio.CancelledError()
        await super().save_events(events)

    async def save_event(self, event: StoredEvent) -> None:
        if self.broken:
            raise asyncio.CancelledError()
        await super().save_event(event)


async def test_a_batched_write_the_store_fails_with_its_own_cancelled_error_is_held_not_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario(compiled: bool) -> Any:
        backend = CancelsItsOwnEventSaves()
        registry = CollectorRegistry()
        store = guard(backend, name="own-cancel-batch", registry=registry, **{**SETTINGS, "batching": True})
        async with store:
            answer = await store.save_event(StoredEvent("t", 1.0, "node_end", "n", "e1", {}))
            held = controller(store).dead_letters
            assert held is not None
            depth = held.depth
            backend.broken = False
            left = await controller(store).drain(2.0)
            written = [event.node_id for event in await InMemoryStateStore.load_history(backend, "t")]
        return answer, depth, left, written, sorted(counts(registry, "own-cancel-batch").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert chain == (None, 1, 0, ["e1"], [(("save_event", "dead_lettered"), 1)])
    assert compiled == chain


# --- tracing on for a whole run --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
async def test_with_tracing_on_every_span_is_recorded_as_on_the_chain(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracer provider set (ALWAYS_ON) while random calls meet random faults: every span (name,
    attributes, events, status) and every exemplar-carrying observation as on the chain."""
    import random

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from guarded.testing import FaultPlan, FaultyStore
    from tests.guard.test_compiled_path import step

    async def scenario(compiled: bool) -> Any:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        registry = CollectorRegistry()
        faulty = FaultyStore(
            InMemoryStateStore(),
            FaultPlan.random(seed, error_before=0.2, error_after=0.1, errors=(ConnectionResetError, OSError)),
        )
        rng = random.Random(seed)
        answers: list[Any] = []
        with monkeypatch.context() as patch:
            patch.setattr(trace, "_TRACER_PROVIDER", provider)
            store = guard(faulty, name="traced", registry=registry, **SETTINGS)
            no_background_replay(store)
            async with store:
                for index in range(40):
                    method, args, kwargs = step(rng, index)
                    answers.append(await getattr(store, method)(*args, **kwargs))
        spans = [
            (
                span.name,
                dict(span.attributes or {}),
                [(event.name, dict(event.attributes or {}).get("error.type")) for event in span.events],
                span.status.status_code.name,
            )
            for span in exporter.get_finished_spans()
        ]
        return answers, spans, sorted(counts(registry, "traced").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert len(chain[1]) == 40
    assert compiled == chain


# --- a loop whose clock is set on the loop itself ---------------------------------------------------


class SlowReads(InMemoryStateStore):
    """A memory read takes 50 ms (well inside the attempt timeout)."""

    async def load_memory_state(self, key: str) -> Any:
        await asyncio.sleep(0.05)
        return await super().load_memory_state(key)


async def test_a_clock_set_on_the_running_loop_itself_times_calls_as_on_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A test's virtual clock may be set on the loop object rather than on its class (aiotools'
    VirtualClock and asynctest patch ``loop.time``); the loop schedules by it, so every time a call
    reads must be read from it: a call that takes 50 ms of that clock, well inside its timeout,
    answers ``ok`` and is observed as taking about 50 ms (not 1000 s less than that)."""

    async def scenario(compiled: bool) -> Any:
        loop = asyncio.get_running_loop()
        own_clock = loop.time
        registry = CollectorRegistry()
        store = guard(SlowReads(), name="own-clock", registry=registry, **SETTINGS)
        async with store:
            await store.save_memory_state("k", {"v": 1})
            with monkeypatch.context() as patch:
                patch.setattr(loop, "time", lambda: own_clock() + 1000.0)
                answer = await store.load_memory_state("k")
                await store.save_memory_state("k", {"v": 2})
            durations = {
                method: 0.0 <= series.total < 10.0
                for (name, method, _), series in call_stats(registry).durations.items()
                if name == "own-clock"
            }
        return answer, durations, sorted(counts(registry, "own-clock").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert chain == (
        {"v": 1},
        {"save_memory_state": True, "load_memory_state": True},
        [(("load_memory_state", "ok"), 1), (("save_memory_state", "ok"), 2)],
    ), chain
    assert compiled == chain


# --- the caller's cancellation while a read's answer waits for the held writes --------------------


class GatedAndTold(Gated):
    """:class:`Gated`, telling when a read has the backend's answer and waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def load_memory_state(self, key: str) -> Any:
        if self.gate is not None:
            self.waiting.set()
        return await super().load_memory_state(key)

    async def load_history(self, trace_id: str) -> Any:
        if self.gate is not None:
            self.waiting.set()
        return await super().load_history(trace_id)


@pytest.mark.parametrize("method", ["load_memory_state", "load_history"])
async def test_a_read_cancelled_while_its_answer_looks_up_the_held_writes_ends_as_on_the_chain(
    method: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A read on the success path whose backend answers after a write of its key (or scope) was
    held meanwhile: its answer looks the held write up in the buffer (the deferred part of the
    stale-reads ``after`` step, made to take a few turns), and the caller is cancelled 0, 1, 2, ...
    turns into that (the runs are compared by what must hold whatever turn it lands on). A
    cancelled read is counted ``cancelled``, an answered one answers the held write; a later outage
    answers the held write too (never the backend's older answer the read had); no logical time is
    left behind."""

    def event(ts: float) -> StoredEvent:
        return StoredEvent("t", ts, "node_end", "n", f"e{ts}", {})

    newer = {"v": 2} if method == "load_memory_state" else [event(1.0), event(2.0)]
    args = ("k",) if method == "load_memory_state" else ("t",)
    from guarded.deadletter.buffer import DeadLetterBuffer

    for lookup in ("latest_for_key", "pending_for_scope"):  # each takes a few turns, as a file read does
        original = getattr(DeadLetterBuffer, lookup)

        async def slow(self: Any, *args: Any, original: Any = original) -> Any:
            for _ in range(3):
                await asyncio.sleep(0)
            return await original(self, *args)

        monkeypatch.setattr(DeadLetterBuffer, lookup, slow)

    async def scenario(compiled: bool) -> Any:
        endings: list[str] = []
        outages: list[Any] = []
        registry = CollectorRegistry()
        for turns in range(8):
            backend = GatedAndTold()
            path = str(tmp_path / f"deferred-{method}-{compiled}-{turns}.sqlite")
            store = guard(backend, name="deferred", registry=registry, **{**SETTINGS, "spill_path": path})
            no_background_replay(store)
            async with store:
                if method == "load_memory_state":
                    await store.save_memory_state("k", {"v": 1})
                else:
                    await store.save_event(event(1.0))
                backend.gate = asyncio.Event()
                backend.saves_fail = True
                reader = asyncio.ensure_future(getattr(store, method)(*args))
                await asyncio.wait_for(backend.waiting.wait(), 5.0)  # the backend answered; it waits
                if method == "load_memory_state":
                    await store.save_memory_state("k", {"v": 2})  # held
                else:
                    await store.save_event(event(2.0))  # held
                backend.gate.set()
                for _ in range(turns):
                    await asyncio.sleep(0)
                reader.cancel()
                try:
                    answer = await reader
                except asyncio.CancelledError:
                    endings.append("cancelled")
                else:
                    endings.append("answered")
                    assert answer == newer, (turns, answer)
                backend.gate = None
                backend.down = True
                outages.append(await getattr(store, method)(*args))
                backend.down = backend.saves_fail = False
                assert LOGICAL_TIMES.get() is None
        return endings, outages, counts(registry, "deferred")

    for endings, outages, counted in await both(scenario, monkeypatch):
        assert endings[0] == "cancelled", endings
        assert counted[(method, "cancelled")] == endings.count("cancelled"), (endings, counted)
        assert counted[(method, "ok")] == endings.count("answered"), (endings, counted)
        assert counted[(method, "stale")] == len(outages)
        # Memory: the held write; history: the held event merged into the last answer kept (none
        # when the only read was cancelled).
        assert all(outage in (newer, [event(2.0)]) for outage in outages), outages


# --- a consume in flight while an older save of its token gets held ------------------------------


class GatedPauses(InMemoryStateStore):
    """Each call is logged; a consume waits for ``load_gate`` after taking its answer; a save waits
    for ``save_gate`` (once) and fails while ``saves_fail``; a save that reaches the backend while
    a consume waits opens its gate (so a wrong order shows in the log instead of hanging)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.load_gate: asyncio.Event | None = None
        self.save_gate: asyncio.Event | None = None
        self.loading = asyncio.Event()
        self.saving = asyncio.Event()
        self.saves_fail = False

    async def load_planner_state(self, token: str) -> Any:
        answer = await super().load_planner_state(token)
        gate = self.load_gate
        if gate is not None:
            self.log.append("consume waits")
            self.loading.set()
            await gate.wait()
            self.log.append("consume ends")
        return answer

    async def save_planner_state(self, token: str, payload: Any) -> None:
        gate, self.save_gate = self.save_gate, None
        if gate is not None:
            self.saving.set()
            await gate.wait()
        if self.saves_fail:
            self.log.append("save fails")
            raise ConnectionRefusedError("down")
        self.log.append("save lands")
        if self.load_gate is not None:
            self.load_gate.set()
        await super().save_planner_state(token, payload)


async def test_a_consume_in_flight_while_an_older_save_of_its_token_gets_held_is_ordered_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consume that took the success path (nothing held) is registered with the key gate as the
    chain's is: a save of its token that began before it and is held meanwhile is replayed only
    once the consume is done (and loses to the consume's tombstone: the token is resumed once),
    and no registration is left behind."""

    async def scenario(compiled: bool) -> Any:
        backend = GatedPauses()
        registry = CollectorRegistry()
        store = guard(backend, name="pause-race", registry=registry, **{**SETTINGS, "retries": 1})
        no_background_replay(store)
        async with store:
            await store.save_planner_state("tok", {"p": 1})
            save_gate, load_gate = asyncio.Event(), asyncio.Event()
            backend.save_gate, backend.load_gate = save_gate, load_gate
            saver = asyncio.ensure_future(store.save_planner_state("tok", {"p": 2}))
            await backend.saving.wait()  # the older save is in the backend
            consumer = asyncio.ensure_future(store.load_planner_state("tok"))
            await backend.loading.wait()  # the consume has {"p": 1} and waits
            held = controller(store).dead_letters
            assert held is not None
            registered = len(held.gate)
            backend.saves_fail = True
            save_gate.set()
            await saver  # failed: held
            backend.saves_fail = False
            drain = asyncio.ensure_future(controller(store).drain(2.0))
            await asyncio.sleep(0.05)  # a replay that does not wait for the consume lands now
            load_gate.set()
            consumed = await consumer
            left = await drain
            backend.load_gate = None
            again = await store.load_planner_state("tok")
            then = await store.load_planner_state("tok")
            observed = (
                consumed,
                left,
                again,
                then,
                registered,
                len(held.gate),
                backend.log,
                sorted(counts(registry, "pause-race").items()),
            )
        return observed

    chain, compiled = await both(scenario, monkeypatch)
    assert (chain[0], chain[2], chain[3]) == ({"p": 1}, None, None), chain
    replay = ["consume ends", "save lands"]
    assert chain[6] == ["save lands", "consume waits", "save fails", "save fails", *replay], chain
    assert chain[5] == 0, chain
    assert compiled == chain
