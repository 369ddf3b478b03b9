"""The Postgres backend dashboard: the asyncpg pool, read replicas, table growth, cleanup,
schema version and partitions (horizon, retention by partition).

Series come from ``guarded.backends.postgres`` (backends/postgres/database_metrics.py), labelled by store
and schema (one schema per tenant); table series add the table.
"""

from __future__ import annotations

from guarded.observability import telemetry_names as names

from . import promql as q
from .backend_dashboard import INSTANCE, backend_dashboard
from .model import Dashboard, Panel, Query, QueryVariable, Row, SeriesStyle, Threshold
from .semantics import PARTITION_HORIZON_ALERT_SECONDS
from .store_overview import PAUSE_ALERTS

UID = "guarded-postgres"
SCOPE = q.Scope((INSTANCE, names.LABEL_STORE, names.LABEL_SCHEMA))
STORE_SCHEMA = (names.LABEL_STORE, names.LABEL_SCHEMA)
PER_PROCESS = (INSTANCE, *STORE_SCHEMA)
PER_TABLE = (*STORE_SCHEMA, names.LABEL_TABLE)
PROCESS_LEGEND = "{{store}}/{{schema}} @ {{instance}}"
TABLE_LEGEND = "{{store}}/{{schema}} {{table}}"
STATS_TIMESTAMP = names.GUARDED_PG_TABLE_STATS_TIMESTAMP
CONNECTION_ERRORS = q.counter(names.GUARDED_PG_CONNECTION_ERRORS_TOTAL)
POOLER_ERRORS = q.counter(names.GUARDED_PG_POOLER_ERRORS_TOTAL)
BACKEND_ALERTS = (
    *PAUSE_ALERTS,
    names.ALERT_REPLICA_SKIPPED,
    names.ALERT_PARTITION_HORIZON_NEAR,
    names.ALERT_CIRCUIT_OPEN,
    names.ALERT_ERROR_BUDGET_BURN,
    names.ALERT_LATENCY_P99,
)


def _pool_panels() -> tuple[Panel, ...]:
    def per_process(metric: str) -> str:
        return q.sum_by(PER_PROCESS, SCOPE.selector(metric))

    return (
        Panel(
            title="Pool connections",
            description=(
                "Connections of each process's asyncpg pool: open, checked out (in use) and the "
                "configured maximum (dashed). In use at the maximum means calls wait for a connection "
                "(see Acquire wait)."
            ),
            queries=(
                Query(per_process(names.GUARDED_PG_POOL_SIZE), f"open {PROCESS_LEGEND}"),
                Query(per_process(names.GUARDED_PG_POOL_IN_USE), f"in use {PROCESS_LEGEND}"),
                Query(per_process(names.GUARDED_PG_POOL_MAX_SIZE), f"max {PROCESS_LEGEND}"),
            ),
            series=(SeriesStyle("^max ", dashed=True),),
        ),
        Panel(
            title="Pool utilisation",
            description=(
                "Connections in use over the pool's maximum. Near 100% calls queue for a connection: "
                "find slow queries first, then raise PoolSettings.max_size (GUARDED_PG_POOL_MAX_SIZE) "
                "within the server's max_connections across all processes."
            ),
            queries=(
                Query(
                    q.ratio(
                        per_process(names.GUARDED_PG_POOL_IN_USE), per_process(names.GUARDED_PG_POOL_MAX_SIZE)
                    ),
                    PROCESS_LEGEND,
                ),
            ),
            unit="percentunit",
            maximum=1,
            thresholds=(Threshold("yellow", 0.8), Threshold("red", 0.95)),
        ),
        Panel(
            title="Acquire wait (p50 / p95 / p99)",
            description=(
                "Time a call waited for a pool connection. It is normally below a millisecond; a tail "
                "of hundreds of milliseconds means the pool is exhausted (see Pool utilisation) and "
                "shows up as store latency and timeouts on the StateStore overview dashboard."
            ),
            queries=tuple(
                Query(
                    q.quantile(
                        quantile,
                        STORE_SCHEMA,
                        SCOPE.selector(q.bucket(names.GUARDED_PG_POOL_ACQUIRE_SECONDS)),
                    ),
                    f"p{round(quantile * 100)} {{{{store}}}}/{{{{schema}}}}",
                    exemplar=True,
                )
                for quantile in (0.5, 0.95, 0.99)
            ),
            unit="s",
        ),
        Panel(
            title="Connection errors per second",
            description=(
                "Operations that lost their database connection (re-run on a fresh one or failed). "
                "Any sustained rate means the network, PgBouncer or the server drops connections: "
                "check the server's log and max_connections; the guard's retries hide short bursts."
            ),
            queries=(
                Query(
                    q.sum_by(STORE_SCHEMA, q.rate(SCOPE.selector(CONNECTION_ERRORS))), "{{store}}/{{schema}}"
                ),
            ),
            unit="ops",
            thresholds=(Threshold("red", 0.1),),
        ),
        Panel(
            title="Connection pooler errors per second, by kind",
            description=(
                "Operations that failed because the store's connection settings do not suit the "
                "connection pooler in front of PostgreSQL: a store in the default (session) mode behind "
                "PgBouncer, RDS Proxy or Supavisor in transaction mode (prepared statements missing or "
                "already present on the server connection, a refused start-up parameter). Any rate "
                'needs an operator: set pooler="transaction" (GUARDED_PG_POOLER=transaction). '
                "Writes that failed so are held and replayed once it is fixed."
            ),
            queries=(
                Query(
                    q.sum_by(
                        (*STORE_SCHEMA, names.LABEL_POOLER_ERROR_KIND), q.rate(SCOPE.selector(POOLER_ERRORS))
                    ),
                    "{{store}}/{{schema}} {{kind}}",
                ),
            ),
            unit="ops",
            thresholds=(Threshold("red", 0.001),),
        ),
    )


def _replica_panels() -> tuple[Panel, ...]:
    per_replica = (*STORE_SCHEMA, names.LABEL_REPLICA)
    reads = q.sum_by(
        (*STORE_SCHEMA, names.LABEL_TARGET), q.rate(SCOPE.selector(q.counter(names.GUARDED_PG_READS_TOTAL)))
    )
    skipped = q.sum_by(
        (*per_replica, names.LABEL_REASON),
        q.increase(SCOPE.selector(q.counter(names.GUARDED_PG_REPLICA_SKIPPED_TOTAL))),
    )
    return (
        Panel(
            title="Reads by server",
            description=(
                "History and list reads per second by the server that answered them: the primary or a "
                "replica (replica0, replica1... in the order of replica_dsn). A read goes to the primary "
                "when this process wrote its trace or session more recently than the replicas have "
                "replayed, when writes are held for replay, and whenever no replica is in use."
            ),
            queries=(Query(reads, "{{target}} {{store}}/{{schema}}"),),
            unit="reqps",
            width=8,
        ),
        Panel(
            title="Replica lag",
            description=(
                "How far each replica is behind the primary, measured by WAL position at every check "
                "(replica_check_interval): seconds since the primary last had nothing the replica has "
                "not replayed. An idle primary costs no lag. Above replica_max_lag (10 s by default) the "
                "replica is left out of the reads; a line that only climbs is a replica not replaying."
            ),
            queries=(
                Query(
                    q.max_by(per_replica, SCOPE.selector(names.GUARDED_PG_REPLICA_LAG_SECONDS)),
                    "{{replica}} {{store}}/{{schema}}",
                ),
            ),
            unit="s",
            thresholds=(Threshold("yellow", 5), Threshold("red", 10)),
            width=8,
        ),
        Panel(
            title="Replicas left out",
            description=(
                "Checks that left a replica out of the reads, and reads it failed, per interval and by "
                "reason: unreachable (no answer within replica_read_timeout), lagging (beyond "
                "replica_max_lag), not_replica (the DSN names a primary), failed (a read failed or was "
                "slow; the primary answered it). No call fails for it (GuardedReplicaSkipped)."
            ),
            queries=(Query(skipped, "{{replica}} {{reason}} {{store}}/{{schema}}"),),
            decimals=0,
            width=8,
        ),
    )


def _table_panels() -> tuple[Panel, ...]:
    rows = q.max_by(PER_TABLE, SCOPE.selector(names.GUARDED_PG_TABLE_ROWS))
    deleted = q.sum_by(
        PER_TABLE, q.increase(SCOPE.selector(q.counter(names.GUARDED_PG_CLEANUP_DELETED_ROWS_TOTAL)))
    )
    return (
        Panel(
            title="Table rows (estimate)",
            description=(
                "Live rows per table from PostgreSQL's statistics (an estimate, sampled every "
                "stats_interval). Unbounded growth of flow_events, task updates or planner events means "
                "no retention: set RetentionPolicy and run `guarded pg cleanup`."
            ),
            queries=(Query(rows, TABLE_LEGEND),),
        ),
        Panel(
            title="Table size",
            description=(
                "On-disk size per table including indexes and TOAST. Plan disk from its slope; a table "
                "growing while its rows do not is bloat: check autovacuum."
            ),
            queries=(
                Query(q.max_by(PER_TABLE, SCOPE.selector(names.GUARDED_PG_TABLE_SIZE_BYTES)), TABLE_LEGEND),
            ),
            unit="bytes",
        ),
        Panel(
            title="Table statistics age",
            description=(
                "Time since the last successful table sample. It should stay below a few sampling "
                "intervals (stats_interval, 60 s by default); a growing age means sampling fails, so "
                "the row and size panels are stale: check the process's log and database access."
            ),
            queries=(
                Query(
                    f"time() - {q.max_by(PER_PROCESS, SCOPE.selector(STATS_TIMESTAMP))}",
                    PROCESS_LEGEND,
                ),
            ),
            unit="s",
            thresholds=(Threshold("yellow", 180), Threshold("red", 600)),
            width=8,
        ),
        Panel(
            title="Rows deleted by cleanup",
            description=(
                "Rows removed by `cleanup()` per interval (expired pauses, over-age events and "
                "updates). Zero while tables grow means cleanup is not scheduled or no retention is "
                "configured."
            ),
            queries=(Query(q.or_zero(deleted, rows), TABLE_LEGEND),),
            decimals=0,
            width=8,
        ),
        Panel(
            title="Schema version",
            description=(
                "Migration version each process runs against, and the newest its code knows. All processes "
                "of a schema should agree; a process whose code knows less than the schema's version is an "
                "old deployment still running (GuardedSchemaVersionSkew). Migrations are forward-only: old "
                "code refuses a newer schema (SchemaTooNewError). `guarded pg status` shows the database's."
            ),
            queries=(
                Query(
                    q.max_by(PER_PROCESS, SCOPE.selector(names.GUARDED_PG_MIGRATION_VERSION)), PROCESS_LEGEND
                ),
                Query(
                    q.max_by(PER_PROCESS, SCOPE.selector(names.GUARDED_PG_SCHEMA_EXPECTED_VERSION)),
                    f"code knows {PROCESS_LEGEND}",
                ),
            ),
            kind="stat",
            unit="none",
            decimals=0,
            width=8,
        ),
    )


def _partition_panels() -> tuple[Panel, ...]:
    dropped = q.sum_by(
        PER_TABLE, q.increase(SCOPE.selector(q.counter(names.GUARDED_PG_PARTITIONS_DROPPED_TOTAL)))
    )
    returned = q.sum_by(
        PER_TABLE, q.increase(SCOPE.selector(q.counter(names.GUARDED_PG_PARTITION_DROPPED_BYTES_TOTAL)))
    )
    horizon = q.max_by(PER_TABLE, SCOPE.selector(names.GUARDED_PG_PARTITION_HORIZON))
    return (
        Panel(
            title="Partition horizon (time left)",
            description=(
                "How far ahead each partitioned table has partitions: where its newest partition ends, "
                "minus now. Maintenance (every store opened with partitioning=, hourly; or `guarded pg "
                "maintain`) keeps it about a week; a falling line means maintenance stopped. Rows timed "
                "past the horizon go to the default partition (writes never fail), where retention can "
                "only delete them row by row. The red line is GuardedPgPartitionHorizonNear's threshold. "
                "No series: no store runs with partitioning=."
            ),
            queries=(Query(f"{horizon} - time()", TABLE_LEGEND),),
            unit="s",
            thresholds=(Threshold("red", PARTITION_HORIZON_ALERT_SECONDS),),
        ),
        Panel(
            title="Partitions dropped by cleanup",
            description=(
                "Whole partitions cleanup() dropped per interval: a partition goes once it ends before now "
                "minus the table's RetentionPolicy max age. Rows deleted one by one (the default "
                "partition, a converted table's legacy partition, unpartitioned tables) are in 'Rows "
                "deleted by cleanup'. Zero while partitions pile up: no max age set or cleanup not "
                "scheduled."
            ),
            queries=(Query(q.or_zero(dropped, horizon), TABLE_LEGEND),),
            decimals=0,
            width=6,
        ),
        Panel(
            title="Space returned by partition drops",
            description=(
                "Bytes (heap, indexes, TOAST) the dropped partitions held, per interval: returned to the "
                "file system at once, unlike row deletes, whose space only autovacuum makes reusable."
            ),
            queries=(Query(q.or_zero(returned, horizon), TABLE_LEGEND),),
            unit="bytes",
            width=6,
        ),
    )


def dashboard() -> Dashboard:
    """The Postgres backend dashboard."""
    source = q.histogram_count(names.GUARDED_PG_POOL_ACQUIRE_SECONDS)
    return backend_dashboard(
        uid=UID,
        title="guarded / Postgres backend",
        description=(
            "asyncpg pool, acquire wait, connection errors, read replicas, table rows and sizes, cleanup, "
            "schema version, partitions."
        ),
        tags=("guarded", "postgres"),
        source=source,
        alerts=BACKEND_ALERTS,
        rows=(
            Row("Connection pool", _pool_panels()),
            Row("Read replicas", _replica_panels()),
            Row("Tables", _table_panels()),
            Row("Partitions", _partition_panels()),
        ),
        variables=(
            QueryVariable(
                names.LABEL_SCHEMA,
                "Schema",
                f"{source}{{{q.variable_matcher(INSTANCE)}, {q.variable_matcher(names.LABEL_STORE)}}}",
            ),
        ),
    )
