"""``python -m benchmarks.durability_profile [--writers N] [--writes N] [--pipelined] [--no-gc] [--dsn DSN]``:
where the event loop's CPU goes per ``save_event`` of ``guard(PostgresStateStore)`` under group
commit.

Runs the durability bench's group-commit workload (:mod:`benchmarks.durability_workload`: ``N``
writers, one trace each, each awaiting its own calls, or all calls in flight at once with
``--pipelined``) once unprofiled as a warm-up, then once under ``cProfile``, and prints the own
time per source file and the functions with the most own time, per write. The table is truncated
between runs. Profiling inflates every Python call alike, so read shares, not microseconds.
Without ``--dsn`` an embedded PostgreSQL server is started and removed afterwards.

``--no-gc`` turns Python's cyclic garbage collector off for the runs: the difference is what the
collector costs, which grows with the calls in flight (thousands of pipelined calls keep their
tasks, coroutine frames and futures alive through every collection).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.config import BatchConfig, GuardConfig
from guarded.observability import telemetry_names as names

from .durability_workload import (
    SCHEMA,
    _connect,
    _count,
    _truncate,
    drive,
    drive_pipelined,
    save_calls,
    writer_events,
)
from .guard_profile import report
from .workload import reset_schemas


async def profile(
    dsn: str, writers: int, writes: int, pipelined: bool, config: GuardConfig | None = None
) -> tuple[pstats.Stats, tuple[float, float, float]]:
    """Profile one run of ``writes`` events by ``writers`` writers; the stats and the unprofiled
    warm-up's events per second and this process's CPU seconds per write and writes per flush."""
    await reset_schemas(dsn, SCHEMA)
    store = await _connect(dsn)
    registry = CollectorRegistry()
    proxy = guard(store, name="profile", config=config or GuardConfig(), registry=registry)
    driver = drive_pipelined if pipelined else drive
    try:
        await _truncate(store, "flow_events")
        calls = save_calls(proxy.save_event, writer_events(writers, writes, "warm"))
        started, cpu = time.perf_counter(), time.process_time()
        await driver(calls, [])
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        flushes = registry.get_sample_value(
            names.BATCH_SIZE + "_count", {names.LABEL_STORE: "profile", names.LABEL_METHOD: "save_event"}
        )
        await _truncate(store, "flow_events")
        calls = save_calls(proxy.save_event, writer_events(writers, writes, "prof"))
        profiler = cProfile.Profile()
        profiler.enable()
        await driver(calls, [])
        profiler.disable()
        stored = await _count(store, "flow_events")
        if stored != writes:
            raise RuntimeError(f"{stored} rows stored, {writes} written")
    finally:
        await controller(proxy).aclose()
        await store.close()
    return pstats.Stats(profiler), (writes / wall, cpu / writes, writes / (flushes or 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.durability_profile", description=__doc__)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--writes", type=int, default=4000)
    parser.add_argument("--pipelined", action="store_true")
    parser.add_argument("--no-gc", action="store_true", help="cyclic garbage collector off")
    parser.add_argument("--dsn")
    parser.add_argument("--flushes", type=int, help="max_concurrent_flushes (default: the default)")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    config = GuardConfig(batching=BatchConfig(max_concurrent_flushes=args.flushes)) if args.flushes else None
    if args.no_gc:
        gc.disable()
    if args.dsn:
        stats, rate = asyncio.run(profile(args.dsn, args.writers, args.writes, args.pipelined, config))
    else:
        from guarded.testing.postgres import embedded_postgres

        with embedded_postgres() as server:
            stats, rate = asyncio.run(profile(server.dsn, args.writers, args.writes, args.pipelined, config))
    how = "pipelined" if args.pipelined else "each awaiting its write"
    print(f"guard(PostgresStateStore).save_event, {args.writers} writers ({how}), {args.writes:,} writes")
    print(
        f"unprofiled warm-up: {rate[0]:,.0f} events/s, {rate[1] * 1e6:.1f} µs of this process's CPU "
        f"per write, {rate[2]:.1f} writes per flush\n"
    )
    print(report(stats, args.writes, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
