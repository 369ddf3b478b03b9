"""Group commit, dead-letter spill and drain of ``guard(PostgresStateStore)``, side by side in one run.

Every figure is about ``guard(store)``; the only writes that bypass the guard are the ``COPY``
references (and one clearly labelled bare-store reference at a single writer). Repetitions of the
series that are compared with each other are interleaved (repetition 1 of every series, then
repetition 2, ...) and medians are reported, so a busier stretch of a shared machine affects
every side of a ratio alike.

1. **Group commit** (the guard's default, ``BatchConfig(ack="commit")``): ``WRITERS``
   concurrent writers, one trace each, each awaiting its own ``save_event`` calls of small events
   in a loop. Per number of writers, on a freshly truncated table each time and with the same
   events:

   * ``group commit``: ``guard(store)`` with the default configuration. A call returns once the
     batch holding its event is committed, so the time of each awaited call is the caller's
     latency from call to commit (p50 / p99 over every timed repetition).
   * ``group commit, pipelined``: the same guard configuration and events, but each writer sends
     all its calls at once and awaits them together (every call still returns at commit): the
     batcher sees deep queues, so this is the guard's throughput when the event loop, not the
     round trip of a lone write, is the limit.
   * ``unbatched``: ``GuardConfig(batching=BatchConfig(enabled=False))``, the same writers and
     the same number of writes: every call waits for its own ``INSERT``.
   * ``COPY``: the same events encoded exactly as the store encodes them
     (:func:`~guarded.backends.postgres.event_log.encode_events`, the rows its bulk ``COPY`` path sends)
     and written with one ``copy_records_to_table``; no callers. Encoding is timed in.
   * ``write-behind``: ``BatchConfig(ack="enqueue")``, the opt-in that acknowledges a write when
     it is queued (docs/durability.md, "Write-behind"): the same writers and events, timed until
     :meth:`~guarded.controller.GuardController.flush` returns, so every event is written.
   * ``hand-written group commit``: the same writers, each awaiting its own event, through the
     group commit written by hand (:mod:`benchmarks.hand_group_commit`: a queue, the guard's
     default flush concurrency, a connection kept by each flush, the store's encoding, one
     ``COPY``; no guard). It shows how far returning at commit, before any guard, is from
     ``COPY`` and from unbatched writes.
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
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.event_log import encode_events
from guarded.config import BatchConfig, DeadLetterConfig, GuardConfig
from guarded.models import StoredEvent
from guarded.testing.postgres import EmbeddedPostgres

from . import durability_workload as sizes
from .durability_outage import measure_drains, measure_spills
from .durability_report import _encode_cost, _ms, format_report, verdicts
from .durability_workload import (
    BARE,
    COPY,
    DRAIN_CALLERS,
    GROUP_COMMIT,
    HAND,
    PIPELINED,
    SCHEMA,
    SECTION,
    UNBATCHED,
    WRITE_BEHIND,
    Level,
    Report,
    Series,
    _check_healthy,
    _connect,
    _count,
    _nothing,
    _truncate,
    configure_quick,
    configure_tiny,
    drive,
    drive_pipelined,
    percentile,
    save_calls,
    writer_events,
)
from .hand_group_commit import HandGroupCommit
from .postgres_bench import COLUMNS
from .workload import reset_schemas

# --- 1. group commit ------------------------------------------------------------------------------


def _guarded_run(
    store: PostgresStateStore,
    name: str,
    config: GuardConfig,
    registry: CollectorRegistry,
    groups: Sequence[Sequence[StoredEvent]],
    closers: list[Callable[[], Awaitable[None]]],
    driver: Callable[..., Awaitable[None]] = drive,
    *,
    until_flushed: bool = False,
) -> Callable[[list[float]], Awaitable[None]]:
    """A guard over ``store`` whose writers save ``groups`` (one by one, or with ``driver``); its
    ``aclose`` goes to ``closers``. With ``until_flushed`` (a guard acknowledging at enqueue) the
    run also waits until every write is flushed (timed in) and records no latencies (a call
    returns when its write is queued)."""
    proxy = guard(store, name=name, config=config, registry=registry)
    calls = save_calls(proxy.save_event, groups)
    control = controller(proxy)
    closers.append(control.aclose)

    async def run(latencies: list[float]) -> None:
        await driver(calls, None if until_flushed else latencies)
        if until_flushed:
            await control.flush()
        _check_healthy(name, proxy)

    return run


def _driven(calls: list[list[Any]]) -> Callable[[list[float]], Awaitable[None]]:
    return lambda latencies: drive(calls, latencies)


def _hand_run(
    hand: HandGroupCommit, groups: Sequence[Sequence[StoredEvent]]
) -> Callable[[list[float]], Awaitable[None]]:
    """The hand-written group commit's writers; its connections go back to the pool at the end
    (timed in), as the other series' guards share the pool."""
    calls = save_calls(hand.save_event, groups)

    async def run(latencies: list[float]) -> None:
        await drive(calls, latencies)
        await hand.release()

    return run


def build_levels(store: PostgresStateStore, closers: list[Callable[[], Awaitable[None]]]) -> list[Level]:
    """Every series at every number of writers, each guard with its own registry, all over ``store``."""
    levels = []
    unbatched = GuardConfig(batching=BatchConfig(enabled=False))
    for writers in sizes.WRITERS:
        total = sizes.WRITES.get(writers, 8000)
        groups = writer_events(writers, total, f"w{writers}")
        registry = CollectorRegistry()
        batched_run = _guarded_run(store, f"gc-{writers}", GuardConfig(), registry, groups, closers)
        pipelined_registry = CollectorRegistry()
        pipelined_run = _guarded_run(
            store, f"pipelined-{writers}", GuardConfig(), pipelined_registry, groups, closers, drive_pipelined
        )
        write_behind_registry = CollectorRegistry()
        unbatched_run = _guarded_run(
            store, f"unbatched-{writers}", unbatched, CollectorRegistry(), groups, closers
        )
        series = {
            GROUP_COMMIT: Series(GROUP_COMMIT, writers, total, batched_run, registry),
            PIPELINED: Series(PIPELINED, writers, total, pipelined_run, pipelined_registry),
            UNBATCHED: Series(UNBATCHED, writers, total, unbatched_run),
            COPY: Series(COPY, writers, total, _copy_run(store, [e for group in groups for e in group])),
            WRITE_BEHIND: Series(
                WRITE_BEHIND,
                writers,
                total,
                _guarded_run(
                    store,
                    f"write-behind-{writers}",
                    GuardConfig(batching=BatchConfig(ack="enqueue")),
                    write_behind_registry,
                    groups,
                    closers,
                    until_flushed=True,
                ),
                write_behind_registry,
            ),
            HAND: Series(
                HAND, writers, total, _hand_run(HandGroupCommit(store.pool, SCHEMA, COLUMNS), groups)
            ),
        }
        if writers == 1:
            series[BARE] = Series(BARE, writers, total, _driven(save_calls(store.save_event, groups)))
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
                started = time.perf_counter()
                await drive_pipelined(groups, [])
                level.pipelined_harness.append((time.perf_counter() - started) / level.writes)
        if round_number == warmup - 1:
            for level in levels:
                for entry in level.series.values():
                    entry.batch_baseline = entry.batch_totals()


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
    await reset_schemas(dsn, SCHEMA)
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
        "copy_records_to_table, no callers. hand-written: the same callers, each awaiting its own "
        "event, through a group commit written by hand (benchmarks/hand_group_commit.py: the guard's "
        f"default flush concurrency ({defaults.max_concurrent_flushes} at most, a further one at "
        f"{defaults.parallel_flush_at} waiting), a connection kept by each flush, the store's encoding, "
        "one COPY, no guard): what returning at commit costs before any guard; x hand = group commit / "
        "hand-written, hand x unbatched = hand-written / unbatched. avg batch / avg flush ms: "
        "guarded_batch_size / guarded_batch_flush_duration_seconds.",
        "the writers alone (awaiting a no-op) cost "
        + ", ".join(
            f"{statistics.median(level.harness) * 1e6:.1f} µs/write at {level.writers:,}" for level in levels
        )
        + " (pipelined: "
        + ", ".join(f"{statistics.median(level.pipelined_harness) * 1e6:.1f}" for level in levels)
        + ")"
        + "; the store's row encoding (COPY series) "
        + f"{_encode_cost(levels) * 1e6:.1f} µs/event.",
        "pipelined: every call of a repetition is in flight at once, and Python's cyclic garbage "
        "collector traverses each one's task, coroutine frames and future at every collection, so "
        "its cost per write grows with the calls in flight (python -m benchmarks.durability_profile "
        "--pipelined [--no-gc] shows the share).",
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
        f"spill: {sizes.SPILL_WRITES:,} save_memory_state per repetition, {repeats} timed repetitions after "
        "one warm-up, interleaved over the caller counts, a fresh guard and spill file each; the "
        "buffer's depth is checked (and that nothing is held in memory only), then it is purged.",
        f"drains: {sizes.DRAIN_REPEATS} repetitions each, interleaved; "
        f"{DRAIN_CALLERS} callers fill the buffer. "
        f"Upserts: {sizes.DRAIN_UPSERTS:,} held with the breaker forced open (memory states, tasks, "
        "trajectories in turn as written, or for reference kind by kind), breaker reset, drain timed, "
        "rows counted per table. Events: "
        f"{sizes.DRAIN_EVENTS:,} save_event with the server stopped, breaker forced open while it restarts, "
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


__all__ = ["SECTION", "Report", "configure_quick", "configure_tiny", "format_report", "run"]
