"""The guard's guarantees written by hand, as references for its added cost.

* :class:`LeanGuard`: the least a careful user writes: a retry loop, ``asyncio.timeout`` per
  attempt, an OpenTelemetry span and a ``prometheus_client`` histogram. No breaker, no fallback.
* :class:`NaiveGuard`: the same composed from packages the obvious way: tenacity retries,
  a ``purgatory`` circuit breaker, a fallback, a span, a histogram and a counter.

Both nest their layers in the guard's order (span, metrics, fallback, breaker, retry, timeout) and
build tracer, instruments and configuration once; only per-call work is timed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram
from purgatory import AsyncCircuitBreakerFactory
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from guarded.observability import telemetry_names as names

AsyncMethod = Callable[..., Awaitable[Any]]

ATTEMPTS = 3
ATTEMPT_TIMEOUT = 2.0
"""Per-attempt timeout (the guard's default ``timeout.attempt``)."""
FIRST_BACKOFF = 0.05
RETRYABLE: tuple[type[BaseException], ...] = (OSError, TimeoutError)
LABELS = ["store", "method", "outcome"]

LEAN_CALLS = "lean_store_call_duration_seconds_count"
"""The sample that counts the lean stack's calls, by outcome."""
NAIVE_CALLS = "naive_store_calls_total"
"""The sample that counts the naive stack's calls, by outcome."""

_FIRST_BACKOFF = (
    "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter).parameters else "initial"
)
"""tenacity 9.2 renamed ``initial`` (now deprecated) to ``multiplier``; 8.x only knows ``initial``."""


class LeanGuard:
    """A retry loop, ``asyncio.timeout``, a span and a histogram, written by hand.

    Per call: ``start_as_current_span`` (CLIENT, two attributes: the usual idiom, so that a
    driver's own spans nest under it), up to :data:`ATTEMPTS` attempts each under
    ``asyncio.timeout`` with exponential backoff between them, then one histogram observation on
    the child of its outcome (``ok`` or ``error``), both children bound once per method.
    """

    def __init__(
        self, store: object, *, name: str, registry: CollectorRegistry, provider: TracerProvider | None
    ) -> None:
        self._store = store
        self._name = name
        self._tracer = trace.get_tracer("bench.lean", tracer_provider=provider)
        self._duration = Histogram(
            "lean_store_call_duration_seconds",
            "Latency of store calls.",
            LABELS,
            registry=registry,
            buckets=names.CALL_DURATION_BUCKETS,
        )

    def method(self, method: str) -> AsyncMethod:
        target: AsyncMethod = getattr(self._store, method)
        tracer, store = self._tracer, self._name
        succeeded = self._duration.labels(store, method, "ok")
        failed = self._duration.labels(store, method, "error")
        attributes = {"db.operation.name": method, "guarded.store": store}
        clock = time.perf_counter

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            with tracer.start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes):
                started = clock()
                observe = succeeded.observe
                try:
                    for attempt in range(ATTEMPTS):
                        try:
                            async with asyncio.timeout(ATTEMPT_TIMEOUT):
                                return await target(*args, **kwargs)
                        except RETRYABLE:
                            if attempt + 1 == ATTEMPTS:
                                raise
                            await asyncio.sleep(FIRST_BACKOFF * 2**attempt)
                    raise AssertionError("unreachable")
                except BaseException:
                    observe = failed.observe
                    raise
                finally:
                    observe(clock() - started)

        return guarded


class NaiveGuard:
    """The guard's guarantees composed by hand from packages, the obvious way.

    Per call: an OpenTelemetry CLIENT span (``start_as_current_span``), a try/except returning the
    fallback, a ``purgatory`` circuit breaker, tenacity retries (``stop_after_attempt(3)``,
    ``wait_exponential_jitter``; a ``copy()`` of the pre-built ``AsyncRetrying`` per call, which is
    what tenacity's own ``@retry`` does, since one ``AsyncRetrying`` holds the state of one call),
    ``asyncio.timeout`` per attempt, then a labelled ``prometheus_client`` Histogram observation
    and Counter increment.
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
        self._duration = Histogram(
            "naive_store_call_duration_seconds",
            "Latency of store calls.",
            LABELS,
            registry=registry,
            buckets=names.CALL_DURATION_BUCKETS,
        )
        self._calls = Counter("naive_store_calls", "Store calls by outcome.", LABELS, registry=registry)
        self._breakers = breakers
        self._retrying = AsyncRetrying(
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_exponential_jitter(max=1.0, jitter=0.05, **{_FIRST_BACKOFF: FIRST_BACKOFF}),
            retry=retry_if_exception_type(RETRYABLE),
            reraise=True,
        )

    async def method(self, method: str, fallback: Callable[[], Any] = lambda: None) -> AsyncMethod:
        """The hand-guarded version of ``store.method``."""
        target: AsyncMethod = getattr(self._store, method)
        breaker = await self._breakers.get_breaker(self._name)
        retrying, tracer = self._retrying, self._tracer
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


__all__ = ["LEAN_CALLS", "NAIVE_CALLS", "LeanGuard", "NaiveGuard"]
