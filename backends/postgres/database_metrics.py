"""Backend metrics for the dashboards: pool size and use, acquire wait, table rows and sizes, and
the schema's migration version beside the newest one the code knows.

Metric names come from :data:`guarded.backend.metric_names` (one source of truth with the dashboards).
Metric families are created once per Prometheus registry and shared by every store that uses
that registry; each store owns the children labelled with its ``store`` name and ``schema`` and
removes them on close. Labels are bounded: store name and schema are operator-chosen, table
names are a fixed set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from guarded.backend import PerRegistry, ScrapeTimeGauge, forget_series, scrape_time_gauge
from guarded.backend import metric_names as names

ACQUIRE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Pool acquire waits are normally sub-millisecond; the tail shows pool exhaustion."""

_STORE_LABELS = (names.LABEL_STORE, names.LABEL_SCHEMA)
_TABLE_LABELS = (names.LABEL_STORE, names.LABEL_SCHEMA, names.LABEL_TABLE)


@dataclass(frozen=True, slots=True)
class PgMetricFamilies:
    """The Postgres backend's metric families in one registry."""

    pool_size: ScrapeTimeGauge
    pool_max_size: ScrapeTimeGauge
    pool_in_use: ScrapeTimeGauge
    acquire_seconds: Histogram
    connection_errors: Counter
    pooler_errors: Counter
    table_rows: ScrapeTimeGauge
    table_size_bytes: ScrapeTimeGauge
    table_stats_timestamp: ScrapeTimeGauge
    cleanup_deleted: Counter
    schema_version: ScrapeTimeGauge
    schema_expected_version: ScrapeTimeGauge
    partition_horizon: ScrapeTimeGauge
    partitions_dropped: Counter
    partition_dropped_bytes: Counter


def _families(registry: CollectorRegistry) -> PgMetricFamilies:
    families = PgMetricFamilies(
        pool_size=scrape_time_gauge(
            registry,
            names.GUARDED_PG_POOL_SIZE,
            "Connections open in the store's asyncpg pool.",
            _STORE_LABELS,
        ),
        pool_max_size=scrape_time_gauge(
            registry,
            names.GUARDED_PG_POOL_MAX_SIZE,
            "Configured maximum size of the store's asyncpg pool.",
            _STORE_LABELS,
        ),
        pool_in_use=scrape_time_gauge(
            registry, names.GUARDED_PG_POOL_IN_USE, "Pool connections checked out right now.", _STORE_LABELS
        ),
        acquire_seconds=Histogram(
            names.GUARDED_PG_POOL_ACQUIRE_SECONDS,
            "Time waited to acquire a pool connection.",
            _STORE_LABELS,
            buckets=ACQUIRE_BUCKETS,
            registry=registry,
        ),
        connection_errors=Counter(
            names.GUARDED_PG_CONNECTION_ERRORS_TOTAL,
            "Operations that lost their database connection.",
            _STORE_LABELS,
            registry=registry,
        ),
        pooler_errors=Counter(
            names.GUARDED_PG_POOLER_ERRORS_TOTAL,
            "Operations that failed because the connection settings do not suit the pooler in front "
            "of the server (set pooler=transaction).",
            (*_STORE_LABELS, names.LABEL_POOLER_ERROR_KIND),
            registry=registry,
        ),
        table_rows=scrape_time_gauge(
            registry,
            names.GUARDED_PG_TABLE_ROWS,
            "Estimated live rows per table (sampled periodically).",
            _TABLE_LABELS,
        ),
        table_size_bytes=scrape_time_gauge(
            registry,
            names.GUARDED_PG_TABLE_SIZE_BYTES,
            "On-disk size per table including indexes and TOAST (sampled periodically).",
            _TABLE_LABELS,
        ),
        table_stats_timestamp=scrape_time_gauge(
            registry,
            names.GUARDED_PG_TABLE_STATS_TIMESTAMP,
            "Unix time of the last successful table sample.",
            _STORE_LABELS,
        ),
        cleanup_deleted=Counter(
            names.GUARDED_PG_CLEANUP_DELETED_ROWS_TOTAL,
            "Rows deleted by cleanup().",
            _TABLE_LABELS,
            registry=registry,
        ),
        schema_version=scrape_time_gauge(
            registry,
            names.GUARDED_PG_MIGRATION_VERSION,
            "Migration version of the schema the store runs against.",
            _STORE_LABELS,
        ),
        schema_expected_version=scrape_time_gauge(
            registry,
            names.GUARDED_PG_SCHEMA_EXPECTED_VERSION,
            "Newest migration version the running code knows.",
            _STORE_LABELS,
        ),
        partition_horizon=scrape_time_gauge(
            registry,
            names.GUARDED_PG_PARTITION_HORIZON,
            "Unix time where the newest partition of a partitioned table ends.",
            _TABLE_LABELS,
        ),
        partitions_dropped=Counter(
            names.GUARDED_PG_PARTITIONS_DROPPED_TOTAL,
            "Whole partitions dropped by cleanup().",
            _TABLE_LABELS,
            registry=registry,
        ),
        partition_dropped_bytes=Counter(
            names.GUARDED_PG_PARTITION_DROPPED_BYTES_TOTAL,
            "Bytes held by the partitions cleanup() dropped.",
            _TABLE_LABELS,
            registry=registry,
        ),
    )
    return families


families_for: PerRegistry[PgMetricFamilies] = PerRegistry(_families)
"""The metric families registered in a registry (created on first use)."""


class StoreMetrics:
    """The metric children of one store (labelled with its name and schema)."""

    def __init__(
        self,
        *,
        store: str,
        schema: str,
        registry: CollectorRegistry | None = None,
        pool_size: Callable[[], int] | None = None,
        pool_max_size: Callable[[], int] | None = None,
        pool_in_use: Callable[[], int] | None = None,
    ) -> None:
        self.families = families_for(registry if registry is not None else REGISTRY)
        self.labels = (store, schema)
        self._tables: set[str] = set()
        families = self.families
        if pool_size is not None:
            families.pool_size.set_function(self.labels, pool_size)
        if pool_max_size is not None:
            families.pool_max_size.set_function(self.labels, pool_max_size)
        if pool_in_use is not None:
            families.pool_in_use.set_function(self.labels, pool_in_use)
        self._acquire = families.acquire_seconds.labels(*self.labels)
        self._connection_errors = families.connection_errors.labels(*self.labels)
        # Every kind exported from the start at zero: a panel shows a rate of none, and an
        # increase() sees the first error (a series born at 1 has no increase to show).
        self._pooler_error_kinds = set(names.PG_POOLER_ERROR_KINDS)
        for kind in self._pooler_error_kinds:
            families.pooler_errors.labels(*self.labels, kind)

    def observe_acquire(self, seconds: float) -> None:
        self._acquire.observe(seconds)

    def connection_error(self) -> None:
        self._connection_errors.inc()

    def pooler_error(self, kind: str) -> None:
        """An operation failed on a pooler mismatch of ``kind`` (one of the bounded set)."""
        self.families.pooler_errors.labels(*self.labels, kind).inc()

    def set_schema_version(self, version: int, expected: int) -> None:
        """The schema's migration version as the store found (or left) it on connecting, beside
        ``expected``, the newest version this code knows: a schema a newer deployment migrated
        shows the skew."""
        self.families.schema_version.set(self.labels, version)
        self.families.schema_expected_version.set(self.labels, expected)

    def set_table_stats(self, stats: Mapping[str, tuple[int, int]]) -> None:
        """Record ``{table: (rows, bytes)}`` from one sample."""
        for table, (rows, size) in stats.items():
            self._tables.add(table)
            self.families.table_rows.set((*self.labels, table), rows)
            self.families.table_size_bytes.set((*self.labels, table), size)
        self.families.table_stats_timestamp.set(self.labels, time.time())

    def cleanup_deleted(self, table: str, rows: int) -> None:
        self._tables.add(table)
        self.families.cleanup_deleted.labels(*self.labels, table).inc(rows)

    def set_partition_horizon(self, table: str, horizon: float) -> None:
        """Where ``table``'s newest partition ends (Unix time)."""
        self._tables.add(table)
        self.families.partition_horizon.set((*self.labels, table), horizon)

    def partitions_dropped(self, table: str, count: int, size: int) -> None:
        self._tables.add(table)
        self.families.partitions_dropped.labels(*self.labels, table).inc(count)
        self.families.partition_dropped_bytes.labels(*self.labels, table).inc(size)

    def close(self) -> None:
        """Remove this store's children so a closed store stops being exported."""
        families = self.families
        for gauge in (
            families.pool_size,
            families.pool_max_size,
            families.pool_in_use,
            families.table_stats_timestamp,
            families.schema_version,
            families.schema_expected_version,
        ):
            gauge.remove(self.labels)
        for counted in (families.acquire_seconds, families.connection_errors):
            forget_series(counted, *self.labels)
        for kind in self._pooler_error_kinds:
            forget_series(families.pooler_errors, *self.labels, kind)
        for table in self._tables:
            for table_gauge in (families.table_rows, families.table_size_bytes, families.partition_horizon):
                table_gauge.remove((*self.labels, table))
            for table_counter in (
                families.cleanup_deleted,
                families.partitions_dropped,
                families.partition_dropped_bytes,
            ):
                forget_series(table_counter, *self.labels, table)


__all__ = ["ACQUIRE_BUCKETS", "PgMetricFamilies", "StoreMetrics", "families_for"]
