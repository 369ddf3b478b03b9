"""Task state with last-write-wins that never goes backwards.

``save_task`` upserts by ``task_id`` (like the in-memory reference, a task saved under another
session moves there), but only when the incoming ``updated_at`` is not older than the stored
one::

    ON CONFLICT (task_id) DO UPDATE SET ... WHERE stored.updated_at <= EXCLUDED.updated_at

so a late replay (a retry, a dead-letter drain after an outage) can never undo a newer write.
Equal timestamps: the later write wins. A naive ``updated_at`` is taken as UTC for the
comparison; the record itself is stored losslessly (naive stays naive) in ``doc``.

Task updates live in :mod:`.streams` (``state_updates``).

:meth:`Tasks.save_many` (``save_tasks``) leaves what single saves in list order would leave, in
one round trip. Tasks of distinct ids go in one ``INSERT ... SELECT FROM unnest(...)`` statement
(``list_seq`` values taken in list order, rows locked in task id order). A list naming a task
twice is sent as the single upsert once per item, pipelined in one atomic ``executemany``:
folding a task's items into one row would give the right final state (the newest
``updated_at``, the later of equal ones) but not always the right ``list_seq``, which depends on
which of the task's writes the *stored* row accepts when the task moves between sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from guarded.codec import TASK_STATE, RecordTypes
from guarded.errors import InvalidPayloadError

from .bulk import has_duplicates
from .connection import Connection, Database
from .json_codec import check_text, dump_json, loads_json, to_db_text, to_db_text_opt
from .schema_names import next_seq, qualified

TaskRow = tuple[str, str, str, str, str | None, datetime, str]


def encode_task(state: Any) -> TaskRow:
    """Validate ``state`` and return its row (``InvalidPayloadError`` names the field)."""
    doc = TASK_STATE.encode(state)
    updated_at = getattr(state, "updated_at", None)
    if not isinstance(updated_at, datetime):
        raise InvalidPayloadError("expected a datetime", path="updated_at")
    if updated_at.tzinfo is None:
        updated_at = updated_at.replace(tzinfo=UTC)
    trace_id = doc.get("trace_id")
    return (
        to_db_text(str(doc["session_id"])),
        to_db_text(str(doc["task_id"])),
        str(doc["status"]),
        str(doc["task_type"]),
        to_db_text_opt(trace_id if isinstance(trace_id, str) else None),
        updated_at,
        dump_json(doc),
    )


class Tasks:
    """SQL of the ``task_states`` table."""

    def __init__(self, db: Database, schema: str, types: RecordTypes) -> None:
        self._db = db
        self._types = types
        table = qualified(schema, "task_states")
        columns = "session_id, task_id, status, task_type, trace_id, updated_at, doc"
        on_conflict = (
            "ON CONFLICT (task_id) DO UPDATE SET session_id = EXCLUDED.session_id, status = EXCLUDED.status, "
            "task_type = EXCLUDED.task_type, trace_id = EXCLUDED.trace_id, updated_at = EXCLUDED.updated_at, "
            "doc = EXCLUDED.doc, stored_at = now(), "
            "list_seq = CASE WHEN stored.session_id = EXCLUDED.session_id THEN stored.list_seq "
            "ELSE EXCLUDED.list_seq END "
            "WHERE stored.updated_at <= EXCLUDED.updated_at"
        )
        self.upsert = (
            f"INSERT INTO {table} AS stored ({columns}, list_seq) "
            f"VALUES ($1, $2, $3, $4, $5, $6, $7, {next_seq(schema)}) {on_conflict}"
        )
        # The CTE takes the sequence values in list order (PostgreSQL evaluates nextval, a volatile
        # output expression, after the ORDER BY sort, and materialises a CTE calling it once); the
        # rows then go in task order, so concurrent bulk writes lock shared rows in one order.
        self.upsert_many = (
            f"WITH batch AS (SELECT {columns}, {next_seq(schema)} AS list_seq "
            "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], "
            f"$7::json[]) WITH ORDINALITY AS item({columns}, ord) ORDER BY ord) "
            f"INSERT INTO {table} AS stored ({columns}, list_seq) SELECT {columns}, list_seq FROM batch "
            f"ORDER BY task_id {on_conflict}"
        )
        self.select = f"SELECT doc FROM {table} WHERE session_id = $1 ORDER BY list_seq"

    async def save(self, row: TaskRow) -> bool:
        """Upsert; ``False`` when a newer stored state refused the write."""
        status = await self._db.execute(self.upsert, *row)
        return status.endswith(" 1")

    async def save_many(self, rows: Sequence[TaskRow]) -> int | None:
        """Upsert rows as single saves in order would; how many a newer stored state refused
        (``None`` when not counted: a list naming a task twice)."""
        if not rows:
            return 0
        if len(rows) == 1:
            return 0 if await self.save(rows[0]) else 1
        if has_duplicates(rows, lambda row: row[1]):

            async def pipelined(conn: Connection) -> None:
                await conn.executemany(self.upsert, rows)

            await self._db.run(pipelined)
            return None
        status = await self._db.execute(self.upsert_many, *zip(*rows, strict=True))
        return len(rows) - int(status.rsplit(" ", 1)[1])

    async def list(self, session_id: Any) -> list[Any]:
        """The session's tasks in the order first saved there."""
        records = await self._db.fetch(self.select, to_db_text(check_text(session_id, "session_id")))
        return [TASK_STATE.decode(loads_json(record[0]), self._types) for record in records]


__all__ = ["TaskRow", "Tasks", "encode_task"]
