"""Keys of consumes whose answer never reached their caller, recovered once by the next consume.

A consume (``load_planner_state``) that timed out, was cancelled or lost its connection may have
been committed by the backend: the pause is then consumed under the guard's idempotency key and
nobody got it. The key is never given to another caller (a backend answers a repeat of a key
again, so a shared key would hand the payload to everyone who used it). Instead the guard keeps
the key here, and the next consume of the same item *claims* every key kept for it -- one consume
at a time: concurrent consumes find nothing to claim -- and passes them to the backend
(:data:`guarded.backend.UNANSWERED_KEYS`). A backend that recovers them moves an item
consumed under one of those keys to the claiming consume's own key, atomically: the payload goes
to exactly one caller. The claim is settled when that consume ends: answered, the keys are spent;
unanswered, they are kept again (with the claiming consume's own key when it may have committed).

Only keys the guard drew are kept: a key the caller set is the caller's to retry with.
Keys are kept for the backend's grace period (``consume_grace``), after which the backend forgets
the consume too.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

DEFAULT_GRACE = 60.0
"""Seconds a key is kept when the backend does not say (PostgresStateStore's ``consume_grace``)."""
MAX_ITEMS = 10_000
MAX_KEYS = 16
"""Keys kept per item: each is a resume of the item that got no answer, the oldest dropped first."""

Unanswered = tuple[str, float]
"""A key and the clock time its consume ended without an answer."""


class UnansweredConsumes:
    """At most ``max_items`` items (oldest dropped first), each with at most ``max_keys`` keys kept
    for ``grace`` seconds."""

    def __init__(
        self,
        grace: float = DEFAULT_GRACE,
        *,
        max_items: int = MAX_ITEMS,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace = grace
        self._max = max_items
        self._max_keys = max_keys
        self._clock = clock
        self._keys: OrderedDict[Hashable, list[Unanswered]] = OrderedDict()

    def __len__(self) -> int:
        """Items with kept keys (some may have outlived the grace period)."""
        return len(self._keys)

    def _live(self, kept: Sequence[Unanswered]) -> list[Unanswered]:
        oldest = self._clock() - self.grace
        return [(key, since) for key, since in kept if since >= oldest]

    def keys_for(self, item: Hashable) -> tuple[str, ...]:
        """The kept keys of ``item`` within the grace period (nothing is claimed)."""
        return tuple(key for key, _ in self._live(self._keys.get(item, ())))

    def claim(self, item: Hashable) -> tuple[Unanswered, ...]:
        """Take every kept key of ``item`` within the grace period: the caller's consume recovers
        them; it must :meth:`restore` them unless it got an answer. Until then nobody else gets
        them."""
        kept = self._keys.pop(item, None)
        return tuple(self._live(kept)) if kept else ()

    def restore(self, item: Hashable, claimed: Sequence[Unanswered]) -> None:
        """The consume that claimed ``claimed`` got no answer: keep them again."""
        for key, since in claimed:
            self._add(item, key, since)

    def remember(self, item: Hashable, key: str) -> None:
        """A consume of ``item`` with ``key`` (a key the guard drew) got no answer."""
        self._add(item, key, self._clock())

    def _add(self, item: Hashable, key: str, since: float) -> None:
        kept = self._keys.get(item)
        if kept is None:
            kept = self._keys[item] = []
            if len(self._keys) > self._max:
                self._keys.popitem(last=False)
        if all(key != other for other, _ in kept):
            kept.append((key, since))
            kept.sort(key=lambda entry: entry[1])
            del kept[: max(0, len(kept) - self._max_keys)]


__all__ = ["DEFAULT_GRACE", "MAX_KEYS", "Unanswered", "UnansweredConsumes"]
