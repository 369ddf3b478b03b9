"""``cleanup()``: delete expired pauses and artifacts, enforce the configured retention.

* ``planner_pauses``: rows past ``expires_at`` (for a consumed row, its tombstone: the pause TTL
  after the consume), a consumed row not before its grace period is over.
* ``artifacts``: rows past ``expires_at`` (the artifact TTL).
* ``flow_events``, ``state_updates``, ``steering_events``, ``planner_events``: rows stored longer
  ago than the :class:`~.options.RetentionPolicy` maximum age, when one is configured.

Deletes run in batches of ``RetentionPolicy.batch_size`` rows (``DELETE ... WHERE ctid = ANY
(ARRAY(SELECT ctid ... LIMIT n))``), each its own short transaction, so a large backlog never
holds a long lock or a huge transaction. The time-correlated tables use BRIN indexes on
``created_at`` for these scans. At high volume, time partitioning replaces row deletes with
``DROP``/``DETACH PARTITION`` (see the backend README, "Partitioning plan").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .connection import Database
from .options import RetentionPolicy
from .schema_names import qualified


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """Rows deleted per table by one ``cleanup()``."""

    deleted: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    def __str__(self) -> str:
        if not self.total:
            return "nothing to clean up"
        return ", ".join(f"{table}: {rows}" for table, rows in self.deleted.items() if rows)


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
    for table, max_age in (
        ("flow_events", policy.events_max_age),
        ("state_updates", policy.updates_max_age),
        ("steering_events", policy.steering_max_age),
        ("planner_events", policy.planner_events_max_age),
    ):
        if max_age is not None:
            deleted[table] = await _delete_batched(
                db,
                qualified(schema, table),
                "created_at < now() - make_interval(secs => $1)",
                (float(max_age),),
                batch,
            )
    return CleanupReport(deleted)


__all__ = ["CleanupReport", "cleanup"]
