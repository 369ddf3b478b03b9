"""Settings, workloads, records and PostgreSQL helpers of the durability bench.

The sizes (:data:`WRITERS`, :data:`WRITES`, spill and drain counts) come from ``BENCH_DURABILITY_*``
environment variables; :func:`configure_quick` and :func:`configure_tiny` shrink them, and the
other durability modules read them from this module at call time.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from guarded import controller
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.models import StoredEvent, TaskContextSnapshot, TaskState, TaskStatus, TaskType
from guarded.observability import telemetry_names as names

from .guard_report import Verdict

SECTION = "durability"
TITLE = "durability: group commit, dead-letter spill and drain of guard(PostgresStateStore)"
SCHEMA = "bench_durability"


def _ints(variable: str, default: str) -> tuple[int, ...]:
    return tuple(int(part) for part in os.environ.get(variable, default).split(",") if part.strip())


WRITERS = _ints("BENCH_DURABILITY_WRITERS", "1,10,100,1000")
"""Concurrent writers of the group-commit series."""
WRITES = dict(zip(WRITERS, _ints("BENCH_DURABILITY_WRITES", "600,3000,8000,8000"), strict=False))
"""Events per repetition at each number of writers, the same for every series of that number."""
SPILL_CALLERS = _ints("BENCH_DURABILITY_SPILL_CALLERS", "100,1000")
"""Concurrent callers of the spill-rate figure."""
SPILL_WRITES = int(os.environ.get("BENCH_DURABILITY_SPILL_WRITES", "10000"))
"""Memory-state upserts held per repetition of the spill-rate figure."""
DRAIN_UPSERTS = int(os.environ.get("BENCH_DURABILITY_DRAIN_UPSERTS", "10000"))
"""Upserts held, then drained, per repetition of the upsert drain."""
DRAIN_EVENTS = int(os.environ.get("BENCH_DURABILITY_DRAIN_EVENTS", "10000"))
"""Events held during an outage, then drained, per repetition of the event drain."""
DRAIN_REPEATS = int(os.environ.get("BENCH_DURABILITY_DRAIN_REPEATS", "3"))
"""Repetitions of each drain (they take seconds each and the event drain restarts the server)."""
DRAIN_CALLERS = 100
"""Concurrent callers filling the buffer before a drain."""
DRAIN_TIMEOUT = 120.0

HEADLINE_WRITERS = 100
"""The number of writers the group-commit targets are judged at."""
VS_COPY_TARGET = 0.8
"""Target: batched ``save_event`` reaches at least this share of ``COPY`` (store encoding) ..."""
VS_COPY_FROM_WRITERS = 10
"""... at this many writers and more."""
VS_UNBATCHED_TARGET = 10.0
P99_TARGET_S = 10e-3
SPILL_TARGET = 10_000.0
UPSERT_DRAIN_TARGET = 5_000.0

GROUP_COMMIT = "group commit"
PIPELINED = "group commit, pipelined"
UNBATCHED = "unbatched"
COPY = "COPY"
HAND = "hand-written group commit"
WRITE_BEHIND = "write-behind"
BARE = "bare store"

BASE_TS = 1_702_857_600.0
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def configure_quick() -> None:
    """Smaller workloads and a single drain repetition, for ``python -m benchmarks --quick``."""
    global WRITES, SPILL_CALLERS, SPILL_WRITES, DRAIN_UPSERTS, DRAIN_EVENTS, DRAIN_REPEATS
    WRITES = dict(zip(WRITERS, (200, 1_000, 2_000, 2_000), strict=False))
    SPILL_CALLERS = (100,)
    SPILL_WRITES = 1_000
    DRAIN_UPSERTS = 1_000
    DRAIN_EVENTS = 1_000
    DRAIN_REPEATS = 1


def configure_tiny() -> None:
    """Token workloads at 1 and 10 writers: the smoke test's sizes (figures meaningless)."""
    global WRITERS, WRITES, SPILL_CALLERS, SPILL_WRITES, DRAIN_UPSERTS, DRAIN_EVENTS, DRAIN_REPEATS
    WRITERS = (1, 10)
    WRITES = {1: 20, 10: 50}
    SPILL_CALLERS = (10,)
    SPILL_WRITES = 50
    DRAIN_UPSERTS = 60
    DRAIN_EVENTS = 50
    DRAIN_REPEATS = 1


# --- workloads ------------------------------------------------------------------------------------


def writer_events(writers: int, total: int, prefix: str) -> list[list[StoredEvent]]:
    """``total`` small events spread over ``writers`` writers, one trace per writer."""
    per_writer = [total // writers + (1 if index < total % writers else 0) for index in range(writers)]
    return [
        [
            StoredEvent(
                trace_id=f"{prefix}-{writer:04d}",
                ts=BASE_TS + index * 0.001,
                kind="node_success",
                node_name="planner",
                node_id=f"node-{index % 7}",
                payload={"step": index, "ok": True},
            )
            for index in range(count)
        ]
        for writer, count in enumerate(per_writer)
    ]


def memory_state(index: int) -> dict[str, Any]:
    """A short-term memory state of a few hundred bytes."""
    return {
        "summary": f"conversation {index}: the user asked for a report, the agent fetched two sources",
        "turns": [
            {"role": "user", "content": "summarise the incident of last night"},
            {"role": "assistant", "content": "the primary database restarted at 02:14; no data was lost"},
        ],
        "facts": {"team": "platform", "step": index},
    }


def task_state(task_id: str, session_id: str, index: int) -> TaskState:
    return TaskState(
        task_id=task_id,
        session_id=session_id,
        status=TaskStatus.RUNNING,
        task_type=TaskType.BACKGROUND,
        priority=index % 5,
        context_snapshot=TaskContextSnapshot(session_id=session_id, task_id=task_id),
        description="fetch and summarise",
        progress={"done": index % 100, "total": 100},
        created_at=T0,
        updated_at=T0 + timedelta(milliseconds=index),
    )


def trajectory(index: int) -> dict[str, Any]:
    return {
        "query": "summarise the incident",
        "steps": [{"thought": "look up the logs", "action": "search", "observation": f"hit {index}"}],
    }


Upsert = Callable[[Any], Awaitable[Any]]
"""One upsert, as a function of the guarded store."""


def _memory_upsert(key: str, state: dict[str, Any]) -> Upsert:
    return lambda store: store.save_memory_state(key, state)


def _task_upsert(task: TaskState) -> Upsert:
    return lambda store: store.save_task(task)


def _trajectory_upsert(trace: str, session: str, doc: dict[str, Any]) -> Upsert:
    return lambda store: store.save_trajectory(trace, session, doc)


def mixed_upserts(count: int, prefix: str) -> list[Upsert]:
    """``count`` upserts with distinct keys, memory states, tasks and trajectories in turn; each
    is a function of the guarded store."""
    calls: list[Upsert] = []
    for index in range(count):
        kind = index % 3
        if kind == 0:
            calls.append(_memory_upsert(f"{prefix}-mem-{index}", memory_state(index)))
        elif kind == 1:
            calls.append(
                _task_upsert(task_state(f"{prefix}-task-{index}", f"{prefix}-session-{index % 50}", index))
            )
        else:
            calls.append(
                _trajectory_upsert(
                    f"{prefix}-trace-{index}", f"{prefix}-session-{index % 50}", trajectory(index)
                )
            )
    return calls


async def drive(
    calls: Sequence[Sequence[Callable[[], Awaitable[Any]]]], latencies: list[float] | None = None
) -> None:
    """One task per group, each awaiting its calls in order; every call's duration goes to ``latencies``."""

    async def caller(group: Sequence[Callable[[], Awaitable[Any]]]) -> None:
        clock = time.perf_counter
        record = latencies.append if latencies is not None else None
        for call in group:
            started = clock()
            await call()
            if record is not None:
                record(clock() - started)

    await asyncio.gather(*(caller(group) for group in calls))


async def drive_pipelined(
    calls: Sequence[Sequence[Callable[[], Awaitable[Any]]]], latencies: list[float] | None = None
) -> None:
    """Every call of every group in flight at once (each writer sends its writes as a burst and
    awaits them together); every call's duration, call to commit, goes to ``latencies``."""
    clock = time.perf_counter
    record = latencies.append if latencies is not None else None

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        started = clock()
        await call()
        if record is not None:
            record(clock() - started)

    await asyncio.gather(*(one(call) for group in calls for call in group))


def save_calls(save: Callable[[Any], Awaitable[Any]], groups: Sequence[Sequence[Any]]) -> list[list[Any]]:
    return [[lambda item=item: save(item) for item in group] for group in groups]


def split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``items`` dealt round-robin into ``parts`` groups."""
    return [list(items[index::parts]) for index in range(parts)]


async def _nothing(_: object) -> None:
    return None


# --- measurements ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@dataclass
class Series:
    """One way of writing ``writes`` events with ``writers`` writers; ``run`` fills call latencies."""

    name: str
    writers: int
    writes: int
    run: Callable[[list[float]], Awaitable[None]]
    registry: CollectorRegistry | None = None
    seconds: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    encode_seconds: list[float] = field(default_factory=list)
    batch_baseline: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def rate(self) -> float:
        return self.writes / statistics.median(self.seconds)

    @property
    def rates(self) -> tuple[float, float]:
        return self.writes / max(self.seconds), self.writes / min(self.seconds)

    def batch_totals(self) -> tuple[float, float, float]:
        """(writes, flushes, flush seconds) of the guard's batcher so far."""
        if self.registry is None:
            return (0.0, 0.0, 0.0)
        found: dict[str, float] = {}
        for metric in self.registry.collect():
            for sample in metric.samples:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
        return (
            found.get(names.BATCH_SIZE + "_sum", 0.0),
            found.get(names.BATCH_SIZE + "_count", 0.0),
            found.get(names.BATCH_FLUSH_DURATION + "_sum", 0.0),
        )

    def batches(self) -> tuple[float, float] | None:
        """Average batch size and flush duration (seconds) over the timed repetitions."""
        writes, flushes, seconds = (
            now - before for now, before in zip(self.batch_totals(), self.batch_baseline, strict=True)
        )
        if flushes <= 0:
            return None
        return writes / flushes, seconds / flushes


@dataclass
class Level:
    """Every series at one number of writers."""

    writers: int
    writes: int
    series: dict[str, Series]
    harness: list[float] = field(default_factory=list)
    """Seconds per write of the writers alone (awaiting a no-op), per repetition."""
    pipelined_harness: list[float] = field(default_factory=list)
    """The same for the pipelined writers."""


@dataclass
class Spill:
    callers: int
    writes: int
    seconds: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.writes / statistics.median(self.seconds)


@dataclass
class Drain:
    name: str
    held: int
    fill_seconds: list[float] = field(default_factory=list)
    drain_seconds: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.held / statistics.median(self.drain_seconds)

    @property
    def fill_rate(self) -> float:
        return self.held / statistics.median(self.fill_seconds)


@dataclass
class Report:
    levels: list[Level]
    spills: list[Spill]
    drains: list[Drain]
    verdicts: list[Verdict]
    notes: list[str]


# --- PostgreSQL helpers ---------------------------------------------------------------------------

TABLES = ("flow_events", "memory_states", "task_states", "trajectories")


async def _count(store: PostgresStateStore, table: str, where: str = "", *args: Any) -> int:
    value = await store.pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.{table} {where}", *args)
    return int(value)


async def _truncate(store: PostgresStateStore, *tables: str) -> None:
    await store.pool.execute("; ".join(f"TRUNCATE {SCHEMA}.{table}" for table in tables))


async def _connect(dsn: str, **pool: Any) -> PostgresStateStore:
    return await PostgresStateStore.connect(
        dsn,
        schema=SCHEMA,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(**pool) if pool else None,
    )


def _check_healthy(name: str, proxy: object) -> None:
    buffer = controller(proxy).dead_letters
    if buffer is not None and not buffer.is_empty:
        raise RuntimeError(f"{name}: {buffer.depth} writes were dead-lettered during a healthy run")
