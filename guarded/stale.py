"""The stale-if-error cache: the last value this process read or wrote per key, bounded (LRU).

When the backend fails, a read answers from here (outcome ``stale``) instead of an empty
default: without it an outage makes a planner load "no memory" and then save an empty memory
over the real one (DESIGN.md "fallback").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

_MISSING = object()


class StaleCache:
    """At most ``max_entries`` values by key; the least recently used goes first."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._values: OrderedDict[Hashable, Any] = OrderedDict()

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
