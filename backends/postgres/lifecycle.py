"""What a :class:`~.store.PostgresStateStore` does around its calls: preparing its schema
(applying migrations, or requiring an up-to-date schema), sampling table sizes into its metrics in
the background, and closing (the sampler, the metrics, the pool when the store owns it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import asyncpg

from . import schema_migrations as migrations_module
from .connection import Database
from .database_metrics import StoreMetrics
from .partition_maintenance import PartitionMaintenance
from .partitioning import is_partitioned
from .table_stats import table_stats

logger = logging.getLogger("guarded.backends.postgres")

_STATS_FAILURE_LOG_INTERVAL = 300.0
"""Seconds between two warnings of failing table-stats samples, at least."""


class Lifecycle:
    """Opening, background sampling and closing of one store (see the module docs)."""

    def __init__(
        self,
        db: Database,
        schema: str,
        *,
        name: str,
        migrate: bool,
        metrics: StoreMetrics | None,
        stats_interval: float | None,
        owns_pool: bool,
    ) -> None:
        self._db = db
        self._schema = schema
        self._name = name
        self._migrate = migrate
        self._metrics = metrics
        self._stats_interval = stats_interval
        self._owns_pool = owns_pool
        self._sampler: asyncio.Task[None] | None = None
        self._closed = False
        self.schema_version: int | None = None
        self.partitions: PartitionMaintenance | None = None
        """The partition upkeep of a store opened with ``partitioning=`` (run on open, then periodically)."""
        self.on_partitioned: Callable[[], None] | None = None
        """Called when the schema, once prepared, has partitioned history tables."""

    async def open(self) -> None:
        """The pool is open: prepare the schema and start sampling."""
        await self.prepare_schema(self._db.pool)
        self.start_sampler()

    async def prepare_schema(self, pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn:
            if self._migrate:
                await migrations_module.migrate(
                    conn, self._schema, transaction_scoped=self._db.transaction_pooled
                )
                version = migrations_module.latest_version()
            else:
                version = await migrations_module.require_current(conn, self._schema)
            if self.partitions is not None:
                await self.partitions.prepare(conn)
            if self.on_partitioned is not None and await is_partitioned(conn, self._schema, "state_updates"):
                self.on_partitioned()
        self.schema_version = version
        if self._metrics is not None:
            self._metrics.set_schema_version(version, migrations_module.latest_version())

    def start_sampler(self) -> None:
        if self.partitions is not None:
            self.partitions.start()
        if self._metrics is None or self._stats_interval is None or self._sampler is not None:
            return
        self._sampler = asyncio.get_running_loop().create_task(
            self._sample_forever(self._stats_interval), name=f"guarded-pg-stats-{self._name}-{self._schema}"
        )

    async def _sample_forever(self, interval: float) -> None:
        last_error = 0.0
        while True:
            try:
                await self.sample_table_stats()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                now = time.monotonic()
                if now - last_error > _STATS_FAILURE_LOG_INTERVAL:
                    last_error = now
                    logger.warning(
                        "guarded_pg_stats_failed",
                        extra={
                            "event": "guarded_pg_stats_failed",
                            "schema": self._schema,
                            "exception": repr(exc),
                        },
                    )
            await asyncio.sleep(interval)

    async def sample_table_stats(self) -> dict[str, tuple[int, int]]:
        """Sample ``{table: (estimated rows, bytes)}`` now and update the metrics."""
        stats = await table_stats(self._db, self._schema)
        if self._metrics is not None:
            self._metrics.set_table_stats(stats)
        return stats

    async def close(self) -> None:
        """Stop sampling, drop the metrics and close the pool when the store owns it (once)."""
        if self._closed:
            return
        self._closed = True
        if self.partitions is not None:
            await self.partitions.stop()
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._metrics is not None:
            self._metrics.close()
        if self._owns_pool and self._db.is_open:
            try:
                await asyncio.wait_for(self._db.pool.close(), timeout=10)
            except TimeoutError:
                self._db.pool.terminate()
            except asyncio.CancelledError:
                # The caller gave up on the close (a server that never answers): no pool left open.
                self._db.pool.terminate()
                raise


async def server_target(pool: asyncpg.Pool, schema: str) -> str | None:
    """Which database and schema a store on ``pool`` writes to, as the server names it."""
    async with pool.acquire() as conn:
        where = await conn.fetchrow(
            "SELECT coalesce(host(inet_server_addr()), 'local') AS host, "
            "coalesce(inet_server_port(), 0) AS port, current_database() AS db"
        )
    if where is None:
        return None
    return f"postgresql://{where['host']}:{where['port']}/{where['db']}?schema={schema}"


__all__ = ["Lifecycle", "server_target"]
