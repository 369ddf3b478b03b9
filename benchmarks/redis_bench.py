"""The Redis store per call against the raw redis-py client running the same commands, and a pause
saved then resumed on Redis against PostgreSQL.

**Per call** (:data:`METHODS`, arguments from :func:`~benchmarks.workload.calls`): three series on
one real ``redis-server`` (``guarded.testing.redis``), timed in interleaved rounds by
:func:`benchmarks.postgres_protocol.time_rounds` (median over the rounds of the mean per call):

* ``raw redis-py``: the commands the bare store sends for one call of the method, exactly as it
  sends them (``EVALSHA`` of the same Lua script with the same keys and arguments, or the same
  ``HGET``/``XRANGE``; recorded from the store's client), replayed on a plain ``redis.asyncio``
  client configured as the store's (pool size and wait, socket timeouts). Arguments are prepared
  in advance: the floor (server, network, redis-py), no encoding or validation.
* ``bare store``: ``RedisStateStore``'s method.
* ``guard``: the same method of ``guard(store)`` with the default configuration (``save_event`` is
  batched by the guard and returns once its batch is written).

``load_planner_state`` consumes its pause, so each call of every series is preceded, untimed, by
the store's ``save_planner_state``. Target: ``guard`` at most :data:`TARGET` x ``raw`` per call.

**Pause save + resume**: ``save_planner_state`` then ``load_planner_state`` of a fresh token
through ``guard(RedisStateStore)`` and ``guard(PostgresStateStore)`` (the embedded server),
alternating, p50 and p99 of the pair, no target (the figure the hybrid store's routing rests on).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from redis import asyncio as redis_asyncio

from guarded import controller, guard
from guarded.backends.redis import RedisStateStore

from .guard_report import Verdict, render_table
from .method_samples import MethodSamples
from .postgres_protocol import AsyncCall, Interleaved, time_rounds
from .workload import PAUSE, MethodCall, calls, seeds

SECTION = "redis"
TARGET = 1.15
ROUNDS = 20
CALLS_PER_ROUND = 20
PAIRS = 400
"""Pause save + resume pairs per store."""
POOL_SIZE = 4
METHODS = (
    "save_event",
    "load_history",
    "save_memory_state",
    "load_memory_state",
    "save_planner_state",
    "load_planner_state",
    "save_task",
    "list_tasks",
)
SERVER_ARGUMENTS = ("--appendfsync", "everysec")
"""The bench server: the append-only file fsynced once a second (Redis' default with appendonly),
so a call's time is the server's work, not the disk's (the test fixture fsyncs every write)."""
SERVER_NOTE = "appendonly yes, appendfsync everysec"
RAW, BARE, GUARD = "raw redis-py", "bare store", "guard"
SERIES = (RAW, BARE, GUARD)
TARGET_TEXT = f"guard(RedisStateStore) <= {TARGET}x raw redis-py running the same commands, per call"

Command = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class RedisRow(MethodSamples):
    reference = RAW

    commands: int = 0


@dataclass
class PausePairs:
    """Seconds of each save + resume pair, per store."""

    seconds: dict[str, list[float]] = field(default_factory=dict)

    def quantile_ms(self, store: str, q: float) -> float:
        found = sorted(self.seconds[store])
        return found[min(len(found) - 1, int(q * len(found)))] * 1000


@dataclass
class RedisReport:
    rows: list[RedisRow]
    pauses: PausePairs
    verdict: Verdict
    text: str


PIPELINE = "<pipeline>"
"""The first element of a recorded pipeline: ``((PIPELINE, [(args, options), ...]), {})``."""


class CommandRecorder:
    """Records the commands a redis-py client sends while on: each ``execute_command``, and each
    pipeline's queued commands when it executes (the client's two methods wrapped)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.recording = False
        self.commands: list[Command] = []
        self._original = client.execute_command
        self._original_pipeline = client.pipeline

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            if self.recording:
                self.commands.append((args, dict(kwargs)))
            return await self._original(*args, **kwargs)

        def recorded_pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = self._original_pipeline(*args, **kwargs)
            execute = pipe.execute

            async def recorded_execute(*execute_args: Any, **execute_kwargs: Any) -> Any:
                if self.recording:
                    stack = [(tuple(queued), dict(options)) for queued, options in pipe.command_stack]
                    self.commands.append(((PIPELINE, stack), {}))
                return await execute(*execute_args, **execute_kwargs)

            pipe.execute = recorded_execute
            return pipe

        client.execute_command = recorded
        client.pipeline = recorded_pipeline

    async def record(self, call: AsyncCall) -> list[Command]:
        self.commands, self.recording = [], True
        try:
            await call()
        finally:
            self.recording = False
        return self.commands

    def uninstall(self) -> None:
        """Give the client its own methods back (before timing: the wrappers cost the store's calls)."""
        del self.client.execute_command
        del self.client.pipeline


def _bound(target: Any, arguments: MethodCall) -> AsyncCall:
    function = getattr(target, arguments.method)
    return lambda: function(*arguments.args, **arguments.kwargs)


def _replay(client: Any, commands: Sequence[Command]) -> AsyncCall:
    async def replay() -> None:
        for args, kwargs in commands:
            if args and args[0] == PIPELINE:
                pipe = client.pipeline(transaction=False)
                for queued, options in args[1]:
                    pipe.execute_command(*queued, **options)
                await pipe.execute()
            else:
                await client.execute_command(*args, **kwargs)

    return replay


def verdict(rows: Sequence[RedisRow]) -> Verdict:
    ratios = {row.method: row.ratio(GUARD) for row in rows}
    worst = max(ratios, key=lambda method: ratios[method] or 0.0)
    return Verdict(
        TARGET_TEXT,
        all(ratio is not None and ratio <= TARGET for ratio in ratios.values()),
        [
            f"worst {worst} {ratios[worst]:.2f}x",
            *(f"{method} {ratio:.2f}x" for method, ratio in ratios.items()),
        ],
    )


def format_report(
    rows: Sequence[RedisRow], pauses: PausePairs, result: Verdict, *, rounds: int, per_round: int
) -> str:
    header = ("method", "commands", "raw redis-py µs", "bare store µs", "x raw", "guard µs", "x raw")
    body = []
    for row in rows:
        cells = [row.method, str(row.commands)]
        for series in SERIES:
            value = row.median_us(series)
            cells.append("-" if value is None else f"{value:.0f}")
            if series != RAW:
                ratio = row.ratio(series)
                cells.append("-" if ratio is None else f"{ratio:.2f}")
        body.append(tuple(cells))
    lines = [
        "== guard(RedisStateStore) against raw redis-py running the same commands, per call ==",
        "",
        *render_table(header, body, left=1),
        "",
        f"{'met' if result.passed else 'NOT MET'}: {TARGET_TEXT} ({result.details[0]}). Median over "
        f"{rounds} interleaved rounds of {per_round} calls per series; one redis-server on loopback "
        f"({SERVER_NOTE}), pools of {POOL_SIZE} connections.",
    ]
    if pauses.seconds:
        lines += ["", "== pause save + resume (save_planner_state then load_planner_state), guarded ==", ""]
        stores = list(pauses.seconds)
        lines += render_table(
            ("store", "pairs", "p50 ms", "p99 ms"),
            [
                (
                    store,
                    str(len(pauses.seconds[store])),
                    f"{pauses.quantile_ms(store, 0.5):.2f}",
                    f"{pauses.quantile_ms(store, 0.99):.2f}",
                )
                for store in stores
            ],
            left=1,
        )
        if len(stores) == 2:
            first, second = stores
            p50 = pauses.quantile_ms(second, 0.5) / pauses.quantile_ms(first, 0.5)
            p99 = pauses.quantile_ms(second, 0.99) / pauses.quantile_ms(first, 0.99)
            lines += [
                "",
                f"{second} / {first}: p50 {p50:.2f}x, p99 {p99:.2f}x (alternating pairs in one run; "
                "PostgreSQL is the bench's server with its settings).",
            ]
    return "\n".join(lines)


def _raw_client(url: str, store_client: Any) -> Any:
    """A plain ``redis.asyncio`` client configured as the store's own: a blocking pool of the same
    size and wait, the same socket timeouts (a read under a timeout costs redis-py a few µs more),
    so the two series differ only by what the store does around the commands."""
    pool = store_client.connection_pool
    timeouts = {
        name: pool.connection_kwargs.get(name) for name in ("socket_timeout", "socket_connect_timeout")
    }
    return redis_asyncio.Redis.from_pool(
        redis_asyncio.BlockingConnectionPool.from_url(
            url, max_connections=pool.max_connections, timeout=pool.timeout, **timeouts
        )
    )


async def _per_call(url: str, *, rounds: int, per_round: int, methods: Sequence[str]) -> list[RedisRow]:
    store = await RedisStateStore.connect(
        url,
        prefix="bench-redis",
        max_connections=POOL_SIZE,
        registry=CollectorRegistry(),
        sample_interval=None,
    )
    raw = _raw_client(url, store.client)
    proxy = guard(store, name="bench-redis", registry=CollectorRegistry())
    try:
        for seed in seeds():  # writes first, so reads find their rows
            await _bound(store, seed)()
        table = calls()
        recorder = CommandRecorder(store.client)
        rows = [RedisRow(method) for method in methods]
        replays: dict[str, AsyncCall] = {}
        for row in rows:
            if row.method == "load_planner_state":
                await store.save_planner_state("pause-token", PAUSE)
            await _bound(store, table[row.method])()  # scripts loaded: no NOSCRIPT fallback recorded
            if row.method == "load_planner_state":
                await store.save_planner_state("pause-token", PAUSE)
            commands = await recorder.record(_bound(store, table[row.method]))
            row.commands = len(commands)
            replays[row.method] = _replay(raw, commands)
        recorder.uninstall()

        def prepare(method: str) -> AsyncCall | None:
            if method != "load_planner_state":
                return None
            return lambda: store.save_planner_state("pause-token", PAUSE)

        entries: list[Interleaved] = [
            (
                {
                    RAW: replays[row.method],
                    BARE: _bound(store, table[row.method]),
                    GUARD: _bound(proxy, table[row.method]),
                },
                prepare(row.method),
                row.samples,
            )
            for row in rows
        ]
        await time_rounds(entries, rounds=rounds, per_round=per_round)
    finally:
        await controller(proxy).aclose()
        await store.close()
        await raw.aclose()
    return rows


async def _pause_pairs(url: str, dsn: str | None, *, pairs: int) -> PausePairs:
    stores: dict[str, Any] = {}
    backends: list[Any] = []
    redis_store = await RedisStateStore.connect(
        url, prefix="bench-pauses", registry=CollectorRegistry(), sample_interval=None
    )
    backends.append(redis_store)
    stores["redis"] = guard(redis_store, name="bench-pauses-redis", registry=CollectorRegistry())
    if dsn is not None:
        from guarded.backends.postgres import PostgresStateStore

        pg_store = await PostgresStateStore.connect(
            dsn, schema="bench_pauses", registry=CollectorRegistry(), stats_interval=None
        )
        backends.append(pg_store)
        stores["postgresql"] = guard(pg_store, name="bench-pauses-pg", registry=CollectorRegistry())
    found = PausePairs({name: [] for name in stores})
    clock = time.perf_counter
    try:
        for index in range(pairs + 10):
            for name, proxy in stores.items():
                token = f"pair-{index}"
                started = clock()
                await proxy.save_planner_state(token, PAUSE)
                resumed = await proxy.load_planner_state(token)
                spent = clock() - started
                if resumed is None:
                    raise AssertionError(f"{name}: pause {token} saved but not resumed")
                if index >= 10:  # ten warm-up pairs
                    found.seconds[name].append(spent)
    finally:
        for proxy in stores.values():
            await controller(proxy).aclose()
        for backend in backends:
            await backend.close()
    return found


def run_with_servers(
    *, dsn: str | None, rounds: int, per_round: int, pairs: int, embedded_postgres: bool
) -> RedisReport | str:
    """Start a ``redis-server`` (and, without ``dsn`` and with ``embedded_postgres``, an embedded
    PostgreSQL) and run the section; the reason as text when there is no ``redis-server``."""
    import asyncio
    import contextlib

    from guarded.testing.redis import RedisServer, RedisServerError

    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(RedisServer.started(extra=SERVER_ARGUMENTS))
        except RedisServerError as exc:
            return f"== redis ==\n\nnot run: {exc} (Debian's package redis-server; `make tools` installs it)"
        if dsn is None and embedded_postgres:
            from guarded.testing.postgres import embedded_postgres as start_postgres

            dsn = stack.enter_context(start_postgres()).dsn
        return asyncio.run(run(server.url, dsn=dsn, rounds=rounds, per_round=per_round, pairs=pairs))


async def run(
    url: str,
    *,
    dsn: str | None = None,
    rounds: int = ROUNDS,
    per_round: int = CALLS_PER_ROUND,
    pairs: int = PAIRS,
    methods: Sequence[str] = METHODS,
) -> RedisReport:
    """Measure ``methods`` on the Redis server at ``url``, and pause pairs there and on the
    PostgreSQL at ``dsn`` (Redis alone without one)."""
    started = time.perf_counter()
    raw = redis_asyncio.Redis.from_url(url)
    try:
        await raw.flushall()
    finally:
        await raw.aclose()
    rows = await _per_call(url, rounds=rounds, per_round=per_round, methods=methods)
    pauses = await _pause_pairs(url, dsn, pairs=pairs)
    result = verdict(rows)
    text = format_report(rows, pauses, result, rounds=rounds, per_round=per_round)
    text += f"\nTook {time.perf_counter() - started:.0f} s."
    return RedisReport(rows, pauses, result, text)


__all__ = [
    "METHODS",
    "SECTION",
    "TARGET",
    "CommandRecorder",
    "PausePairs",
    "RedisReport",
    "RedisRow",
    "run",
    "run_with_servers",
]
