"""The stale-if-error cache: the last value this process read or wrote per key, bounded (LRU).

When the backend fails, a read answers from here (outcome ``stale``) instead of an empty
default: without it an outage makes a planner load "no memory" and then save an empty memory
over the real one (DESIGN.md "fallback").
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import telemetry_names as names

_MISSING = object()


class StaleCache:
    """At most ``max_entries`` values by key; the least recently used goes first.

    Its size is exported at scrape time as ``guarded_stale_cache_entries{store}`` in ``registry``.
    """

    def __init__(
        self, max_entries: int, *, store_name: str = "default", registry: CollectorRegistry | None = None
    ) -> None:
        self._max = max_entries
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self.store_name = store_name
        _collector_for(REGISTRY if registry is None else registry).caches.add(self)

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._values.get(key, _MISSING)
        if value is _MISSING:
            return default
        self._values.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def put(self, key: Hashable, value: Any) -> None:
        if self._max <= 0:
            return
        values = self._values
        values[key] = value
        values.move_to_end(key)
        if len(values) > self._max:
            values.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        self._values.pop(key, None)


class _EntriesCollector(Collector):
    """``guarded_stale_cache_entries`` by store, summed over the live caches of one registry."""

    def __init__(self) -> None:
        self.caches: weakref.WeakSet[StaleCache] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        totals: dict[str, int] = {}
        for cache in list(self.caches):
            totals[cache.store_name] = totals.get(cache.store_name, 0) + len(cache)
        family = GaugeMetricFamily(
            names.STALE_ENTRIES, "Values held for stale-if-error reads.", labels=[names.LABEL_STORE]
        )
        for store, total in sorted(totals.items()):
            family.add_metric([store], total)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(names.STALE_ENTRIES, "", labels=[names.LABEL_STORE])


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, _EntriesCollector] = weakref.WeakKeyDictionary()


def _collector_for(registry: CollectorRegistry) -> _EntriesCollector:
    found = _collectors.get(registry)
    if found is None:
        found = _collectors[registry] = _EntriesCollector()
        registry.register(found)
    return found
