"""``PostgresStateStore``: the whole StateStore protocol on PostgreSQL (asyncpg).

Lifecycle::

    store = await PostgresStateStore.connect(dsn, schema="tenant_a")     # pool + migrations
    store = await PostgresStateStore.from_pool(app_pool, schema="tenant_a")  # your pool
    store = PostgresStateStore.lazy(dsn)          # sync: the pool opens on first use
    store = await PostgresStateStore.connect(dsn, pooler="transaction")  # behind PgBouncer & co.
    async with await PostgresStateStore.connect(dsn) as store: ...
    await store.close()

Every method validates its arguments before any I/O: values that can never be stored raise
:class:`~guarded.errors.InvalidPayloadError` (non-retryable) naming the method and the field
path.

Bulk forms write many calls of a method in one round trip: ``save_events``, ``save_updates``,
``save_planner_events`` (appends) and ``save_memory_states``, ``save_tasks``,
``save_trajectories``, ``save_remote_bindings``, ``mark_bindings_terminal``,
``save_planner_states`` (upserts). Each takes one list -- for a single-parameter method each item
is that argument, else the tuple of the single method's parameters in signature order -- and
leaves what the single method called once per item in list order would leave (the last item of
a key wins). One bad item raises the single method's error, with the item's index in the path,
before anything is written.

Everything else a method raises comes from the database (connection loss, timeouts) and is for
the guard's retry / circuit-breaker / dead-letter layers to handle: this is a plain store that
may throw, ``guard()`` makes it safe.

Record types returned are PenguiFlow's own classes when ``penguiflow`` is installed, else
guarded's models (:func:`guarded.codec.installed_types`); pass ``types=`` to choose.

This module builds, opens and closes the store; the protocol's methods are its base's
(:class:`~.protocol_methods.ProtocolMethods`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, Unpack

import asyncpg

from guarded.backend import PoolUsage
from guarded.codec import installed_types

from . import schema_migrations as migrations_module
from .artifact_store import PostgresArtifactStore
from .connection import Database, PoolSettings, create_pool, pool_settings, with_pooler
from .database_metrics import StoreMetrics
from .error_classifier import POSTGRES_ERRORS
from .lifecycle import Lifecycle, server_target
from .options import (
    DEFAULT_CONSUME_GRACE_SECONDS,
    DEFAULT_PAUSE_TTL_SECONDS,
    DEFAULT_STATS_INTERVAL_SECONDS,
    RetentionPolicy,
    StoreOptions,
    check_options,
    check_seconds,
)
from .partition_maintenance import PartitionMaintenance
from .partitioning import check_period
from .protocol_methods import ProtocolMethods
from .read_routing import ReplicaStatus
from .replica_set import read_router
from .retention import CleanupReport, cleanup
from .schema_names import validate_schema_name
from .tables import Tables
from .target import target_identity


class PostgresStateStore(ProtocolMethods):
    """A production StateStore on PostgreSQL; every capability of the protocol, one schema per tenant."""

    honours_idempotency_key = True
    """A consume is safe to retry under one idempotency key: the guard retries it."""
    error_classifier = POSTGRES_ERRORS
    """How the guard classifies this store's errors (:mod:`.errors`: SQLSTATEs)."""
    recovers_unanswered_consumes = True
    """A consume recovers a pause consumed by a key whose answer was lost (see :mod:`.pauses`)."""

    def __init__(
        self,
        db: Database,
        *,
        schema: str,
        owns_pool: bool,
        replica_pool: PoolSettings | None = None,
        **options: Unpack[StoreOptions],
    ) -> None:
        """Use :meth:`connect`, :meth:`from_pool` or :meth:`lazy` rather than this constructor
        (``replica_pool``: the pool settings of the replicas' pools, default the defaults)."""
        self.schema = validate_schema_name(schema)
        self.name = options.get("name", "postgres")
        self.types = options.get("types") or installed_types()
        self.pause_ttl = check_seconds("pause_ttl", options.get("pause_ttl", DEFAULT_PAUSE_TTL_SECONDS))
        self.consume_grace = check_seconds(
            "consume_grace", options.get("consume_grace", DEFAULT_CONSUME_GRACE_SECONDS), allow_zero=True
        )
        self.retention = options.get("retention") or RetentionPolicy()
        interval = options.get("stats_interval", DEFAULT_STATS_INTERVAL_SECONDS)
        stats_interval = None if interval is None else check_seconds("stats_interval", interval)
        self._db = db
        self._metrics: StoreMetrics | None = None
        if options.get("metrics", True):
            self._metrics = StoreMetrics(
                store=self.name,
                schema=self.schema,
                registry=options.get("registry"),
                pool_size=db.pool_size,
                pool_max_size=db.pool_max_size,
                pool_in_use=db.pool_in_use,
            )
        db.metrics = self._metrics
        self._tables = self._tables_on(db, options)
        self._router = read_router(
            db,
            self._tables,
            lambda replica_db: self._tables_on(replica_db, options),
            options,
            pool=replica_pool or PoolSettings(),
            store_name=self.name,
            schema=self.schema,
        )
        self.routes_reads = self._router is not None
        """Reads may be answered by a replica: the guard marks the reads that must be current
        (:data:`guarded.backend.ROUTES_READS`)."""
        self.max_concurrency: int | None = db.pool_max_size() or None
        """How many calls this store runs at once: its pool's maximum size (a lazy store's from its
        pool settings). The guard's bulkhead reads it (:data:`guarded.backend.MAX_CONCURRENCY`)
        and lets that many calls in at a time, so callers wait in the guard's line rather than
        for a connection, and that wait never counts as the database being slow. On a pool the
        application shares, set ``GuardConfig.bulkhead.max_concurrent`` to this store's share."""
        self._lifecycle = Lifecycle(
            db,
            self.schema,
            name=self.name,
            migrate=options.get("migrate", True),
            metrics=self._metrics,
            stats_interval=stats_interval,
            owns_pool=owns_pool,
        )
        partitioning = options.get("partitioning")
        self.partitioning = None if partitioning is None else check_period(partitioning)
        """The partition period (``partitioning=``), or ``None``."""
        self._lifecycle.on_partitioned = self._partitioned
        if self.partitioning is not None:
            self._lifecycle.partitions = PartitionMaintenance(
                db, self.schema, self.partitioning, self._metrics
            )
        self.target_identity = f"postgresql://(application pool)/?schema={self.schema}"
        """Which database and schema this store writes to, without credentials (recorded by the
        guard's spill file so held writes are replayed only here); set from the DSN by
        :meth:`connect` and :meth:`lazy`, from the server by :meth:`from_pool`."""

    def _tables_on(self, db: Database, options: StoreOptions) -> Tables:
        return Tables.of(
            db,
            self.schema,
            self.types,
            pause_ttl=self.pause_ttl,
            consume_grace=self.consume_grace,
            artifact_retention=options.get("artifact_retention"),
        )

    # ------------------------------------------------------------------------------------------------
    # Lifecycle
    # ------------------------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        dsn: str | None = None,
        *,
        schema: str = "public",
        pool: PoolSettings | Mapping[str, Any] | None = None,
        pooler: str | None = None,
        **options: Unpack[StoreOptions],
    ) -> Self:
        """Create a pool for ``dsn``, apply migrations to ``schema`` and return a ready store.

        ``dsn`` ``None`` lets asyncpg read the standard ``PG*`` environment variables.
        ``pool`` sets the pool size, ``command_timeout``, server ``statement_timeout`` and
        connection setup (see :class:`~.connection.PoolSettings`). ``pooler="transaction"``
        (short for ``PoolSettings.pooler``) when a connection pooler in transaction mode (PgBouncer,
        RDS Proxy, Supavisor) sits in front of the server: the store then keeps nothing in a
        session (see :mod:`.pooler`).
        """
        validate_schema_name(schema)
        check_options("PostgresStateStore.connect()", options, StoreOptions.__optional_keys__)
        settings = with_pooler(pool_settings("PostgresStateStore.connect()", pool), pooler)
        created = await create_pool(dsn, settings)
        try:
            store = cls(
                Database(created, settings=settings),
                schema=schema,
                owns_pool=True,
                replica_pool=settings,
                **options,
            )
        except BaseException:
            await created.close()
            raise
        store.target_identity = target_identity(dsn, store.schema)
        try:
            await store._opened()
        except BaseException:
            await store.close()
            raise
        return store

    @classmethod
    async def from_pool(
        cls, pool: asyncpg.Pool, *, schema: str = "public", **options: Unpack[StoreOptions]
    ) -> Self:
        """A store on an application-owned pool (not closed by :meth:`close`); migrations applied."""
        check_options("PostgresStateStore.from_pool()", options, StoreOptions.__optional_keys__)
        store = cls(Database(pool), schema=schema, owns_pool=False, **options)
        try:
            await store._opened()
            target = await server_target(pool, store.schema)
            if target is not None:
                store.target_identity = target
        except BaseException:
            await store.close()
            raise
        return store

    @classmethod
    def lazy(
        cls,
        dsn: str | None = None,
        *,
        schema: str = "public",
        pool: PoolSettings | Mapping[str, Any] | None = None,
        pooler: str | None = None,
        **options: Unpack[StoreOptions],
    ) -> Self:
        """A store built synchronously whose pool (and migrations) open on the first call
        (``pooler`` as in :meth:`connect`)."""
        check_options("PostgresStateStore.lazy()", options, StoreOptions.__optional_keys__)
        settings = with_pooler(pool_settings("PostgresStateStore.lazy()", pool), pooler)
        holder: list[PostgresStateStore] = []

        async def opener() -> asyncpg.Pool:
            created = await create_pool(dsn, settings)
            try:
                await holder[0]._lifecycle.prepare_schema(created)
            except BaseException:
                await created.close()
                raise
            holder[0]._lifecycle.start_sampler()
            return created

        store = cls(
            Database(opener=opener, settings=settings),
            schema=validate_schema_name(schema),
            owns_pool=True,
            replica_pool=settings,
            **options,
        )
        store.target_identity = target_identity(dsn, store.schema)
        store.max_concurrency = settings.max_size
        holder.append(store)
        return store

    def _partitioned(self) -> None:
        self._tables.updates.use_partitioned_table()
        self._tables.steering.use_partitioned_table()

    async def _opened(self) -> None:
        await self._lifecycle.open()

    @property
    def schema_version(self) -> int | None:
        """The schema's migration version once opened (``None`` before)."""
        return self._lifecycle.schema_version

    async def sample_table_stats(self) -> dict[str, tuple[int, int]]:
        """Sample ``{table: (estimated rows, bytes)}`` now and update the metrics."""
        return await self._lifecycle.sample_table_stats()

    async def close(self) -> None:
        """Stop background sampling, drop this store's metrics and close the pool when the store
        owns it (the replicas' pools always)."""
        if self._router is not None:
            await self._router.close()
        await self._lifecycle.close()

    async def check_replicas(self) -> list[ReplicaStatus]:
        """Measure every replica's lag now and say which are in use (``[]`` without replicas); the
        store also does this every ``replica_check_interval`` seconds while reads come."""
        return [] if self._router is None else await self._router.check()

    async def __aenter__(self) -> Self:
        if not self._db.is_open:
            await self._db.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def pool(self) -> asyncpg.Pool:
        """The asyncpg pool (for ops tooling; the store does not expect others to use its schema)."""
        return self._db.pool

    def pool_usage(self) -> PoolUsage | None:
        """How full the store's pool is now: connections in use, the maximum, callers waiting
        (:class:`guarded.backend.ReportsPoolUsage`; the guard's health check reports
        ``pool_saturated`` from it). ``None`` before a lazy store's pool is opened."""
        return self._db.pool_usage()

    async def migration_status(self) -> migrations_module.MigrationStatus:
        """Where the schema stands relative to the migrations shipped with this code."""
        async with self._db.acquire() as conn:
            return await migrations_module.status(conn, self.schema)

    async def cleanup(self) -> CleanupReport:
        """Delete expired pauses and artifacts and enforce the configured retention (on a partitioned
        schema by dropping whole partitions); report rows deleted and partitions dropped."""
        report = await cleanup(self._db, self.schema, grace=self.consume_grace, policy=self.retention)
        if self._metrics is not None:
            for table, rows in report.deleted.items():
                self._metrics.cleanup_deleted(table, rows)
            for table, dropped in report.dropped.items():
                self._metrics.partitions_dropped(table, len(dropped), report.dropped_bytes.get(table, 0))
        return report

    async def maintain(self) -> dict[str, list[str]]:
        """Create the partitions ahead on a partitioned schema now (the store does it on open and
        hourly when opened with ``partitioning=``); return the partitions created per table."""
        maintenance = self._lifecycle.partitions
        if maintenance is None:
            maintenance = PartitionMaintenance(self._db, self.schema, None, self._metrics)
        return await maintenance.run()

    def __repr__(self) -> str:
        return f"PostgresStateStore(name={self.name!r}, schema={self.schema!r})"

    # ------------------------------------------------------------------------------------------------
    # Artifacts
    # ------------------------------------------------------------------------------------------------

    @property
    def artifact_store(self) -> PostgresArtifactStore:
        """Artifacts in this store's schema, with the configured retention."""
        return self._tables.artifacts


__all__ = ["PostgresStateStore", "StoreOptions"]
