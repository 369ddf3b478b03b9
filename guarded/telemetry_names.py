"""Every metric name guarded emits, defined once.

The library registers its metrics under these names and ``dashboards/`` builds panels and alert
rules from the same constants, so a rename can never leave a dashboard panel empty.

Prometheus conventions: a ``guarded_`` prefix, base units in the name (``_seconds``,
``_bytes``), ``_total`` for counters, and only bounded labels (store name, schema, table,
method, outcome) — never a trace id or session id.
"""

from __future__ import annotations

# --- label names --------------------------------------------------------------------------------

LABEL_STORE = "store"
"""The store's name (``PostgresStateStore(name=...)`` / ``guard(name=...)``); operator-chosen, bounded."""
LABEL_SCHEMA = "schema"
"""The PostgreSQL schema (tenant) a backend store uses; operator-chosen, bounded."""
LABEL_TABLE = "table"
"""A table of the backend's schema (a fixed set)."""

# --- Postgres backend ---------------------------------------------------------------------------

GUARDED_PG_POOL_SIZE = "guarded_pg_pool_connections"
"""Gauge: connections currently open in the store's asyncpg pool (labels: store, schema)."""
GUARDED_PG_POOL_MAX_SIZE = "guarded_pg_pool_max_connections"
"""Gauge: the pool's configured maximum size (labels: store, schema)."""
GUARDED_PG_POOL_IN_USE = "guarded_pg_pool_connections_in_use"
"""Gauge: pool connections checked out right now (labels: store, schema)."""
GUARDED_PG_POOL_ACQUIRE_SECONDS = "guarded_pg_pool_acquire_seconds"
"""Histogram: time waited to acquire a pool connection (labels: store, schema)."""
GUARDED_PG_CONNECTION_ERRORS_TOTAL = "guarded_pg_connection_errors_total"
"""Counter: operations that lost their connection and were re-run on a fresh one, or failed
(labels: store, schema)."""
GUARDED_PG_TABLE_ROWS = "guarded_pg_table_rows"
"""Gauge: estimated live rows per table, sampled periodically (labels: store, schema, table)."""
GUARDED_PG_TABLE_SIZE_BYTES = "guarded_pg_table_size_bytes"
"""Gauge: total on-disk size per table including indexes and TOAST, sampled periodically
(labels: store, schema, table)."""
GUARDED_PG_TABLE_STATS_TIMESTAMP = "guarded_pg_table_stats_timestamp_seconds"
"""Gauge: Unix time of the last successful table sample (labels: store, schema); alert when stale."""
GUARDED_PG_CLEANUP_DELETED_ROWS_TOTAL = "guarded_pg_cleanup_deleted_rows_total"
"""Counter: rows deleted by ``cleanup()`` (labels: store, schema, table)."""
GUARDED_PG_MIGRATION_VERSION = "guarded_pg_schema_version"
"""Gauge: the migration version of the schema the store runs against (labels: store, schema)."""

PG_METRIC_NAMES: tuple[str, ...] = (
    GUARDED_PG_POOL_SIZE,
    GUARDED_PG_POOL_MAX_SIZE,
    GUARDED_PG_POOL_IN_USE,
    GUARDED_PG_POOL_ACQUIRE_SECONDS,
    GUARDED_PG_CONNECTION_ERRORS_TOTAL,
    GUARDED_PG_TABLE_ROWS,
    GUARDED_PG_TABLE_SIZE_BYTES,
    GUARDED_PG_TABLE_STATS_TIMESTAMP,
    GUARDED_PG_CLEANUP_DELETED_ROWS_TOTAL,
    GUARDED_PG_MIGRATION_VERSION,
)
"""Every Postgres backend metric name."""

# --- guard: one observation per logical call -----------------------------------------------------
CALL_DURATION = "guarded_store_call_duration_seconds"
"""Histogram of logical call latency (all attempts and backoff), by store, method, outcome."""
CALLS = "guarded_store_calls"
"""Counter (exposed as ``guarded_store_calls_total``) of logical calls by store, method, outcome."""
RETRIES = "guarded_store_retries"
"""Counter (``guarded_store_retries_total``) of retried attempts by store, method."""
CIRCUIT_STATE = "guarded_circuit_state"
"""Gauge, 1 for the breaker's current state and 0 for the others, by store, state."""
CIRCUIT_TRANSITIONS = "guarded_circuit_transitions"
"""Counter (``guarded_circuit_transitions_total``) of breaker state changes by store, from_state, to_state."""

LABEL_METHOD = "method"
LABEL_OUTCOME = "outcome"
LABEL_STATE = "state"

CALL_DURATION_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
)
"""Store-call buckets; a superset of the OpenTelemetry database-client duration boundaries
(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10) with finer steps below a millisecond."""

# --- spans ----------------------------------------------------------------------------------------
TRACER_NAME = "guarded"
SPAN_ATTR_STORE = "guarded.store"
SPAN_ATTR_OUTCOME = "guarded.outcome"
SPAN_ATTR_ATTEMPTS = "guarded.attempts"
SPAN_EVENT_RETRY = "retry"
