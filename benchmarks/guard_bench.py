"""Per-call cost of ``guard()`` on every protocol method, beside hand-written stacks, in one run.

Every series calls one method of its own :class:`~benchmarks.workload.NullStore` (an in-memory
backend that answers at once, its bulk write as costly as the single writes it stands for) in a
tight loop on one event loop. The repetitions of all series are interleaved (repetition 1 of every
series, then repetition 2, ...) so a slow spell of the machine hits all of them alike, and each
series reports its median. "Added" is a series' median minus the bare store's median for the same
method.

Series, for every method of :data:`~benchmarks.workload.PROTOCOL_METHODS`, each with metrics on
and spans not recording (no tracer provider: the OpenTelemetry API's default; and an SDK
provider sampling ``ALWAYS_OFF``):

* ``bare``: the store's own method.
* ``guard``: ``guard(store)`` with every layer.
* ``lean``: a retry loop, ``asyncio.timeout``, a span and a histogram, by hand
  (:class:`~benchmarks.stacks.LeanGuard`).
* ``tenacity``: tenacity + purgatory + a fallback + a span + a histogram and a counter
  (:class:`~benchmarks.stacks.NaiveGuard`).

Besides: the three stacks with recording spans (SDK ``ALWAYS_ON``, a ``SimpleSpanProcessor`` whose
exporter only counts) on :data:`RECORDING_METHODS`, and a fail-fast read: the guard's
:data:`OPEN_BREAKER_METHODS` with the breaker forced open before the first call (no stale value to
serve). After the run every series is checked: each call counted once by its metrics (as a
success, or for the open breaker as one failure outcome), each span exported when recording.

The loop yields to the event loop every :data:`YIELD_EVERY` calls, as a real program does between
calls: asyncio purges the cancelled timer handles of ``asyncio.timeout``, the guard's watchdog and
write-behind run. The yield costs the same in every series.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import ProxyTracerProvider
from prometheus_client import CollectorRegistry
from purgatory import AsyncCircuitBreakerFactory

from guarded import controller, guard
from guarded.observability import telemetry_names as names

from .guard_report import BenchRow, MethodRow, SectionResult, Verdict
from .stacks import LEAN_CALLS, NAIVE_CALLS, LeanGuard, NaiveGuard
from .workload import PROTOCOL_METHODS, MethodCall, NullStore, calls

TITLE = "guard overhead: every protocol method, in-memory null backend, metrics on, per call"

REPETITIONS = int(os.environ.get("BENCH_GUARD_REPETITIONS", "7"))
"""Repetitions of each series; the median is reported."""
REPETITION_BUDGET = float(os.environ.get("BENCH_GUARD_REPETITION_SECONDS", "0.04"))
"""A repetition of a series runs about this long."""
MAX_CALLS = 20_000
MIN_CALLS = 500
WARMUP_CALLS = 300
YIELD_EVERY = 100
"""The timing loop yields to the event loop after this many calls."""

ADDED_COST_TARGET_US = 5.0
"""Target: every protocol method adds at most this much per call, spans not recording."""
LEAN_SHARE_TARGET = 1 / 3
"""Target: the guard's added cost is at most this share of the lean stack's."""
OPEN_BREAKER_TARGET_US = 10.0
"""Target: a fail-fast read with the breaker open costs at most this much per call."""

STORE_NAME = "bench"
RECORDING_METHODS = ("save_event", "load_memory_state")
OPEN_BREAKER_METHODS = ("load_memory_state", "load_history")

Tracing = Literal["none", "off", "on"]
Stack = Literal["bare", "guard", "lean", "naive", "open"]
AsyncMethod = Callable[..., Awaitable[Any]]

HAND_AND_GUARD: tuple[Stack, ...] = ("guard", "lean", "naive")
QUIET_MODES: tuple[Tracing, ...] = ("none", "off")
"""Tracing modes in which spans do not record (the targets apply)."""
TRACING_LABELS: dict[Tracing, str] = {"none": "no provider", "off": "ALWAYS_OFF", "on": "ALWAYS_ON"}
STACK_LABELS: dict[Stack, str] = {
    "bare": "bare store",
    "guard": "guard",
    "lean": "lean (retry loop, timeout, span, histogram)",
    "naive": "tenacity + purgatory + span + metrics",
    "open": "guard, breaker open (fail fast)",
}
SUCCESS_OUTCOMES = frozenset({"ok", "not_found"})


class CountingExporter(SpanExporter):
    """Drops every span; counts them so the benchmark can check spans were really recorded."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def tracer_provider(tracing: Tracing) -> tuple[TracerProvider | None, CountingExporter | None]:
    """A fresh tracer provider for ``tracing`` (``None``: the API's global default) and its exporter."""
    if tracing == "none":
        return None, None
    if tracing == "off":
        return TracerProvider(sampler=ALWAYS_OFF), None
    exporter = CountingExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@dataclass
class Series:
    """One measured callable: (method, stack, tracing mode)."""

    method: str
    stack: Stack
    tracing: Tracing
    call: AsyncMethod
    arguments: MethodCall
    registry: CollectorRegistry | None = None
    counted_by: str | None = None
    """The metric sample that counts this series' calls by outcome."""
    exporter: CountingExporter | None = None
    closer: Callable[[], Awaitable[None]] | None = None
    calls: int = 0
    """Calls per repetition, set by the warm-up."""
    samples_us: list[float] = field(default_factory=list)
    calls_made: int = 0
    outcomes: dict[str, float] = field(default_factory=dict)

    @property
    def variant(self) -> str:
        if self.stack == "bare":
            return STACK_LABELS["bare"]
        return f"{STACK_LABELS[self.stack]}, {TRACING_LABELS[self.tracing]}"

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)


async def _stack(
    method: str, stack: Stack, tracing: Tracing, arguments: MethodCall, breakers: AsyncCircuitBreakerFactory
) -> Series:
    registry = CollectorRegistry()
    provider, exporter = tracer_provider(tracing)
    if stack == "bare":
        return Series(method, stack, tracing, getattr(NullStore(), method), arguments)
    if stack in ("guard", "open"):
        proxy = guard(NullStore(), name=STORE_NAME, registry=registry, tracer_provider=provider)
        ctl = controller(proxy)
        if stack == "open":
            ctl.breaker.force_open()
        call = getattr(proxy, method)
        return Series(
            method, stack, tracing, call, arguments, registry, names.CALLS + "_total", exporter, ctl.aclose
        )
    if stack == "lean":
        lean = LeanGuard(NullStore(), name=STORE_NAME, registry=registry, provider=provider)
        return Series(method, stack, tracing, lean.method(method), arguments, registry, LEAN_CALLS, exporter)
    naive = NaiveGuard(NullStore(), name=STORE_NAME, registry=registry, provider=provider, breakers=breakers)
    call = await naive.method(method)
    return Series(method, stack, tracing, call, arguments, registry, NAIVE_CALLS, exporter)


async def build_series(methods: Sequence[str]) -> list[Series]:
    """Every series, each over its own store, registry and tracer provider."""
    table = calls()
    breakers = AsyncCircuitBreakerFactory()
    series: list[Series] = []
    for method in methods:
        arguments = table[method]
        series.append(await _stack(method, "bare", "none", arguments, breakers))
        for tracing in QUIET_MODES:
            for stack in HAND_AND_GUARD:
                series.append(await _stack(method, stack, tracing, arguments, breakers))
        if method in RECORDING_METHODS:
            for stack in HAND_AND_GUARD:
                series.append(await _stack(method, stack, "on", arguments, breakers))
        if method in OPEN_BREAKER_METHODS:
            series.append(await _stack(method, "open", "none", arguments, breakers))
    return series


async def time_calls(call: AsyncMethod, arguments: MethodCall, count: int) -> float:
    """Microseconds per call over ``count`` calls (rounded to :data:`YIELD_EVERY`).

    The collector runs as in a real program: the collections a series' own garbage triggers are
    part of its cost (everything built before timing is frozen, see :func:`measure`, so they scan
    only that garbage). Collected first, so one series' garbage is not another's cost.
    """
    batches = max(1, count // YIELD_EVERY)
    per_batch = range(YIELD_EVERY)
    args, kwargs = arguments.args, arguments.kwargs
    sleep = asyncio.sleep
    gc.collect()
    started = time.perf_counter()
    for _ in range(batches):
        for _ in per_batch:
            await call(*args, **kwargs)
        await sleep(0)
    elapsed = time.perf_counter() - started
    return elapsed / (batches * YIELD_EVERY) * 1e6


def calls_for(estimate_us: float, budget: float, most: int) -> int:
    """Calls per repetition to last about ``budget`` seconds, within [MIN_CALLS, most]."""
    fitting = int(budget * 1e6 / max(estimate_us, 1e-3))
    count = min(most, max(MIN_CALLS, fitting))
    return max(YIELD_EVERY, count // YIELD_EVERY * YIELD_EVERY)


async def measure(series: Sequence[Series], *, repetitions: int, budget: float, most: int) -> None:
    """Warm up and size each series, then fill their samples, interleaving the repetitions."""
    warmup = min(WARMUP_CALLS, most)
    gc.collect()
    gc.freeze()  # what exists now is never collected again, so each gc.collect() below is short
    try:
        await _measure(series, repetitions=repetitions, budget=budget, most=most, warmup=warmup)
    finally:
        gc.unfreeze()


async def _measure(
    series: Sequence[Series], *, repetitions: int, budget: float, most: int, warmup: int
) -> None:
    for entry in series:
        for _ in range(warmup):
            await entry.call(*entry.arguments.args, **entry.arguments.kwargs)
        entry.calls = calls_for(await time_calls(entry.call, entry.arguments, warmup), budget, most)
        entry.calls_made += warmup + max(1, warmup // YIELD_EVERY) * YIELD_EVERY
    for _ in range(repetitions):
        for entry in series:
            entry.samples_us.append(await time_calls(entry.call, entry.arguments, entry.calls))
            entry.calls_made += entry.calls


def _counted(registry: CollectorRegistry, sample_name: str) -> dict[str, float]:
    counted: dict[str, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == sample_name and sample.value:  # outcomes that never happened read 0
                outcome = sample.labels["outcome"]
                counted[outcome] = counted.get(outcome, 0.0) + sample.value
    return counted


def check(series: Sequence[Series]) -> None:
    """Fail loudly when a stack skipped its work or fell back: every call counted once by its
    metrics (as a success; one failure outcome with the breaker open), every span exported when
    spans record."""
    for entry in series:
        where = f"{entry.method} / {entry.variant}"
        if entry.registry is not None and entry.counted_by is not None:
            entry.outcomes = _counted(entry.registry, entry.counted_by)
            expected = entry.outcomes.keys() - SUCCESS_OUTCOMES if entry.stack == "open" else SUCCESS_OUTCOMES
            matching = sum(count for outcome, count in entry.outcomes.items() if outcome in expected)
            if matching != entry.calls_made or len(entry.outcomes) != 1:
                raise AssertionError(f"{where}: {entry.calls_made} calls made, counted: {entry.outcomes}")
        if entry.exporter is not None and entry.exporter.exported != entry.calls_made:
            raise AssertionError(f"{where}: {entry.exporter.exported} spans, {entry.calls_made} calls")


def _find(series: Sequence[Series], method: str, stack: Stack, tracing: Tracing = "none") -> Series:
    for entry in series:
        if (entry.method, entry.stack, entry.tracing) == (method, stack, tracing):
            return entry
    raise KeyError((method, stack, tracing))


def bench_rows(series: Sequence[Series], title: str = TITLE) -> list[BenchRow]:
    """One row per series, with its added cost and ratio to the bare store."""
    table: list[BenchRow] = []
    for entry in series:
        bare = _find(series, entry.method, "bare").median_us
        median = entry.median_us
        table.append(
            BenchRow(
                section=title,
                method=entry.method,
                variant=entry.variant,
                median_us=median,
                added_us=None if entry.stack == "bare" else median - bare,
                ratio=median / bare,
                low_us=min(entry.samples_us),
                high_us=max(entry.samples_us),
                calls=entry.calls,
            )
        )
    return table


def method_rows(series: Sequence[Series], methods: Sequence[str]) -> list[MethodRow]:
    """The summary: per method and quiet tracing mode, each stack's added cost."""
    summary: list[MethodRow] = []
    for method in methods:
        bare = _find(series, method, "bare").median_us
        for tracing in QUIET_MODES:
            added = {
                stack: _find(series, method, stack, tracing).median_us - bare for stack in HAND_AND_GUARD
            }
            summary.append(
                MethodRow(
                    method=method,
                    tracing=TRACING_LABELS[tracing],
                    bare_us=bare,
                    guard_added_us=added["guard"],
                    lean_added_us=added["lean"],
                    naive_added_us=added["naive"],
                    added_target_us=ADDED_COST_TARGET_US,
                    lean_share_target=LEAN_SHARE_TARGET,
                )
            )
    return summary


def verdicts(series: Sequence[Series], summary: Sequence[MethodRow]) -> list[Verdict]:
    """The issue's three in-memory targets, each with the figures that miss it (or the worst)."""

    def worst(rows: Sequence[MethodRow], key: Callable[[MethodRow], float], unit: str) -> list[str]:
        if not rows:
            return []
        row = max(rows, key=key)
        return [f"worst: {row.method}, {row.tracing}: {key(row):.2f}{unit}"]

    over = [row for row in summary if not row.added_met]
    share = [row for row in summary if not row.share_met]
    found = [
        Verdict(
            target=f"every protocol method adds <= {ADDED_COST_TARGET_US:g} µs/call "
            "(metrics on, spans not recording)",
            passed=not over,
            details=[
                f"{len(over)} of {len(summary)} (method, tracing) medians over",
                *worst(summary, lambda row: row.guard_added_us, " µs"),
            ],
        ),
        Verdict(
            target=f"guard's added cost <= {LEAN_SHARE_TARGET:.2f} of the lean stack's "
            "(same method, same tracing)",
            passed=not share,
            details=[
                f"{len(share)} of {len(summary)} over",
                *worst(summary, lambda row: row.lean_share, "x"),
            ],
        ),
    ]
    open_series = [entry for entry in series if entry.stack == "open"]
    if open_series:
        details = [
            f"{entry.method}: {entry.median_us:.2f} µs/call, outcome {', '.join(entry.outcomes) or '?'} "
            f"{'ok' if entry.median_us <= OPEN_BREAKER_TARGET_US else 'MISSED'}"
            for entry in open_series
        ]
        found.append(
            Verdict(
                target=f"fail-fast read with the breaker open <= {OPEN_BREAKER_TARGET_US:g} µs/call",
                passed=all(entry.median_us <= OPEN_BREAKER_TARGET_US for entry in open_series),
                details=details,
            )
        )
    return found


def global_provider_note() -> list[str]:
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):
        return []
    return [
        f"WARNING: a global tracer provider ({type(provider).__name__}) is set, so the "
        "'no provider' series use it"
    ]


def footer(repetitions: int, budget: float, started: float) -> str:
    return (
        f"median of {repetitions} interleaved repetitions per series (about {budget * 1e3:g} ms each); "
        "added = series median - bare store median; guard/lean added = guard added / lean added; "
        f"bulk save_events carries 10 events; took {time.perf_counter() - started:.0f} s"
    )


async def run(
    repetitions: int = REPETITIONS,
    budget: float = REPETITION_BUDGET,
    most: int = MAX_CALLS,
    methods: Sequence[str] = PROTOCOL_METHODS,
) -> SectionResult:
    """Measure every series; the per-method table, the highlighted series and the verdicts."""
    started = time.perf_counter()
    notes = global_provider_note()
    series = await build_series(methods)
    try:
        await measure(series, repetitions=repetitions, budget=budget, most=most)
    finally:
        for entry in series:
            if entry.closer is not None:
                await entry.closer()
    check(series)
    summary = method_rows(series, methods)
    rows = bench_rows(series)
    highlights = [
        row for row, entry in zip(rows, series, strict=True) if entry.tracing == "on" or entry.stack == "open"
    ]
    notes.append(footer(repetitions, budget, started))
    return SectionResult(
        title=TITLE,
        rows=rows,
        verdicts=verdicts(series, summary),
        notes=notes,
        methods=summary,
        highlights=highlights,
    )


__all__ = ["PROTOCOL_METHODS", "TITLE", "run"]
