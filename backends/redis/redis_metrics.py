"""The Redis backend's metrics: per node memory used and ``maxmemory``, evicted and expired keys,
connected clients, a sampled ``PING`` round trip, whether the node answered and failed commands by
node; per store the pauses saved and consumed.

Metric names come from :data:`guarded.backend.metric_names` (one source of truth with the
dashboards). Metric families are created once per Prometheus registry and shared by every store
that uses that registry; each store owns the children labelled with its ``store`` name and removes
them on close. Labels are bounded: the store name is operator-chosen, a node is ``host:port`` of a
server of the deployment (bounded by the cluster's size), error kinds are a fixed set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from guarded.backend import PerRegistry, ScrapeTimeGauge, forget_series, scrape_time_gauge
from guarded.backend import metric_names as names

PING_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""A PING on a healthy network is tens to hundreds of microseconds; the tail shows a busy server."""

_STORE = (names.LABEL_STORE,)
_NODE = (names.LABEL_STORE, names.LABEL_NODE)


@dataclass(frozen=True, slots=True)
class RedisMetricFamilies:
    """The Redis backend's metric families in one registry."""

    memory_used: ScrapeTimeGauge
    maxmemory: ScrapeTimeGauge
    evicted_keys: Counter
    expired_keys: Counter
    connected_clients: ScrapeTimeGauge
    ping_seconds: Histogram
    node_up: ScrapeTimeGauge
    node_errors: Counter
    sample_timestamp: ScrapeTimeGauge
    pauses_saved: Counter
    pauses_consumed: Counter


def _families(registry: CollectorRegistry) -> RedisMetricFamilies:
    return RedisMetricFamilies(
        memory_used=scrape_time_gauge(
            registry,
            names.GUARDED_REDIS_MEMORY_USED_BYTES,
            "Memory the Redis node uses (INFO used_memory).",
            _NODE,
        ),
        maxmemory=scrape_time_gauge(
            registry,
            names.GUARDED_REDIS_MAXMEMORY_BYTES,
            "The Redis node's maxmemory (0: no limit).",
            _NODE,
        ),
        evicted_keys=Counter(
            names.GUARDED_REDIS_EVICTED_KEYS_TOTAL,
            "Keys the Redis node evicted at maxmemory since the store began sampling it.",
            _NODE,
            registry=registry,
        ),
        expired_keys=Counter(
            names.GUARDED_REDIS_EXPIRED_KEYS_TOTAL,
            "Keys whose TTL ran out on the Redis node since the store began sampling it.",
            _NODE,
            registry=registry,
        ),
        connected_clients=scrape_time_gauge(
            registry,
            names.GUARDED_REDIS_CONNECTED_CLIENTS,
            "Client connections open on the Redis node (every client's).",
            _NODE,
        ),
        ping_seconds=Histogram(
            names.GUARDED_REDIS_PING_SECONDS,
            "Round trip of a sampled PING to the Redis node.",
            _NODE,
            buckets=PING_BUCKETS,
            registry=registry,
        ),
        node_up=scrape_time_gauge(
            registry,
            names.GUARDED_REDIS_NODE_UP,
            "1 when the Redis node answered the last sample, 0 when it did not.",
            _NODE,
        ),
        node_errors=Counter(
            names.GUARDED_REDIS_NODE_ERRORS_TOTAL,
            "Failed commands by the Redis node that failed them and kind.",
            (*_NODE, names.LABEL_REDIS_ERROR_KIND),
            registry=registry,
        ),
        sample_timestamp=scrape_time_gauge(
            registry,
            names.GUARDED_REDIS_SAMPLE_TIMESTAMP,
            "Unix time of the last sample in which every Redis node answered.",
            _STORE,
        ),
        pauses_saved=Counter(
            names.GUARDED_REDIS_PAUSES_SAVED_TOTAL,
            "Planner pauses the store saved to Redis.",
            _STORE,
            registry=registry,
        ),
        pauses_consumed=Counter(
            names.GUARDED_REDIS_PAUSES_CONSUMED_TOTAL,
            "Planner pauses a resume consumed from Redis.",
            _STORE,
            registry=registry,
        ),
    )


families_for: PerRegistry[RedisMetricFamilies] = PerRegistry(_families)
"""The metric families registered in a registry (created on first use)."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What one sample read from a node's ``INFO``."""

    used_memory: int
    maxmemory: int
    evicted_keys: int
    expired_keys: int
    connected_clients: int


class RedisStoreMetrics:
    """The metric children of one Redis store (labelled with its name, and each node's address).

    Every series of a node is exported from its first sample on, the counters at zero, so a
    panel shows a rate of none and an ``increase()`` sees the first eviction or error. The
    pause counters are exported at zero from the start.
    """

    def __init__(self, *, store: str, registry: CollectorRegistry | None = None) -> None:
        self.families = families_for(registry if registry is not None else REGISTRY)
        self.store = store
        self._nodes: set[str] = set()
        self._last_counts: dict[str, tuple[int, int]] = {}
        self._pauses_saved = self.families.pauses_saved.labels(store)
        self._pauses_consumed = self.families.pauses_consumed.labels(store)

    @property
    def nodes(self) -> frozenset[str]:
        """The nodes this store exports series for."""
        return frozenset(self._nodes)

    def add_node(self, node: str) -> None:
        """Export ``node``'s counters at zero (once)."""
        if node in self._nodes:
            return
        self._nodes.add(node)
        families = self.families
        families.evicted_keys.labels(self.store, node)
        families.expired_keys.labels(self.store, node)
        families.ping_seconds.labels(self.store, node)
        for kind in names.REDIS_NODE_ERROR_KINDS:
            families.node_errors.labels(self.store, node, kind)

    def remove_node(self, node: str) -> None:
        """Stop exporting ``node`` (it left the cluster)."""
        if node not in self._nodes:
            return
        self._nodes.discard(node)
        self._last_counts.pop(node, None)
        families = self.families
        for gauge in (families.memory_used, families.maxmemory, families.connected_clients, families.node_up):
            gauge.remove((self.store, node))
        for counted in (families.evicted_keys, families.expired_keys, families.ping_seconds):
            forget_series(counted, self.store, node)
        for kind in names.REDIS_NODE_ERROR_KINDS:
            forget_series(families.node_errors, self.store, node, kind)

    def node_answered(self, node: str, ping_seconds: float, info: NodeInfo) -> None:
        """Record one sample of ``node``: its PING round trip and what its ``INFO`` said.

        The key counters grow by what the node counted since the previous sample; the first
        sample of a node only sets the baseline, and a node whose counts went down (restarted)
        counts from zero again.
        """
        self.add_node(node)
        families = self.families
        families.node_up.set((self.store, node), 1)
        families.ping_seconds.labels(self.store, node).observe(ping_seconds)
        families.memory_used.set((self.store, node), info.used_memory)
        families.maxmemory.set((self.store, node), info.maxmemory)
        families.connected_clients.set((self.store, node), info.connected_clients)
        previous = self._last_counts.get(node)
        self._last_counts[node] = (info.evicted_keys, info.expired_keys)
        if previous is None:
            return
        for family, now, before in (
            (families.evicted_keys, info.evicted_keys, previous[0]),
            (families.expired_keys, info.expired_keys, previous[1]),
        ):
            grown = now - before if now >= before else now
            if grown:
                family.labels(self.store, node).inc(grown)

    def node_failed(self, node: str, kind: str) -> None:
        """``node`` did not answer a sample: down, and one error of ``kind``."""
        self.add_node(node)
        self.families.node_up.set((self.store, node), 0)
        self.node_error(node, kind)

    def node_error(self, node: str, kind: str) -> None:
        """A command failed on ``node`` with an error of ``kind`` (one of the bounded set)."""
        if kind not in names.REDIS_NODE_ERROR_KINDS:
            kind = "other"
        self.add_node(node)
        self.families.node_errors.labels(self.store, node, kind).inc()

    def sampled(self) -> None:
        """Every node answered the sample just taken."""
        self.families.sample_timestamp.set((self.store,), time.time())

    def pause_saved(self, count: int = 1) -> None:
        self._pauses_saved.inc(count)

    def pause_consumed(self, count: int = 1) -> None:
        self._pauses_consumed.inc(count)

    def close(self) -> None:
        """Remove this store's children so a closed store stops being exported."""
        for node in list(self._nodes):
            self.remove_node(node)
        families = self.families
        families.sample_timestamp.remove((self.store,))
        for counter in (families.pauses_saved, families.pauses_consumed):
            forget_series(counter, self.store)


__all__ = ["PING_BUCKETS", "NodeInfo", "RedisMetricFamilies", "RedisStoreMetrics", "families_for"]
