"""``cleanup()``: delete expired pauses and artifacts, enforce the configured retention.

* ``planner_pauses``: rows past ``expires_at`` (for a consumed row, its tombstone: the pause TTL
  after the consume), a consumed row not before its grace period is over.
* ``artifacts``: rows past ``expires_at`` (the artifact TTL).
* ``flow_events``, ``state_updates``, ``steering_events``, ``planner_events``: rows stored longer
  ago than the :class:`~.options.RetentionPolicy` maximum age, when one is configured.

Deletes run in batches of ``RetentionPolicy.batch_size`` rows (``DELETE ... WHERE ctid = ANY
(ARRAY(SELECT ctid ... LIMIT n))``), each its own short transaction, so a large backlog never
holds a long lock or a huge transaction. The time-correlated tables use BRIN indexes on
``created_at`` for these scans.

On a partitioned table (:mod:`.partitioning`) retention drops whole partitions instead: each
partition of one period that ends before the horizon (now minus the maximum age, on the partition
key) is detached and dropped, and its space returned at once; a partition still partly inside the
horizon is kept whole until it is not (rows live at most one period past their maximum age). The
two partitions without a period -- the default partition and a converted table's legacy heap --
keep the batched ``DELETE`` by ``created_at`` above (the legacy heap is dropped whole once its
cut-over is past the horizon).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .connection import Database
from .options import RetentionPolicy
from .partitioning import PARTITIONED_TABLES, drop_partition, relation, table_layout
from .schema_names import qualified


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """Rows deleted, and partitions dropped (with the bytes they held), per table by one ``cleanup()``."""

    deleted: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, list[str]] = field(default_factory=dict)
    dropped_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    def __str__(self) -> str:
        parts = [f"{table}: {rows}" for table, rows in self.deleted.items() if rows]
        parts += [
            f"{table}: {len(names)} partition{'s' if len(names) != 1 else ''} dropped"
            for table, names in self.dropped.items()
            if names
        ]
        return ", ".join(parts) if parts else "nothing to clean up"


async def _delete_batched(
    db: Database, table: str, condition: str, args: tuple[object, ...], batch: int
) -> int:
    n = len(args) + 1
    sql = (
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {condition} LIMIT ${n}))"
    )
    total = 0
    while True:
        status = await db.execute(sql, *args, batch)
        deleted = int(status.rsplit(" ", 1)[-1])
        total += deleted
        if deleted < batch:
            return total


async def cleanup(db: Database, schema: str, *, grace: float, policy: RetentionPolicy) -> CleanupReport:
    """Run every cleanup rule once; return the rows deleted per table."""
    batch = policy.batch_size
    deleted: dict[str, int] = {}
    deleted["planner_pauses"] = await _delete_batched(
        db,
        qualified(schema, "planner_pauses"),
        "expires_at <= now() AND (consumed_at IS NULL OR consumed_at <= now() - make_interval(secs => $1))",
        (grace,),
        batch,
    )
    deleted["artifacts"] = await _delete_batched(
        db, qualified(schema, "artifacts"), "expires_at <= now()", (), batch
    )
    dropped: dict[str, list[str]] = {}
    dropped_bytes: dict[str, int] = {}
    max_ages = {
        "flow_events": policy.events_max_age,
        "state_updates": policy.updates_max_age,
        "steering_events": policy.steering_max_age,
        "planner_events": policy.planner_events_max_age,
    }
    for table in PARTITIONED_TABLES:
        max_age = max_ages[table.name]
        if max_age is None:
            continue
        async with db.acquire() as conn:
            layout = await table_layout(conn, schema, table)
            horizon = time.time() - max_age
            targets = [qualified(schema, table.name)]
            if layout.partitioned:
                targets = []
                names: list[str] = []
                size = 0
                for partition in layout.partitions:
                    if (
                        partition.upper is not None
                        and not partition.is_default
                        and partition.upper <= horizon
                    ):
                        size += await drop_partition(conn, schema, table, partition.name)
                        names.append(partition.name)
                    elif not partition.is_range:
                        targets.append(relation(schema, partition.name))
                dropped[table.name], dropped_bytes[table.name] = names, size
        deleted[table.name] = 0
        for target in targets:
            deleted[table.name] += await _delete_batched(
                db, target, "created_at < now() - make_interval(secs => $1)", (float(max_age),), batch
            )
    return CleanupReport(deleted, dropped, dropped_bytes)


__all__ = ["CleanupReport", "cleanup"]
