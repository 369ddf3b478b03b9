"""Durability bench, parts 2 to 4: held-upsert spill rate and drains after an outage (see
:mod:`benchmarks.durability_bench`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PostgresStateStore
from guarded.testing.postgres import EmbeddedPostgres

from . import durability_workload as sizes
from .durability_workload import (
    DRAIN_CALLERS,
    DRAIN_TIMEOUT,
    Drain,
    Spill,
    _connect,
    _count,
    _truncate,
    drive,
    memory_state,
    mixed_upserts,
    save_calls,
    split,
    writer_events,
)

# --- 2. spill rate --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _outage_guard(dsn: str, name: str) -> AsyncIterator[Any]:
    """A guard (defaults, spill file on, in a temporary directory rather than the user's state
    directory) over a store of its own, its breaker forced open; closed (and its store with it)
    on exit."""
    store = await _connect(dsn, min_size=1, max_size=4)
    try:
        with tempfile.TemporaryDirectory(prefix="guarded-bench-") as directory:
            spill_path = str(Path(directory) / f"{name}.sqlite")
            proxy = guard(store, name=name, registry=CollectorRegistry(), spill_path=spill_path)
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
    spills = [Spill(callers, sizes.SPILL_WRITES) for callers in sizes.SPILL_CALLERS]
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
    directory = tempfile.TemporaryDirectory(prefix="guarded-bench-")
    try:
        spill_path = str(Path(directory.name) / f"{name}.sqlite")
        proxy = guard(store, name=name, registry=CollectorRegistry(), spill_path=spill_path)
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
        directory.cleanup()


UPSERTS_MIXED = "upserts, kinds interleaved (as written)"
UPSERTS_BLOCKED = "upserts, kinds in blocks (reference)"
EVENTS_OUTAGE = "events, server stopped and restarted"


async def measure_drains(dsn: str, server: EmbeddedPostgres) -> list[Drain]:
    mixed = Drain(UPSERTS_MIXED, sizes.DRAIN_UPSERTS)
    blocked = Drain(UPSERTS_BLOCKED, sizes.DRAIN_UPSERTS)
    events = Drain(EVENTS_OUTAGE, sizes.DRAIN_EVENTS)
    for rep in range(sizes.DRAIN_REPEATS):
        await _drain_upserts_once(dsn, mixed, rep, blocked=False)
        await _drain_upserts_once(dsn, blocked, rep, blocked=True)
        await _drain_events_once(server, events, rep)
    return [mixed, blocked, events]
