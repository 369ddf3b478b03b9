"""Gauges by store read at scrape time from live objects (batchers, stale caches ...).

The hot path keeps plain counters on its own objects; when Prometheus scrapes, one collector per
(registry, metric) sums ``value(source)`` over the sources still alive, by ``source.store_name``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import telemetry_names as names
from .per_registry import PerRegistry


class StoreSource(Protocol):
    """Anything that belongs to one store."""

    @property
    def store_name(self) -> str: ...


class StoreTotalGauge(Collector):
    """The gauge ``name`` by store: the sum of ``value(source)`` over the live :attr:`sources`."""

    def __init__(self, name: str, documentation: str, value: Callable[[Any], float]) -> None:
        self.name = name
        self.documentation = documentation
        self.value = value
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, source: StoreSource) -> None:
        """Count ``source`` until it is garbage-collected."""
        self.sources.add(source)

    def collect(self) -> Iterator[Metric]:
        totals: dict[str, float] = {}
        for source in list(self.sources):
            totals[source.store_name] = totals.get(source.store_name, 0) + self.value(source)
        family = GaugeMetricFamily(self.name, self.documentation, labels=[names.LABEL_STORE])
        for store, total in sorted(totals.items()):
            family.add_metric([store], total)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, "", labels=[names.LABEL_STORE])


_gauges: PerRegistry[dict[str, StoreTotalGauge]] = PerRegistry(lambda registry: {})


def store_total_gauge(
    registry: CollectorRegistry, name: str, documentation: str, value: Callable[[Any], float]
) -> StoreTotalGauge:
    """The gauge ``name`` of ``registry``, registered on first use and shared afterwards."""
    by_name = _gauges(registry)
    found = by_name.get(name)
    if found is None:
        found = by_name[name] = StoreTotalGauge(name, documentation, value)
        registry.register(found)
    return found


__all__ = ["StoreSource", "StoreTotalGauge", "store_total_gauge"]
