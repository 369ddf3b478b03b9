"""Converting an unpartitioned schema's history tables to partitioned ones (``guarded pg partition``).

No row is copied: each table's heap becomes the ``<table>_legacy`` partition of a new partitioned
table, holding everything before a cut-over instant (the start of the period after tomorrow, so
writes of the next day or more still land there while the conversion runs). Per table, in order,
each step checks the catalog first and does nothing when already done, so a killed run resumes
where it stopped:

1. ``prepare``: create ``<table>_partitioned`` (same columns; ``id`` from a new sequence), its
   indexes, its default partition and the first period's partition from the cut-over (one
   transaction, no lock on the live table).
2. ``index``: ``CREATE UNIQUE INDEX CONCURRENTLY`` of the partitioned unique key on the live table
   (writes go on; an invalid index left by a killed build is dropped and built again).
3. ``constrain``: ``ADD CONSTRAINT <table>_before_cutover CHECK (key < cut-over) NOT VALID``
   (a brief lock; existing rows are not scanned, new ones are checked).
4. ``validate``: ``VALIDATE CONSTRAINT`` (scans the table under ``SHARE UPDATE EXCLUSIVE``:
   reads and writes go on).
5. ``swap``: one short transaction under ``ACCESS EXCLUSIVE`` on the live table (waiting at most
   :data:`~.partitioning.LOCK_TIMEOUT`): carry the identity sequence's position to the new
   sequence, drop the identity, rename the table to ``<table>_legacy`` and the new one to
   ``<table>``, attach the legacy table for ``(MINVALUE) TO (cut-over)`` -- the validated
   constraint proves the bound, so nothing is scanned, and the unique index of step 2 becomes
   the partition's -- and drop the constraint.

A store opened with ``partitioning=`` on a schema whose history tables are all empty (a new
schema) is converted at once by :func:`partition_empty_schema`, in one transaction, without a
legacy partition; on a schema holding rows it refuses (:class:`~.partitioning.PartitioningError`
naming this command).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .connection import Connection
from .partitioning import (
    LOCK_TIMEOUT,
    PARTITIONED_TABLES,
    PartitionedTable,
    PartitioningError,
    ahead_until,
    default_name,
    ensure_partitions,
    is_partitioned,
    legacy_name,
    maintenance_lock_key,
    next_boundary,
    partition_name,
    period_start,
    relation,
    table_layout,
)
from .schema_names import quote_ident

STEPS = ("prepare", "index", "constrain", "validate", "swap")
"""The conversion's steps, in order (``guarded pg partition --until STEP`` stops after one)."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step of one table: ``ran`` false when the catalog showed it already done."""

    table: str
    step: str
    ran: bool


def _names(table: PartitionedTable) -> tuple[str, str, str, str]:
    """(new parent, sequence, unique index on the live table, cut-over constraint)."""
    return (
        f"{table.name}_partitioned",
        f"{table.name}_ids",
        f"{table.name}_partition_key",
        f"{table.name}_before_cutover",
    )


async def _exists(conn: Connection, schema: str, name: str) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", relation(schema, name)))


async def _create_parent(
    conn: Connection, schema: str, table: PartitionedTable, period: str, first: float, until: float, name: str
) -> None:
    """The partitioned table ``name`` like ``table``, with its indexes, default partition and the
    partitions of the periods from ``first`` up to ``until`` (inside the caller's transaction)."""
    _, sequence, _, _ = _names(table)
    parent = relation(schema, name)
    unique_where = f" WHERE {table.unique_where}" if table.unique_where else ""
    await conn.execute(
        f"CREATE TABLE {parent} (LIKE {relation(schema, table.name)} INCLUDING DEFAULTS) "
        f"PARTITION BY RANGE ({table.key})"
    )
    await conn.execute(f"CREATE SEQUENCE {relation(schema, sequence)} AS bigint OWNED BY {parent}.id")
    await conn.execute(
        f"ALTER TABLE {parent} ALTER COLUMN id SET DEFAULT nextval('{relation(schema, sequence)}')"
    )
    await conn.execute(
        f"CREATE UNIQUE INDEX {quote_ident(table.name + '_p_key')} ON {parent} "
        f"({table.unique_columns}){unique_where}"
    )
    for suffix, definition in table.indexes:
        await conn.execute(f"CREATE INDEX {quote_ident(f'{table.name}_p_{suffix}')} ON {parent} {definition}")
    await conn.execute(
        f"CREATE TABLE {relation(schema, default_name(table.name))} PARTITION OF {parent} DEFAULT"
    )
    start = first
    while start < until:
        end = next_boundary(period, start)
        await conn.execute(
            f"CREATE TABLE {relation(schema, partition_name(table.name, start))} PARTITION OF {parent} "
            f"FOR VALUES FROM ({table.literal(start)}) TO ({table.literal(end)})"
        )
        start = end


def cutover(period: str, now: float) -> float:
    """The instant a converted table's legacy partition ends: the start of the period after tomorrow."""
    return next_boundary(period, now + 86400.0)


async def _prepare(conn: Connection, schema: str, table: PartitionedTable, period: str, now: float) -> bool:
    parent, _, _, _ = _names(table)
    if await _exists(conn, schema, parent):
        return False
    async with conn.transaction():
        first = cutover(period, now)
        await _create_parent(conn, schema, table, period, first, next_boundary(period, first), parent)
    return True


async def _index(conn: Connection, schema: str, table: PartitionedTable) -> bool:
    _, _, index, _ = _names(table)
    valid = await conn.fetchval(
        "SELECT indisvalid FROM pg_catalog.pg_index WHERE indexrelid = to_regclass($1)",
        relation(schema, index),
    )
    if valid:
        return False
    if valid is not None:  # a build killed half-way leaves an invalid index behind
        await conn.execute(f"DROP INDEX CONCURRENTLY {relation(schema, index)}")
    unique_where = f" WHERE {table.unique_where}" if table.unique_where else ""
    await conn.execute(
        f"CREATE UNIQUE INDEX CONCURRENTLY {quote_ident(index)} ON {relation(schema, table.name)} "
        f"({table.unique_columns}){unique_where}"
    )
    return True


async def _constraint_state(conn: Connection, schema: str, table: PartitionedTable) -> bool | None:
    """``None``: no cut-over constraint; else whether it is validated."""
    _, _, _, constraint = _names(table)
    state: bool | None = await conn.fetchval(
        "SELECT convalidated FROM pg_catalog.pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2",
        relation(schema, table.name),
        constraint,
    )
    return state


async def _cutover_of(conn: Connection, schema: str, table: PartitionedTable) -> float:
    parent, _, _, _ = _names(table)
    layout = await table_layout(conn, schema, table, name=parent)
    lowers = [item.lower for item in layout.partitions if item.lower is not None and not item.is_default]
    if not lowers:
        raise PartitioningError(
            f"{schema}.{parent} has no range partition: drop it and run the command again"
        )
    return min(lowers)


async def _constrain(conn: Connection, schema: str, table: PartitionedTable) -> bool:
    if await _constraint_state(conn, schema, table) is not None:
        return False
    _, _, _, constraint = _names(table)
    bound = table.literal(await _cutover_of(conn, schema, table))
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute(
            f"ALTER TABLE {relation(schema, table.name)} ADD CONSTRAINT {quote_ident(constraint)} "
            f"CHECK ({table.key} < {bound}) NOT VALID"
        )
    return True


async def _validate(conn: Connection, schema: str, table: PartitionedTable) -> bool:
    if await _constraint_state(conn, schema, table) is not False:
        return False
    _, _, _, constraint = _names(table)
    await conn.execute(
        f"ALTER TABLE {relation(schema, table.name)} VALIDATE CONSTRAINT {quote_ident(constraint)}"
    )
    return True


async def _carry_sequence(conn: Connection, schema: str, table: PartitionedTable) -> None:
    """Move the live table's identity position to the new sequence and drop the identity."""
    _, sequence, _, _ = _names(table)
    live = relation(schema, table.name)
    old = await conn.fetchval("SELECT pg_get_serial_sequence($1, 'id')", live)
    if old is None:
        return
    position = await conn.fetchrow(f"SELECT last_value, is_called FROM {old}")
    assert position is not None
    await conn.execute(
        "SELECT setval($1::regclass, $2, $3)",
        relation(schema, sequence),
        position["last_value"],
        position["is_called"],
    )
    await conn.execute(f"ALTER TABLE {live} ALTER COLUMN id DROP IDENTITY")


async def _swap(conn: Connection, schema: str, table: PartitionedTable) -> bool:
    if await is_partitioned(conn, schema, table.name):
        return False
    parent, _, _, constraint = _names(table)
    if await _constraint_state(conn, schema, table) is not True:
        raise PartitioningError(f"{schema}.{table.name}: the cut-over constraint is not validated yet")
    bound = table.literal(await _cutover_of(conn, schema, table))
    live = relation(schema, table.name)
    legacy = legacy_name(table.name)
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute("SELECT pg_advisory_xact_lock($1)", maintenance_lock_key(schema))
        await conn.execute(f"LOCK TABLE {live} IN ACCESS EXCLUSIVE MODE")
        await _carry_sequence(conn, schema, table)
        await conn.execute(f"ALTER TABLE {live} RENAME TO {quote_ident(legacy)}")
        await conn.execute(f"ALTER TABLE {relation(schema, parent)} RENAME TO {quote_ident(table.name)}")
        await conn.execute(
            f"ALTER TABLE {live} ATTACH PARTITION {relation(schema, legacy)} "
            f"FOR VALUES FROM (MINVALUE) TO ({bound})"
        )
        await conn.execute(
            f"ALTER TABLE {relation(schema, legacy)} DROP CONSTRAINT {quote_ident(constraint)}"
        )
    return True


async def convert_schema(
    conn: Connection,
    schema: str,
    period: str,
    *,
    now: float,
    until: str | None = None,
    on_step: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Run the conversion's steps (up to ``until`` included) on every history table of ``schema``.

    ``conn`` must not be in a transaction (``CREATE INDEX CONCURRENTLY``) and should have no
    ``statement_timeout`` (step 2 and 4 scan the tables). After the last step the partitions ahead
    are created (:func:`~.partitioning.ensure_partitions`).
    """
    if until is not None and until not in STEPS:
        raise ValueError(f"until must be one of {', '.join(STEPS)}, got {until!r}")
    last = STEPS.index(until) if until is not None else len(STEPS) - 1
    results: list[StepResult] = []
    for table in PARTITIONED_TABLES:
        done = await is_partitioned(conn, schema, table.name)
        for step in STEPS[: last + 1]:
            if done:
                ran = False
            elif step == "prepare":
                ran = await _prepare(conn, schema, table, period, now)
            elif step == "index":
                ran = await _index(conn, schema, table)
            elif step == "constrain":
                ran = await _constrain(conn, schema, table)
            elif step == "validate":
                ran = await _validate(conn, schema, table)
            else:
                ran = await _swap(conn, schema, table)
            result = StepResult(table.name, step, ran)
            results.append(result)
            if on_step is not None:
                on_step(result)
    if last == len(STEPS) - 1:
        await ensure_partitions(conn, schema, period, now=now)
    return results


def convert_command(schema: str, period: str) -> str:
    return f"guarded pg partition --schema {schema} --period {period}"


async def partition_empty_schema(conn: Connection, schema: str, period: str, *, now: float) -> bool:
    """Partition ``schema``'s history tables when every one is empty or already partitioned (one
    transaction, nothing to move); return whether any was converted.

    Raises :class:`~.partitioning.PartitioningError` naming ``guarded pg partition`` when one
    holds rows.
    """

    async def refuse_unless_empty(table: PartitionedTable) -> None:
        live = relation(schema, table.name)
        if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {live})") or await _exists(
            conn, schema, _names(table)[0]
        ):
            raise PartitioningError(
                f"the store was opened with partitioning={period!r}, but {schema}.{table.name} "
                "holds rows and is not partitioned: convert the schema with "
                f"`{convert_command(schema, period)}` "
                "(resumable, see docs/postgres.md, 'Partitioned history'), or open the store without "
                "partitioning"
            )

    pending = [table for table in PARTITIONED_TABLES if not await is_partitioned(conn, schema, table.name)]
    for table in pending:  # first without a lock: a live table is refused without being blocked
        await refuse_unless_empty(table)
    if not pending:
        return False
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute("SELECT pg_advisory_xact_lock($1)", maintenance_lock_key(schema))
        pending = [table for table in pending if not await is_partitioned(conn, schema, table.name)]
        for table in pending:
            await conn.execute(f"LOCK TABLE {relation(schema, table.name)} IN ACCESS EXCLUSIVE MODE")
            await refuse_unless_empty(table)
        for table in pending:
            parent, _, _, _ = _names(table)
            first = period_start(period, now)
            await _create_parent(conn, schema, table, period, first, ahead_until(period, now), parent)
            await conn.execute(f"DROP TABLE {relation(schema, table.name)}")
            await conn.execute(f"ALTER TABLE {relation(schema, parent)} RENAME TO {quote_ident(table.name)}")
    return bool(pending)


__all__ = ["STEPS", "StepResult", "convert_command", "convert_schema", "cutover", "partition_empty_schema"]
