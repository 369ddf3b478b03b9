"""Write-behind batching and dead-letter drain of ``guard(PostgresStateStore)``, side by side.

**Throughput** (target: batched >= 10x unbatched, batched >= 0.8x ``COPY``): :data:`CALLERS`
concurrent callers, one trace each, each awaiting its own ``save_event`` calls of small events in
a loop and yielding to the event loop after every call (as a caller with other work does; without
the yield a caller whose write is queued at once never lets the others, or the flushes, run).
Series, all in one run, their repetitions interleaved (repetition 1 of every series, then
repetition 2, ...), each on a freshly truncated table:

* ``guard, batched``: ``guard(store)`` with the default :class:`~guarded.config.BatchConfig`; the
  time includes ``controller(store).flush()`` after the last call, and the rows are counted in the
  database afterwards.
* ``guard, unbatched``: ``GuardConfig(batching=BatchConfig(enabled=False))``: every call waits for
  its ``INSERT``. It is about 10x slower, so it writes the first :data:`UNBATCHED_PER_CALLER`
  events of each caller only (a rate is a rate; the callers are as many).
* ``COPY, rows built per spec``: one ``COPY`` (asyncpg ``copy_records_to_table``) of the same rows
  built with spec 000's recipe, as the ``postgres`` section's bulk-insert reference: the
  reference of the 0.8x target.
* for reference, without a target: ``COPY`` of rows built in advance (database time only), the
  store's own ``save_events`` in chunks of ``max_batch`` with no guard and no callers, and, when
  :data:`TUNED` is not empty, the batched guard with non-default settings.

**Caller latency** (target: p99 <= 1 ms): the time each ``await store.save_event(event)`` of the
batched series took, over every timed repetition.

**Dead-letter drain**: while the server is stopped, the callers write :data:`DEAD_LETTERS` events
through a batched guard whose buffer spills to a SQLite file in a temporary directory (the
production setting, ``DeadLetterConfig.path``); every flush fails and is dead-lettered. The
breaker is then held open (so the background replay cannot start early), the server started
again, the breaker reset (as an operator would, instead of waiting for ``breaker.open_duration``)
and ``controller(store).drain()`` timed until the buffer is empty; the rows are counted in the
database afterwards. Once with ``replay_rate`` so high that it never throttles (the drain's own
speed), once more so with ``replay_batch`` :data:`TUNED_REPLAY_BATCH` (clearly labelled), and once
with the default ``replay_rate`` (the pace a recovering backend sees). With ``--dsn`` the drain
runs on an embedded server of its own, since the given one cannot be stopped.

The table also shows, per batched series, the batch size and flush duration achieved
(``guarded_batch_size``, ``guarded_batch_flush_duration_seconds``) and the peak of
``guarded_batch_pending``: when it reaches ``queue_size`` the callers wait for space, which is
what a p99 in milliseconds means.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded import telemetry_names as names
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.config import BatchConfig, DeadLetterConfig, GuardConfig
from guarded.models import StoredEvent
from guarded.testing.postgres import EmbeddedPostgres

from .guard_report import Verdict
from .postgres_bench import COLUMNS, spec_row

SECTION = "durability"
TITLE = "durability: write-behind batching and dead-letter drain (PostgreSQL)"
SCHEMA = "bench_durability"

CALLERS = int(os.environ.get("BENCH_DURABILITY_CALLERS", "100"))
"""Concurrent callers, one trace each."""
PER_CALLER = int(os.environ.get("BENCH_DURABILITY_EVENTS_PER_CALLER", "500"))
"""Events each caller saves in one repetition of the batched and COPY series."""
UNBATCHED_PER_CALLER = int(os.environ.get("BENCH_DURABILITY_UNBATCHED_PER_CALLER", "20"))
"""Events each caller saves in one repetition of the unbatched series."""
DEAD_LETTERS = int(os.environ.get("BENCH_DURABILITY_DEAD_LETTERS", "20000"))
"""Events dead-lettered during the outage, then drained with an unthrottled replay."""
PACED_DEAD_LETTERS = int(os.environ.get("BENCH_DURABILITY_PACED_DEAD_LETTERS", "2000"))
"""Events dead-lettered, then drained at the default ``replay_rate`` (about 4 s at 500/s)."""
UNTHROTTLED_RATE = 1e9
"""``replay_rate`` of the drain-speed measurement: high enough never to make the replay wait."""
TUNED_REPLAY_BATCH = 1000
"""``replay_batch`` of the extra, clearly labelled unthrottled drain (the default is 100)."""

BATCHED_VS_UNBATCHED_TARGET = 10.0
BATCHED_VS_COPY_TARGET = 0.8
P99_TARGET_S = 1e-3

TUNED: tuple[tuple[str, BatchConfig], ...] = (
    (
        "tuned: max_batch=1000, max_concurrent_flushes=4",
        BatchConfig(max_batch=1000, max_concurrent_flushes=4),
    ),
)
"""Extra batched series with non-default settings, clearly labelled (no target of their own)."""

BATCHED = "guard, batched (defaults)"
UNBATCHED = "guard, unbatched"
COPY_SPEC = "COPY, rows built per spec"
COPY_PREBUILT = "COPY, rows prebuilt (db only)"
STORE_CHUNKS = "store.save_events, no guard, chunks of"

BASE_TS = 1_702_857_600.0
STORE_NAME = "bench"
"""The guards' name (metric label ``store``)."""
SAMPLE_EVERY = 0.01
"""Seconds between two readings of ``guarded_batch_pending`` during a batched series."""


def caller_events(callers: int, per_caller: int, prefix: str) -> list[list[StoredEvent]]:
    """Small events, one trace per caller: ``per_caller`` events for each of ``callers`` callers."""
    return [
        [
            StoredEvent(
                trace_id=f"{prefix}-{caller:03d}",
                ts=BASE_TS + index * 0.001,
                kind="node_success",
                node_name="planner",
                node_id=f"node-{index % 7}",
                payload={"step": index, "ok": True},
            )
            for index in range(per_caller)
        ]
        for caller in range(callers)
    ]


SaveEvent = Callable[[StoredEvent], Awaitable[Any]]


async def drive(save: SaveEvent, groups: Sequence[Sequence[StoredEvent]], latencies: list[float]) -> None:
    """One caller task per group, each awaiting ``save(event)`` for its events in order and yielding
    to the event loop after every call; the duration of every call is appended to ``latencies``."""

    async def caller(events: Sequence[StoredEvent]) -> None:
        clock = time.perf_counter
        record = latencies.append
        sleep = asyncio.sleep
        for event in events:
            started = clock()
            await save(event)
            record(clock() - started)
            await sleep(0)

    await asyncio.gather(*(caller(events) for events in groups))


async def _nothing(event: StoredEvent) -> None:
    return None


# --- series -------------------------------------------------------------------------------------


@dataclass
class Series:
    """One measured way of writing ``events`` events; ``run`` appends call latencies when it has calls."""

    name: str
    events: int
    run: Callable[[list[float]], Awaitable[None]]
    registry: CollectorRegistry | None = None
    """The guard's metrics, for the batch sizes achieved."""
    batch_config: BatchConfig | None = None
    seconds: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    batch_baseline: tuple[float, float, float] = (0.0, 0.0, 0.0)
    peak_pending: int | None = None
    """Most writes queued or being flushed at once (``guarded_batch_pending``, sampled)."""

    @property
    def rate(self) -> float:
        return self.events / statistics.median(self.seconds)

    @property
    def rates(self) -> tuple[float, float]:
        return self.events / max(self.seconds), self.events / min(self.seconds)

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

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


@dataclass(frozen=True, slots=True)
class Drain:
    """One dead-letter drain after recovery."""

    name: str
    entries: int
    replay_rate: float
    replay_batch: int
    fill_seconds: float
    drain_seconds: float

    @property
    def rate(self) -> float:
        return self.entries / self.drain_seconds


@dataclass
class Report:
    series: list[Series]
    drains: list[Drain]
    verdicts: list[Verdict]
    notes: list[str]


async def _count(store: PostgresStateStore) -> int:
    value = await store.pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.flow_events")
    return int(value)


async def _truncate(store: PostgresStateStore) -> None:
    await store.pool.execute(f"TRUNCATE {SCHEMA}.flow_events")


def build_series(store: PostgresStateStore) -> list[Series]:
    """Every throughput series, each guard with its own registry, all over ``store``."""
    groups = caller_events(CALLERS, PER_CALLER, "dur")
    unbatched_groups = [events[:UNBATCHED_PER_CALLER] for events in groups]
    flat = [event for events in groups for event in events]
    prebuilt = [spec_row(event) for event in flat]
    chunk = BatchConfig().max_batch

    def guarded(config: GuardConfig, registry: CollectorRegistry) -> Callable[[list[float]], Awaitable[None]]:
        proxy = guard(store, name=STORE_NAME, config=config, registry=registry)
        ctl = controller(proxy)

        async def run(latencies: list[float]) -> None:
            await drive(proxy.save_event, groups if config.batching.enabled else unbatched_groups, latencies)
            await ctl.flush()
            buffer = ctl.dead_letters
            if buffer is not None and not buffer.is_empty:
                raise AssertionError(f"{buffer.depth} writes were dead-lettered during a healthy run")

        return run

    async def copy(rows: list[tuple[Any, ...]]) -> None:
        async with store.pool.acquire() as conn:
            await conn.copy_records_to_table("flow_events", schema_name=SCHEMA, columns=COLUMNS, records=rows)

    async def copy_spec(latencies: list[float]) -> None:
        await copy([spec_row(event) for event in flat])

    async def copy_prebuilt(latencies: list[float]) -> None:
        await copy(prebuilt)

    async def store_chunks(latencies: list[float]) -> None:
        for start in range(0, len(flat), chunk):
            await store.save_events(flat[start : start + chunk])

    series: list[Series] = []
    for name, batching in ((BATCHED, BatchConfig()), *TUNED):
        registry = CollectorRegistry()
        series.append(
            Series(name, len(flat), guarded(GuardConfig(batching=batching), registry), registry, batching)
        )
    unbatched = GuardConfig(batching=BatchConfig(enabled=False))
    series += [
        Series(UNBATCHED, CALLERS * UNBATCHED_PER_CALLER, guarded(unbatched, CollectorRegistry())),
        Series(COPY_SPEC, len(flat), copy_spec),
        Series(COPY_PREBUILT, len(flat), copy_prebuilt),
        Series(f"{STORE_CHUNKS} {chunk}", len(flat), store_chunks),
    ]
    return series


class PendingSampler:
    """Reads a guard's ``guarded_batch_pending`` gauge every :data:`SAMPLE_EVERY` seconds; keeps the peak."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._registry = registry
        self._handle: asyncio.TimerHandle | None = None
        self.peak: int | None = None

    def _sample(self) -> None:
        assert self._registry is not None
        value = self._registry.get_sample_value(names.BATCH_PENDING, {names.LABEL_STORE: STORE_NAME})
        if value is not None:
            self.peak = max(self.peak or 0, int(value))
        self._handle = asyncio.get_running_loop().call_later(SAMPLE_EVERY, self._sample)

    def __enter__(self) -> PendingSampler:
        if self._registry is not None:
            self._handle = asyncio.get_running_loop().call_later(SAMPLE_EVERY, self._sample)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def measure(store: PostgresStateStore, series: Sequence[Series], repeats: int, warmup: int = 1) -> None:
    """Interleaved repetitions of every series on a truncated table; rows counted after each."""
    for round_number in range(warmup + repeats):
        timed = round_number >= warmup
        for entry in series:
            await _truncate(store)
            gc.collect()
            latencies: list[float] = []
            with PendingSampler(entry.registry if entry.batch_config is not None else None) as sampler:
                started = time.perf_counter()
                await entry.run(latencies)
                elapsed = time.perf_counter() - started
            stored = await _count(store)
            if stored != entry.events:
                raise AssertionError(f"{entry.name}: {stored} rows in the table, {entry.events} written")
            if timed:
                entry.seconds.append(elapsed)
                entry.latencies += latencies
                if sampler.peak is not None:
                    entry.peak_pending = max(entry.peak_pending or 0, sampler.peak)
        if round_number == warmup - 1:
            for entry in series:
                entry.batch_baseline = entry.batch_totals()


async def harness_cost(repeats: int) -> float:
    """Seconds per event of the callers alone (awaiting a coroutine that does nothing), median."""
    groups = caller_events(CALLERS, PER_CALLER, "idle")
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        await drive(_nothing, groups, [])
        samples.append((time.perf_counter() - started) / (CALLERS * PER_CALLER))
    return statistics.median(samples)


# --- dead-letter drain ----------------------------------------------------------------------------


async def _drain_once(
    server: EmbeddedPostgres,
    store: PostgresStateStore,
    spill_dir: Path,
    *,
    name: str,
    entries: int,
    replay_rate: float | None,
    replay_batch: int | None = None,
) -> tuple[Drain, Callable[[], Awaitable[None]]]:
    """Dead-letter ``entries`` events during an outage, recover, time the drain; a closer for the guard."""
    defaults = DeadLetterConfig()
    dead_letter = DeadLetterConfig(
        path=str(spill_dir / "dlq-{name}.sqlite"),
        replay_rate=defaults.replay_rate if replay_rate is None else replay_rate,
        replay_batch=defaults.replay_batch if replay_batch is None else replay_batch,
    )
    proxy = guard(store, name=name, config=GuardConfig(dead_letter=dead_letter), registry=CollectorRegistry())
    ctl = controller(proxy)
    buffer = ctl.dead_letters
    assert buffer is not None
    groups = caller_events(CALLERS, max(1, entries // CALLERS), name)
    flat = [event for events in groups for event in events]
    await _truncate(store)

    await asyncio.to_thread(server.stop)
    started = time.perf_counter()
    await drive(proxy.save_event, groups, [])
    await ctl.flush()
    fill_seconds = time.perf_counter() - started
    if buffer.depth != len(flat):
        raise AssertionError(f"{name}: {buffer.depth} writes dead-lettered, {len(flat)} written")
    # A short outage may not open the breaker; hold it open so that the background replay does not
    # start while the server comes back, before the timed drain.
    ctl.breaker.force_open()
    await asyncio.to_thread(server.start)

    ctl.breaker.reset()
    started = time.perf_counter()
    remaining = await ctl.drain(timeout=600)
    drain_seconds = time.perf_counter() - started
    stored = await _count(store)
    if remaining or stored != len(flat):
        raise AssertionError(f"{name}: {remaining} writes left after the drain, {stored} of {len(flat)} rows")
    drain = Drain(
        name=name,
        entries=len(flat),
        replay_rate=dead_letter.replay_rate,
        replay_batch=dead_letter.replay_batch,
        fill_seconds=fill_seconds,
        drain_seconds=drain_seconds,
    )
    return drain, ctl.aclose


async def measure_drains(server: EmbeddedPostgres) -> list[Drain]:
    """The unthrottled drain of :data:`DEAD_LETTERS` events, then the paced one at the default rate."""
    store = await PostgresStateStore.connect(
        server.dsn,
        schema=SCHEMA,
        registry=CollectorRegistry(),
        stats_interval=None,
        # min_size=0: asyncpg's pool would log every failed attempt to keep its floor during the outage.
        pool=PoolSettings(min_size=0, max_size=4, connect_timeout=2.0),
    )
    spill_dir = Path(tempfile.mkdtemp(prefix="guarded-bench-dlq-"))
    closers: list[Callable[[], Awaitable[None]]] = []
    drains: list[Drain] = []
    try:
        for name, entries, rate, batch in (
            ("unthrottled", DEAD_LETTERS, UNTHROTTLED_RATE, None),
            ("unthrottled, tuned", DEAD_LETTERS, UNTHROTTLED_RATE, TUNED_REPLAY_BATCH),
            ("default rate", PACED_DEAD_LETTERS, None, None),
        ):
            drain, closer = await _drain_once(
                server, store, spill_dir, name=name, entries=entries, replay_rate=rate, replay_batch=batch
            )
            drains.append(drain)
            closers.append(closer)
    finally:
        if not server.running:
            await asyncio.to_thread(server.start)
        for closer in closers:
            await closer()
        await store.close()
        shutil.rmtree(spill_dir, ignore_errors=True)
    return drains


# --- verdicts and report --------------------------------------------------------------------------


def _find(series: Sequence[Series], name: str) -> Series:
    return next(entry for entry in series if entry.name == name)


def verdicts(series: Sequence[Series]) -> list[Verdict]:
    batched, unbatched = _find(series, BATCHED), _find(series, UNBATCHED)
    copy = _find(series, COPY_SPEC)
    tuned = [entry for entry in series if entry.name.startswith("tuned")]

    def vs(entry: Series, reference: Series, target: float) -> str:
        ratio = entry.rate / reference.rate
        return (
            f"{entry.name}: {entry.rate:,.0f} / {reference.rate:,.0f} events/s = {ratio:.2f}x "
            f"{'ok' if ratio >= target else 'UNDER'}"
        )

    def p99(entry: Series) -> str:
        value = entry.percentile(0.99)
        return (
            f"{entry.name}: p50 {entry.percentile(0.5) * 1e6:.1f} µs, p99 {value * 1e6:.1f} µs, "
            f"max {max(entry.latencies) * 1e3:.2f} ms over {len(entry.latencies):,} calls "
            f"{'ok' if value <= P99_TARGET_S else 'OVER'}"
        )

    informational = " (informational)"
    return [
        Verdict(
            target=f"batched >= {BATCHED_VS_UNBATCHED_TARGET:g}x unbatched (events/s)",
            passed=batched.rate / unbatched.rate >= BATCHED_VS_UNBATCHED_TARGET,
            details=[vs(entry, unbatched, BATCHED_VS_UNBATCHED_TARGET) for entry in (batched, *tuned)],
        ),
        Verdict(
            target=f"batched >= {BATCHED_VS_COPY_TARGET:g}x COPY of the same rows built per spec (events/s)",
            passed=batched.rate / copy.rate >= BATCHED_VS_COPY_TARGET,
            details=[
                vs(entry, copy, BATCHED_VS_COPY_TARGET) + (informational if entry is not batched else "")
                for entry in (batched, *tuned)
            ],
        ),
        Verdict(
            target=f"batched save_event p99 <= {P99_TARGET_S * 1e3:g} ms (caller side, under that load)",
            passed=batched.percentile(0.99) <= P99_TARGET_S,
            details=[
                p99(entry) + (informational if entry is not batched else "") for entry in (batched, *tuned)
            ]
            + [p99(unbatched) + informational],
        ),
    ]


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], left: int) -> list[str]:
    widths = [max(len(line[i]) for line in (header, *lines)) for i in range(len(header))]

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [render(header), "  ".join("-" * width for width in widths), *(render(line) for line in lines)]


def format_report(report: Report) -> str:
    """Both tables, the verdicts and the notes."""
    copy = _find(report.series, COPY_SPEC).rate
    throughput = []
    for entry in report.series:
        low, high = entry.rates
        batches = entry.batches()
        has_calls = bool(entry.latencies)
        throughput.append(
            (
                entry.name,
                f"{entry.events:,}",
                f"{entry.rate:,.0f}",
                f"{low:,.0f}..{high:,.0f}",
                f"{entry.rate / copy:.2f}",
                f"{entry.percentile(0.5) * 1e6:.1f}" if has_calls else "-",
                f"{entry.percentile(0.99) * 1e6:.1f}" if has_calls else "-",
                "-" if batches is None else f"{batches[0]:.0f}",
                "-" if batches is None else f"{batches[1] * 1e3:.1f}",
                "-" if entry.peak_pending is None else f"{entry.peak_pending:,}",
            )
        )
    drains = [
        (
            drain.name,
            f"{drain.entries:,}",
            f"{drain.replay_rate:g}/s",
            str(drain.replay_batch),
            f"{drain.entries / drain.fill_seconds:,.0f}",
            f"{drain.drain_seconds:.2f}",
            f"{drain.rate:,.0f}",
        )
        for drain in report.drains
    ]
    lines = [f"== {TITLE} ==", ""]
    lines += _table(
        (
            "series",
            "events",
            "events/s",
            "min..max events/s",
            "x COPY",
            "p50 µs",
            "p99 µs",
            "avg batch",
            "avg flush ms",
            "peak queued",
        ),
        throughput,
        left=1,
    )
    lines += ["", "dead-letter drain after recovery (controller(store).drain(), spill file on)", ""]
    lines += _table(
        ("drain", "entries", "replay_rate", "replay_batch", "fill writes/s", "drain s", "drain writes/s"),
        drains,
        left=1,
    )
    for verdict in report.verdicts:
        lines += ["", f"{'PASS' if verdict.passed else 'FAIL'}  {verdict.target}"]
        lines += [f"      {detail}" for detail in verdict.details]
    if report.notes:
        lines += ["", *report.notes]
    return "\n".join(lines)


# --- entry point ----------------------------------------------------------------------------------


async def run(dsn: str, *, repeats: int = 7, server: EmbeddedPostgres | None = None) -> Report:
    """Measure everything against ``dsn`` (schema ``bench_durability`` is reset); the drain stops
    and restarts ``server`` (an embedded server of its own when ``None``)."""
    started = time.perf_counter()
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    finally:
        await setup.close()
    store = await PostgresStateStore.connect(
        dsn, schema=SCHEMA, registry=CollectorRegistry(), stats_interval=None
    )
    try:
        series = build_series(store)
        await measure(store, series, repeats)
    finally:
        await store.close()
    harness = await harness_cost(repeats)

    own = server is None
    drain_server = server if server is not None else EmbeddedPostgres()
    try:
        if own:
            await asyncio.to_thread(drain_server.start)
        drains = await measure_drains(drain_server)
    finally:
        if own:
            await asyncio.to_thread(drain_server.destroy)

    batched = _find(series, BATCHED)
    pool = PoolSettings()
    defaults = BatchConfig()
    notes = [
        f"{CALLERS} callers, one trace each, each awaiting its save_event calls and yielding to the loop "
        f"after every call; median of {repeats} interleaved repetitions (after a warm-up), table truncated "
        "before each; every batched run includes controller(store).flush() and its rows are counted after.",
        f"the callers alone (awaiting a no-op) cost {harness * 1e6:.2f} µs/event, "
        f"{harness * batched.rate:.0%} of the batched series' time; COPY series have no callers.",
        f"store pool: PoolSettings defaults (max_size={pool.max_size}); batching defaults: "
        f"max_batch={defaults.max_batch}, max_delay={defaults.max_delay * 1e3:g} ms, "
        f"max_concurrent_flushes={defaults.max_concurrent_flushes}, queue_size={defaults.queue_size:,}; "
        "avg batch / avg flush ms from guarded_batch_size and guarded_batch_flush_duration_seconds, "
        f"peak queued: guarded_batch_pending read every {SAMPLE_EVERY * 1e3:g} ms "
        "(at queue_size, callers wait for space).",
        f"drain: 'unthrottled' sets replay_rate={UNTHROTTLED_RATE:g}/s, so pacing never waits (the drain's "
        f"own speed), 'tuned' also replay_batch={TUNED_REPLAY_BATCH}; 'default rate' keeps "
        f"replay_rate={DeadLetterConfig().replay_rate:g}/s, whose token bucket lets the first bulk write out "
        "at once (so slightly above the limit). fill writes/s: the callers' writes during the outage, "
        "dead-lettered to the spill file. The breaker is reset after the restart; the drain runs on "
        + (
            "the same embedded server (stopped and restarted)."
            if not own
            else "an embedded server of its own."
        ),
        f"took {time.perf_counter() - started:.0f} s",
    ]
    return Report(series=series, drains=drains, verdicts=verdicts(series), notes=notes)


__all__ = ["SECTION", "Report", "format_report", "run"]
