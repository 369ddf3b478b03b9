"""PenguiFlow's ``DefaultShortTermMemory`` persists and hydrates through ``guard(PostgresStateStore)``.

The memory persists itself (``persist(store, key)`` -> ``save_memory_state(key, to_dict())``) and
hydrates itself (``hydrate(store, key)`` -> ``from_dict(load_memory_state(key))``) under the key
``MemoryKey(tenant, user, session).composite()`` (``"tenant:user:session"``), as ReactPlanner does
(penguiflow/planner/memory_integration.py). Spec 003 "Persistence" and "Summarization Failure
Handling"; the health gauge is ``guarded_memory_health_keys`` (guarded/layers/memory_health.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import asyncpg
import pytest
from penguiflow.planner.memory import DefaultShortTermMemory, MemoryHealth, MemoryKey
from prometheus_client import CollectorRegistry

from guarded.observability.telemetry_names import MEMORY_HEALTH_KEYS, MEMORY_HEALTH_STATES

from ._session_support import guarded_store, joining_summarizer, memory_config, run_worker, turn

KEY = MemoryKey(tenant_id="tenant-a", user_id="user-1", session_id="session-1").composite()


async def filled_memory(turns: int) -> DefaultShortTermMemory:
    """A memory whose summary is deterministic: flushed after every turn."""
    memory = DefaultShortTermMemory(config=memory_config(), summarizer=joining_summarizer)
    for index in range(turns):
        await memory.add_turn(turn(index))
        await memory.flush()
    return memory


async def stored_state(raw: asyncpg.Connection, schema: str, key: str) -> Any:
    text = await raw.fetchval(f"SELECT state FROM {schema}.memory_states WHERE key = $1", key)
    assert text is not None, f"no memory_states row for {key!r}"
    return json.loads(text)


def jsonable(value: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(value))


@pytest.mark.asyncio
async def test_memory_persists_and_a_new_process_hydrates_it(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    assert KEY == "tenant-a:user-1:session-1"
    memory = await filled_memory(5)
    state = memory.to_dict()
    assert state["summary"] == "question 0|question 1|question 2"
    assert [item["user_message"] for item in state["turns"]] == ["question 3", "question 4"]
    context = jsonable(await memory.get_llm_context())

    async with guarded_store(pg_dsn, schema_name) as store:
        nothing = DefaultShortTermMemory(config=memory_config(), summarizer=joining_summarizer)
        await nothing.hydrate(store, KEY)  # no state yet: hydrate is a no-op, not an error
        assert nothing.to_dict()["turns"] == []
        await memory.persist(store, KEY)
    assert await stored_state(raw, schema_name, KEY) == state

    hydrated = await run_worker("memory", pg_dsn, schema_name, KEY)
    assert hydrated["state"] == state
    assert hydrated["context"] == context

    # The other process added a turn and persisted; this process sees it on its next hydrate.
    async with guarded_store(pg_dsn, schema_name, name="after-worker") as store:
        again = DefaultShortTermMemory(config=memory_config(), summarizer=joining_summarizer)
        await again.hydrate(store, KEY)
    latest = again.to_dict()
    assert latest["summary"] == "question 0|question 1|question 2|question 3"
    assert [item["user_message"] for item in latest["turns"]] == ["question 4", "question 100"]
    assert latest["turns"][1]["trajectory_digest"]["artifacts_refs"] == ["artifact-100"]
    assert latest == await stored_state(raw, schema_name, KEY)


def health_counts(registry: CollectorRegistry, store: str) -> dict[str, float | None]:
    return {
        health: registry.get_sample_value(MEMORY_HEALTH_KEYS, {"store": store, "health": health})
        for health in MEMORY_HEALTH_STATES
    }


def counts(*, healthy: int = 0, retry: int = 0, degraded: int = 0, recovering: int = 0) -> dict[str, float]:
    return {"healthy": healthy, "retry": retry, "degraded": degraded, "recovering": recovering}


class SwitchableSummarizer:
    """The LLM behind the rolling summary: down until ``up`` is set."""

    def __init__(self) -> None:
        self.up = False
        self.calls = 0

    async def __call__(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls += 1
        if not self.up:
            raise RuntimeError("summarizer LLM unavailable")
        return await joining_summarizer(request)


@pytest.mark.asyncio
async def test_memory_health_gauge_counts_degraded_and_recovered_keys(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    """Spec 003 "Summarization Failure Handling": with ``retry_attempts=1`` the first failure moves
    the memory to ``retry`` and the second to ``degraded`` (older turns go to the backlog); a
    later turn with the summarizer back triggers recovery and the memory is ``healthy`` again."""
    steady_key = MemoryKey("tenant-a", "user-1", "steady").composite()
    flaky_key = MemoryKey("tenant-a", "user-2", "flaky").composite()
    summarizer = SwitchableSummarizer()
    first = CollectorRegistry()

    async with guarded_store(pg_dsn, schema_name, name="memory", registry=first) as store:
        steady = await filled_memory(3)
        await steady.persist(store, steady_key)
        assert health_counts(first, "memory") == counts(healthy=1)

        flaky = DefaultShortTermMemory(config=memory_config(), summarizer=summarizer)
        for index in range(3):
            await flaky.add_turn(turn(index))
        await flaky.flush()  # waits for the summarization and its one retry
        assert flaky.health is MemoryHealth.DEGRADED
        assert summarizer.calls == 2
        await flaky.persist(store, flaky_key)
        assert health_counts(first, "memory") == counts(healthy=1, degraded=1)

    persisted = await stored_state(raw, schema_name, flaky_key)
    assert persisted["health"] == "degraded"
    assert [item["user_message"] for item in persisted["backlog"]] == ["question 0"]

    # A restarted process: a fresh store, guard and registry. Hydrating counts the key as degraded.
    second = CollectorRegistry()
    async with guarded_store(pg_dsn, schema_name, name="memory", registry=second) as store:
        resumed = DefaultShortTermMemory(config=memory_config(), summarizer=summarizer)
        await resumed.hydrate(store, flaky_key)
        assert resumed.health is MemoryHealth.DEGRADED
        assert health_counts(second, "memory") == counts(degraded=1)

        summarizer.up = True
        await resumed.add_turn(turn(3))  # degraded: the backlog is retried (recovering -> healthy)
        await resumed.flush()
        assert resumed.health is MemoryHealth.HEALTHY
        assert resumed.to_dict()["summary"] == "question 0;question 1"
        await resumed.persist(store, flaky_key)
        assert health_counts(second, "memory") == counts(healthy=1)

    assert (await stored_state(raw, schema_name, flaky_key))["health"] == "healthy"
