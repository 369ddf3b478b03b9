"""The stale-if-error cache: the last value this process read or wrote per key, bounded (LRU).

When the backend fails, a read answers from here (outcome ``stale``) instead of an empty
default: without it an outage makes a planner load "no memory" and then save an empty memory
over the real one (DESIGN.md "fallback").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from . import telemetry_names as names
from .store_gauge import store_total_gauge

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
        store_total_gauge(
            REGISTRY if registry is None else registry,
            names.STALE_ENTRIES,
            "Values held for stale-if-error reads.",
            len,
        ).add(self)

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
