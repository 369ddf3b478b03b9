"""Group commit, dead-letter spill and drain of ``guard(PostgresStateStore)``, side by side in one run.

Every figure is about ``guard(store)``; the only writes that bypass the guard are the ``COPY``
references (and one clearly labelled bare-store reference at a single writer). Repetitions of the
series that are compared with each other are interleaved (repetition 1 of every series, then
repetition 2, ...) and medians are reported, so a busier stretch of a shared machine affects
every side of a ratio alike.

1. **Group commit** (the guard's default, ``BatchConfig(ack="commit")``): :data:`WRITERS`
   concurrent writers, one trace each, each awaiting its own ``save_event`` calls of small events
   in a loop. Per number of writers, on a freshly truncated table each time and with the same
   events:

   * ``group commit``: ``guard(store)`` with the default configuration. A call returns once the
     batch holding its event is committed, so the time of each awaited call is the caller's
     latency from call to commit (p50 / p99 over every timed repetition).
   * ``unbatched``: ``GuardConfig(batching=BatchConfig(enabled=False))``, the same writers and
     the same number of writes: every call waits for its own ``INSERT``.
   * ``COPY``: the same events encoded exactly as the store encodes them
     (:func:`~guarded.backends.postgres.events.encode_events`, the rows its bulk ``COPY`` path sends)
     and written with one ``copy_records_to_table``; no callers. Encoding is timed in.
   * at one writer only, for reference: the bare store's ``save_event`` (no guard).

   Rows are counted after every repetition; a healthy run that dead-lettered anything stops the
   bench.

2. **Held-upsert spill rate**: the breaker is forced open (``controller(store).breaker.force_open()``:
   the database is unreachable as far as the guard knows) and :data:`SPILL_CALLERS` concurrent
   callers each save memory states with distinct keys. Every call returns once its write is
   committed to the spill file, so upserts per second is the spill file's commit rate as callers
   see it. The buffer's depth is checked against the writes, then it is purged.

3. **Drain of held upserts after recovery**: :data:`DRAIN_UPSERTS` upserts (memory states, tasks
   and trajectories in turn, distinct keys) are held while the breaker is forced open, the breaker
   is reset and ``controller(store).drain(timeout=120)`` is timed until the buffer is empty; the
   rows are then counted in PostgreSQL. The target is judged on the kinds interleaved as callers
   write them; for reference the same upserts are also held kind by kind (all memory states,
   then all tasks, then all trajectories), which gives the replay long runs of one method.

4. **Drain of held events after a real outage**: the server is stopped, the writers save
   :data:`DRAIN_EVENTS` events (each flush fails and is dead-lettered to the spill file), the server
   is started again, the breaker reset and ``controller(store).drain(timeout=120)`` timed; rows are
   counted. With ``--dsn`` this runs on an embedded server of its own (the given one cannot be
   stopped).

Spill files go to ``$XDG_STATE_HOME/guarded/{name}.sqlite`` (the default path) with
``XDG_STATE_HOME`` set to a temporary directory for the run (``GUARDED_DLQ_PATH`` is ignored
meanwhile); both are restored afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import statistics
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded import telemetry_names as names
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.events import encode_events
from guarded.config import BatchConfig, DeadLetterConfig, GuardConfig
from guarded.models import StoredEvent, TaskContextSnapshot, TaskState, TaskStatus, TaskType
from guarded.testing.postgres import EmbeddedPostgres

from .guard_report import Verdict
from .postgres_bench import COLUMNS

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
"""Issue 15: batched ``save_event`` reaches at least this share of ``COPY`` (store encoding) ..."""
VS_COPY_FROM_WRITERS = 10
"""... at this many writers and more."""
VS_UNBATCHED_TARGET = 10.0
P99_TARGET_S = 10e-3
SPILL_TARGET = 10_000.0
UPSERT_DRAIN_TARGET = 5_000.0

GROUP_COMMIT = "group commit"
UNBATCHED = "unbatched"
COPY = "COPY"
BARE = "bare store"

BASE_TS = 1_702_857_600.0
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


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


def mixed_upserts(count: int, prefix: str) -> list[Callable[[Any], Awaitable[Any]]]:
    """``count`` upserts with distinct keys, memory states, tasks and trajectories in turn; each
    is a function of the guarded store."""
    calls: list[Callable[[Any], Awaitable[Any]]] = []
    for index in range(count):
        kind = index % 3
        if kind == 0:
            key, state = f"{prefix}-mem-{index}", memory_state(index)
            calls.append(lambda store, key=key, state=state: store.save_memory_state(key, state))
        elif kind == 1:
            task = task_state(f"{prefix}-task-{index}", f"{prefix}-session-{index % 50}", index)
            calls.append(lambda store, task=task: store.save_task(task))
        else:
            trace, session, doc = (
                f"{prefix}-trace-{index}",
                f"{prefix}-session-{index % 50}",
                trajectory(index),
            )
            calls.append(
                lambda store, trace=trace, session=session, doc=doc: store.save_trajectory(
                    trace, session, doc
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


# --- 1. group commit ------------------------------------------------------------------------------


def _guarded_run(
    store: PostgresStateStore,
    name: str,
    config: GuardConfig,
    registry: CollectorRegistry,
    groups: Sequence[Sequence[StoredEvent]],
    closers: list[Callable[[], Awaitable[None]]],
) -> Callable[[list[float]], Awaitable[None]]:
    """A guard over ``store`` whose writers save ``groups``; its ``aclose`` goes to ``closers``."""
    proxy = guard(store, name=name, config=config, registry=registry)
    calls = save_calls(proxy.save_event, groups)
    closers.append(controller(proxy).aclose)

    async def run(latencies: list[float]) -> None:
        await drive(calls, latencies)
        _check_healthy(name, proxy)

    return run


def build_levels(store: PostgresStateStore, closers: list[Callable[[], Awaitable[None]]]) -> list[Level]:
    """Every series at every number of writers, each guard with its own registry, all over ``store``."""
    levels = []
    unbatched = GuardConfig(batching=BatchConfig(enabled=False))
    for writers in WRITERS:
        total = WRITES.get(writers, 8000)
        groups = writer_events(writers, total, f"w{writers}")
        registry = CollectorRegistry()
        batched_run = _guarded_run(store, f"gc-{writers}", GuardConfig(), registry, groups, closers)
        unbatched_run = _guarded_run(
            store, f"unbatched-{writers}", unbatched, CollectorRegistry(), groups, closers
        )
        series = {
            GROUP_COMMIT: Series(GROUP_COMMIT, writers, total, batched_run, registry),
            UNBATCHED: Series(UNBATCHED, writers, total, unbatched_run),
            COPY: Series(COPY, writers, total, _copy_run(store, [e for group in groups for e in group])),
        }
        if writers == 1:
            bare = save_calls(store.save_event, groups)
            series[BARE] = Series(BARE, writers, total, lambda latencies, bare=bare: drive(bare, latencies))
        levels.append(Level(writers, total, series))
    return levels


def _copy_run(
    store: PostgresStateStore, events: list[StoredEvent]
) -> Callable[[list[float]], Awaitable[None]]:
    """One ``COPY`` of ``events`` encoded by the store's own encoder; ``latencies`` gets the
    encoding time (seconds) as its only item."""

    async def run(latencies: list[float]) -> None:
        started = time.perf_counter()
        rows = encode_events(events)
        latencies.append(time.perf_counter() - started)
        async with store.pool.acquire() as conn:
            await conn.copy_records_to_table("flow_events", schema_name=SCHEMA, columns=COLUMNS, records=rows)

    return run


async def measure_levels(
    store: PostgresStateStore, levels: Sequence[Level], repeats: int, warmup: int = 1
) -> None:
    """Interleaved repetitions of every series on a truncated table; rows counted after each."""
    for round_number in range(warmup + repeats):
        timed = round_number >= warmup
        for level in levels:
            for entry in level.series.values():
                await _truncate(store, "flow_events")
                gc.collect()
                latencies: list[float] = []
                started = time.perf_counter()
                await entry.run(latencies)
                elapsed = time.perf_counter() - started
                stored = await _count(store, "flow_events")
                if stored != entry.writes:
                    raise RuntimeError(
                        f"{entry.name} at {entry.writers} writers: "
                        f"{stored} rows in the table, {entry.writes} written"
                    )
                if timed:
                    entry.seconds.append(elapsed)
                    if entry.name == COPY:
                        entry.encode_seconds += latencies
                    else:
                        entry.latencies += latencies
            if timed:
                groups = save_calls(_nothing, writer_events(level.writers, level.writes, "idle"))
                started = time.perf_counter()
                await drive(groups, [])
                level.harness.append((time.perf_counter() - started) / level.writes)
        if round_number == warmup - 1:
            for level in levels:
                for entry in level.series.values():
                    entry.batch_baseline = entry.batch_totals()


# --- 2. spill rate --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _outage_guard(dsn: str, name: str) -> AsyncIterator[Any]:
    """A guard (defaults, spill file on) over a store of its own, its breaker forced open; closed
    (and its store with it) on exit."""
    store = await _connect(dsn, min_size=1, max_size=4)
    try:
        proxy = guard(store, name=name, registry=CollectorRegistry())
        async with proxy:
            controller(proxy).breaker.force_open()
            yield proxy
    finally:
        await store.close()


async def _spill_once(dsn: str, spill: Spill, rep: int, timed: bool) -> None:
    name = f"spill-{spill.callers}-{rep}"
    async with _outage_guard(dsn, name) as proxy:
        ctl = controller(proxy)
        buffer = ctl.dead_letters
        assert buffer is not None
        states = [(f"{name}-{index}", memory_state(index)) for index in range(spill.writes)]
        groups = split(
            [lambda key=key, state=state: proxy.save_memory_state(key, state) for key, state in states],
            spill.callers,
        )
        latencies: list[float] = []
        gc.collect()
        started = time.perf_counter()
        await drive(groups, latencies)
        elapsed = time.perf_counter() - started
        stats = await buffer.stats()
        memory_only = getattr(stats, "memory_only", 0)
        available = getattr(stats, "spill_available", None)
        if stats.depth != spill.writes or memory_only or available is False:
            raise RuntimeError(
                f"spill at {spill.callers} callers: {stats.depth} held of {spill.writes} written, "
                f"{memory_only} in memory only, spill file available: {available}"
            )
        await buffer.purge(pending=True, parked=True)
        if timed:
            spill.seconds.append(elapsed)
            spill.latencies += latencies


async def measure_spills(dsn: str, repeats: int, warmup: int = 1) -> list[Spill]:
    spills = [Spill(callers, SPILL_WRITES) for callers in SPILL_CALLERS]
    for round_number in range(warmup + repeats):
        for spill in spills:
            await _spill_once(dsn, spill, round_number, timed=round_number >= warmup)
    return spills


# --- 3. and 4. drains -----------------------------------------------------------------------------


async def _drain_upserts_once(dsn: str, drain: Drain, rep: int, *, blocked: bool) -> None:
    """Hold ``drain.held`` upserts with the breaker forced open, reset it, time the drain, count rows.

    ``blocked=False``: the kinds in turn as the callers write them (the held order interleaves
    them); ``True``: all memory states first, then the tasks, then the trajectories (long runs of
    one method in the held order).
    """
    name = f"drain-upserts-{'blocked' if blocked else 'mixed'}-{rep}"
    calls = mixed_upserts(drain.held, name)
    phases = [calls[kind::3] for kind in range(3)] if blocked else [calls]
    async with _outage_guard(dsn, name) as proxy:
        ctl = controller(proxy)
        buffer = ctl.dead_letters
        assert buffer is not None
        store: PostgresStateStore = ctl.store  # type: ignore[assignment]
        await _truncate(store, "memory_states", "task_states", "trajectories")
        # Collected before the outage, not between recovery and drain: a long pause there lets the
        # background replay wake first and take the buffer at its paced replay_rate.
        gc.collect()
        started = time.perf_counter()
        for phase in phases:
            await drive(split([lambda call=call: call(proxy) for call in phase], DRAIN_CALLERS))
        drain.fill_seconds.append(time.perf_counter() - started)
        if buffer.depth != drain.held:
            raise RuntimeError(f"{name}: {buffer.depth} upserts held, {drain.held} written")
        ctl.breaker.reset()
        started = time.perf_counter()
        remaining = await ctl.drain(timeout=DRAIN_TIMEOUT)
        drain.drain_seconds.append(time.perf_counter() - started)
        stored = [await _count(store, table) for table in ("memory_states", "task_states", "trajectories")]
        expected = [len(range(kind, drain.held, 3)) for kind in range(3)]
        if remaining or buffer.depth or stored != expected:
            raise RuntimeError(
                f"{name}: {remaining} upserts left after the drain; rows (memory, tasks, trajectories) "
                f"{stored}, expected {expected}"
            )


async def _drain_events_once(server: EmbeddedPostgres, drain: Drain, rep: int) -> None:
    name = f"drain-events-{rep}"
    store = await _connect(server.dsn, min_size=0, max_size=4, connect_timeout=2.0)
    try:
        proxy = guard(store, name=name, registry=CollectorRegistry())
        async with proxy:
            ctl = controller(proxy)
            buffer = ctl.dead_letters
            assert buffer is not None
            await _truncate(store, "flow_events")
            groups = writer_events(DRAIN_CALLERS, drain.held, name)
            calls = save_calls(proxy.save_event, groups)
            gc.collect()
            await asyncio.to_thread(server.stop)
            try:
                started = time.perf_counter()
                await drive(calls)
                drain.fill_seconds.append(time.perf_counter() - started)
                if buffer.depth != drain.held:
                    raise RuntimeError(f"{name}: {buffer.depth} events held, {drain.held} written")
                # Hold the breaker open so that the background replay cannot start while the server
                # comes back, before the timed drain.
                ctl.breaker.force_open()
            finally:
                await asyncio.to_thread(server.start)
            ctl.breaker.reset()
            started = time.perf_counter()
            remaining = await ctl.drain(timeout=DRAIN_TIMEOUT)
            drain.drain_seconds.append(time.perf_counter() - started)
            stored = await _count(store, "flow_events")
            if remaining or stored != drain.held:
                raise RuntimeError(
                    f"{name}: {remaining} events left after the drain, {stored} of {drain.held} rows"
                )
    finally:
        await store.close()


UPSERTS_MIXED = "upserts, kinds interleaved (as written)"
UPSERTS_BLOCKED = "upserts, kinds in blocks (reference)"
EVENTS_OUTAGE = "events, server stopped and restarted"


async def measure_drains(dsn: str, server: EmbeddedPostgres) -> list[Drain]:
    mixed = Drain(UPSERTS_MIXED, DRAIN_UPSERTS)
    blocked = Drain(UPSERTS_BLOCKED, DRAIN_UPSERTS)
    events = Drain(EVENTS_OUTAGE, DRAIN_EVENTS)
    for rep in range(DRAIN_REPEATS):
        await _drain_upserts_once(dsn, mixed, rep, blocked=False)
        await _drain_upserts_once(dsn, blocked, rep, blocked=True)
        await _drain_events_once(server, events, rep)
    return [mixed, blocked, events]


# --- verdicts and report --------------------------------------------------------------------------


def _encode_cost(levels: Sequence[Level]) -> float:
    """Seconds per event of ``encode_events`` in the COPY series (median of the largest level)."""
    level = max(levels, key=lambda level: level.writes)
    return statistics.median(level.series[COPY].encode_seconds) / level.writes


def _met(passed: bool) -> str:
    return "met" if passed else "not met"


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


def verdicts(levels: Sequence[Level], spills: Sequence[Spill], drains: Sequence[Drain]) -> list[Verdict]:
    found: list[Verdict] = []
    for level in levels:
        if level.writers >= VS_COPY_FROM_WRITERS:
            batched, copy = level.series[GROUP_COMMIT], level.series[COPY]
            share = batched.rate / copy.rate
            found.append(
                Verdict(
                    target=f"batched save_event >= {VS_COPY_TARGET:g}x COPY (store encoding) "
                    f"at {level.writers:,} writers",
                    passed=share >= VS_COPY_TARGET,
                    details=[f"{share:.2f}x ({batched.rate:,.0f} vs {copy.rate:,.0f} events/s)"],
                )
            )
    headline = next((level for level in levels if level.writers == HEADLINE_WRITERS), None)
    if headline is not None:
        batched, unbatched = headline.series[GROUP_COMMIT], headline.series[UNBATCHED]
        ratio = batched.rate / unbatched.rate
        found.append(
            Verdict(
                target=f"group commit >= {VS_UNBATCHED_TARGET:g}x unbatched at {HEADLINE_WRITERS} writers",
                passed=ratio >= VS_UNBATCHED_TARGET,
                details=[f"{ratio:.1f}x ({batched.rate:,.0f} vs {unbatched.rate:,.0f} events/s)"],
            )
        )
        p99 = percentile(batched.latencies, 0.99)
        found.append(
            Verdict(
                target=f"caller p99 (call to commit) <= {P99_TARGET_S * 1e3:g} ms "
                f"at {HEADLINE_WRITERS} writers",
                passed=p99 <= P99_TARGET_S,
                details=[f"p99 {p99 * 1e3:.2f} ms over {len(batched.latencies):,} calls"],
            )
        )
    for spill in spills:
        found.append(
            Verdict(
                target=f"held-upsert spill rate >= {SPILL_TARGET:,.0f}/s at {spill.callers:,} callers",
                passed=spill.rate >= SPILL_TARGET,
                details=[f"{spill.rate:,.0f} upserts/s"],
            )
        )
    for drain in drains:
        if drain.name == UPSERTS_MIXED:
            found.append(
                Verdict(
                    target=f"drain of {drain.held:,} held upserts >= {UPSERT_DRAIN_TARGET:,.0f}/s",
                    passed=drain.rate >= UPSERT_DRAIN_TARGET,
                    details=[f"{drain.rate:,.0f} upserts/s"],
                )
            )
    return found


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    widths = [max(len(line[i]) for line in (header, *lines)) for i in range(len(header))]

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [render(header), "  ".join("-" * width for width in widths), *(render(line) for line in lines)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def format_report(report: Report) -> str:
    """The tables, each figure with its target, and the notes."""
    lines = [f"== {TITLE} ==", ""]
    lines += [
        "1. save_event through guard(PostgresStateStore), N concurrent writers (one trace each); "
        "events/s, median (min..max)",
        "",
    ]
    throughput = []
    for level in report.levels:
        batched, unbatched, copy = (level.series[name] for name in (GROUP_COMMIT, UNBATCHED, COPY))
        low, high = batched.rates
        batches = batched.batches()
        ratio = batched.rate / unbatched.rate
        target = ""
        if level.writers == HEADLINE_WRITERS:
            target = f">= {VS_UNBATCHED_TARGET:g}x: {_met(ratio >= VS_UNBATCHED_TARGET)}"
        throughput.append(
            (
                f"{level.writers:,}",
                f"{level.writes:,}",
                f"{batched.rate:,.0f} ({low:,.0f}..{high:,.0f})",
                f"{unbatched.rate:,.0f}",
                f"{copy.rate:,.0f}",
                f"{ratio:.1f}x",
                target,
                f"{batched.rate / copy.rate:.2f}x",
                f">= {VS_COPY_TARGET:g}x: {_met(batched.rate / copy.rate >= VS_COPY_TARGET)}"
                if level.writers >= VS_COPY_FROM_WRITERS
                else "",
                "-" if batches is None else f"{batches[0]:.1f}",
                "-" if batches is None else _ms(batches[1]),
            )
        )
    lines += _table(
        (
            "writers",
            "writes/rep",
            "group commit",
            "unbatched",
            "COPY",
            "x unbatched",
            "target",
            "x COPY",
            "target",
            "avg batch",
            "avg flush ms",
        ),
        throughput,
    )
    lines += ["", "caller latency, call to commit (each awaited save_event), ms over every timed call", ""]
    latency = []
    for level in report.levels:
        batched, unbatched = level.series[GROUP_COMMIT], level.series[UNBATCHED]
        p99 = percentile(batched.latencies, 0.99)
        target = ""
        if level.writers == HEADLINE_WRITERS:
            target = f"p99 <= {P99_TARGET_S * 1e3:g} ms: {_met(p99 <= P99_TARGET_S)}"
        latency.append(
            (
                f"{level.writers:,}",
                f"{len(batched.latencies):,}",
                _ms(percentile(batched.latencies, 0.5)),
                _ms(p99),
                _ms(max(batched.latencies)),
                target,
                _ms(level.writers / batched.rate),
                _ms(percentile(unbatched.latencies, 0.5)),
                _ms(percentile(unbatched.latencies, 0.99)),
            )
        )
    lines += _table(
        (
            "writers",
            "calls",
            "group p50",
            "group p99",
            "group max",
            "target",
            "writers/rate",
            "unbatched p50",
            "unbatched p99",
        ),
        latency,
    )
    lines += ["", "2. held-upsert spill rate: breaker forced open, save_memory_state with distinct keys", ""]
    lines += _table(
        ("callers", "upserts/rep", "upserts/s (min..max)", "caller p50 ms", "caller p99 ms", "target"),
        [
            (
                f"{spill.callers:,}",
                f"{spill.writes:,}",
                f"{spill.rate:,.0f} ({spill.writes / max(spill.seconds):,.0f}.."
                f"{spill.writes / min(spill.seconds):,.0f})",
                _ms(percentile(spill.latencies, 0.5)),
                _ms(percentile(spill.latencies, 0.99)),
                f">= {SPILL_TARGET:,.0f}/s: {_met(spill.rate >= SPILL_TARGET)}",
            )
            for spill in report.spills
        ],
    )
    lines += [
        "",
        f"3./4. controller(store).drain(timeout={DRAIN_TIMEOUT:g}) after recovery, median of {DRAIN_REPEATS}",
        "",
    ]
    lines += _table(
        ("held writes", "count", "fill writes/s", "drain s", "drain writes/s (min..max)", "target"),
        [
            (
                drain.name,
                f"{drain.held:,}",
                f"{drain.fill_rate:,.0f}",
                f"{statistics.median(drain.drain_seconds):.2f}",
                f"{drain.rate:,.0f} ({drain.held / max(drain.drain_seconds):,.0f}.."
                f"{drain.held / min(drain.drain_seconds):,.0f})",
                f">= {UPSERT_DRAIN_TARGET:,.0f}/s: {_met(drain.rate >= UPSERT_DRAIN_TARGET)}"
                if drain.name == UPSERTS_MIXED
                else "",
            )
            for drain in report.drains
        ],
    )
    lines += [""]
    for verdict in report.verdicts:
        lines.append(f"{_met(verdict.passed):>7}  {verdict.target}: {'; '.join(verdict.details)}")
    if report.notes:
        lines.append("")
        lines += [textwrap.fill(note, width=110, subsequent_indent="  ") for note in report.notes]
    return "\n".join(lines)


# --- entry point ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _private_state_home() -> Iterator[Path]:
    """``XDG_STATE_HOME`` set to a fresh temporary directory (``GUARDED_DLQ_PATH`` unset) meanwhile."""
    directory = Path(tempfile.mkdtemp(prefix="guarded-bench-state-"))
    saved = {name: os.environ.get(name) for name in ("XDG_STATE_HOME", "GUARDED_DLQ_PATH")}
    os.environ["XDG_STATE_HOME"] = str(directory)
    os.environ.pop("GUARDED_DLQ_PATH", None)
    try:
        yield directory
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(directory, ignore_errors=True)


async def run(dsn: str, *, repeats: int = 7, server: EmbeddedPostgres | None = None) -> Report:
    """Measure everything against ``dsn`` (schema ``bench_durability`` is reset); the event drain
    stops and restarts ``server`` (an embedded server of its own when ``None``)."""
    started = time.perf_counter()
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    finally:
        await setup.close()
    timings: dict[str, float] = {}
    with _private_state_home():
        store = await _connect(dsn)
        closers: list[Callable[[], Awaitable[None]]] = []
        try:
            mark = time.perf_counter()
            levels = build_levels(store, closers)
            await measure_levels(store, levels, repeats)
            timings["group commit"] = time.perf_counter() - mark
        finally:
            for close in closers:  # each also closes the shared store, which allows that
                await close()
            await store.close()

        mark = time.perf_counter()
        spills = await measure_spills(dsn, repeats)
        timings["spill"] = time.perf_counter() - mark

        mark = time.perf_counter()
        own = server is None
        drain_server = server if server is not None else EmbeddedPostgres()
        try:
            if own:
                await asyncio.to_thread(drain_server.start)
                await (await asyncpg.connect(drain_server.dsn)).close()
            drains = await measure_drains(dsn, drain_server)
        finally:
            if own:
                await asyncio.to_thread(drain_server.destroy)
        timings["drains"] = time.perf_counter() - mark

    defaults = BatchConfig()
    pool = PoolSettings()
    one = next((level for level in levels if level.writers == 1), None)
    notes = [
        f"writes: every series at N writers writes the same 'writes/rep' events; {repeats} timed "
        "repetitions after one warm-up, interleaved; rows counted after each. Latency percentiles pool "
        "every timed call; 'writers/rate' is the mean latency Little's law implies (writers / "
        "throughput): no p50 can be far below it.",
        "group commit: GuardConfig() defaults (ack='commit', "
        f"max_batch={defaults.max_batch}, max_concurrent_flushes={defaults.max_concurrent_flushes}, "
        f"queue_size={defaults.queue_size:,}); unbatched: BatchConfig(enabled=False); store pool "
        f"max_size={pool.max_size}. COPY: encode_events (the store's own row encoding) + one "
        "copy_records_to_table, no callers. avg batch / avg flush ms: guarded_batch_size / "
        "guarded_batch_flush_duration_seconds.",
        "the writers alone (awaiting a no-op) cost "
        + ", ".join(
            f"{statistics.median(level.harness) * 1e6:.1f} µs/write at {level.writers:,}" for level in levels
        )
        + "; the store's row encoding (COPY series) "
        + f"{_encode_cost(levels) * 1e6:.1f} µs/event.",
    ]
    if one is not None and BARE in one.series:
        bare = one.series[BARE]
        notes.append(
            f"at 1 writer, for reference: the bare store's save_event (no guard) {bare.rate:,.0f} events/s, "
            f"p50 {_ms(percentile(bare.latencies, 0.5))} ms; the guard (group commit) "
            f"{one.series[GROUP_COMMIT].rate:,.0f} events/s, p50 "
            f"{_ms(percentile(one.series[GROUP_COMMIT].latencies, 0.5))} ms."
        )
    notes += [
        f"spill: {SPILL_WRITES:,} save_memory_state per repetition, {repeats} timed repetitions after "
        "one warm-up, interleaved over the caller counts, a fresh guard and spill file each; the "
        "buffer's depth is checked (and that nothing is held in memory only), then it is purged.",
        f"drains: {DRAIN_REPEATS} repetitions each, interleaved; {DRAIN_CALLERS} callers fill the buffer. "
        f"Upserts: {DRAIN_UPSERTS:,} held with the breaker forced open (memory states, tasks, "
        "trajectories in turn as written, or for reference kind by kind), breaker reset, drain timed, "
        "rows counted per table. Events: "
        f"{DRAIN_EVENTS:,} save_event with the server stopped, breaker forced open while it restarts, "
        "reset, drain timed, rows counted; on "
        + ("an embedded server of its own (--dsn)." if own else "the same embedded server.")
        + f" A drain near the default replay_rate ({DeadLetterConfig(path=None).replay_rate:g}/s) "
        "waited behind a background replay pass, which is paced at that rate.",
        "took "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
        + f"; {time.perf_counter() - started:.0f} s in all.",
    ]
    return Report(
        levels=levels,
        spills=spills,
        drains=drains,
        verdicts=verdicts(levels, spills, drains),
        notes=notes,
    )


__all__ = ["SECTION", "Report", "format_report", "run"]
