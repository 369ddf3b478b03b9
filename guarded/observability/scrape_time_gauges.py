"""Gauges read at scrape time from live objects: by store, summed over sources (batchers, stale
caches ...), and by label values, each read from a function (a breaker's state, a pool's size).

The hot path keeps plain counters on its own objects; when Prometheus scrapes, one collector per
(registry, metric) reads them. Both are registered through
:func:`~guarded.observability.multiprocess_metrics.register_scrape_time`, so they also reach
prometheus-client's multiprocess mode (a ``Gauge.set_function`` does not: its function runs only
in the process that serves the scrape).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import telemetry_names as names
from .multiprocess_metrics import register_scrape_time
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


class ScrapeTimeGauge(Collector):
    """The gauge ``name`` whose series are each a value or a function read at scrape time (as a
    prometheus-client ``Gauge`` with ``set`` and ``set_function``), in multiprocess mode too, where
    a series can also be removed."""

    def __init__(self, name: str, documentation: str, label_names: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.label_names = list(label_names)
        self._functions: dict[tuple[str, ...], Callable[[], float] | float] = {}

    def set(self, label_values: Sequence[str], value: float) -> None:
        """The series of ``label_values`` reads ``value`` from now on."""
        self._functions[tuple(label_values)] = float(value)

    def set_function(self, label_values: Sequence[str], function: Callable[[], float]) -> None:
        """Read the series of ``label_values`` from ``function()`` (which replaces the one before)."""
        self._functions[tuple(label_values)] = function

    def remove(self, label_values: Sequence[str]) -> None:
        """Stop exporting the series of ``label_values``."""
        self._functions.pop(tuple(label_values), None)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for label_values, found in list(self._functions.items()):
            family.add_metric(list(label_values), found if isinstance(found, float) else found())
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, "", labels=self.label_names)


_gauges: PerRegistry[dict[str, Collector]] = PerRegistry(lambda registry: {})
"""Every scrape-time gauge of a registry, by name."""

G = TypeVar("G", bound=Collector)


def _registered_once(registry: CollectorRegistry, name: str, build: Callable[[], G]) -> G:
    """The gauge ``name`` of ``registry``: ``build()`` registered on first use, shared afterwards."""
    by_name = _gauges(registry)
    found = by_name.get(name)
    if found is None:
        found = by_name[name] = build()
        register_scrape_time(registry, found)
    return found  # type: ignore[return-value]  # the name was first built by the same function


def store_total_gauge(
    registry: CollectorRegistry, name: str, documentation: str, value: Callable[[Any], float]
) -> StoreTotalGauge:
    """The store-total gauge ``name`` of ``registry``, registered on first use and shared afterwards."""
    return _registered_once(registry, name, lambda: StoreTotalGauge(name, documentation, value))


def scrape_time_gauge(
    registry: CollectorRegistry, name: str, documentation: str, label_names: Sequence[str]
) -> ScrapeTimeGauge:
    """The scrape-time gauge ``name`` of ``registry``, registered on first use and shared afterwards."""
    return _registered_once(registry, name, lambda: ScrapeTimeGauge(name, documentation, label_names))


__all__ = ["ScrapeTimeGauge", "StoreSource", "StoreTotalGauge", "scrape_time_gauge", "store_total_gauge"]
