"""The cost of transaction pooling per call: ``guard(PostgresStateStore)`` with ``pooler="transaction"``
against the default (session) mode.

Per method of :data:`METHODS` (arguments from :func:`~benchmarks.workload.calls`, rows the reads look
up written first), three series of ``guard(store)`` (default configuration) on one schema of one
server, timed in interleaved rounds by :func:`benchmarks.postgres_protocol.time_rounds`:

* ``direct``: the default mode on a direct connection (the baseline);
* ``pooler=transaction``: the same server, directly, with ``pooler="transaction"``: what the
  transaction-pooling mode itself costs (no named prepared statements, ``BEGIN; SET LOCAL
  statement_timeout`` in each operation's transaction, no reset on release);
* ``no timeout``: the same with ``statement_timeout=None`` (the operations need no transaction of
  their own: two round trips fewer; set the timeout on the role instead);
* ``PgBouncer``: ``pooler="transaction"`` through a real PgBouncer in transaction mode in front of
  the same server (when one is given): the mode plus the pooler's own hop, which shares the
  machine's CPUs with the server and the client.

Target: ``pooler=transaction`` at most :data:`TARGET` x ``direct`` on every method (median over the
rounds of the mean time per call). The PgBouncer column is reported beside it, without a target:
the hop is PgBouncer's, not the store's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore

from .guard_report import Verdict, render_table
from .method_samples import MethodSamples
from .postgres_protocol import AsyncCall, Interleaved, time_rounds
from .workload import MethodCall, calls, reset_schemas, seeds

SECTION = "pooling"
SCHEMA = "bench_pooling"
METHODS = ("save_event", "save_memory_state", "load_memory_state", "load_history", "save_task", "list_tasks")
TARGET = 1.15
ROUNDS = 20
CALLS_PER_ROUND = 20
DIRECT, POOLER, NO_TIMEOUT, PGBOUNCER = "direct", "pooler=transaction", "no timeout", "PgBouncer"
SERIES = (DIRECT, POOLER, NO_TIMEOUT, PGBOUNCER)
TARGET_TEXT = f'guard(PostgresStateStore) pooler="transaction" <= {TARGET}x the default mode per call'


@dataclass
class PoolingRow(MethodSamples):
    reference = DIRECT


@dataclass
class PoolingReport:
    rows: list[PoolingRow]
    verdict: Verdict
    text: str


def _bound(target: Any, arguments: MethodCall) -> AsyncCall:
    function = getattr(target, arguments.method)
    return lambda: function(*arguments.args, **arguments.kwargs)


def verdict(rows: Sequence[PoolingRow]) -> Verdict:
    ratios = {row.method: row.ratio(POOLER) for row in rows}
    worst = max(ratios, key=lambda method: ratios[method] or 0.0)
    return Verdict(
        TARGET_TEXT,
        all(ratio is not None and ratio <= TARGET for ratio in ratios.values()),
        [
            f"worst {worst} {ratios[worst]:.2f}x",
            *(f"{method} {ratio:.2f}x" for method, ratio in ratios.items()),
        ],
    )


def format_report(rows: Sequence[PoolingRow], result: Verdict, *, rounds: int, per_round: int) -> str:
    header = (
        "method",
        "direct µs",
        "pooler=transaction µs",
        "x direct",
        "same, statement_timeout=None µs",
        "x direct",
        "through PgBouncer µs",
        "x direct",
    )
    body = []
    for row in rows:
        cells = [row.method]
        for series in SERIES:
            value = row.median_us(series)
            cells.append("-" if value is None else f"{value:.0f}")
            if series != DIRECT:
                ratio = row.ratio(series)
                cells.append("-" if ratio is None else f"{ratio:.2f}")
        body.append(tuple(cells))
    lines = [
        "== cost of transaction pooling per call: guard(PostgresStateStore), default mode against "
        'pooler="transaction", directly and through PgBouncer ==',
        "",
        *render_table(header, body, left=1),
        "",
        f"{'met' if result.passed else 'NOT MET'}: {TARGET_TEXT} ({result.details[0]}); "
        "statement_timeout=None and the PgBouncer column (PgBouncer's own hop added, on the same "
        "machine) are beside it, without a target. Median over "
        f"{rounds} interleaved rounds of {per_round} calls per series",
    ]
    return "\n".join(lines)


async def run(
    dsn: str,
    *,
    pgbouncer_dsn: str | None = None,
    rounds: int = ROUNDS,
    per_round: int = CALLS_PER_ROUND,
    methods: Sequence[str] = METHODS,
) -> PoolingReport:
    """Measure ``methods`` against ``dsn`` (and through ``pgbouncer_dsn``, a PgBouncer in
    transaction mode in front of the same server, when given); schema ``bench_pooling`` is reset."""
    started = time.perf_counter()
    await reset_schemas(dsn, SCHEMA)
    targets: Mapping[str, tuple[str, PoolSettings]] = {
        DIRECT: (dsn, PoolSettings(min_size=2, max_size=2)),
        POOLER: (dsn, PoolSettings(min_size=2, max_size=2, pooler="transaction")),
        NO_TIMEOUT: (dsn, PoolSettings(min_size=2, max_size=2, pooler="transaction", statement_timeout=None)),
        **(
            {PGBOUNCER: (pgbouncer_dsn, PoolSettings(min_size=2, max_size=2, pooler="transaction"))}
            if pgbouncer_dsn
            else {}
        ),
    }
    stores: dict[str, PostgresStateStore] = {}
    proxies: dict[str, Any] = {}
    try:
        for name, (target_dsn, pool) in targets.items():
            stores[name] = await PostgresStateStore.connect(
                target_dsn,
                schema=SCHEMA,
                registry=CollectorRegistry(),
                stats_interval=None,
                pool=pool,
            )
            proxies[name] = guard(
                stores[name], name=f"bench-pooling-{len(proxies)}", registry=CollectorRegistry()
            )
        for seed in seeds():  # writes first, so reads find their rows
            await _bound(stores[DIRECT], seed)()
        table = calls()
        rows = [PoolingRow(method) for method in methods]
        entries: list[Interleaved] = [
            ({name: _bound(proxy, table[row.method]) for name, proxy in proxies.items()}, None, row.samples)
            for row in rows
        ]
        await time_rounds(entries, rounds=rounds, per_round=per_round)
    finally:
        for proxy in proxies.values():
            await controller(proxy).aclose()
        for store in stores.values():
            await store.close()
    result = verdict(rows)
    text = format_report(rows, result, rounds=rounds, per_round=per_round)
    text += f"; took {time.perf_counter() - started:.0f} s."
    if pgbouncer_dsn is None:
        text += "\n(no PgBouncer: `make tools` installs it; it runs in front of the embedded server only)"
    return PoolingReport(rows, result, text)


__all__ = ["METHODS", "SECTION", "TARGET", "PoolingReport", "PoolingRow", "run"]
