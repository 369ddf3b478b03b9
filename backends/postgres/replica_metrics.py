"""Metrics of a store's read replicas: reads by the server that answered them, each replica's lag,
and the checks and reads that left a replica out.

Families are created once per Prometheus registry (:class:`~guarded.backend.PerRegistry`); each
store owns its children (labelled ``store`` and ``schema``) and removes them on close. Labels are
bounded: ``target`` is ``primary`` or one of the configured replicas (``replica0``, ...),
``reason`` a fixed set (:data:`SKIP_REASONS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from guarded.backend import PerRegistry, ScrapeTimeGauge, forget_series, scrape_time_gauge
from guarded.backend import metric_names as names

PRIMARY = "primary"
"""The ``target`` label of a read the primary answered."""

UNREACHABLE = "unreachable"
"""The replica did not answer its check within the read timeout (down, frozen, refusing)."""
LAGGING = "lagging"
"""The replica answered but is further behind than ``replica_max_lag``."""
NOT_REPLICA = "not_replica"
"""The server is not in recovery (``pg_last_wal_replay_lsn()`` is null): not a standby."""
FAILED = "failed"
"""A read on the replica failed or outlasted the read timeout; the primary answered it."""
SKIP_REASONS = (UNREACHABLE, LAGGING, NOT_REPLICA, FAILED)


@dataclass(frozen=True, slots=True)
class ReplicaMetricFamilies:
    """The replica metric families of one registry."""

    reads: Counter
    lag_seconds: ScrapeTimeGauge
    skipped: Counter


def _families(registry: CollectorRegistry) -> ReplicaMetricFamilies:
    store_labels = (names.LABEL_STORE, names.LABEL_SCHEMA)
    return ReplicaMetricFamilies(
        reads=Counter(
            names.GUARDED_PG_READS_TOTAL,
            "Reads that may go to a replica, by the server that answered them.",
            (*store_labels, names.LABEL_TARGET),
            registry=registry,
        ),
        lag_seconds=scrape_time_gauge(
            registry,
            names.GUARDED_PG_REPLICA_LAG_SECONDS,
            "Seconds a replica is behind the primary, measured by WAL position at each check.",
            (*store_labels, names.LABEL_REPLICA),
        ),
        skipped=Counter(
            names.GUARDED_PG_REPLICA_SKIPPED_TOTAL,
            "Checks that left a replica out of the reads, and reads it failed, by reason.",
            (*store_labels, names.LABEL_REPLICA, names.LABEL_REASON),
            registry=registry,
        ),
    )


families_for: PerRegistry[ReplicaMetricFamilies] = PerRegistry(_families)
"""The replica metric families registered in a registry (created on first use)."""


class ReplicaMetrics:
    """The replica metric children of one store."""

    def __init__(
        self, *, store: str, schema: str, replicas: Sequence[str], registry: CollectorRegistry | None
    ) -> None:
        self._families = families_for(registry if registry is not None else REGISTRY)
        self._labels = (store, schema)
        self._replicas = tuple(replicas)
        reads = self._families.reads
        self.reads_by_target = {
            target: reads.labels(store, schema, target) for target in (PRIMARY, *self._replicas)
        }
        """The read counter of each target (``primary``, ``replica0``, ...)."""
        for replica in self._replicas:  # at zero from the start: the first skip shows as an increase
            for reason in SKIP_REASONS:
                self._families.skipped.labels(store, schema, replica, reason)

    def set_lag(self, replica: str, seconds: float) -> None:
        self._families.lag_seconds.set((*self._labels, replica), seconds)

    def skipped(self, replica: str, reason: str) -> None:
        self._families.skipped.labels(*self._labels, replica, reason).inc()

    def close(self) -> None:
        """Remove this store's children."""
        families = self._families
        for target in (PRIMARY, *self._replicas):
            forget_series(families.reads, *self._labels, target)
        for replica in self._replicas:
            families.lag_seconds.remove((*self._labels, replica))
            for reason in SKIP_REASONS:
                forget_series(families.skipped, *self._labels, replica, reason)


__all__ = [
    "FAILED",
    "LAGGING",
    "NOT_REPLICA",
    "PRIMARY",
    "SKIP_REASONS",
    "UNREACHABLE",
    "ReplicaMetricFamilies",
    "ReplicaMetrics",
    "families_for",
]
