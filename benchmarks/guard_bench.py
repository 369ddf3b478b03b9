"""Per-call cost of ``guard()`` next to the bare store and next to the same stack composed by hand.

Every series calls one method of its own :class:`~guarded.backends.memory.InMemoryStateStore` in
a tight loop on one event loop. The repetitions of all series are interleaved (repetition 1 of
every series, then repetition 2, ...) so a slow spell of the machine hits all of them alike, and
each series reports its median. "Added" is a series' median minus the bare store's median for
the same method.

Series, for ``load_memory_state`` of a missing key and ``save_event`` of a small event:

* ``bare``: the store's own method.
* ``guard``: ``guard(store)`` with every layer, with no tracer provider (the OpenTelemetry API's
  default: spans never record), with an SDK provider sampling ``ALWAYS_OFF``, and with an SDK
  provider sampling ``ALWAYS_ON`` (recording spans).
* ``naive``: what a competent user writes by hand for the same guarantees (:class:`NaiveGuard`),
  in the same three tracing modes.

Recording spans go to ``SimpleSpanProcessor`` with an exporter that only counts them, so the
numbers are those of creating and ending spans, not of exporting them. After the run every
series is checked: each call counted once by its metrics, each call's span exported when
recording.

The loop yields to the event loop every :data:`YIELD_EVERY` calls, as a real program does
between calls; this lets asyncio purge the cancelled timer handles of ``asyncio.timeout`` and the
guard's watchdog run its tick. The yield costs the same in every series.

``python -m benchmarks.guard_bench --layers`` measures instead what each layer of the guard
costs (the guard without that layer, against the full guard).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
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
from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram
from purgatory import AsyncCircuitBreakerFactory
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from guarded import telemetry_names as names
from guarded.backends.memory import InMemoryStateStore
from guarded.config import GuardConfig
from guarded.guard import GuardCore, guard
from guarded.models import StoredEvent
from guarded.policy import PolicyTable

from .guard_report import BenchRow, SectionResult, Verdict, format_section

TITLE = "guard overhead (in-memory store, per call)"

CALLS = int(os.environ.get("BENCH_GUARD_CALLS", "20000"))
"""Most calls in one repetition of a series."""
MIN_CALLS = 2_000
"""Fewest calls in one repetition of a series."""
REPETITION_BUDGET = float(os.environ.get("BENCH_GUARD_REPETITION_SECONDS", "0.5"))
"""A repetition of a slow series runs fewer than :data:`CALLS` calls to last about this long."""
REPETITIONS = int(os.environ.get("BENCH_GUARD_REPETITIONS", "7"))
"""Repetitions of each series; the median is reported."""
WARMUP_CALLS = 500
YIELD_EVERY = 100
"""The timing loop yields to the event loop after this many calls."""

ADDED_COST_TARGET_US = 10.0
"""Target 1: the guard's added cost per call while spans are not recording."""
NAIVE_RATIO_TARGET = 3.0
"""Target 2: the naive stack's added cost over the guard's, at least."""

STORE_NAME = "bench"
ATTEMPT_TIMEOUT = 2.0
"""The naive stack's per-attempt timeout (the guard's default ``timeout.attempt``)."""

_FIRST_BACKOFF = (
    "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter).parameters else "initial"
)
"""tenacity 9.2 renamed ``initial`` (now deprecated) to ``multiplier``; 8.x only knows ``initial``."""

Tracing = Literal["none", "off", "on"]
Stack = Literal["bare", "guard", "naive"]
AsyncMethod = Callable[..., Awaitable[Any]]

TRACING_MODES: tuple[Tracing, ...] = ("none", "off", "on")
QUIET_MODES: tuple[Tracing, ...] = ("none", "off")
"""Tracing modes in which spans do not record (target 1 and target 2 apply)."""
TRACING_LABELS: dict[Tracing, str] = {
    "none": "no tracer provider",
    "off": "SDK ALWAYS_OFF",
    "on": "SDK ALWAYS_ON (recording)",
}

EVENT = StoredEvent(
    trace_id="bench-trace",
    ts=1_700_000_000.0,
    kind="node_start",
    node_name="planner",
    node_id="node-1",
    payload={"step": 1, "ok": True},
)
"""The small event ``save_event`` stores (the store keeps one copy: repeats are idempotent)."""

METHODS: dict[str, tuple[Any, ...]] = {
    "load_memory_state": ("missing-key",),
    "save_event": (EVENT,),
}
"""Benchmarked methods and their arguments."""


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


class NaiveGuard:
    """The guard's guarantees composed by hand from packages, the obvious way.

    Per call: an OpenTelemetry CLIENT span (``start_as_current_span``), a try/except returning the
    fallback, a ``purgatory`` circuit breaker, tenacity retries (``stop_after_attempt(3)``,
    ``wait_exponential_jitter``; a ``copy()`` of the pre-built ``AsyncRetrying`` per call, which is
    what tenacity's own ``@retry`` does, since one ``AsyncRetrying`` holds the state of one call),
    ``asyncio.timeout`` per attempt, then a labelled ``prometheus_client`` Histogram observation
    and Counter increment. Tracer, instruments, breaker and retry configuration are built once.
    Layers nest in the guard's order: span, metrics, fallback, breaker, retry, timeout.
    """

    def __init__(
        self,
        store: object,
        *,
        name: str,
        registry: CollectorRegistry,
        provider: TracerProvider | None,
        breakers: AsyncCircuitBreakerFactory,
    ) -> None:
        self._store = store
        self._name = name
        self._tracer = trace.get_tracer("bench.naive", tracer_provider=provider)
        labels = ["store", "method", "outcome"]
        self._duration = Histogram(
            "naive_store_call_duration_seconds",
            "Latency of store calls.",
            labels,
            registry=registry,
            buckets=names.CALL_DURATION_BUCKETS,
        )
        self._calls = Counter("naive_store_calls", "Store calls by outcome.", labels, registry=registry)
        self._breakers = breakers
        self._retrying = AsyncRetrying(
            stop=stop_after_attempt(3),
            wait=wait_exponential_jitter(max=1.0, jitter=0.05, **{_FIRST_BACKOFF: 0.05}),
            retry=retry_if_exception_type((OSError, TimeoutError)),
            reraise=True,
        )

    async def method(self, method: str, fallback: Callable[[], Any]) -> AsyncMethod:
        """The hand-guarded version of ``store.method``."""
        target: AsyncMethod = getattr(self._store, method)
        breaker = await self._breakers.get_breaker(self._name)
        retrying = self._retrying
        tracer = self._tracer
        duration, calls = self._duration, self._calls
        store = self._name
        attributes = {"db.operation.name": method, "guarded.store": store}
        clock = time.perf_counter

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            with tracer.start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes) as span:
                started = clock()
                outcome = "ok"
                try:
                    async with breaker:
                        async for attempt in retrying.copy():
                            with attempt:
                                async with asyncio.timeout(ATTEMPT_TIMEOUT):
                                    result = await target(*args, **kwargs)
                except Exception as exc:
                    outcome = "fallback"
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                    result = fallback()
                duration.labels(store, method, outcome).observe(clock() - started)
                calls.labels(store, method, outcome).inc()
                span.set_attribute("guarded.outcome", outcome)
                return result

        return guarded


@dataclass
class Series:
    """One measured callable: (method, stack, tracing mode), or a stack of the layer breakdown."""

    method: str
    stack: Stack
    tracing: Tracing
    call: AsyncMethod
    args: tuple[Any, ...]
    registry: CollectorRegistry | None = None
    exporter: CountingExporter | None = None
    label: str | None = None
    calls: int = 0
    """Calls per repetition, set by the warm-up."""
    samples_us: list[float] = field(default_factory=list)
    calls_made: int = 0

    @property
    def variant(self) -> str:
        if self.label is not None:
            return self.label
        return "bare store" if self.stack == "bare" else f"{self.stack}, {TRACING_LABELS[self.tracing]}"

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)


async def build_series() -> list[Series]:
    """Every series of the comparison, each over its own store, registry and tracer provider."""
    series: list[Series] = []
    for method, args in METHODS.items():
        bare = InMemoryStateStore()
        series.append(Series(method, "bare", "none", getattr(bare, method), args))
        for tracing in TRACING_MODES:
            registry = CollectorRegistry()
            provider, exporter = tracer_provider(tracing)
            proxy = guard(InMemoryStateStore(), name=STORE_NAME, registry=registry, tracer_provider=provider)
            series.append(Series(method, "guard", tracing, getattr(proxy, method), args, registry, exporter))
        for tracing in TRACING_MODES:
            registry = CollectorRegistry()
            provider, exporter = tracer_provider(tracing)
            naive = NaiveGuard(
                InMemoryStateStore(),
                name=STORE_NAME,
                registry=registry,
                provider=provider,
                breakers=AsyncCircuitBreakerFactory(),
            )
            call = await naive.method(method, fallback=lambda: None)
            series.append(Series(method, "naive", tracing, call, args, registry, exporter))
    return series


async def time_calls(call: AsyncMethod, args: tuple[Any, ...], calls: int) -> float:
    """Microseconds per ``await call(*args)``, over ``calls`` calls (a multiple of :data:`YIELD_EVERY`).

    Collects garbage first, and keeps the collector off while timing.
    """
    batches = max(1, calls // YIELD_EVERY)
    per_batch = range(YIELD_EVERY)
    sleep = asyncio.sleep
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        started = time.perf_counter()
        for _ in range(batches):
            for _ in per_batch:
                await call(*args)
            await sleep(0)
        elapsed = time.perf_counter() - started
    finally:
        if was_enabled:
            gc.enable()
    return elapsed / (batches * YIELD_EVERY) * 1e6


def calls_for(estimate_us: float, most: int) -> int:
    """Calls per repetition: ``most``, or fewer (not under :data:`MIN_CALLS`) to fit the budget."""
    fitting = int(REPETITION_BUDGET * 1e6 / max(estimate_us, 1e-3))
    calls = min(most, max(MIN_CALLS, fitting))
    return max(YIELD_EVERY, calls // YIELD_EVERY * YIELD_EVERY)


async def measure(series: Sequence[Series], *, calls: int, repetitions: int) -> None:
    """Warm up and size each series, then fill their samples, interleaving the repetitions."""
    for entry in series:
        for _ in range(WARMUP_CALLS):
            await entry.call(*entry.args)
        entry.calls = calls_for(await time_calls(entry.call, entry.args, WARMUP_CALLS), calls)
        entry.calls_made += WARMUP_CALLS * 2
    for _ in range(repetitions):
        for entry in series:
            entry.samples_us.append(await time_calls(entry.call, entry.args, entry.calls))
            entry.calls_made += entry.calls


SUCCESS_OUTCOMES = frozenset({"ok", "not_found"})
"""Outcomes of a call that reached the store and succeeded (guard and naive labels alike)."""


def _calls_counted(registry: CollectorRegistry, sample_name: str) -> dict[str, float]:
    counted: dict[str, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == sample_name and sample.value:  # outcomes that never happened read 0
                outcome = sample.labels["outcome"]
                counted[outcome] = counted.get(outcome, 0.0) + sample.value
    return counted


def check(series: Sequence[Series]) -> None:
    """Fail loudly when a stack skipped its work or fell back: every call counted once as a
    success by its metrics, and every call's span exported when spans record."""
    for entry in series:
        where = f"{entry.method} / {entry.variant}"
        if entry.registry is not None:
            metric = names.CALLS if entry.stack == "guard" else "naive_store_calls"
            counted = _calls_counted(entry.registry, metric + "_total")
            succeeded = sum(count for outcome, count in counted.items() if outcome in SUCCESS_OUTCOMES)
            if succeeded != entry.calls_made or len(counted) != 1:
                raise AssertionError(f"{where}: {entry.calls_made} calls made, counted by outcome: {counted}")
        if entry.exporter is not None and entry.exporter.exported != entry.calls_made:
            raise AssertionError(f"{where}: {entry.exporter.exported} spans, {entry.calls_made} calls")


def _find(series: Sequence[Series], method: str, stack: Stack, tracing: Tracing) -> Series:
    for entry in series:
        if (entry.method, entry.stack, entry.tracing) == (method, stack, tracing) and entry.label is None:
            return entry
    raise KeyError((method, stack, tracing))


def rows(series: Sequence[Series]) -> list[BenchRow]:
    """One table row per series, with its added cost and ratio to the bare store."""
    table: list[BenchRow] = []
    for entry in series:
        bare = _find(series, entry.method, "bare", "none").median_us
        median = entry.median_us
        table.append(
            BenchRow(
                section=TITLE,
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


def verdicts(series: Sequence[Series]) -> list[Verdict]:
    """Target 1 (the guard's added cost) and target 2 (the guard against the naive stack)."""
    added_details: list[str] = []
    added_ok = True
    for method in METHODS:
        bare = _find(series, method, "bare", "none").median_us
        for tracing in QUIET_MODES:
            added = _find(series, method, "guard", tracing).median_us - bare
            ok = added <= ADDED_COST_TARGET_US
            added_ok &= ok
            added_details.append(
                f"{method}, {TRACING_LABELS[tracing]}: +{added:.2f} µs {'ok' if ok else 'OVER'}"
            )
    result = [
        Verdict(
            target=f"target 1: guard adds <= {ADDED_COST_TARGET_US:g} µs/call over bare, spans not recording",
            passed=added_ok,
            details=added_details,
        )
    ]
    for modes, scope in ((QUIET_MODES, "spans not recording"), (("on",), "recording spans, informational")):
        details: list[str] = []
        ok_all = True
        for method in METHODS:
            bare = _find(series, method, "bare", "none").median_us
            for tracing in modes:
                guarded = _find(series, method, "guard", tracing).median_us
                naive = _find(series, method, "naive", tracing).median_us
                added_ratio = (naive - bare) / (guarded - bare) if guarded > bare else float("inf")
                ok = added_ratio >= NAIVE_RATIO_TARGET
                ok_all &= ok
                details.append(
                    f"{method}, {TRACING_LABELS[tracing]}: added-cost ratio {naive - bare:.2f} / "
                    f"{guarded - bare:.2f} = {added_ratio:.1f}x {'ok' if ok else 'UNDER'}; "
                    f"total-time ratio {naive:.2f} / {guarded:.2f} = {naive / guarded:.2f}x"
                )
        result.append(
            Verdict(
                target=(
                    f"target 2: guard >= {NAIVE_RATIO_TARGET:g}x cheaper than naive by added cost, "
                    f"(naive - bare) / (guard - bare); {scope}"
                ),
                passed=ok_all,
                details=details,
            )
        )
    return result


def _global_provider_note() -> list[str]:
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):
        return []
    return [
        f"WARNING: a global tracer provider ({type(provider).__name__}) is set, so the "
        "'no tracer provider' series use it"
    ]


def _footer(repetitions: int, started: float) -> str:
    return (
        f"median of {repetitions} interleaved repetitions per series, min..max alongside; "
        f"calls = calls per repetition (up to {CALLS}, fewer for slow series: about "
        f"{REPETITION_BUDGET:g} s per repetition); added = median - bare median; "
        f"x bare = median / bare median; took {time.perf_counter() - started:.0f} s"
    )


async def run(calls: int = CALLS, repetitions: int = REPETITIONS) -> SectionResult:
    """Measure every series of the comparison; the table and the verdicts."""
    started = time.perf_counter()
    notes = _global_provider_note()
    series = await build_series()
    await measure(series, calls=calls, repetitions=repetitions)
    check(series)
    notes.append(_footer(repetitions, started))
    return SectionResult(title=TITLE, rows=rows(series), verdicts=verdicts(series), notes=notes)


# --- layer breakdown ------------------------------------------------------------------------------


def _core_args() -> dict[str, Any]:
    return {
        "name": STORE_NAME,
        "config": GuardConfig(),
        "policies": PolicyTable.for_state_store(),
        "registry": CollectorRegistry(),
        "tracer_provider": None,
        "extra_layers": (),
    }


def _guard_method(method: str, *, without: str | None, provider: TracerProvider | None) -> AsyncMethod:
    """``method`` of a fresh guarded store whose layer chain lacks the layer class named ``without``
    (``"*"``: no layer at all, only the guard's entry point and the call to the store)."""
    core = GuardCore(InMemoryStateStore(), **{**_core_args(), "tracer_provider": provider})
    core.layers = [layer for layer in core.layers if without not in ("*", type(layer).__name__)]
    return core.build_method(method)


async def run_layers(calls: int = CALLS, repetitions: int = REPETITIONS) -> SectionResult:
    """What each layer costs: the full guard against the guard without that layer."""
    started = time.perf_counter()
    layer_names = [type(layer).__name__ for layer in GuardCore(InMemoryStateStore(), **_core_args()).layers]
    series: list[Series] = []
    for method, args in METHODS.items():
        series.append(Series(method, "bare", "none", getattr(InMemoryStateStore(), method), args))
        for label, without, provider in [
            ("guard, every layer", None, None),
            ("guard, every layer, SDK ALWAYS_OFF", None, TracerProvider(sampler=ALWAYS_OFF)),
            ("guard entry point only, no layer", "*", None),
            *((f"guard without {name}", name, None) for name in layer_names),
        ]:
            call = _guard_method(method, without=without, provider=provider)
            series.append(Series(method, "guard", "none", call, args, label=label))
    await measure(series, calls=calls, repetitions=repetitions)
    notes: list[str] = []
    for method in METHODS:
        of_method = [entry for entry in series if entry.method == method]
        full = next(entry for entry in of_method if entry.label == "guard, every layer").median_us
        costs = ", ".join(
            f"{name} {full - next(e for e in of_method if e.label == f'guard without {name}').median_us:+.2f}"
            for name in layer_names
        )
        notes.append(f"{method}: cost of each layer (full guard - guard without it), µs: {costs}")
    notes.append(_footer(repetitions, started))
    return SectionResult(title=f"{TITLE}: layer breakdown", rows=rows(series), notes=notes)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.guard_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--layers", action="store_true", help="measure the cost of each layer instead")
    options = parser.parse_args()
    result = asyncio.run(run_layers() if options.layers else run())
    print(format_section(result))


if __name__ == "__main__":
    main()
