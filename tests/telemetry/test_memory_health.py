"""The memory health gauge: keys by the ``health`` of their last acknowledged or loaded memory
state (spec 003 "Summarization Failure Handling"; spec 000 "Memory Health States"), through a
real ``guard(InMemoryStateStore())`` and with states from PenguiFlow's DefaultShortTermMemory."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from enum import Enum
from typing import Any

import pytest
from penguiflow.planner.memory import (
    ConversationTurn,
    DefaultShortTermMemory,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    ShortTermMemoryConfig,
)
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig, StaleConfig
from guarded.guard import controller, guard
from guarded.observability import telemetry_names as names
from guarded.telemetry.memory_health_gauge import MemoryHealthTracker, health_of, memory_health_tracker
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.aio import eventually
from tests.support.metrics import calls

from ..guard.support import fast_config
from .support import label_values

HEALTHS = ("healthy", "retry", "degraded", "recovering", "unknown")
OUTAGE = FaultPlan.always(Fault.error_before(ConnectionRefusedError))


def keys(registry: CollectorRegistry, store: str = "default") -> dict[str, float | None]:
    """The gauge for ``store``, by health (a missing series reads as ``None``)."""
    return {
        health: registry.get_sample_value(names.MEMORY_HEALTH_KEYS, {"store": store, "health": health})
        for health in HEALTHS
    }


def expected(**counts: int) -> dict[str, float | None]:
    return {health: float(counts.get(health, 0)) for health in HEALTHS}


def state(health: Any) -> dict[str, Any]:
    return {"version": 1, "health": health, "summary": "", "turns": [], "pending": [], "backlog": []}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.mark.asyncio
async def test_keys_are_counted_by_the_health_of_their_last_saved_state(registry: CollectorRegistry) -> None:
    store = guard(InMemoryStateStore(), registry=registry)
    assert keys(registry) == expected()  # every series exported from the start, at 0
    await store.save_memory_state("tenant:user:k1", state("healthy"))
    await store.save_memory_state("tenant:user:k2", state("degraded"))
    await store.save_memory_state(key="tenant:user:k3", state=state("retry"))
    await store.save_memory_state("tenant:user:k4", state("on fire"))
    await store.save_memory_state("tenant:user:k5", {"value": "session key-value, no health"})
    assert keys(registry) == expected(healthy=1, degraded=1, retry=1, unknown=1)

    await store.save_memory_state("tenant:user:k1", state("recovering"))
    await store.save_memory_state("tenant:user:k2", state("healthy"))
    await store.save_memory_state("tenant:user:k4", {"value": "no longer a memory state"})
    assert keys(registry) == expected(healthy=1, recovering=1, retry=1)

    assert not {label for label in label_values(registry) if "tenant:user" in label}


@pytest.mark.asyncio
async def test_loaded_states_count_too(registry: CollectorRegistry) -> None:
    backend = InMemoryStateStore()
    await backend.save_memory_state("k-loaded", state("degraded"))
    store = guard(backend, registry=registry)
    assert keys(registry) == expected()
    assert (await store.load_memory_state("k-loaded"))["health"] == "degraded"
    assert keys(registry) == expected(degraded=1)

    await backend.save_memory_state("k-loaded", {"value": "replaced by something else"})
    await store.load_memory_state("k-loaded")
    assert keys(registry) == expected()
    assert await store.load_memory_state("never-saved") is None
    assert keys(registry) == expected()


@pytest.mark.asyncio
async def test_a_dead_lettered_write_is_acknowledged_and_counted(registry: CollectorRegistry) -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan())
    config = fast_config(dead_letter=DeadLetterConfig(path=None, replay_rate=10_000), stale=StaleConfig())
    store = guard(faulty, registry=registry, config=config)
    await store.save_memory_state("k", state("healthy"))
    fault_injector(faulty).plan = OUTAGE
    await store.save_memory_state("k", state("degraded"))
    assert calls(registry, "save_memory_state", "dead_lettered") == 1
    assert keys(registry) == expected(degraded=1)
    # a read during the outage answers the held write, and the gauge agrees with it
    assert (await store.load_memory_state("k"))["health"] == "degraded"
    assert keys(registry) == expected(degraded=1)
    fault_injector(faulty).plan = FaultPlan()
    assert await controller(store).drain(timeout=5) == 0
    assert keys(registry) == expected(degraded=1)


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_writes_the_guard_did_not_acknowledge_do_not_count(registry: CollectorRegistry) -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan())
    store = guard(faulty, registry=registry, config=fast_config())  # no dead-letter buffer
    await store.save_memory_state("k", state("healthy"))
    fault_injector(faulty).plan = OUTAGE
    await store.save_memory_state("k", state("degraded"))
    assert calls(registry, "save_memory_state", "fallback") == 1
    assert keys(registry) == expected(healthy=1)

    fault_injector(faulty).plan = FaultPlan()
    await store.save_memory_state("k", state(float("nan")) | {"summary": float("nan")})  # bad data
    assert calls(registry, "save_memory_state", "rejected") == 1
    assert keys(registry) == expected(healthy=1)


@pytest.mark.asyncio
async def test_guards_of_one_name_on_one_registry_share_the_count(registry: CollectorRegistry) -> None:
    backend = InMemoryStateStore()
    first = guard(backend, name="memories", registry=registry)
    second = guard(backend, name="memories", registry=registry)
    other = guard(InMemoryStateStore(), name="elsewhere", registry=registry)
    await first.save_memory_state("k", state("retry"))
    await second.save_memory_state("k", state("retry"))
    await other.save_memory_state("k", state("healthy"))
    assert keys(registry, "memories") == expected(retry=1)
    assert keys(registry, "elsewhere") == expected(healthy=1)


def test_the_tracker_forgets_the_least_recently_seen_key_beyond_its_cap() -> None:
    tracker = MemoryHealthTracker("s", max_keys=2)
    tracker.observe("a", state("degraded"))
    tracker.observe("b", state("retry"))
    tracker.observe("a", state("degraded"))  # seen again: now the most recent
    tracker.observe("c", state("healthy"))
    assert len(tracker) == 2
    assert tracker.forgotten == 1
    assert tracker.counts() == {"healthy": 1, "retry": 0, "degraded": 1, "recovering": 0, "unknown": 0}
    tracker.observe("b", None)  # forgotten already: nothing to undo
    assert sum(tracker.counts().values()) == 2
    with pytest.raises(ValueError, match="max_keys"):
        MemoryHealthTracker("s", max_keys=0)


class Health(Enum):
    DEGRADED = "degraded"


class BrokenMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("unreadable")

    def __iter__(self) -> Iterator[str]:
        return iter(["health"])

    def __len__(self) -> int:
        return 1

    def __contains__(self, key: object) -> bool:
        return True


def test_health_values_of_every_shape() -> None:
    assert health_of(state(MemoryHealth.RECOVERING)) == "recovering"  # PenguiFlow's enum
    assert health_of(state(Health.DEGRADED)) == "degraded"
    assert health_of(state("HEALTHY")) == "unknown"
    assert health_of(state(3)) == "unknown"
    assert health_of(state(None)) == "unknown"
    assert health_of(BrokenMapping()) == "unknown"
    assert health_of({"turns": []}) is None
    assert health_of(None) is None
    assert health_of(["healthy"]) is None
    tracker = MemoryHealthTracker("s")
    tracker.observe(["unhashable"], state("healthy"))
    assert len(tracker) == 0


def test_one_tracker_per_store_and_registry(registry: CollectorRegistry) -> None:
    assert memory_health_tracker("a", registry) is memory_health_tracker("a", registry)
    assert memory_health_tracker("a", registry) is not memory_health_tracker("b", registry)
    assert memory_health_tracker("a", registry) is not memory_health_tracker("a", CollectorRegistry())


class ScriptedSummarizer:
    """PenguiFlow's summarizer callable, answering from a queue the test fills ("fail" / "ok")."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[str] = asyncio.Queue()

    async def __call__(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        if await self.answers.get() == "fail":
            raise ConnectionError("summarizer model unavailable")
        return {"summary": "the user talked about the weather"}


@pytest.mark.asyncio
async def test_states_from_penguiflows_short_term_memory_through_every_health(
    registry: CollectorRegistry,
) -> None:
    store = guard(InMemoryStateStore(), name="memory", registry=registry)
    summarizer = ScriptedSummarizer()
    memory = DefaultShortTermMemory(
        config=ShortTermMemoryConfig(
            strategy="rolling_summary",
            budget=MemoryBudget(full_zone_turns=1),
            retry_attempts=1,
            retry_backoff_base_s=0.0,
            degraded_retry_interval_s=0.0,
        ),
        summarizer=summarizer,
    )
    key = MemoryKey(tenant_id="acme", user_id="u-1", session_id="s-1").composite()
    other = DefaultShortTermMemory(config=ShortTermMemoryConfig(strategy="truncation"))
    await other.persist(store, MemoryKey(tenant_id="acme", user_id="u-2", session_id="s-2").composite())

    async def reach(health: MemoryHealth, act: Callable[[], Awaitable[None]]) -> dict[str, float]:
        await act()
        await eventually(lambda: memory.health is health)
        await memory.persist(store, key)
        return keys(registry, "memory")

    async def turn() -> None:
        await memory.add_turn(ConversationTurn(user_message="hi", assistant_response="hello"))

    async def two_turns_and_a_failure() -> None:
        await summarizer.answers.put("fail")
        await turn()
        await turn()

    async def a_turn_and_another_failure() -> None:
        await summarizer.answers.put("fail")
        await turn()  # the retry runs with the next turn

    async def a_turn_while_degraded() -> None:
        await memory.flush()
        await turn()  # starts the recovery, which waits for the summarizer's answer

    async def summary_arrives() -> None:
        await summarizer.answers.put("ok")

    assert await reach(MemoryHealth.HEALTHY, _nothing) == expected(healthy=2)
    assert await reach(MemoryHealth.RETRY, two_turns_and_a_failure) == expected(healthy=1, retry=1)
    assert await reach(MemoryHealth.DEGRADED, a_turn_and_another_failure) == expected(healthy=1, degraded=1)
    assert await reach(MemoryHealth.RECOVERING, a_turn_while_degraded) == expected(healthy=1, recovering=1)
    assert await reach(MemoryHealth.HEALTHY, summary_arrives) == expected(healthy=2)

    # a fresh process hydrating the key sees the state it was left in
    fresh = CollectorRegistry()
    hydrating = guard(controller(store).store, name="memory", registry=fresh)
    restored = DefaultShortTermMemory(config=ShortTermMemoryConfig(strategy="truncation"))
    await restored.hydrate(hydrating, key)
    assert keys(fresh, "memory") == expected(healthy=1)
    assert "acme:u-1:s-1" not in label_values(registry) | label_values(fresh)


async def _nothing() -> None:
    return None
