"""Batch flush statistics, exposed to Prometheus at scrape time.

A flush only bumps plain integers (no lock, no label lookup): a custom collector turns them into
the ``guarded_batch_size`` and ``guarded_batch_flush_duration_seconds`` histograms by store and
method when Prometheus scrapes, as :mod:`guarded.observability.call_stats` does for calls. A batch of one (a
lone writer under group commit) is the usual flush at low concurrency, so its cost counts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from . import telemetry_names as names
from .call_stats import DurationSeries, format_bound
from .per_registry import PerRegistry, registered


class FlushSeries:
    """The flushes of one (store, method): their sizes and durations."""

    __slots__ = ("_one", "duration", "size")

    def __init__(self) -> None:
        self.size = DurationSeries(names.BATCH_SIZE_BUCKETS)
        self.duration = DurationSeries(names.CALL_DURATION_BUCKETS)
        self._one = bisect_left(names.BATCH_SIZE_BUCKETS, 1)
        """The size bucket of a flush of one write."""

    def observe(self, writes: int, seconds: float) -> None:
        self.size.observe(writes)
        self.duration.observe(seconds)

    def observe_one(self, seconds: float) -> None:
        """:meth:`observe` of a flush of one write (a lone writer's), its size bucket known."""
        size = self.size
        size.counts[self._one] += 1
        size.total += 1
        self.duration.observe(seconds)


class BatchStats:
    """Every batcher's flush statistics in one registry."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], FlushSeries] = {}

    def of(self, store: str, method: str) -> FlushSeries:
        key = (store, method)
        found = self.series.get(key)
        if found is None:
            found = self.series[key] = FlushSeries()
        return found


def _histogram(
    name: str, documentation: str, bounds: tuple[float, ...]
) -> tuple[HistogramMetricFamily, list[str]]:
    family = HistogramMetricFamily(name, documentation, labels=[names.LABEL_STORE, names.LABEL_METHOD])
    return family, [*(format_bound(bound) for bound in bounds), "+Inf"]


class _BatchStatsCollector(Collector):
    def __init__(self, stats: BatchStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        sizes, size_bounds = _histogram(names.BATCH_SIZE, "Writes per batch flush.", names.BATCH_SIZE_BUCKETS)
        durations, duration_bounds = _histogram(
            names.BATCH_FLUSH_DURATION,
            "Time one batch flush took, writer included.",
            names.CALL_DURATION_BUCKETS,
        )
        for key, series in list(self._stats.series.items()):
            sizes.add_metric(list(key), series.size.buckets(size_bounds)[0], series.size.total)
            durations.add_metric(
                list(key), series.duration.buckets(duration_bounds)[0], series.duration.total
            )
        yield sizes
        yield durations

    def describe(self) -> Iterator[Metric]:
        labels = [names.LABEL_STORE, names.LABEL_METHOD]
        yield HistogramMetricFamily(names.BATCH_SIZE, "", labels=labels)
        yield HistogramMetricFamily(names.BATCH_FLUSH_DURATION, "", labels=labels)


batch_stats: PerRegistry[BatchStats] = registered(BatchStats, _BatchStatsCollector)
"""The flush statistics exported through a registry, registered on first use."""
