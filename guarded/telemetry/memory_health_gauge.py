"""Memory health: how many memory keys this process last saw in each ``health`` state.

PenguiFlow's short-term memory persists its summarisation health (``healthy``, ``retry``,
``degraded``, ``recovering``; spec 003 "Summarization Failure Handling") in the ``health`` field of
the state it saves with ``save_memory_state(key, state)``. The tracker remembers the last health
seen per key and exports ``guarded_memory_health_keys`` by store and health, never by key.

* A ``health`` outside the four states (or not a string) counts as ``unknown``.
* A state without a ``health`` field (PenguiFlow's session key-value store also uses
  ``save_memory_state``), or ``None`` from a load, is not a memory-health state: the key stops
  being counted.
* At most ``max_keys`` keys are remembered per store; beyond that the least recently seen key is
  forgotten and simply stops being counted.

Counts are plain integers turned into the gauge when Prometheus scrapes (like the call
statistics): updates happen on the event loop and cost a few dictionary operations.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping
from enum import Enum

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..observability import telemetry_names as names
from ..observability.per_registry import PerRegistry, registered

logger = logging.getLogger("guarded.telemetry")

UNKNOWN = names.MEMORY_HEALTH_UNKNOWN
"""The ``health`` label value of a state whose health is none of the known states."""
HEALTH_VALUES: tuple[str, ...] = (*names.MEMORY_HEALTH_STATES, UNKNOWN)
"""Every ``health`` label value; each is exported for every store, 0 included."""
DEFAULT_MAX_KEYS = 100_000

_KNOWN = frozenset(names.MEMORY_HEALTH_STATES)
_ABSENT = object()


def health_of(state: object) -> str | None:
    """The ``health`` label value of a memory ``state``; ``None`` when it carries no health."""
    if type(state) is dict:  # what PenguiFlow saves and loads: no Mapping ABC check on the hot path
        health = state.get("health", _ABSENT)
    elif isinstance(state, Mapping):
        try:
            health = state.get("health", _ABSENT)
        except Exception:
            return UNKNOWN
    else:
        return None
    if health is _ABSENT:
        return None
    if type(health) is str:
        return health if health in _KNOWN else UNKNOWN
    if isinstance(health, Enum):
        health = health.value
    return health if isinstance(health, str) and health in _KNOWN else UNKNOWN


class MemoryHealthTracker:
    """The last health seen per memory key of one store, at most ``max_keys`` keys (LRU)."""

    def __init__(self, store: str, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys}")
        self.store = store
        self._max = max_keys
        self._health: OrderedDict[Hashable, str] = OrderedDict()
        self._counts: dict[str, int] = dict.fromkeys(HEALTH_VALUES, 0)
        self.forgotten = 0
        """Keys forgotten because more than ``max_keys`` were tracked."""

    def __len__(self) -> int:
        return len(self._health)

    def counts(self) -> dict[str, int]:
        """Keys by health label value (every value present, 0 included)."""
        return dict(self._counts)

    def observe(self, key: object, state: object) -> None:
        """Record that ``key`` now holds ``state`` (saved and acknowledged, or loaded)."""
        tracked = self._health
        try:
            previous = tracked.get(key)
        except TypeError:  # an unhashable key
            return
        health = health_of(state)
        counts = self._counts
        if health is None:
            if previous is not None:
                del tracked[key]
                counts[previous] -= 1
            return
        if previous is None:
            tracked[key] = health
            counts[health] += 1
            if len(tracked) > self._max:
                _, oldest = tracked.popitem(last=False)
                counts[oldest] -= 1
                self._forget_one()
            return
        tracked.move_to_end(key)
        if previous != health:
            tracked[key] = health
            counts[previous] -= 1
            counts[health] += 1

    def _forget_one(self) -> None:
        self.forgotten += 1
        if self.forgotten == 1:
            logger.warning(
                "memory health of store %r: more than %d memory keys, the least recently seen are "
                "no longer counted",
                self.store,
                self._max,
                extra={"event": "memory_health_keys_capped", "store": self.store, "max_keys": self._max},
            )


class _MemoryHealthCollector(Collector):
    def __init__(self) -> None:
        self.trackers: dict[str, MemoryHealthTracker] = {}

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for store, tracker in list(self.trackers.items()):
            for health, count in tracker.counts().items():
                family.add_metric([store, health], count)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            names.MEMORY_HEALTH_KEYS,
            "Memory keys whose last saved or loaded state this process saw in each health state.",
            labels=[names.LABEL_STORE, names.LABEL_HEALTH],
        )


_collector_for: PerRegistry[_MemoryHealthCollector] = registered(_MemoryHealthCollector)


def memory_health_tracker(
    store: str, registry: CollectorRegistry = REGISTRY, *, max_keys: int = DEFAULT_MAX_KEYS
) -> MemoryHealthTracker:
    """The tracker of ``store`` exported through ``registry`` (shared by every guard of that
    name on that registry; ``max_keys`` applies when it is created)."""
    collector = _collector_for(registry)
    tracker = collector.trackers.get(store)
    if tracker is None:
        tracker = collector.trackers[store] = MemoryHealthTracker(store, max_keys=max_keys)
    return tracker
