"""Bend under load, do not break, against a real PostgreSQL.

1,000 concurrent callers on the default 10-connection pool for 8 seconds, every guard setting at
its default: agent turns mixing batched appends (``save_event``, group commit), direct upserts
(``save_memory_state``, ``save_task``, ``save_trajectory``) and reads (``load_memory_state``,
``load_history``). The database is healthy, only busy — each statement takes 5 ms
(:data:`STATEMENT_LATENCY`), so the pool, not the event loop, is what callers wait for. The
breaker must never open (waiting for admission is the guard's own queueing, not the backend being
slow), no write may be dropped or parked, no caller may see an exception, and every acknowledged
write must be in PostgreSQL at the end (counted with SQL behind the store's back).

Without the bulkhead the callers waited for a pool connection inside the time the breaker
measured: the breaker opened 1.1 s into the run and again later, 56,349 of 59,880 acknowledged
writes were dead-lettered and 21,866 reads answered stale (nothing was lost: the spill file held
the writes). The assertions are about behaviour, never timings: the test runs on a loaded
two-core machine. The figures of a run are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.config import GuardConfig, LoggingConfig
from guarded.guard import controller, guard
from guarded.layers.breaker import BreakerState
from guarded.models import StoredEvent, TaskContextSnapshot, TaskState, TaskStatus, TaskType
from guarded.observability import telemetry_names as names
from tests.support.metrics import outcome_counts as outcomes
from tests.support.metrics import total

from ._outages import T0, Ledger, differences, drain_all, read_back

CALLERS = 1_000
SECONDS = 8.0
"""Long enough: the breaker opened 1.1 s into the run when the bulkhead was missing."""
STATEMENT_LATENCY = 0.005
"""Seconds each statement holds its connection before it runs: a healthy database a few network
hops away, or busy with other clients (the embedded test server on the loopback answers in a
fraction of a millisecond, and then the event loop, not the pool, is what callers wait for)."""
TURNS_KEPT = 20
"""Conversation turns a memory state keeps (about 4 KB of JSON)."""
TEXT = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 3
"""About 170 characters: a message, a tool output."""


class DistantConnection(asyncpg.Connection):  # type: ignore[misc]
    """A connection to a database :data:`STATEMENT_LATENCY` away: every statement (a transaction's
    ``BEGIN`` and ``COMMIT`` too) holds the connection that much longer."""

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(STATEMENT_LATENCY)
        return await super().execute(*args, **kwargs)

    async def executemany(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(STATEMENT_LATENCY)
        return await super().executemany(*args, **kwargs)

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(STATEMENT_LATENCY)
        return await super().fetch(*args, **kwargs)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(STATEMENT_LATENCY)
        return await super().fetchrow(*args, **kwargs)

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(STATEMENT_LATENCY)
        return await super().fetchval(*args, **kwargs)

    async def copy_records_to_table(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(STATEMENT_LATENCY)
        return await super().copy_records_to_table(*args, **kwargs)


class Agent:
    """One caller: turn after turn of what a PenguiFlow agent asks its store, on keys of its own.

    A turn loads the session memory, records two runtime events (batched), saves the trajectory,
    the task and the memory, and reads the trace's history back. Every acknowledged write is
    recorded in the :class:`~tests.postgres._outages.Ledger` as its last value (upserts) or once
    (events)."""

    def __init__(self, store: Any, number: int, ledger: Ledger, latencies: list[float]) -> None:
        self.store = store
        self.number = number
        self.ledger = ledger
        self.latencies = latencies
        self.read_errors: list[BaseException] = []
        self.trace = f"trace-{number}"
        self.session = f"sess-{number}"
        self.memory_key = f"mem-{number}"
        self.turns: list[dict[str, Any]] = []

    async def call(self, method: str, made: Awaitable[Any], record: Any = None) -> None:
        begun = time.perf_counter()
        try:
            await made
        except Exception as exc:  # a guarded store never raises: asserted by the test
            (self.ledger.errors if record is not None else self.read_errors).append(exc)
        else:
            if record is not None:
                record()
        finally:
            self.latencies.append(time.perf_counter() - begun)
            if record is not None:
                self.ledger.calls += 1

    async def turn(self, turn: int) -> None:
        store, ledger = self.store, self.ledger
        await self.call("load_memory_state", store.load_memory_state(self.memory_key))
        for phase in ("node_start", "node_end"):
            node = f"n{turn}-{phase}"
            event = StoredEvent(self.trace, float(turn), phase, "answer", node, {"turn": turn, "text": TEXT})

            def record_event(node: str = node) -> None:
                ledger.events[(self.trace, node)] += 1

            await self.call("save_event", store.save_event(event), record_event)
        traj = f"traj-{self.number}-{turn % 3}"
        trajectory = {"steps": [{"thought": TEXT, "action": "search", "observation": TEXT}] * 3, "turn": turn}

        def record_trajectory() -> None:
            ledger.trajectories[traj] = (self.session, trajectory)

        await self.call(
            "save_trajectory", store.save_trajectory(traj, self.session, trajectory), record_trajectory
        )
        task_id = f"task-{self.number}"
        task = TaskState(
            task_id=task_id,
            session_id=self.session,
            status=TaskStatus.RUNNING,
            task_type=TaskType.FOREGROUND,
            priority=turn,
            context_snapshot=TaskContextSnapshot(session_id=self.session, task_id=task_id),
            description=TEXT,
            progress={"turn": turn},
            created_at=T0,
            updated_at=T0 + timedelta(seconds=turn),
        )

        def record_task() -> None:
            ledger.tasks[task_id] = (self.session, turn)

        await self.call("save_task", store.save_task(task), record_task)
        self.turns = [*self.turns[-(TURNS_KEPT - 1) :], {"role": "user", "turn": turn, "content": TEXT}]
        memory = {"turn": turn, "turns": self.turns, "summary": TEXT}

        def record_memory() -> None:
            ledger.memory[self.memory_key] = memory

        await self.call("save_memory_state", store.save_memory_state(self.memory_key, memory), record_memory)
        await self.call("load_history", store.load_history(self.trace))


@pytest.mark.asyncio
async def test_a_thousand_callers_on_a_ten_connection_pool_lose_nothing_and_never_open_the_breaker(
    pg_dsn: str, schema_name: str
) -> None:
    backend = await PostgresStateStore.connect(
        pg_dsn,
        schema=schema_name,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(extra={"connection_class": DistantConnection}),  # 10 connections
    )
    assert PoolSettings().max_size == 10
    registry = CollectorRegistry()
    config = GuardConfig(logging=LoggingConfig(interval=60))  # defaults; one log line a minute
    store = guard(backend, name="overload", config=config, registry=registry)
    breaker = controller(store).breaker
    loop = asyncio.get_running_loop()
    transitions: list[tuple[float, str, str]] = []
    started = loop.time()
    breaker.add_listener(lambda old, new: transitions.append((loop.time() - started, old.value, new.value)))
    states: Counter[str] = Counter()
    ledger = Ledger()
    latencies: list[float] = []
    agents = [Agent(store, number, ledger, latencies) for number in range(CALLERS)]
    stop = started + SECONDS

    async def run(agent: Agent) -> None:
        turn = 0
        while loop.time() < stop:
            await agent.turn(turn)
            turn += 1

    async def watch_breaker() -> None:
        while loop.time() < stop:
            states[breaker.state.value] += 1
            await asyncio.sleep(0.1)

    try:
        await asyncio.gather(watch_breaker(), *(run(agent) for agent in agents))
        loaded_for = loop.time() - started
        during = outcomes(registry, "overload")
        dead_lettered = total(registry, names.DLQ_ENQUEUED, "overload")
        remaining = await drain_all(store, 120.0)
    finally:
        await controller(store).aclose()
    dropped = total(registry, names.DLQ_DROPPED, "overload")
    parked = total(registry, names.DLQ_PARKED, "overload")
    found = await read_back(pg_dsn, schema_name)
    lost = differences(ledger, found)
    read_errors = [error for agent in agents for error in agent.read_errors]
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)] if latencies else 0.0
    print(
        f"\n{len(latencies)} calls in {loaded_for:.1f}s ({ledger.acknowledged} writes acknowledged), "
        f"p99 {p99:.3f}s; outcomes {dict(during)}; dead-lettered {dead_lettered}, dropped {dropped}, "
        f"parked {parked}, left after the drain {remaining}; breaker transitions {transitions}, "
        f"states sampled {dict(states)}; lost {lost}"
    )
    assert ledger.calls >= CALLERS, "every caller made at least one write"
    assert not ledger.errors, "a guarded store never raises"
    assert not read_errors, "a guarded store never raises"
    assert transitions == [], f"the breaker changed state under load on a healthy database: {transitions}"
    assert set(states) == {BreakerState.CLOSED.value}
    assert total(registry, names.CIRCUIT_TRANSITIONS + "_total", "overload") == 0
    assert dropped == 0
    assert parked == 0
    assert remaining == 0
    assert lost == {}, f"acknowledged writes missing from PostgreSQL: {lost}"


@pytest.mark.asyncio
async def test_the_store_declares_its_pool_size_and_the_guard_admits_that_many(
    pg_dsn: str, schema_name: str
) -> None:
    connected = await PostgresStateStore.connect(
        pg_dsn,
        schema=schema_name,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(max_size=4),
    )
    lazy = PostgresStateStore.lazy(
        pg_dsn, schema=schema_name, registry=CollectorRegistry(), pool=PoolSettings(max_size=6)
    )
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=3)
    try:
        shared = await PostgresStateStore.from_pool(pool, schema=schema_name, registry=CollectorRegistry())
        assert (connected.max_concurrency, lazy.max_concurrency, shared.max_concurrency) == (4, 6, 3)
        for backend, limit in ((connected, 4), (lazy, 6), (shared, 3)):
            bulkhead = controller(guard(backend, registry=CollectorRegistry())).bulkhead
            assert bulkhead is not None
            assert bulkhead.limit == limit
        store = guard(connected, registry=CollectorRegistry())
        assert controller(store).bulkhead is not None
        artifacts = store.artifact_store
        assert controller(artifacts).bulkhead is controller(store).bulkhead  # one pool: one line
        await store.save_memory_state("k", {"v": 1})
        assert await store.load_memory_state("k") == {"v": 1}
    finally:
        await connected.close()
        await lazy.close()
        await pool.close()
