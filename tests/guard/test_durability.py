"""Nothing acknowledged is lost, against the in-memory
store with injected faults: dead-lettering, replay, last-write-wins, stale-if-error,
read-your-writes through the batcher, consume of a held pause, graceful drain and spill files.
The PostgreSQL outage, crash and flapping scenarios are in tests/postgres/test_outages.py.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, DeadLetterConfig, MethodConfig, StaleConfig
from guarded.deadletter import decode_call
from guarded.guard import controller, guard
from guarded.models import PlannerEvent, TaskContextSnapshot, TaskState, TaskStatus, TaskType
from guarded.pipeline.idempotency import WRITE_KEY_ARGUMENT
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import calls, outcome_counts

from .support import event, fast_config
from .test_properties import plans

OUTAGE = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
RECOVERED = FaultPlan()
BEGIN = datetime(2026, 11, 21, tzinfo=UTC)


def durable(
    path: Path | None = None,
    *,
    batch_delay: float = 0.001,
    drain_timeout: float = DeadLetterConfig().drain_timeout,
    **fields: Any,
) -> Any:
    return fast_config(
        batching=BatchConfig(max_delay=batch_delay),
        dead_letter=DeadLetterConfig(
            path=str(path) if path else None, replay_rate=10_000, drain_timeout=drain_timeout
        ),
        stale=StaleConfig(),
        **fields,
    )


def guarded_faulty(
    path: Path | None = None, **fields: Any
) -> tuple[Any, InMemoryStateStore, Any, CollectorRegistry]:
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, FaultPlan())
    store = guard(faulty, registry=registry, config=durable(path, **fields))
    return store, backend, fault_injector(faulty), registry


def task(task_id: str, status: TaskStatus, version: int) -> TaskState:
    return TaskState(
        task_id=task_id,
        session_id="s1",
        status=status,
        task_type=TaskType.FOREGROUND,
        priority=0,
        context_snapshot=TaskContextSnapshot(session_id="s1", task_id=task_id),
        created_at=BEGIN,
        updated_at=BEGIN + timedelta(seconds=version),
    )


@pytest.mark.asyncio
async def test_a_failed_write_is_acknowledged_kept_and_replayed_after_recovery() -> None:
    store, backend, injector, registry = guarded_faulty()
    injector.plan = OUTAGE
    assert await store.save_memory_state("k1", {"turns": [1]}) is None
    assert calls(registry, "save_memory_state", "dead_lettered") == 1
    assert controller(store).dead_letters.depth == 1
    assert await backend.load_memory_state("k1") is None

    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=5) == 0
    assert await backend.load_memory_state("k1") == {"turns": [1]}


@pytest.mark.asyncio
async def test_memory_keeps_its_turns_through_an_outage() -> None:
    store, backend, injector, registry = guarded_faulty()
    await store.save_memory_state("m", {"turns": ["a"]})
    assert await store.load_memory_state("m") == {"turns": ["a"]}

    injector.plan = OUTAGE
    for turn in ("b", "c"):
        state = await store.load_memory_state("m")
        assert state is not None, "an outage must not look like an empty memory"
        await store.save_memory_state("m", {"turns": [*state["turns"], turn]})
    assert calls(registry, "load_memory_state", "stale") == 2
    assert controller(store).dead_letters.depth == 1  # coalesced by key

    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=5) == 0
    assert await backend.load_memory_state("m") == {"turns": ["a", "b", "c"]}


@pytest.mark.asyncio
async def test_the_stale_cache_size_is_exported_per_store() -> None:
    store, _, _, registry = guarded_faulty()
    assert registry.get_sample_value("guarded_stale_cache_entries", {"store": "default"}) == 0
    await store.save_memory_state("k1", {"turns": [1]})
    await store.save_memory_state("k2", {"turns": [2]})
    await store.load_memory_state("k1")
    assert registry.get_sample_value("guarded_stale_cache_entries", {"store": "default"}) == 2


@pytest.mark.asyncio
async def test_a_replay_never_overwrites_a_newer_direct_write() -> None:
    store, backend, injector, _ = guarded_faulty()
    injector.plan = OUTAGE
    await store.save_task(task("t1", TaskStatus.RUNNING, 1))
    assert controller(store).dead_letters.depth == 1

    injector.plan = RECOVERED
    await store.save_task(task("t1", TaskStatus.COMPLETE, 2))
    assert controller(store).dead_letters.depth == 0  # superseded by the newer write
    assert await controller(store).drain(timeout=5) == 0
    [stored] = await backend.list_tasks("s1")
    assert stored.status is TaskStatus.COMPLETE


class SlowFirstWrite(FaultPlan):
    """The next call of ``method`` reaches the store only after ``seconds``; the rest go through."""

    def __init__(self, seconds: float, method: str = "save_memory_state") -> None:
        self.seconds = seconds
        self.method = method
        self.used = False

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if method == self.method and not self.used:
            self.used = True
            return Fault.delay(self.seconds)
        return Fault.ok()


async def until_called(injector: Any, method: str, count: int) -> None:
    async with asyncio.timeout(5):
        while injector.calls(method) < count:  # noqa: ASYNC110 - the injector offers no event
            await asyncio.sleep(0.001)


@pytest.mark.asyncio
async def test_a_newer_direct_write_lands_after_a_replay_of_its_key_already_in_flight() -> None:
    store, backend, injector, _ = guarded_faulty(attempt=2.0, deadline=4.0)
    injector.plan = OUTAGE
    await store.save_memory_state("k1", {"turns": ["old"]})
    before = injector.calls("save_memory_state")

    injector.plan = SlowFirstWrite(0.3)  # the replay of "old" is slow to reach the store
    drain = asyncio.ensure_future(controller(store).drain(timeout=5))
    await until_called(injector, "save_memory_state", before + 1)
    await store.save_memory_state("k1", {"turns": ["old", "new"]})
    assert await drain == 0
    assert await backend.load_memory_state("k1") == {"turns": ["old", "new"]}


@pytest.mark.asyncio
async def test_a_replay_waits_for_a_newer_direct_write_in_flight_and_then_skips_the_older_write() -> None:
    store, backend, injector, _ = guarded_faulty(attempt=2.0, deadline=4.0)
    injector.plan = OUTAGE
    await store.save_memory_state("k1", {"turns": ["old"]})
    # 3 attempts of the write, 3 of the first background replay, which then sleeps for 0.5 s
    await until_called(injector, "save_memory_state", 6)
    before = injector.calls("save_memory_state")

    injector.plan = SlowFirstWrite(0.2)  # the direct write of "new" is slow to reach the store
    direct = asyncio.ensure_future(store.save_memory_state("k1", {"turns": ["old", "new"]}))
    await until_called(injector, "save_memory_state", before + 1)
    assert await controller(store).drain(timeout=5) == 0
    await direct
    assert injector.calls("save_memory_state") == before + 1  # "old" was never sent again
    assert await backend.load_memory_state("k1") == {"turns": ["old", "new"]}


@pytest.mark.asyncio
async def test_a_pause_resumed_while_its_replay_is_in_flight_is_consumed_once() -> None:
    store, backend, injector, _ = guarded_faulty(attempt=2.0, deadline=4.0)
    injector.plan = OUTAGE
    await store.save_planner_state("tok", {"step": 1})
    before = injector.calls("save_planner_state")

    injector.plan = SlowFirstWrite(0.3, "save_planner_state")  # the replay is slow to reach the store
    drain = asyncio.ensure_future(controller(store).drain(timeout=5))
    await until_called(injector, "save_planner_state", before + 1)
    assert await store.load_planner_state("tok") == {"step": 1}
    assert await drain == 0
    assert await store.load_planner_state("tok") is None  # not a second time
    assert await backend.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_batched_events_are_read_back_at_once_and_survive_an_outage() -> None:
    store, backend, injector, registry = guarded_faulty(batch_delay=10.0)
    await store.save_event(event("t1", 0))
    assert len(await store.load_history("t1")) == 1  # read-your-writes flushes the batch

    injector.plan = OUTAGE
    for index in range(1, 4):
        assert await store.save_event(event("t1", index)) is None
    history = await store.load_history("t1")
    assert [e.node_id for e in history] == ["n0", "n1", "n2", "n3"]  # stale cache + held writes
    assert calls(registry, "load_history", "stale") == 1
    assert len(await backend.load_history("t1")) == 1

    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=5) == 0
    assert [e.node_id for e in await backend.load_history("t1")] == ["n0", "n1", "n2", "n3"]


@pytest.mark.asyncio
async def test_a_pause_saved_during_an_outage_is_resumed_from_the_buffer_once() -> None:
    store, backend, injector, registry = guarded_faulty()
    injector.plan = OUTAGE
    await store.save_planner_state("tok", {"step": 3})
    assert calls(registry, "save_planner_state", "dead_lettered") == 1

    assert await store.load_planner_state("tok") == {"step": 3}
    assert await store.load_planner_state("tok") is None  # consumed once
    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=5) == 0
    assert await backend.load_planner_state("tok") is None  # never replayed after its consume


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_bad_data_is_parked_with_its_reason_and_not_retried() -> None:
    store, backend, _, registry = guarded_faulty()
    assert await store.save_memory_state("k", {"x": math.nan}) is None
    assert calls(registry, "save_memory_state", "rejected") == 1
    buffer = controller(store).dead_letters
    assert buffer.depth == 0
    [parked] = await buffer.parked()
    assert parked.method == "save_memory_state"
    assert "NaN" in parked.reason or "nan" in parked.reason.lower()
    assert await backend.load_memory_state("k") is None


@pytest.mark.asyncio
async def test_close_keeps_what_it_could_not_drain_and_the_next_process_replays_it(tmp_path: Path) -> None:
    spill = tmp_path / "dlq-{name}.sqlite"
    store, backend, injector, _ = guarded_faulty(spill, drain_timeout=0.5)  # the close tries, briefly
    injector.plan = OUTAGE
    await store.save_memory_state("k", {"v": 1})
    for index in range(3):
        await store.save_event(event("t1", index))
    await controller(store).flush()
    await controller(store).aclose()
    assert (tmp_path / "dlq-default.sqlite").exists()

    injector.plan = FaultPlan()  # the next process, over the same store, its backend back
    registry = CollectorRegistry()
    again = guard(controller(store).store, registry=registry, config=durable(spill))
    async with again:
        assert await controller(again).drain(timeout=5) == 0
    assert await backend.load_memory_state("k") == {"v": 1}
    assert len(await backend.load_history("t1")) == 3


async def run_durable_example(
    plan: FaultPlan, writes: list[tuple[str, int]], group: int, outage: tuple[int, int]
) -> None:
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, plan)
    store = guard(faulty, name="prop", registry=registry, config=durable(batch_delay=0.002))
    acknowledged: list[str] = []
    last_memory: dict[str, int] = {}
    made = 0
    injector = fault_injector(faulty)
    for number, start in enumerate(range(0, len(writes), group)):
        injector.plan = OUTAGE if outage[0] <= number < outage[0] + outage[1] else plan
        chunk = writes[start : start + group]
        calls_made = []
        for index, (kind, key) in enumerate(chunk, start=start):
            if kind == "event":
                calls_made.append(store.save_event(event(f"t{key}", index)))
            elif kind == "memory":
                calls_made.append(store.save_memory_state(f"m{key}", {"v": index}))
            elif kind == "history":
                calls_made.append(store.load_history(f"t{key}"))
            else:
                calls_made.append(store.load_memory_state(f"m{key}"))
        results = await asyncio.gather(*calls_made, return_exceptions=True)
        made += len(chunk)
        for (kind, key), result, index in zip(chunk, results, range(start, start + len(chunk)), strict=True):
            assert not isinstance(result, BaseException), f"{result!r} escaped the guard"
            if kind == "event":
                acknowledged.append(f"t{key}/n{index}")
            elif kind == "memory":
                last_memory[f"m{key}"] = index
    counted = sum(outcome_counts(registry, store=None).values())
    assert counted == made

    await controller(store).flush()
    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=10) == 0
    parked_events: set[str] = set()
    parked_memory: set[str] = set()
    for parked in await controller(store).dead_letters.parked():
        assert parked.call is not None
        args, _ = decode_call(parked.method, parked.call)
        if parked.method == "save_event":
            parked_events.add(f"{args[0].trace_id}/{args[0].node_id}")
        elif parked.method == "save_memory_state":
            parked_memory.add(args[0])
    stored: list[str] = []
    for trace in sorted({name.split("/")[0] for name in acknowledged}):
        stored.extend(f"{trace}/{e.node_id}" for e in await backend.load_history(trace))
    # Exactly once: nothing twice, nothing unknown, and every write not refused as bad data.
    # (A write refused after the backend applied it, an injected error_after, may be stored.)
    assert len(stored) == len(set(stored))
    assert set(stored) <= set(acknowledged)
    assert set(acknowledged) - parked_events <= set(stored)
    for key, index in last_memory.items():
        state = await backend.load_memory_state(key)
        if state is None:
            assert key in parked_memory, f"{key}: acknowledged memory lost"
        else:
            assert state["v"] <= index


@pytest.mark.lenient
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=plans,
    writes=st.lists(
        st.tuples(st.sampled_from(["event", "memory", "history", "load"]), st.integers(0, 3)),
        min_size=1,
        max_size=120,
    ),
    group=st.integers(1, 25),
    outage=st.tuples(st.integers(0, 4), st.integers(0, 3)),
)
def test_under_random_faults_every_acknowledged_write_lands_once(
    plan: FaultPlan, writes: list[tuple[str, int]], group: int, outage: tuple[int, int]
) -> None:
    """Random faults plus an outage of a few call groups: no exception escapes, every call is
    counted, and after recovery and drain every acknowledged event is stored exactly once."""
    asyncio.run(run_durable_example(plan, writes, group, outage))


class BulkPlannerEventsStore(InMemoryStateStore):
    """The reference store plus the bulk form the batcher uses when a backend has it."""

    async def save_planner_events(self, items: list[tuple[str, PlannerEvent]]) -> None:
        for trace_id, planner_event in items:
            await self.save_planner_event(trace_id, planner_event)


@pytest.mark.asyncio
async def test_a_planner_event_refused_by_a_full_queue_keeps_its_item_key() -> None:
    """Its replay then uses the same key as any earlier attempt, so it is stored once."""
    registry = CollectorRegistry()
    # Either form of the flush (a batch of one goes out as the single write) takes 0.3 s.
    slow_flush = FaultPlan.always(Fault.delay(0.3), methods=["save_planner_events", "save_planner_event"])
    faulty = FaultyStore(BulkPlannerEventsStore(), slow_flush)
    config = fast_config(
        attempt=1.0,
        deadline=1.0,
        batching=BatchConfig(
            ack="enqueue", max_batch=1, max_delay=0.001, queue_size=1, max_concurrent_flushes=1
        ),
        dead_letter=DeadLetterConfig(path=None),
        methods={"save_planner_event": MethodConfig(deadline=0.05)},
    )
    store = guard(faulty, registry=registry, config=config)
    await store.save_planner_event("t1", PlannerEvent("step_complete", 1.0))  # flushing for 0.3 s
    await store.save_planner_event("t1", PlannerEvent("step_complete", 2.0))  # queue full
    assert calls(registry, "save_planner_event", "dead_lettered") == 1
    [entry] = await controller(store).dead_letters.entries()
    assert entry.error == "queue_full"
    _, kwargs = decode_call(entry.method, entry.call)
    assert isinstance(kwargs[WRITE_KEY_ARGUMENT], str)
    fault_injector(faulty).plan = RECOVERED
    assert await controller(store).drain(timeout=5) == 0
