"""The ``workers`` section: 1, 2 and 4 worker processes writing and reading through
``guard(PostgresStateStore)`` against one server, directly (and through any further target given,
such as a connection pooler).

Each worker is a process of its own (``python -m benchmarks.workers_bench worker ...``) with its own
guard, store and pool, as a pod of an agent deployment has. It runs :data:`WRITERS` writers, each
on a trace of its own, each awaiting its own ``save_event`` (returned at commit: the guard's group
commit), and after every :data:`READ_EVERY` writes a ``load_history`` of its trace (a read that must
see its writes). Workers start together at an agreed wall-clock time and run for :data:`SECONDS`.

Per worker count and target: events per second (all workers together, over the span from the first
start to the last end), p50 and p99 from call to commit over every write of every worker, the
``load_history`` p50, and the most server connections seen (``pg_stat_activity``, sampled every
20 ms: client backends of the database, the sampler's own excluded). Scaling is the rate at N
workers over the rate at 1. The rows written are counted after each run and must match the writes
acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from .workload import reset_schemas

SECTION = "workers"
SCHEMA = "bench_workers"
WORKER_COUNTS = (1, 2, 4)
WRITERS = 25
"""Concurrent writers per worker process."""
READ_EVERY = 20
"""A writer reads its trace's history after this many writes."""
SECONDS = 4.0
"""How long each worker writes, per run."""
POOL_SIZE = 10
"""Each worker's pool ``max_size`` (the store's default)."""


@dataclass
class WorkerResult:
    """What one worker process measured (its JSON line)."""

    started: float
    ended: float
    writes: int
    reads: int
    write_ms: list[float]
    read_ms: list[float]
    dead_lettered: int


@dataclass
class Row:
    """One (target, worker count) run."""

    target: str
    workers: int
    events_per_second: float
    write_p50_ms: float
    write_p99_ms: float
    read_p50_ms: float
    server_connections: int
    writes: int
    stored: int
    notes: list[str] = field(default_factory=list)


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _worker(
    dsn: str, index: int, start_at: float, seconds: float, store_options: Mapping[str, Any]
) -> None:
    from prometheus_client import CollectorRegistry

    from guarded import controller, guard
    from guarded.backends.postgres import PostgresStateStore
    from guarded.models import StoredEvent

    store = await PostgresStateStore.connect(
        dsn,
        schema=SCHEMA,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool={"max_size": POOL_SIZE, "application_name": "bench-workers"},
        **store_options,
    )
    proxy = guard(store, name=f"worker{index}", registry=CollectorRegistry())
    write_ms: list[float] = []
    read_ms: list[float] = []
    counts = [0, 0]
    clock = time.perf_counter
    await asyncio.sleep(max(0.0, start_at - time.time()))
    started = time.time()
    stop = clock() + seconds

    async def writer(number: int) -> None:
        trace = f"w{index}-t{number}"
        sequence = 0
        while clock() < stop:
            event = StoredEvent(trace, float(sequence), "node", "n", None, {"i": sequence, "who": trace})
            began = clock()
            await proxy.save_event(event)
            write_ms.append((clock() - began) * 1000)
            sequence += 1
            counts[0] += 1
            if sequence % READ_EVERY == 0:
                began = clock()
                history = await proxy.load_history(trace)
                read_ms.append((clock() - began) * 1000)
                counts[1] += 1
                if len(history) != sequence:
                    raise RuntimeError(f"{trace}: read {len(history)} events after {sequence} writes")

    await asyncio.gather(*(writer(number) for number in range(WRITERS)))
    ended = time.time()
    buffer = controller(proxy).dead_letters
    held = 0 if buffer is None else buffer.depth
    await controller(proxy).aclose()
    await store.close()
    print(
        json.dumps(
            {
                "started": started,
                "ended": ended,
                "writes": counts[0],
                "reads": counts[1],
                "write_ms": write_ms,
                "read_ms": read_ms,
                "dead_lettered": held,
            }
        ),
        flush=True,
    )


async def _sample_connections(dsn: str, until: asyncio.Event) -> int:
    """The most client backends of the database seen until ``until`` is set."""
    conn = await asyncpg.connect(dsn)
    most = 0
    try:
        while not until.is_set():
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            most = max(most, int(count))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), timeout=0.02)
    finally:
        await conn.close()
    return most


async def _prepare(dsn: str) -> None:
    from guarded.backends.postgres import PostgresStateStore

    await reset_schemas(dsn, SCHEMA)
    store = await PostgresStateStore.connect(dsn, schema=SCHEMA, stats_interval=None, metrics=False)
    await store.close()


async def run_one(
    server_dsn: str,
    target: str,
    target_dsn: str,
    workers: int,
    *,
    seconds: float,
    store_options: Mapping[str, Any],
) -> Row:
    """``workers`` processes writing through ``target_dsn`` for ``seconds``; connections counted on
    ``server_dsn`` (the server itself, not the pooler)."""
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f"TRUNCATE {SCHEMA}.flow_events")
    finally:
        await conn.close()
    start_at = time.time() + 1.5 + 0.3 * workers  # every process imported and connected by then
    options = json.dumps(dict(store_options))
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.workers_bench",
            "worker",
            target_dsn,
            str(index),
            repr(start_at),
            repr(seconds),
            options,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for index in range(workers)
    ]
    done = asyncio.Event()
    sampler = asyncio.create_task(_sample_connections(server_dsn, done))
    outputs = [await process.communicate() for process in processes]
    done.set()
    connections = await sampler
    results: list[WorkerResult] = []
    for process, (out, _) in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"a worker exited with {process.returncode}")
        results.append(WorkerResult(**json.loads(out.decode().strip().splitlines()[-1])))
    conn = await asyncpg.connect(server_dsn)
    try:
        stored = int(await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.flow_events"))
    finally:
        await conn.close()
    writes = sum(result.writes for result in results)
    span = max(result.ended for result in results) - min(result.started for result in results)
    write_ms = [value for result in results for value in result.write_ms]
    read_ms = [value for result in results for value in result.read_ms]
    row = Row(
        target=target,
        workers=workers,
        events_per_second=writes / span,
        write_p50_ms=_percentile(write_ms, 0.5),
        write_p99_ms=_percentile(write_ms, 0.99),
        read_p50_ms=_percentile(read_ms, 0.5),
        server_connections=connections,
        writes=writes,
        stored=stored,
    )
    held = sum(result.dead_lettered for result in results)
    if held:
        row.notes.append(f"{held} writes held by the guard")
    if stored != writes:
        row.notes.append(f"{stored} rows stored for {writes} writes acknowledged")
    return row


async def run(
    server_dsn: str,
    *,
    targets: Mapping[str, tuple[str, Mapping[str, Any]]] | None = None,
    worker_counts: Sequence[int] = WORKER_COUNTS,
    seconds: float = SECONDS,
    repeats: int = 1,
) -> list[Row]:
    """Every worker count through every target (``name -> (dsn, store options)``; default: the
    server directly), interleaved, ``repeats`` times; per (target, count) the run of median rate."""
    targets = targets or {"direct": (server_dsn, {})}
    await _prepare(server_dsn)
    runs: dict[tuple[str, int], list[Row]] = {}
    for _ in range(repeats):
        for workers in worker_counts:
            for name, (dsn, options) in targets.items():
                row = await run_one(server_dsn, name, dsn, workers, seconds=seconds, store_options=options)
                runs.setdefault((name, workers), []).append(row)
    chosen = []
    for rows in runs.values():
        rows.sort(key=lambda row: row.events_per_second)
        chosen.append(rows[len(rows) // 2])
    return chosen


def format_report(rows: Sequence[Row], *, seconds: float = SECONDS) -> str:
    """The section's table, with the scaling of each target against its one-worker row."""
    ones = {row.target: row.events_per_second for row in rows if row.workers == 1}
    header = (
        f"{'target':<10} {'workers':>7} {'events/s':>9} {'x 1 worker':>10} {'write p50 ms':>12} "
        f"{'write p99 ms':>12} {'read p50 ms':>11} {'server conns':>12}  notes"
    )
    lines = [
        f"== workers: {WRITERS} writers per worker process, each awaiting its save_event (commit), "
        f"a load_history every {READ_EVERY} writes, {seconds:g} s ==",
        "",
        header,
        "-" * len(header),
    ]
    for row in sorted(rows, key=lambda row: (row.target, row.workers)):
        one = ones.get(row.target)
        scale = f"{row.events_per_second / one:.2f}x" if one else ""
        lines.append(
            f"{row.target:<10} {row.workers:>7} {row.events_per_second:>9,.0f} {scale:>10} "
            f"{row.write_p50_ms:>12.2f} {row.write_p99_ms:>12.2f} {row.read_p50_ms:>11.2f} "
            f"{row.server_connections:>12}  {'; '.join(row.notes)}"
        )
    cpus = os.cpu_count() or 1
    lines += [
        "",
        f"each worker: its own process, guard (GuardConfig() defaults) and pool (max_size={POOL_SIZE}); "
        f"the server shares this machine's {cpus} CPUs with the workers. events/s: every worker's writes "
        "over the span from the first start to the last end; server conns: the most client backends of "
        "the database seen.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "worker":
        dsn, index, start_at, seconds, options = args[1:6]
        asyncio.run(_worker(dsn, int(index), float(start_at), float(seconds), json.loads(options)))
        return 0
    from guarded.testing.postgres import embedded_postgres

    with embedded_postgres() as server:
        rows = asyncio.run(run(server.dsn))
    print(format_report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
