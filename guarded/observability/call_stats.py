"""In-process statistics of guarded calls, exposed to Prometheus at scrape time.

The hot path only bumps plain integers (no locks, no label lookups); a custom collector turns
them into the call-duration histogram (with trace-id exemplars), the calls counter and the
retries counter when Prometheus scrapes. Guards run on an event loop, so updates are not
concurrent with each other; a scrape from another thread may see a series mid-update, which at
worst shifts one observation between two consecutive scrapes.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from ..outcome import Outcome
from . import telemetry_names as names
from .per_registry import PerRegistry, registered

_OUTCOMES = tuple(outcome.value for outcome in Outcome)


class DurationSeries:
    """The observations of one histogram series: the latencies of one (store, method, outcome),
    or the sizes or durations of one method's batch flushes (:mod:`guarded.observability.batch_stats`)."""

    __slots__ = ("_bounds", "counts", "exemplars", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.exemplars: list[Exemplar | None] = [None] * (len(bounds) + 1)

    def observe(self, seconds: float, trace_id: str | None = None) -> None:
        index = bisect_left(self._bounds, seconds)
        self.counts[index] += 1
        self.total += seconds
        if trace_id is not None:
            self.exemplars[index] = Exemplar({"trace_id": trace_id}, seconds, time.time())

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self, bounds: list[str]) -> tuple[list[tuple[str, float] | tuple[str, float, Exemplar]], int]:
        """The cumulative buckets of a Prometheus histogram (``bounds``: each ``le``, ``+Inf``
        last), with their exemplars, and the count of observations."""
        cumulative = 0
        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        for bound, count, exemplar in zip(bounds, list(self.counts), list(self.exemplars), strict=True):
            cumulative += count
            buckets.append((bound, cumulative, exemplar) if exemplar else (bound, cumulative))
        return buckets, cumulative


class CallStats:
    """Every guard's call statistics in one registry."""

    def __init__(self, bounds: tuple[float, ...] = names.CALL_DURATION_BUCKETS) -> None:
        self.bounds = bounds
        self.durations: dict[tuple[str, str, str], DurationSeries] = {}
        self.retries: dict[tuple[str, str], int] = {}

    def series(self, store: str, method: str, outcome: str) -> DurationSeries:
        key = (store, method, outcome)
        found = self.durations.get(key)
        if found is None:
            found = self.durations[key] = DurationSeries(self.bounds)
        return found

    def add_retries(self, store: str, method: str, retries: int) -> None:
        key = (store, method)
        self.retries[key] = self.retries.get(key, 0) + retries

    def counts(self, store: str) -> dict[tuple[str, str], int]:
        """Calls of ``store`` by (method, outcome)."""
        return {
            (method, outcome): series.count
            for (name, method, outcome), series in list(self.durations.items())
            if name == store
        }


class _CallStatsCollector(Collector):
    def __init__(self, stats: CallStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        labels = [names.LABEL_STORE, names.LABEL_METHOD, names.LABEL_OUTCOME]
        durations = HistogramMetricFamily(
            names.CALL_DURATION, "Latency of guarded StateStore calls, all attempts included.", labels=labels
        )
        calls = CounterMetricFamily(names.CALLS, "Guarded StateStore calls by outcome.", labels=labels)
        bounds = [*(format_bound(bound) for bound in self._stats.bounds), "+Inf"]
        methods: set[tuple[str, str]] = set()
        for key, series in list(self._stats.durations.items()):
            buckets, count = series.buckets(bounds)
            durations.add_metric(list(key), buckets, series.total)
            calls.add_metric(list(key), count)
            methods.add(key[:2])
        # Every outcome of a method in use reads 0 until it happens, so increase() and rate() see
        # a first failure (a counter series that appears at N shows no increase).
        for store, method in sorted(methods):
            for outcome in _OUTCOMES:
                if (store, method, outcome) not in self._stats.durations:
                    calls.add_metric([store, method, outcome], 0)
        retries = CounterMetricFamily(
            names.RETRIES,
            "Retried attempts of guarded calls.",
            labels=[names.LABEL_STORE, names.LABEL_METHOD],
        )
        retry_counts = self._stats.retries
        for store, method in sorted(methods | set(retry_counts)):
            retries.add_metric([store, method], retry_counts.get((store, method), 0))
        yield durations
        yield calls
        yield retries

    def describe(self) -> Iterator[Metric]:
        labels = [names.LABEL_STORE, names.LABEL_METHOD, names.LABEL_OUTCOME]
        yield HistogramMetricFamily(names.CALL_DURATION, "", labels=labels)
        yield CounterMetricFamily(names.CALLS, "", labels=labels)
        yield CounterMetricFamily(names.RETRIES, "", labels=[names.LABEL_STORE, names.LABEL_METHOD])


def format_bound(bound: float) -> str:
    """A bucket bound as Prometheus writes ``le`` (``1.0``, ``0.005``)."""
    return repr(float(bound))


call_stats: PerRegistry[CallStats] = registered(CallStats, _CallStatsCollector)
"""The call statistics exported through a registry, registered on first use."""
