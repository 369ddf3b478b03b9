"""Every metric name guarded emits, defined once.

The library registers its metrics under these names and ``dashboards/`` builds panels and alert
rules from the same constants, so a rename can never leave a dashboard panel empty.

Prometheus conventions: a ``guarded_`` prefix, base units in the name (``_seconds``,
``_bytes``), ``_total`` for counters, and only bounded labels (store name, schema, table,
method, outcome) — never a trace id or session id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .. import error_classes

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
GUARDED_PG_POOLER_ERRORS_TOTAL = "guarded_pg_pooler_errors_total"
"""Counter: operations that failed because the connection settings do not suit the connection
pooler in front of the server -- a store in session mode behind a pooler in transaction mode
(labels: store, schema, kind: one of :data:`PG_POOLER_ERROR_KINDS`). Any increase needs an operator:
set ``pooler="transaction"`` (``GUARDED_PG_POOLER=transaction``)."""
LABEL_POOLER_ERROR_KIND = "kind"
PG_POOLER_ERROR_KINDS = (
    "prepared_statement_missing",
    "prepared_statement_exists",
    "startup_parameter_refused",
)
"""Every value of the ``kind`` label of :data:`GUARDED_PG_POOLER_ERRORS_TOTAL`."""
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
GUARDED_PG_PARTITION_HORIZON = "guarded_pg_partition_horizon_timestamp_seconds"
"""Gauge: Unix time where the newest partition of a partitioned table ends -- rows timed later go
to its default partition -- as the store's partition maintenance last saw it (labels: store,
schema, table); alert when it comes near."""
GUARDED_PG_PARTITIONS_DROPPED_TOTAL = "guarded_pg_partitions_dropped_total"
"""Counter: whole partitions dropped by ``cleanup()`` (labels: store, schema, table)."""
GUARDED_PG_PARTITION_DROPPED_BYTES_TOTAL = "guarded_pg_partition_dropped_bytes_total"
"""Counter: bytes (heap, indexes, TOAST) the partitions dropped by ``cleanup()`` held (labels:
store, schema, table)."""

PG_METRIC_NAMES: tuple[str, ...] = (
    GUARDED_PG_POOL_SIZE,
    GUARDED_PG_POOL_MAX_SIZE,
    GUARDED_PG_POOL_IN_USE,
    GUARDED_PG_POOL_ACQUIRE_SECONDS,
    GUARDED_PG_CONNECTION_ERRORS_TOTAL,
    GUARDED_PG_POOLER_ERRORS_TOTAL,
    GUARDED_PG_TABLE_ROWS,
    GUARDED_PG_TABLE_SIZE_BYTES,
    GUARDED_PG_TABLE_STATS_TIMESTAMP,
    GUARDED_PG_CLEANUP_DELETED_ROWS_TOTAL,
    GUARDED_PG_MIGRATION_VERSION,
    GUARDED_PG_PARTITION_HORIZON,
    GUARDED_PG_PARTITIONS_DROPPED_TOTAL,
    GUARDED_PG_PARTITION_DROPPED_BYTES_TOTAL,
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

# --- dead-letter buffer --------------------------------------------------------------------------
DLQ_DEPTH = "guarded_deadletter_depth"
"""Gauge: writes waiting in the dead-letter buffer (memory and spill file), by store."""
DLQ_BYTES = "guarded_deadletter_bytes"
"""Gauge: encoded size of the waiting writes, by store and ``location`` (memory / disk)."""
DLQ_OLDEST_AGE = "guarded_deadletter_oldest_age_seconds"
"""Gauge: age of the oldest waiting write (0 when empty), by store."""
DLQ_PARKED_DEPTH = "guarded_deadletter_parked_writes"
"""Gauge: writes parked as bad data (never replayed automatically), by store."""
DLQ_ENQUEUED = "guarded_deadletter_enqueued_total"
"""Counter: writes dead-lettered, by store and method."""
DLQ_REPLAYED = "guarded_deadletter_replayed_total"
"""Counter: dead-lettered writes replayed to the backend, by store and method."""
DLQ_DROPPED = "guarded_deadletter_dropped_total"
"""Counter: writes lost (data loss), by store, method and ``reason``: ``spill_corrupt`` (only a
damaged spill file, set aside, held them), ``memory_full`` (parked writes held in memory past the
caps). At its limits the buffer refuses new writes instead (:data:`DLQ_REFUSED`)."""
DLQ_PARKED = "guarded_deadletter_parked_total"
"""Counter: writes parked as bad data, by store and method."""
DLQ_SUPERSEDED = "guarded_deadletter_superseded_total"
"""Counter: dead-lettered writes discarded because a newer write for the same key won, by store."""

# --- batching --------------------------------------------------------------------------------------
BATCH_SIZE = "guarded_batch_size"
"""Histogram: writes per flush, by store and method."""
BATCH_FLUSH_DURATION = "guarded_batch_flush_duration_seconds"
"""Histogram: time one flush took, by store and method."""
BATCH_PENDING = "guarded_batch_pending"
"""Gauge: acknowledged writes queued or being flushed (lost if the process dies now), by store."""
BATCH_SIZE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)

# --- stale-if-error -------------------------------------------------------------------------------
STALE_ENTRIES = "guarded_stale_cache_entries"
"""Gauge: values held for stale-if-error reads, by store."""

# --- memory health ---------------------------------------------------------------------------------
MEMORY_HEALTH_KEYS = "guarded_memory_health_keys"
"""Gauge: memory keys this process last saw in each ``health`` state (healthy / retry / degraded /
recovering, spec 003), by store and ``health``. Never labelled with the key itself."""
LABEL_HEALTH = "health"
MEMORY_HEALTH_STATES: tuple[str, ...] = ("healthy", "retry", "degraded", "recovering")
"""The memory health states of spec 003 (``MemoryHealth``); anything else is exported as ``unknown``."""

# --- task telemetry sinks --------------------------------------------------------------------------
TASK_EVENTS = "guarded_task_events_total"
"""Counter: task telemetry events, by event_type, outcome, task_type and mode."""
TASK_DURATION = "guarded_task_duration_seconds"
"""Histogram: task duration from terminal events carrying ``duration_ms``, by outcome, task_type, mode."""
TASKS_IN_FLIGHT = "guarded_tasks_in_flight"
"""Gauge: tasks spawned and not yet completed, failed or cancelled, by task_type and mode."""
LABEL_EVENT_TYPE = "event_type"
LABEL_TASK_TYPE = "task_type"
LABEL_MODE = "mode"
TASK_DURATION_BUCKETS: tuple[float, ...] = (
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
"""Task durations span sub-second tool calls to multi-minute background jobs."""
OTEL_METER_NAME = "guarded"
"""The OpenTelemetry meter and tracer scope name the library uses."""
OTEL_TASK_EVENTS = "guarded.task.events"
"""OpenTelemetry counter mirroring :data:`TASK_EVENTS` (attributes event_type, outcome, task_type, mode)."""
OTEL_TASK_DURATION = "guarded.task.duration"
"""OpenTelemetry histogram (unit ``s``) mirroring :data:`TASK_DURATION`."""
OTEL_TASKS_IN_FLIGHT = "guarded.tasks.in_flight"
"""OpenTelemetry up-down counter mirroring :data:`TASKS_IN_FLIGHT`."""

# --- alert names -----------------------------------------------------------------------------------
# The rule file in grafana/ and the dashboards' alert annotations use these names.
ALERT_PAUSE_SAVE_FAILED = "GuardedPlannerPauseSaveFailed"
ALERT_PAUSE_LOAD_FAILED = "GuardedPlannerPauseLoadFailed"
ALERT_CIRCUIT_OPEN = "GuardedCircuitOpen"
ALERT_DEADLETTER_DROPS = "GuardedDeadLetterDrops"
ALERT_DEADLETTER_OLD = "GuardedDeadLetterOldestEntryAge"
ALERT_ERROR_BUDGET_BURN = "GuardedErrorBudgetBurn"
ALERT_LATENCY_P99 = "GuardedStoreLatencyP99High"
ALERT_MEMORY_DEGRADED = "GuardedMemoryDegraded"
ALERT_TASK_FAILURE_RATIO = "GuardedTaskFailureRatioHigh"
ALERT_NAMES: tuple[str, ...] = (
    ALERT_PAUSE_SAVE_FAILED,
    ALERT_PAUSE_LOAD_FAILED,
    ALERT_CIRCUIT_OPEN,
    ALERT_DEADLETTER_DROPS,
    ALERT_DEADLETTER_OLD,
    ALERT_ERROR_BUDGET_BURN,
    ALERT_LATENCY_P99,
    ALERT_MEMORY_DEGRADED,
    ALERT_TASK_FAILURE_RATIO,
)
MEMORY_HEALTH_UNKNOWN = "unknown"
"""The ``health`` label value of a memory state whose ``health`` is none of :data:`MEMORY_HEALTH_STATES`."""
TASK_SINK_ERRORS = "guarded_task_sink_errors_total"
"""Counter: task telemetry events a guarded sink failed to take, by ``sink`` and ``reason``
(``timeout`` / ``error``)."""
LABEL_SINK = "sink"
"""A task telemetry sink's name (``guard_sink(name=...)``, its class name by default); bounded."""
LABEL_REASON = "reason"
SPAN_EVENT_TASK = "penguiflow.task"
"""The span event added for each task telemetry event (ids go on it as attributes, never labels)."""
DLQ_SPILL_AVAILABLE = "guarded_deadletter_spill_available"
"""Gauge: 1 while the dead-letter buffer's spill file takes writes, 0 while it cannot (locked on
every slot, damaged, disk full, unwritable) and writes that need holding are refused, by store.
No series for a buffer configured without a spill file."""

# --- operational errors ----------------------------------------------------------------------------
OPERATIONAL_ERRORS = "guarded_store_operational_errors_total"
"""Counter: calls of the guard that failed on an operational condition the database reported — a
table or column missing, a missing grant, a read-only database, a server shutting down, too many
connections — by store, method and ``condition`` (:data:`OPERATIONAL_CONDITIONS`). Writes that
failed so are held and replayed, never parked; the condition needs an operator: alert on any
increase. Batched writes count once each."""
LABEL_CONDITION = "condition"
OPERATIONAL_CONDITIONS = error_classes.OPERATIONAL_CONDITIONS
"""Every value of the ``condition`` label (see :mod:`guarded.error_classes` and docs/durability.md,
"What a failure means"): a missing table, column, function, schema or database; a missing grant or
a refused login; a read-only transaction; a server shutting down or starting up; too many
connections; a full disk or out of memory; a statement the schema does not match; an I/O error;
connection settings that do not suit the connection pooler in front of the server."""

# --- bulkhead ---------------------------------------------------------------------------------------
BULKHEAD_LIMIT = "guarded_bulkhead_limit"
"""Gauge: calls the bulkhead lets into the backend at once (``bulkhead.max_concurrent``, else what
the backend declares, e.g. its pool's maximum size), by store. No series without a limit."""
BULKHEAD_IN_USE = "guarded_bulkhead_in_use"
"""Gauge: calls in the backend now (permits held), the guard's own flushes and replays included,
by store. At the limit with a queue behind it: the backend (or its pool) is the bottleneck."""
BULKHEAD_QUEUE_DEPTH = "guarded_bulkhead_queue_depth"
"""Gauge: calls waiting in line for admission to the backend, by store."""
BULKHEAD_WAIT = "guarded_bulkhead_wait_seconds"
"""Histogram: time each call waited for admission (0 when admitted at once; an admission timeout
is observed too), by store and method. This time is the guard's queueing: it counts toward the
caller's latency, never toward the circuit breaker's slow-call rate."""
BULKHEAD_TIMEOUTS = "guarded_bulkhead_timeouts_total"
"""Counter: calls not admitted before their deadline left time for the backend, by store and
method. They end with outcome ``timeout`` (error type ``BulkheadTimeoutError``): reads answer
stale or their fallback, writes are held and replayed. Sustained increase: more load than the
backend's concurrency serves within the deadlines."""

# --- quarantined spill rows ------------------------------------------------------------------------
DLQ_QUARANTINED = "guarded_deadletter_quarantined_total"
"""Counter: rows of a dead-letter spill file that could not be read (a column of the wrong type,
text that is not UTF-8, a key or call that is not JSON) and were moved to the file's quarantine
table with their raw bytes and a reason, by store. They are not replayed; ``guarded dlq list
--quarantined`` shows them. Any increase means a damaged file: alert on it."""

# --- alerts an on-call engineer trusts --------------------------------------------------------------
ALERT_PAUSE_SAVES_FAILING = "GuardedPlannerPauseSavesFailing"
"""The page: pause saves of a store keep failing (:data:`ALERT_PAUSE_SAVE_FAILED` is the ticket for
a single failure)."""
ALERT_DEADLETTER_PARKED = "GuardedDeadLetterParkedWrites"
ALERT_BATCH_WRITES_FAILED = "GuardedBatchWritesFailed"
ALERT_POOL_SATURATED = "GuardedPoolSaturated"
ALERT_BATCH_QUEUE_FULL = "GuardedBatchQueueFull"
ALERT_REPLAY_STALLED = "GuardedDeadLetterReplayStalled"
ALERT_SCHEMA_VERSION_SKEW = "GuardedSchemaVersionSkew"
ALERT_DEADLETTER_QUARANTINED = "GuardedDeadLetterQuarantinedRows"
ALERT_NAMES = (
    *ALERT_NAMES,
    ALERT_DEADLETTER_QUARANTINED,
    ALERT_PAUSE_SAVES_FAILING,
    ALERT_DEADLETTER_PARKED,
    ALERT_BATCH_WRITES_FAILED,
    ALERT_POOL_SATURATED,
    ALERT_BATCH_QUEUE_FULL,
    ALERT_REPLAY_STALLED,
    ALERT_SCHEMA_VERSION_SKEW,
)

BATCH_CAPACITY = "guarded_batch_capacity"
"""Gauge: writes the batcher holds at most (``batch.queue_size``), by store; :data:`BATCH_PENDING`
at this value means the queue is full and new writes wait for space, then are dead-lettered."""
BATCH_FAILED_WRITES = "guarded_batch_failed_writes_total"
"""Counter: writes a batch writer raised on (a bug in the writer): answered ``fallback`` and not
kept, so write-behind writes already acknowledged are lost, by store and method."""
GUARDED_PG_SCHEMA_EXPECTED_VERSION = "guarded_pg_schema_expected_version"
"""Gauge: the newest migration version the running code knows, set when the store connects (labels:
store, schema). A schema whose :data:`GUARDED_PG_MIGRATION_VERSION` is above this value on some
process is being served by code older than its schema (version skew)."""
PG_METRIC_NAMES = (*PG_METRIC_NAMES, GUARDED_PG_SCHEMA_EXPECTED_VERSION)
LABEL_TARGET = "target"
"""Which server answered a read: ``primary``, or a replica as ``replica0``, ``replica1``... in the
order configured (bounded by the replicas configured)."""
LABEL_REPLICA = "replica"
"""A read replica of a backend store, ``replica0``, ``replica1``... in the order configured."""
LABEL_REASON = "reason"
"""Why a replica was left out of the reads: ``unreachable``, ``lagging``, ``not_replica``,
``failed`` (a fixed set)."""
GUARDED_PG_READS_TOTAL = "guarded_pg_reads_total"
"""Counter: reads of the PostgreSQL store that can go to a replica, by the server that answered
(labels: store, schema, target)."""
GUARDED_PG_REPLICA_LAG_SECONDS = "guarded_pg_replica_lag_seconds"
"""Gauge: how far a replica is behind, measured by WAL position at each check: seconds since the
primary last had nothing the replica has not replayed (labels: store, schema, replica)."""
GUARDED_PG_REPLICA_SKIPPED_TOTAL = "guarded_pg_replica_skipped_total"
"""Counter: checks that left a replica out of the reads, and reads it failed and the primary
answered, by reason (labels: store, schema, replica, reason)."""
ALERT_REPLICA_SKIPPED = "GuardedReplicaSkipped"
"""A store has kept leaving one of its read replicas out of the reads (unreachable, too far behind,
not a standby, or failing reads)."""
ALERT_NAMES = (*ALERT_NAMES, ALERT_REPLICA_SKIPPED)
PG_METRIC_NAMES = (
    *PG_METRIC_NAMES,
    GUARDED_PG_READS_TOTAL,
    GUARDED_PG_REPLICA_LAG_SECONDS,
    GUARDED_PG_REPLICA_SKIPPED_TOTAL,
)

STALE_BYTES = "guarded_stale_cache_bytes"
"""Gauge: estimated bytes of the values held for stale-if-error reads (``stale.max_bytes`` bounds
it), by store; the companion of :data:`STALE_ENTRIES`."""

# --- writes refused at the dead-letter buffer's limits ----------------------------------------------
DLQ_REFUSED = "guarded_deadletter_refused_total"
"""Counter: writes the dead-letter buffer refused to keep (never acknowledged as kept), by store,
method and ``reason``: ``disk_cap`` (the spill file at ``max_disk_bytes``), ``disk_full`` (no room on
its disk), ``spill_unavailable`` (the file cannot be used), ``memory_full`` (a buffer without a spill
file at its memory caps). Nothing already kept is evicted to make room: any increase means callers
are being refused; alert on it."""
ALERT_DEADLETTER_REFUSED = "GuardedDeadLetterRefusedWrites"
ALERT_NAMES = (*ALERT_NAMES, ALERT_DEADLETTER_REFUSED)

# --- a store whose settings do not suit the connection pooler in front of PostgreSQL ----------------
ALERT_POOLER_MISMATCH = "GuardedPoolerMismatch"
"""A store keeps failing operations on :data:`GUARDED_PG_POOLER_ERRORS_TOTAL`: its ``pooler`` setting
does not suit the connection pooler in front of the server."""
ALERT_NAMES = (*ALERT_NAMES, ALERT_POOLER_MISMATCH)
ALERT_PARTITION_HORIZON_NEAR = "GuardedPgPartitionHorizonNear"
"""A partitioned table's newest partition ends soon: partition maintenance has stopped creating
partitions ahead, and rows timed past the horizon would go to the default partition."""
ALERT_NAMES = (*ALERT_NAMES, ALERT_PARTITION_HORIZON_NEAR)

# --- Redis backend ----------------------------------------------------------------------------------
LABEL_NODE = "node"
"""A Redis server as ``host:port``: the one server of a single-node store, or a node of a cluster
(bounded by the cluster's size; never a key or an id)."""
LABEL_REDIS_ERROR_KIND = "kind"
REDIS_NODE_ERROR_KINDS = ("connection", "timeout", "loading", "busy", "readonly", "oom", "other")
"""Every value of the ``kind`` label of :data:`GUARDED_REDIS_NODE_ERRORS_TOTAL`: the connection
lost or refused, no answer in time, a server loading its data set (``LOADING``), a script running
too long (``BUSY``), a replica that cannot take writes (``READONLY``, during a failover), memory at
``maxmemory`` under ``noeviction`` (``OOM``), anything else."""
GUARDED_REDIS_MEMORY_USED_BYTES = "guarded_redis_memory_used_bytes"
"""Gauge: ``used_memory`` of each Redis node the store uses, from ``INFO`` (labels: store, node)."""
GUARDED_REDIS_MAXMEMORY_BYTES = "guarded_redis_maxmemory_bytes"
"""Gauge: ``maxmemory`` of each node (0: no limit; labels: store, node)."""
GUARDED_REDIS_EVICTED_KEYS_TOTAL = "guarded_redis_evicted_keys_total"
"""Counter: keys each node evicted to stay under ``maxmemory`` since the store began sampling it
(``INFO`` ``evicted_keys``; a server restart's reset is not counted backwards; labels: store, node).
Every key the store writes has a TTL, so a ``volatile-*`` policy may evict pauses and memory."""
GUARDED_REDIS_EXPIRED_KEYS_TOTAL = "guarded_redis_expired_keys_total"
"""Counter: keys each node expired (their TTL ran out) since the store began sampling it (``INFO``
``expired_keys``; every key of the node, not only this store's; labels: store, node)."""
GUARDED_REDIS_CONNECTED_CLIENTS = "guarded_redis_connected_clients"
"""Gauge: client connections open on each node, every client's (labels: store, node)."""
GUARDED_REDIS_PING_SECONDS = "guarded_redis_ping_seconds"
"""Histogram: the round trip of a sampled ``PING`` to each node (labels: store, node)."""
GUARDED_REDIS_NODE_UP = "guarded_redis_node_up"
"""Gauge: 1 when the node answered the last sample, 0 when it did not (labels: store, node)."""
GUARDED_REDIS_NODE_ERRORS_TOTAL = "guarded_redis_node_errors_total"
"""Counter: failed commands by the node that failed them and :data:`REDIS_NODE_ERROR_KINDS`, the
sampler's own and the store's when it can tell the node (labels: store, node, kind)."""
GUARDED_REDIS_SAMPLE_TIMESTAMP = "guarded_redis_sample_timestamp_seconds"
"""Gauge: Unix time of the last sample in which every node answered (label: store)."""
GUARDED_REDIS_PAUSES_SAVED_TOTAL = "guarded_redis_pauses_saved_total"
"""Counter: planner pauses the store saved to Redis (label: store)."""
GUARDED_REDIS_PAUSES_CONSUMED_TOTAL = "guarded_redis_pauses_consumed_total"
"""Counter: planner pauses a resume consumed from Redis (label: store). Saves that are never
consumed wait until their TTL expires them (they count among the node's expired keys) or, under
a ``volatile-*`` policy at ``maxmemory``, until they are evicted."""
REDIS_METRIC_NAMES: tuple[str, ...] = (
    GUARDED_REDIS_MEMORY_USED_BYTES,
    GUARDED_REDIS_MAXMEMORY_BYTES,
    GUARDED_REDIS_EVICTED_KEYS_TOTAL,
    GUARDED_REDIS_EXPIRED_KEYS_TOTAL,
    GUARDED_REDIS_CONNECTED_CLIENTS,
    GUARDED_REDIS_PING_SECONDS,
    GUARDED_REDIS_NODE_UP,
    GUARDED_REDIS_NODE_ERRORS_TOTAL,
    GUARDED_REDIS_SAMPLE_TIMESTAMP,
    GUARDED_REDIS_PAUSES_SAVED_TOTAL,
    GUARDED_REDIS_PAUSES_CONSUMED_TOTAL,
)
"""Every metric of the Redis backend (the Redis dashboard has a panel for each)."""
ALERT_REDIS_NODE_DOWN = "GuardedRedisNodeDown"
"""A Redis node a store uses has not answered its samples for minutes."""
ALERT_REDIS_NODE_ERRORS = "GuardedRedisNodeErrors"
"""Commands keep failing on one Redis node (OOM, READONLY, BUSY, LOADING, timeouts)."""
ALERT_REDIS_MEMORY_NEAR_MAX = "GuardedRedisMemoryNearMax"
"""A Redis node's memory is close to its ``maxmemory``."""
ALERT_REDIS_EVICTING = "GuardedRedisEvictingKeys"
"""A Redis node a store keeps its pauses and memory on is evicting keys."""
ALERT_NAMES = (
    *ALERT_NAMES,
    ALERT_REDIS_NODE_DOWN,
    ALERT_REDIS_NODE_ERRORS,
    ALERT_REDIS_MEMORY_NEAR_MAX,
    ALERT_REDIS_EVICTING,
)

# --- prometheus-client's multiprocess mode -------------------------------------------------------

GaugeMultiprocessMode = Literal[
    "all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent", "livemostrecent"
]
"""How prometheus-client's ``MultiProcessCollector`` combines one gauge of several processes."""

GAUGE_MULTIPROCESS_MODES: Mapping[str, GaugeMultiprocessMode] = {
    CIRCUIT_STATE: "livemax",
    DLQ_OLDEST_AGE: "livemax",
    DLQ_SPILL_AVAILABLE: "livemin",
    GUARDED_PG_TABLE_ROWS: "livemostrecent",
    GUARDED_PG_TABLE_SIZE_BYTES: "livemostrecent",
    GUARDED_PG_TABLE_STATS_TIMESTAMP: "livemax",
    GUARDED_PG_MIGRATION_VERSION: "livemax",
    GUARDED_PG_SCHEMA_EXPECTED_VERSION: "livemin",
    GUARDED_PG_PARTITION_HORIZON: "livemostrecent",
    GUARDED_PG_REPLICA_LAG_SECONDS: "livemax",
    GUARDED_REDIS_MEMORY_USED_BYTES: "livemostrecent",
    GUARDED_REDIS_MAXMEMORY_BYTES: "livemostrecent",
    GUARDED_REDIS_CONNECTED_CLIENTS: "livemostrecent",
    GUARDED_REDIS_NODE_UP: "livemin",
    GUARDED_REDIS_SAMPLE_TIMESTAMP: "livemax",
}
"""The gauges that are not summed over the live processes in multiprocess mode, by name: a state
or an age reads as its worst process (a breaker open in any worker reads open, the oldest held
write is the oldest of any worker), a sample of the server's own figures as the most recent
sample. Counters and histograms are summed."""


def gauge_multiprocess_mode(name: str) -> GaugeMultiprocessMode:
    """How the gauge ``name`` of several processes is combined in multiprocess mode: its entry in
    :data:`GAUGE_MULTIPROCESS_MODES`, else summed over the live processes (``livesum``), as
    quantities held by each process (writes held, calls in flight, connections) add up."""
    return GAUGE_MULTIPROCESS_MODES.get(name, "livesum")
