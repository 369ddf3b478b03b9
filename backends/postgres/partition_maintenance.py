"""A partitioned store's upkeep: on open, and every :data:`MAINTENANCE_INTERVAL_SECONDS` after.

On open (:meth:`PartitionMaintenance.prepare`) a store with ``partitioning=`` partitions a schema
whose history tables are all empty (a new one) and refuses one holding unpartitioned rows
(:class:`~.partitioning.PartitioningError` naming ``guarded pg partition``: converting a populated
schema is an operator's decision, never a side effect of a deploy). Then, and in the background,
:meth:`PartitionMaintenance.run` creates the partitions ahead (:func:`~.partitioning.ensure_partitions`)
and exports each table's horizon. A failed run is logged and retried at the next interval; the
horizon metric and its alert show a maintenance that keeps failing long before writes would have
to go to the default partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from .connection import Connection, Database
from .database_metrics import StoreMetrics
from .partition_conversion import partition_empty_schema
from .partitioning import ensure_partitions, schema_layout

logger = logging.getLogger("guarded.backends.postgres")

MAINTENANCE_INTERVAL_SECONDS = 3600.0
"""How often a store with ``partitioning=`` creates the partitions ahead (they are created a week
ahead, so a run missed now and then changes nothing)."""


class PartitionMaintenance:
    """The partition upkeep of one store on one schema, with period ``period`` (``None``: each
    table's newest partition's)."""

    def __init__(self, db: Database, schema: str, period: str | None, metrics: StoreMetrics | None) -> None:
        self._db = db
        self._schema = schema
        self.period = period
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None

    async def prepare(self, conn: Connection) -> None:
        """On open: partition a new schema, refuse an unpartitioned populated one, create partitions
        (a failure of that last step is logged, not raised: the default partition takes the rows
        meanwhile, and the next run retries)."""
        if self.period is not None:
            await partition_empty_schema(conn, self._schema, self.period, now=time.time())
        try:
            await self._maintain(conn)
        except Exception as exc:
            self._failed(exc)

    async def run(self) -> dict[str, list[str]]:
        """Create the partitions ahead now; return the names created per table."""
        async with self._db.acquire() as conn:
            return await self._maintain(conn)

    async def _maintain(self, conn: Connection) -> dict[str, list[str]]:
        created = await ensure_partitions(conn, self._schema, self.period, now=time.time())
        if self._metrics is not None:
            for layout in await schema_layout(conn, self._schema):
                if layout.horizon is not None:
                    self._metrics.set_partition_horizon(layout.table.name, layout.horizon)
        return created

    def start(self, interval: float = MAINTENANCE_INTERVAL_SECONDS) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._forever(interval), name=f"guarded-pg-partitions-{self._schema}"
            )

    async def _forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        logger.warning(
            "guarded_pg_partition_maintenance_failed",
            extra={
                "event": "guarded_pg_partition_maintenance_failed",
                "schema": self._schema,
                "exception": type(exc).__name__,
            },
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


__all__ = ["MAINTENANCE_INTERVAL_SECONDS", "PartitionMaintenance"]
