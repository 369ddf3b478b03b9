"""Idempotency keys of consumes whose answer never arrived, reused by the next consume of the item.

A consume (``load_planner_state``) that timed out or lost its connection may have been committed
by the backend: the pause is then consumed under the guard's idempotency key and nobody got it.
A backend honouring keys (spec 000 consume-once, ``consume_grace``) answers a repeat with the same
key for a while; so the next consume of the same token reuses the key of the unanswered one
instead of drawing a new key that would only ever see ``None``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

DEFAULT_GRACE = 60.0
"""Seconds a key is kept when the backend does not say (PostgresStateStore's ``consume_grace``)."""
MAX_ITEMS = 10_000


class UnansweredConsumes:
    """At most ``max_items`` keys by item, each for ``grace`` seconds (oldest dropped first)."""

    def __init__(
        self,
        grace: float = DEFAULT_GRACE,
        *,
        max_items: int = MAX_ITEMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace = grace
        self._max = max_items
        self._clock = clock
        self._keys: OrderedDict[Hashable, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def key_for(self, item: Hashable) -> str | None:
        """The key of an unanswered consume of ``item`` still within the grace period."""
        found = self._keys.get(item)
        if found is None:
            return None
        key, since = found
        if self._clock() - since > self.grace:
            del self._keys[item]
            return None
        return key

    def remember(self, item: Hashable, key: str) -> None:
        """A consume of ``item`` with ``key`` got no answer."""
        if item not in self._keys:
            self._keys[item] = (key, self._clock())
        if len(self._keys) > self._max:
            self._keys.popitem(last=False)

    def forget(self, item: Hashable) -> None:
        """A consume of ``item`` got a definite answer (the value, or that there is none)."""
        self._keys.pop(item, None)


__all__ = ["DEFAULT_GRACE", "UnansweredConsumes"]
