"""The workload, ledger and checks of tests/postgres/test_outages.py, and its crash subprocess.

A :class:`Ledger` records every write the guard acknowledged (returned from without raising);
:func:`read_back` reads what PostgreSQL holds into the same shape, so a test compares the two
exactly: appends as multisets (a duplicate shows), upserts as the last value per key.

Run as a script, this module is the process a crash test kills::

    python -m tests.postgres._outages MODE DSN SCHEMA SPILL WORKERS PER_WORKER

``MODE`` ``spill``: with the database down, make the mixed writes of :func:`write_call` through
``guard(PostgresStateStore.lazy(DSN))``, flush the batcher (failed flushes are dead-lettered),
print one JSON line (``acked``, ``errors``, ``pending``, ``depth``) and sleep until killed.

``MODE`` ``window``: with a batch delay of an hour, write ``WORKERS`` events and flush them
(dead-lettered, in the spill file), save one memory state (dead-lettered), then queue
``PER_WORKER`` more events that are only in the batcher; print the JSON line and sleep. The
queued events are the documented batch-window exception (docs/durability.md).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.config import (
    BatchConfig,
    BreakerConfig,
    DeadLetterConfig,
    GuardConfig,
    LoggingConfig,
    RetryConfig,
    TimeoutConfig,
)
from guarded.guard import controller, guard
from guarded.models import (
    PlannerEvent,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)
from guarded.observability import telemetry_names as names

ATTEMPT = 0.5
DEADLINE = 1.0
CRITICAL_DEADLINE = 2.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)

KINDS = (
    "save_event",
    "save_update",
    "save_planner_event",
    "save_task",
    "save_memory_state",
    "save_planner_state",
    "save_trajectory",
    "save_steering",
)
"""Write ``i`` of a worker is of kind ``KINDS[i % 8]``."""
BATCHED = frozenset({"save_event", "save_update", "save_planner_event"})


def outage_config(
    spill: Path | str | None = None,
    *,
    batching: BatchConfig | None = None,
    breaker: BreakerConfig | None = None,
    dead_letter: DeadLetterConfig | None = None,
    timeout: TimeoutConfig | None = None,
) -> GuardConfig:
    """Short timeouts, quick retries, a breaker that reopens for probes fast, a fast replay."""
    return GuardConfig(
        timeout=timeout
        or TimeoutConfig(attempt=ATTEMPT, deadline=DEADLINE, critical_deadline=CRITICAL_DEADLINE),
        retry=RetryConfig(initial_backoff=0.01, max_backoff=0.05, jitter=0.01),
        breaker=breaker or BreakerConfig(window_size=50, minimum_calls=10, open_duration=0.2),
        batching=batching or BatchConfig(max_delay=0.005),
        dead_letter=dead_letter
        or DeadLetterConfig(
            path=None if spill is None else str(spill),
            replay_rate=1_000_000,
            replay_batch=500,
            drain_timeout=30,
        ),
        logging=LoggingConfig(interval=60),
    )


def pool_settings(application_name: str = "guarded", max_size: int = 8) -> PoolSettings:
    return PoolSettings(
        min_size=1,
        max_size=max_size,
        connect_timeout=2.0,
        command_timeout=10.0,
        application_name=application_name,
    )


async def open_store(
    dsn: str, schema: str, *, application_name: str = "guarded", max_size: int = 8
) -> PostgresStateStore:
    return await PostgresStateStore.connect(
        dsn,
        schema=schema,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=pool_settings(application_name, max_size),
    )


# --- the workload ---------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What was acknowledged (or, read back, what the database holds)."""

    events: Counter[tuple[str, str]] = field(default_factory=Counter)
    updates: Counter[tuple[str, str]] = field(default_factory=Counter)
    planner_events: Counter[tuple[str, float]] = field(default_factory=Counter)
    steering: Counter[tuple[str, str]] = field(default_factory=Counter)
    tasks: dict[str, tuple[str, int]] = field(default_factory=dict)
    """task id -> (session id, priority of the last acknowledged save)."""
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    pauses: dict[str, dict[str, Any]] = field(default_factory=dict)
    trajectories: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """trace id -> (session id, trajectory)."""
    calls: int = 0
    errors: list[BaseException] = field(default_factory=list)
    slowest: dict[str, float] = field(default_factory=dict)
    """Longest call per method, in seconds."""

    @property
    def acknowledged(self) -> int:
        return self.calls - len(self.errors)

    def parts(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "updates": self.updates,
            "planner_events": self.planner_events,
            "steering": self.steering,
            "tasks": self.tasks,
            "memory": self.memory,
            "pauses": self.pauses,
            "trajectories": self.trajectories,
        }


WriteCall = tuple[str, Callable[[Any], Awaitable[None]], Callable[[Ledger], None]]


def write_call(worker: int, index: int) -> WriteCall:
    """Write ``index`` of ``worker``: (method, the call on a store, how to record its acknowledgement).

    Each worker has its own trace, session and keys, and writes them in order: the last
    acknowledged write of a key is its last value.
    """
    kind = KINDS[index % len(KINDS)]
    trace, session = f"trace-{worker}", f"sess-{worker}"
    if kind == "save_event":
        node = f"n{index}"
        event = StoredEvent(trace, float(index), "node_end", "node", node, {"w": worker, "i": index})

        def record_event(ledger: Ledger) -> None:
            ledger.events[(trace, node)] += 1

        return kind, lambda store: store.save_event(event), record_event
    if kind == "save_update":
        update = StateUpdate(
            session_id=session,
            task_id=f"task-{worker}-{index % 3}",
            update_id=f"u{index}",
            update_type=UpdateType.PROGRESS,
            content={"i": index},
        )

        def record_update(ledger: Ledger) -> None:
            ledger.updates[(session, update.update_id)] += 1

        return kind, lambda store: store.save_update(update), record_update
    if kind == "save_planner_event":
        planner_event = PlannerEvent("step", float(index), index, extra={"w": worker})

        def record_planner_event(ledger: Ledger) -> None:
            ledger.planner_events[(trace, float(index))] += 1

        return kind, lambda store: store.save_planner_event(trace, planner_event), record_planner_event
    if kind == "save_task":
        task_id = f"task-{worker}-{index % 3}"
        state = TaskState(
            task_id=task_id,
            session_id=session,
            status=TaskStatus.RUNNING,
            task_type=TaskType.BACKGROUND,
            priority=index,
            context_snapshot=TaskContextSnapshot(session_id=session, task_id=task_id),
            created_at=T0,
            updated_at=T0 + timedelta(seconds=index),
        )

        def record_task(ledger: Ledger) -> None:
            ledger.tasks[task_id] = (session, index)

        return kind, lambda store: store.save_task(state), record_task
    if kind == "save_memory_state":
        key, value = f"mem-{worker}-{index % 2}", {"i": index, "turns": [f"turn-{index}"]}

        def record_memory(ledger: Ledger) -> None:
            ledger.memory[key] = value

        return kind, lambda store: store.save_memory_state(key, value), record_memory
    if kind == "save_planner_state":
        token, payload = f"pause-{worker}-{index % 2}", {"i": index}

        def record_pause(ledger: Ledger) -> None:
            ledger.pauses[token] = payload

        return kind, lambda store: store.save_planner_state(token, payload), record_pause
    if kind == "save_trajectory":
        traj_trace, trajectory = f"traj-{worker}-{index % 2}", {"steps": [index]}

        def record_trajectory(ledger: Ledger) -> None:
            ledger.trajectories[traj_trace] = (session, trajectory)

        return kind, lambda store: store.save_trajectory(traj_trace, session, trajectory), record_trajectory
    steering = SteeringEvent(
        session_id=session,
        task_id=f"task-{worker}",
        event_id=f"e{index}",
        event_type=SteeringEventType.USER_MESSAGE,
        payload={"text": f"message {index}"},
    )

    def record_steering(ledger: Ledger) -> None:
        ledger.steering[(session, steering.event_id)] += 1

    return kind, lambda store: store.save_steering(steering), record_steering


async def perform(store: Any, ledger: Ledger, worker: int, index: int) -> None:
    """Make one write through ``store``; record it when acknowledged, the exception otherwise."""
    method, make_call, record = write_call(worker, index)
    started = time.perf_counter()
    try:
        await make_call(store)
    except Exception as exc:  # a guarded store must never raise: counted, asserted to be none
        ledger.errors.append(exc)
    else:
        record(ledger)
    finally:
        ledger.calls += 1
        elapsed = time.perf_counter() - started
        if elapsed > ledger.slowest.get(method, 0.0):
            ledger.slowest[method] = elapsed


async def run_workers(
    store: Any, ledger: Ledger, *, workers: int, per_worker: int, pause: float = 0.0, start: int = 0
) -> None:
    """``workers`` concurrent workers, each making writes ``start .. start + per_worker - 1`` in
    order, ``pause`` seconds apart."""

    async def worker(number: int) -> None:
        for index in range(start, start + per_worker):
            await perform(store, ledger, number, index)
            await asyncio.sleep(pause)

    await asyncio.gather(*(worker(number) for number in range(workers)))


def expected_ledger(workers: int, per_worker: int) -> Ledger:
    """The ledger of :func:`run_workers` when every write is acknowledged."""
    ledger = Ledger()
    for number in range(workers):
        for index in range(per_worker):
            write_call(number, index)[2](ledger)
            ledger.calls += 1
    return ledger


# --- reading back --------------------------------------------------------------------------------


async def read_back(dsn: str, schema: str) -> Ledger:
    """What the database holds, as a :class:`Ledger` (read behind the store's back)."""
    found = Ledger()
    conn = await asyncpg.connect(dsn)
    try:
        q = f'"{schema}"'
        for row in await conn.fetch(f"SELECT trace_id, node_id FROM {q}.flow_events"):
            found.events[(row["trace_id"], row["node_id"])] += 1
        for row in await conn.fetch(f"SELECT session_id, update_id FROM {q}.state_updates"):
            found.updates[(row["session_id"], row["update_id"])] += 1
        for row in await conn.fetch(f"SELECT trace_id, ts FROM {q}.planner_events"):
            found.planner_events[(row["trace_id"], row["ts"])] += 1
        for row in await conn.fetch(f"SELECT session_id, event_id FROM {q}.steering_events"):
            found.steering[(row["session_id"], row["event_id"])] += 1
        for row in await conn.fetch(f"SELECT task_id, session_id, doc FROM {q}.task_states"):
            found.tasks[row["task_id"]] = (row["session_id"], json.loads(row["doc"])["priority"])
        for row in await conn.fetch(f"SELECT key, state FROM {q}.memory_states"):
            found.memory[row["key"]] = json.loads(row["state"])
        for row in await conn.fetch(
            f"SELECT token, payload FROM {q}.planner_pauses WHERE consumed_at IS NULL"
        ):
            found.pauses[row["token"]] = json.loads(row["payload"])
        for row in await conn.fetch(f"SELECT trace_id, session_id, doc FROM {q}.trajectories"):
            found.trajectories[row["trace_id"]] = (row["session_id"], json.loads(row["doc"])["value"])
    finally:
        await conn.close()
    return found


def differences(expected: Ledger, found: Ledger) -> dict[str, str]:
    """Per part, a short description of what differs (empty when the database holds exactly
    the acknowledged writes)."""
    problems: dict[str, str] = {}
    for name, want in expected.parts().items():
        got = found.parts()[name]
        if got == want:
            continue
        if isinstance(want, Counter):
            missing = want - got
            extra = got - want
            problems[name] = (
                f"{sum(missing.values())} missing (e.g. {list(missing)[:3]}), "
                f"{sum(extra.values())} extra or duplicated (e.g. {list(extra.items())[:3]})"
            )
        else:
            wrong = {
                key: (want.get(key), got.get(key))
                for key in set(want) | set(got)
                if want.get(key) != got.get(key)
            }
            problems[name] = f"{len(wrong)} keys differ (expected, found), e.g. {list(wrong.items())[:3]}"
    return problems


# --- metrics -------------------------------------------------------------------------------------


async def drain_all(store: Any, seconds: float = 30.0) -> int:
    """Drain until nothing is held (waiting out an open breaker) or ``seconds`` pass; returns what
    is left."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        remaining = await controller(store).drain(timeout=max(0.1, end - loop.time()))
        if remaining == 0 or loop.time() >= end:
            return remaining
        await asyncio.sleep(0.05)


async def wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``seconds``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"condition not met within {seconds}s")
        await asyncio.sleep(0.005)


def reached(ledger: Ledger, calls: float) -> Callable[[], bool]:
    """Whether the workload has made ``calls`` calls."""
    return lambda: ledger.calls >= calls


def assert_stored_exactly(expected: Ledger, found: Ledger) -> None:
    assert differences(expected, found) == {}


# --- a workload through an outage -----------------------------------------------------------------


def start_workload(store: Any, *, workers: int, per_worker: int) -> tuple[Ledger, asyncio.Task[None]]:
    """The ledger of a :func:`run_workers` workload (writes 0.01 s apart) and its running task."""
    ledger = Ledger()
    work = asyncio.create_task(run_workers(store, ledger, workers=workers, per_worker=per_worker, pause=0.01))
    return ledger, work


async def assert_all_kept(
    store: Any, ledger: Ledger, dsn: str, schema: str, *, workers: int, per_worker: int
) -> None:
    """Drain what the guard holds and close it; then every write of the workload was acknowledged
    and PostgreSQL holds exactly what the ledger recorded."""
    assert await drain_all(store) == 0
    await controller(store).aclose()
    assert ledger.parts() == expected_ledger(workers, per_worker).parts()
    assert_stored_exactly(ledger, await read_back(dsn, schema))


# --- calls against a stalled server ---------------------------------------------------------------

Timing = tuple[str, float, str]
"""A call's kind, the seconds it took and its outcome (``ok`` or the class of what it raised)."""


async def two_rounds_then_close(
    store: Any, calls: Sequence[tuple[str, Callable[[Any], Awaitable[Any]]]]
) -> tuple[list[Timing], float]:
    """Make ``calls`` on ``store`` twice (each round all at once), timing each, then close the
    guard; returns the timings and the seconds the close took."""
    loop = asyncio.get_running_loop()
    timings: list[Timing] = []

    async def timed(kind: str, call: Callable[[Any], Awaitable[Any]]) -> None:
        started = loop.time()
        outcome = "ok"
        try:
            await call(store)
        except Exception as exc:
            outcome = type(exc).__name__
        timings.append((kind, loop.time() - started, outcome))

    for _ in range(2):
        await asyncio.gather(*(timed(kind, call) for kind, call in calls))
    started = loop.time()
    await controller(store).aclose()
    return timings, loop.time() - started


# --- the crash subprocess -------------------------------------------------------------------------


async def _crash_main(mode: str, dsn: str, schema: str, spill: str, workers: int, per_worker: int) -> None:
    registry = CollectorRegistry()
    backend = PostgresStateStore.lazy(
        dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, pool=pool_settings()
    )
    if mode == "spill":
        store = guard(backend, name="crash", registry=registry, config=outage_config(spill))
        ledger = Ledger()
        await run_workers(store, ledger, workers=workers, per_worker=per_worker)
    else:
        # Write-behind (the opt-in) with no timer flush: the documented window of queued appends.
        batching = BatchConfig(ack="enqueue", max_delay=3600.0, max_batch=10_000)
        config = outage_config(spill, batching=batching)
        store = guard(backend, name="crash", registry=registry, config=config)
        ledger = Ledger()
        for index in range(workers):
            await store.save_event(StoredEvent("window", float(index), "k", None, f"n{index}", {}))
        await store.save_memory_state("window-memory", {"kept": True})
        ledger.calls = workers + 1
    await controller(store).flush()  # failed flushes are dead-lettered: in the spill file now
    if mode == "window":
        for index in range(workers, workers + per_worker):
            await store.save_event(StoredEvent("window", float(index), "k", None, f"n{index}", {}))
        ledger.calls += per_worker
    buffer = controller(store).dead_letters
    assert buffer is not None
    report = {
        "acked": ledger.acknowledged,
        "errors": len(ledger.errors),
        "pending": int(registry.get_sample_value(names.BATCH_PENDING, {"store": "crash"}) or 0),
        "depth": buffer.depth,
    }
    print(json.dumps(report), flush=True)
    await asyncio.sleep(3600)  # until the test kills the process


if __name__ == "__main__":
    mode, dsn, schema, spill, workers, per_worker = sys.argv[1:7]
    asyncio.run(_crash_main(mode, dsn, schema, spill, int(workers), int(per_worker)))
