"""``python -m benchmarks [--quick] [--dsn DSN] [--section NAME] [--repeats N]``: run the benchmark sections.

Sections run in order:

* ``guard``: the guard's added cost per call on every protocol method over an in-memory null
  backend, beside a lean hand-written stack and a tenacity one, and a fail-fast read with the
  breaker open (no PostgreSQL).
* ``protocol``: every protocol method of ``guard(PostgresStateStore)`` and of the bare store
  against raw asyncpg running the same SQL.
* ``pooling``: the cost of transaction pooling per call: ``guard(PostgresStateStore)`` with
  ``pooler="transaction"`` against the default mode on a direct connection, and through a real
  PgBouncer in transaction mode (target: at most 1.15x).
* ``postgres``: bulk insert against ``COPY`` of rows built with the store's own encoding,
  ``load_history`` of 10,000 events, planner pauses; bare store and guard.
* ``durability``: group commit of ``guard(store)`` at 1 to 1,000 writers against unbatched writes
  and ``COPY`` (store encoding), caller latency from call to commit, the dead-letter spill rate
  of held upserts and the drain of held upserts and events after an outage.
* ``snapshots``: capture (into the file and the PostgreSQL snapshot stores) and restore of a
  session of 100,000 events and 100 MB of artifacts from and into ``PostgresStateStore``, time and
  peak RSS, each in a process of its own (target: peak RSS under 200 MB; ``--quick``: 20,000
  events and 20 MB).
* ``history``: ``load_history`` p50/p99 of one trace while ``flow_events`` grows to 10,000,
  1,000,000 and 10,000,000 events (``--quick``: 10,000 to 1,000,000).
* ``retention``: one day of 30 expired by ``cleanup()``: dropping its partition against the
  batched ``DELETE`` (and ``VACUUM``) of an unpartitioned table, time and space returned.
* ``redis``: ``guard(RedisStateStore)`` per call against raw redis-py running the same commands
  (same Lua scripts, same pipelines; target: at most 1.15x), and a pause saved then resumed through
  ``guard(RedisStateStore)`` against ``guard(PostgresStateStore)`` (p50/p99), on a ``redis-server``
  started for it (``make tools`` installs it) and the embedded PostgreSQL (or ``--dsn``).
* ``workers``: 1, 2 and 4 worker processes writing and reading through ``guard(PostgresStateStore)``
  against one server: events per second, scaling, p50/p99 from call to commit, server connections;
  directly and through PgBouncer in transaction mode.

PgBouncer (``guarded.testing.pgbouncer``; ``make tools`` installs it) runs in front of the embedded
server for the ``pooling`` and ``workers`` sections; without it, or with ``--dsn``, their PgBouncer
rows are left out (and the report says so).

Without ``--dsn`` an embedded PostgreSQL server (``guarded.testing.postgres``) is started for the
PostgreSQL sections and removed afterwards; the durability section stops and restarts it (with
``--dsn`` it starts one of its own for that). Every figure is printed with its target beside it.
``--quick``: fewer repetitions and smaller workloads, for a fast pass. Exit status 1 when a target
is missed (only with ``--strict``). Where a guarded call's time goes: ``python -m
benchmarks.guard_profile --method NAME``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import (
    durability_bench,
    guard_bench,
    history_bench,
    pooler_cost,
    postgres_bench,
    postgres_protocol,
    redis_bench,
    retention_bench,
    snapshot_bench,
    workers_bench,
)
from .guard_report import Verdict, format_section
from .side_by_side import format_table

if TYPE_CHECKING:
    from guarded.testing.postgres import EmbeddedPostgres

GUARD = "guard"
PROTOCOL = "protocol"
POOLING = pooler_cost.SECTION
POSTGRES = postgres_bench.SECTION
DURABILITY = durability_bench.SECTION
SNAPSHOTS = snapshot_bench.SECTION
HISTORY = history_bench.SECTION
RETENTION = retention_bench.SECTION
WORKERS = workers_bench.SECTION
REDIS = redis_bench.SECTION
SECTIONS = (GUARD, PROTOCOL, POOLING, POSTGRES, DURABILITY, SNAPSHOTS, HISTORY, RETENTION, WORKERS, REDIS)
POSTGRES_SECTIONS = (PROTOCOL, POOLING, POSTGRES, DURABILITY, SNAPSHOTS, HISTORY, RETENTION, WORKERS)
PGBOUNCER_POOL_SIZE = 15
"""PgBouncer's ``default_pool_size`` in front of the bench server: fewer server connections than the
4 workers' pools of 10 (40 client connections) would open directly."""


def _pgbouncer(stack: contextlib.ExitStack, server: EmbeddedPostgres | None) -> str | None:
    """Start PgBouncer in front of ``server`` (closed with ``stack``); its DSN, or ``None`` without
    an embedded server or a ``pgbouncer`` binary."""
    from guarded.testing.pgbouncer import PgBouncerError, pgbouncer

    if server is None:
        return None
    try:
        return stack.enter_context(pgbouncer(server, pool_size=PGBOUNCER_POOL_SIZE)).dsn
    except PgBouncerError as exc:
        _say(f"no PgBouncer rows: {str(exc).splitlines()[0]}")
        return None


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def run_postgres(
    sections: Sequence[str],
    dsn: str,
    *,
    repeats: int,
    quick: bool,
    tiny: bool = False,
    server: EmbeddedPostgres | None = None,
) -> tuple[list[str], bool, list[Verdict]]:
    """The PostgreSQL sections' printed tables, whether every target was met, and the verdicts on
    the targets."""
    with contextlib.ExitStack() as stack:
        bouncer = _pgbouncer(stack, server) if {POOLING, WORKERS} & set(sections) else None
        return await _run_postgres(
            sections, dsn, repeats=repeats, quick=quick, tiny=tiny, server=server, bouncer=bouncer
        )


async def _run_postgres(
    sections: Sequence[str],
    dsn: str,
    *,
    repeats: int,
    quick: bool,
    tiny: bool,
    server: EmbeddedPostgres | None,
    bouncer: str | None,
) -> tuple[list[str], bool, list[Verdict]]:
    printed: list[str] = []
    met = True
    issue: list[Verdict] = []
    if PROTOCOL in sections:
        _say(f"running {PROTOCOL} ...")
        rounds, per_round = (postgres_protocol.ROUNDS, postgres_protocol.CALLS_PER_ROUND)
        if quick:
            rounds, per_round = (1, 2) if tiny else (3, 5)
        _, text = await postgres_protocol.run(dsn, rounds=rounds, per_round=per_round)
        printed.append(text)
    if POOLING in sections:
        _say(f"running {POOLING} ...")
        rounds, per_round = (pooler_cost.ROUNDS, pooler_cost.CALLS_PER_ROUND)
        if quick:
            rounds, per_round = (1, 2) if tiny else (5, 10)
        pooling = await pooler_cost.run(dsn, pgbouncer_dsn=bouncer, rounds=rounds, per_round=per_round)
        printed.append(pooling.text)
        met &= pooling.verdict.passed
        issue.append(pooling.verdict)
    if POSTGRES in sections:
        _say(f"running {POSTGRES} ...")
        rows = await postgres_bench.run(
            dsn, repeats=repeats, events=200 if tiny else 2_000 if quick else 10_000
        )
        printed.append(
            f"== postgres: bulk, history and pauses, median of {repeats} runs ==\n\n" + format_table(rows)
        )
        met &= all(row.met is not False for row in rows)
    if DURABILITY in sections:
        _say(f"running {DURABILITY} ...")
        if tiny:
            durability_bench.configure_tiny()
        elif quick:
            durability_bench.configure_quick()
        report = await durability_bench.run(dsn, repeats=repeats, server=server)
        printed.append(durability_bench.format_report(report))
        met &= all(verdict.passed for verdict in report.verdicts)
        issue += [verdict for verdict in report.verdicts if "COPY" in verdict.target]
    if SNAPSHOTS in sections:
        _say(f"running {SNAPSHOTS} ...")
        events, artifact_bytes = (
            snapshot_bench.TINY if tiny else snapshot_bench.QUICK if quick else snapshot_bench.FULL
        )
        snapshots = await snapshot_bench.run(dsn, events=events, artifact_bytes=artifact_bytes)
        printed.append(snapshot_bench.format_report(snapshots))
        met &= snapshots.met
    if HISTORY in sections:
        _say(f"running {HISTORY} ...")
        sizes = (1_000, 5_000) if tiny else (10_000, 100_000, 1_000_000) if quick else history_bench.SIZES
        history = [
            row
            for layout, options in history_bench.LAYOUTS.items()
            for row in await history_bench.run(
                dsn,
                sizes=sizes,
                reads=20 if tiny else history_bench.READS,
                layout=layout,
                store_options=options,
            )
        ]
        printed.append(history_bench.format_report(history))
        met &= all(passed for _, passed in history_bench.verdicts(history)) or tiny
    if RETENTION in sections:
        _say(f"running {RETENTION} ...")
        per_day = 1_000 if tiny else 20_000 if quick else retention_bench.EVENTS_PER_DAY
        retention = await retention_bench.run(dsn, per_day=per_day)
        printed.append(retention_bench.format_report(retention))
        met &= retention_bench.speedup(retention) >= retention_bench.TARGET_SPEEDUP or quick
    if WORKERS in sections:
        _say(f"running {WORKERS} ...")
        seconds = 0.5 if tiny else 2.0 if quick else workers_bench.SECONDS
        counts = (1, 2) if tiny else workers_bench.WORKER_COUNTS
        workers = await workers_bench.run(
            dsn, worker_counts=counts, seconds=seconds, repeats=1 if quick else 3
        )
        if bouncer is not None:  # one run per count through PgBouncer: the bench's time budget
            workers += await workers_bench.run(
                dsn,
                targets={"pgbouncer": (bouncer, {"pooler": "transaction"})},
                worker_counts=counts,
                seconds=seconds,
            )
        printed.append(workers_bench.format_report(workers, seconds=seconds))
        if bouncer is not None:
            printed[-1] += (
                f"\npgbouncer: PgBouncer {PGBOUNCER_POOL_SIZE} server connections (default_pool_size) in "
                'transaction mode, workers connected with pooler="transaction"; one run per worker count.'
            )
        met &= all(not row.notes for row in workers)
    return printed, met, issue


def _run_redis(dsn: str | None, *, quick: bool, tiny: bool) -> tuple[bool, list[Verdict]]:
    """Run the Redis section (its pause comparison on ``dsn``, else on an embedded server of its own)
    and print it; whether its target was met, and its verdict."""
    _say(f"running {REDIS} ...")
    rounds, per_round, pairs = redis_bench.ROUNDS, redis_bench.CALLS_PER_ROUND, redis_bench.PAIRS
    if quick:
        rounds, per_round, pairs = (1, 2, 10) if tiny else (5, 10, 100)
    result = redis_bench.run_with_servers(
        dsn=dsn, rounds=rounds, per_round=per_round, pairs=pairs, embedded_postgres=True
    )
    if isinstance(result, str):
        print(result, end="\n\n", flush=True)
        return True, []
    print(result.text, end="\n\n", flush=True)
    return result.verdict.passed, [result.verdict]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL to use (default: start an embedded server)")
    parser.add_argument("--section", action="append", choices=SECTIONS, help="run only these (repeatable)")
    parser.add_argument(
        "--repeats", type=int, help="timed runs per PostgreSQL benchmark (default 7, quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller workloads")
    parser.add_argument(
        "--detail", action="store_true", help="guard section: every series (median, min..max, calls) too"
    )
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the smoke test's sizes
    parser.add_argument(
        "--durable", action="store_true", help="embedded server with fsync/synchronous_commit on"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a figure misses its target")
    args = parser.parse_args(argv)
    args.quick |= args.tiny
    sections = args.section or list(SECTIONS)
    repeats = args.repeats or (1 if args.tiny else 3 if args.quick else 7)
    started = time.perf_counter()
    print(
        f"guarded benchmarks ({'quick' if args.quick else 'full'}): Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.platform(terse=True)}",
        end="\n\n",
        flush=True,
    )
    met = True
    issue: list[Verdict] = []
    if GUARD in sections:
        _say(f"running {GUARD} ...")
        if args.tiny:
            result = asyncio.run(guard_bench.run(repetitions=1, budget=0.0005, most=100))
        elif args.quick:
            result = asyncio.run(guard_bench.run(repetitions=3, budget=0.005, most=2_000))
        else:
            result = asyncio.run(guard_bench.run())
        print(format_section(result, detail=args.detail), end="\n\n", flush=True)
        met &= all(verdict.passed for verdict in result.verdicts)
        issue += result.verdicts
    wanted = [section for section in POSTGRES_SECTIONS if section in sections]
    redis_dsn = args.dsn
    if wanted:
        if args.dsn:
            printed, pg_met, pg_issue = asyncio.run(
                run_postgres(wanted, args.dsn, repeats=repeats, quick=args.quick, tiny=args.tiny)
            )
            where = "given server"
        else:
            from guarded.testing.postgres import embedded_postgres

            with embedded_postgres(durable=args.durable) as server:
                printed, pg_met, pg_issue = asyncio.run(
                    run_postgres(
                        wanted, server.dsn, repeats=repeats, quick=args.quick, tiny=args.tiny, server=server
                    )
                )
                if REDIS in sections:  # the pause comparison on this server: no second start
                    redis_met, redis_issue = _run_redis(server.dsn, quick=args.quick, tiny=args.tiny)
                    met &= redis_met
                    issue += redis_issue
                    sections = [section for section in sections if section != REDIS]
            where = "embedded server, " + ("durable" if args.durable else "fsync=off synchronous_commit=off")
        print(f"PostgreSQL: {where}", end="\n\n")
        print("\n\n".join(printed), flush=True)
        met &= pg_met
        issue += pg_issue
    if REDIS in sections:
        redis_met, redis_issue = _run_redis(redis_dsn, quick=args.quick, tiny=args.tiny)
        met &= redis_met
        issue += redis_issue
    if issue:
        print("\n== targets, this run (medians) ==\n")
        for verdict in issue:
            print(
                f"{'met' if verdict.passed else 'NOT MET':>7}  {verdict.target}: {'; '.join(verdict.details)}"
            )
    print(f"\nbench took {time.perf_counter() - started:.0f} s")
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
