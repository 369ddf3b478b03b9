"""Every protocol method of ``guard(PostgresStateStore)`` against raw asyncpg running the same SQL.

For each method of :data:`~benchmarks.workload.PROTOCOL_METHODS` (arguments from
:func:`~benchmarks.workload.calls`), three series on the same server and tables. Each round runs
:data:`CALLS_PER_ROUND` calls of every series of every method in turn; the reported figure is the
median over the rounds of the mean time per call, so a busier stretch hits every series alike:

* ``raw asyncpg``: the statements the bare store sends for one call of the method, exactly as it
  sends them (SQL text and arguments recorded with asyncpg's query logger), replayed on a plain
  asyncpg pool of the same size (one connection acquired per call, as the store does; the pool's
  reset on release is asyncpg's, not the store's, and both pay it). Arguments are prepared in
  advance, so this is the floor: server, network and asyncpg's own work, no encoding or validation.
* ``raw, no reset`` (reference): the same on a pool created with a no-op ``reset``, so a
  released connection costs no reset round trip (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN
  *; RESET ALL``): what a store that keeps no session state could save per call.
* ``bare store``: ``PostgresStateStore``'s method.
* ``guard``: the same method of ``guard(store)`` with the default configuration. Appends the guard
  batches (``save_event``, ``save_update``, ``save_planner_event``) return once their batch is
  committed (``ack="commit"``), so with one caller each call waits for its own flush.

Writes repeat one item (idempotent inserts, upserts of one key; ``save_planner_event`` appends to
a trace of its own, so what ``list_planner_events`` reads stays the same). ``load_planner_state``
consumes its row, so each of its calls is preceded, untimed, by the store's ``save_planner_state``
SQL.
Rows that reads look up are written once before timing.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore

from .guard_report import render_table
from .workload import PROTOCOL_METHODS, MethodCall, calls, reset_schemas, seeds

SECTION = "postgres protocol"
TITLE = "guard(PostgresStateStore) against raw asyncpg running the same SQL, every protocol method, per call"
SCHEMA = "bench_protocol"
CALLS_PER_ROUND = 20
"""Calls of one series per round."""
ROUNDS = 30

AsyncCall = Callable[[], Awaitable[Any]]
Statement = tuple[str, tuple[Any, ...]]


class QueryRecorder:
    """Collects the statements (SQL text, arguments) the store's connections send while on."""

    def __init__(self) -> None:
        self.recording = False
        self.statements: list[Statement] = []
        self._connections: list[asyncpg.Connection] = []

    async def install(self, conn: asyncpg.Connection) -> None:
        conn.add_query_logger(self._logged)
        self._connections.append(conn)

    def uninstall(self) -> None:
        """Stop logging (before timing: a query logger costs the store's calls, not the raw pools')."""
        for conn in self._connections:
            conn.remove_query_logger(self._logged)
        self._connections.clear()

    def _logged(self, record: Any) -> None:
        if self.recording:
            self.statements.append((record.query, tuple(record.args or ())))

    async def record(self, call: AsyncCall) -> list[Statement]:
        self.statements = []
        self.recording = True
        try:
            await call()
            for _ in range(3):  # the logger runs in a callback scheduled after the statement
                await asyncio.sleep(0)
        finally:
            self.recording = False
        return [statement for statement in self.statements if not statement[0].startswith(POOL_RESET)]


@dataclass
class MethodSeries:
    method: str
    raw: AsyncCall
    raw_no_reset: AsyncCall
    bare: AsyncCall
    guarded: AsyncCall
    statements: list[Statement]
    prepare: AsyncCall | None = None
    samples: dict[str, list[float]] = field(
        default_factory=lambda: {"raw": [], "raw_no_reset": [], "bare": [], "guard": []}
    )

    def median_us(self, name: str) -> float:
        return statistics.median(self.samples[name]) * 1e6


def _bound(target: Any, method: str, arguments: MethodCall) -> AsyncCall:
    function = getattr(target, method)
    return lambda: function(*arguments.args, **arguments.kwargs)


POOL_RESET = "SELECT pg_advisory_unlock_all()"
"""How asyncpg's pool resets a released connection (logged too; the raw pool sends it on its own)."""


async def recorded_store(dsn: str, schema: str = SCHEMA) -> tuple[PostgresStateStore, QueryRecorder]:
    """A store on ``schema`` of ``dsn``, reset (pool of two, no table sampling), whose connections
    record every statement they send."""
    await reset_schemas(dsn, schema)
    recorder = QueryRecorder()
    store = await PostgresStateStore.connect(
        dsn,
        schema=schema,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(min_size=2, max_size=2, init=recorder.install),
    )
    return store, recorder


async def _no_reset(conn: asyncpg.Connection) -> None:
    return None


def _replay(pool: asyncpg.Pool, statements: Sequence[Statement]) -> AsyncCall:
    """The statements on one connection of ``pool``, acquired and released as the store does."""

    async def run() -> None:
        async with pool.acquire() as conn:
            for query, args in statements:
                if args:
                    await conn.fetch(query, *args)
                else:  # as the store sent it: simple protocol (it may hold several commands)
                    await conn.execute(query)

    return run


async def build(
    store: PostgresStateStore,
    proxy: Any,
    raw: asyncpg.Pool,
    raw_no_reset: asyncpg.Pool,
    recorder: QueryRecorder,
    methods: Sequence[str],
) -> list[MethodSeries]:
    """Seed the rows reads look up, record each method's statements, and bind the three series."""
    table = calls()
    for seed in seeds():  # writes first, so reads find their rows
        await _bound(store, seed.method, seed)()
    built = []
    planner_save = await recorder.record(_bound(store, "save_planner_state", table["save_planner_state"]))
    for method in methods:
        arguments = table[method]
        if method == "load_planner_state":
            await _replay(raw, planner_save)()
        statements = await recorder.record(_bound(store, method, arguments))
        if not statements:
            raise RuntimeError(f"{method}: the store sent no statement the query logger saw")
        built.append(
            MethodSeries(
                method,
                raw=_replay(raw, statements),
                raw_no_reset=_replay(raw_no_reset, statements),
                bare=_bound(store, method, arguments),
                guarded=_bound(proxy, method, arguments),
                statements=statements,
                prepare=_replay(raw, planner_save) if method == "load_planner_state" else None,
            )
        )
    return built


Interleaved = tuple[Mapping[str, AsyncCall], AsyncCall | None, dict[str, list[float]]]
"""One method's named calls, what to run untimed before each call (or ``None``), and where each
name's per-round means go."""


async def time_rounds(entries: Sequence[Interleaved], *, rounds: int, per_round: int) -> None:
    """Rounds of every (entry, named call) in turn, ``per_round`` calls each, so a busier stretch
    hits every series alike; each round's mean time per call is appended to the entry's samples
    under the call's name. One warm-up round untimed."""
    clock = time.perf_counter
    for round_number in range(rounds + 1):
        for named_calls, prepare, samples in entries:
            for name, call in named_calls.items():
                spent = 0.0
                for _ in range(per_round):
                    if prepare is not None:
                        await prepare()
                    started = clock()
                    await call()
                    spent += clock() - started
                if round_number:
                    samples.setdefault(name, []).append(spent / per_round)


async def measure(series: Sequence[MethodSeries], *, rounds: int, per_round: int) -> None:
    """Rounds of every (method, series), ``per_round`` calls each; one warm-up round untimed."""
    entries: list[Interleaved] = [
        (
            {
                "raw": entry.raw,
                "raw_no_reset": entry.raw_no_reset,
                "bare": entry.bare,
                "guard": entry.guarded,
            },
            entry.prepare,
            entry.samples,
        )
        for entry in series
    ]
    await time_rounds(entries, rounds=rounds, per_round=per_round)


def format_table(series: Sequence[MethodSeries]) -> str:
    header = (
        "method",
        "statements",
        "raw asyncpg µs",
        "raw, no reset µs",
        "bare store µs",
        "x raw",
        "guard µs",
        "x raw",
        "guard - bare µs",
    )
    body = []
    for entry in series:
        raw, no_reset, bare, guarded = (
            entry.median_us(name) for name in ("raw", "raw_no_reset", "bare", "guard")
        )
        body.append(
            (
                entry.method,
                str(len(entry.statements)),
                f"{raw:.0f}",
                f"{no_reset:.0f}",
                f"{bare:.0f}",
                f"{bare / raw:.2f}",
                f"{guarded:.0f}",
                f"{guarded / raw:.2f}",
                f"{guarded - bare:+.0f}",
            )
        )
    return "\n".join([f"== {TITLE} ==", "", *render_table(header, body, left=1)])


async def run(
    dsn: str,
    *,
    rounds: int = ROUNDS,
    per_round: int = CALLS_PER_ROUND,
    methods: Sequence[str] = PROTOCOL_METHODS,
) -> tuple[list[MethodSeries], str]:
    """Measure every method against ``dsn`` (schema ``bench_protocol`` is reset); series and table."""
    started = time.perf_counter()
    store, recorder = await recorded_store(dsn)
    raw = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
    raw_no_reset = await asyncpg.create_pool(dsn, min_size=2, max_size=2, reset=_no_reset)
    assert raw is not None
    assert raw_no_reset is not None
    proxy = guard(store, name="bench-protocol", registry=CollectorRegistry())
    try:
        series = await build(store, proxy, raw, raw_no_reset, recorder, methods)
        recorder.uninstall()
        await measure(series, rounds=rounds, per_round=per_round)
    finally:
        await controller(proxy).aclose()
        await raw_no_reset.close()
        await raw.close()
        await store.close()
    text = format_table(series) + (
        f"\n\nmedian over {rounds} interleaved rounds of {per_round} calls per series; "
        "raw asyncpg replays the "
        "bare store's recorded statements with prepared arguments (the floor); took "
        f"{time.perf_counter() - started:.0f} s"
    )
    return series, text


__all__ = ["SECTION", "run", "time_rounds"]
