"""Cursor-paginated, append-only session streams: task updates and steering events.

Both streams share one set of rules (spec 000 §8/§9, PenguiFlow's reference store):

* items are idempotent by their id (``update_id`` / ``event_id``) within a session;
* a listing is oldest first, in insertion order (the ``id`` identity column);
* ``since_id`` is an *exclusive* cursor resolved in the session's whole stream -- before the
  ``task_id`` filter -- and an unknown (or empty) cursor means no cursor;
* ``limit`` is PenguiFlow's ``filtered[-limit:]``: the **most recent** ``limit`` matching items,
  still returned oldest first; ``limit=0`` returns them all and ``limit=-n`` all but the oldest
  ``n`` (PenguiFlow's reference does exactly this).

The cursor is resolved inside the query (a keyset on ``id``), so a listing is one statement
using the ``(session_id, id)`` or ``(session_id, task_id, id)`` index.

**Appends commit in call order.** PenguiFlow publishes a session's updates with
``asyncio.create_task(store.save_update(update))`` and never awaits them, and ``guard()`` flushes
batches of them concurrently; on a pool, concurrent inserts on different connections commit in any
order, so the insertion order (the listing order and the ``since_id`` keyset) would not be the
publish order, and a client resuming from its last update id would skip updates published after
it. Each stream therefore runs its inserts one at a time per store (an ``asyncio.Lock``, which is
FIFO): a store's appends get ids in the order they were called. Appends from several processes to
one session are not ordered with each other.

**``created_at`` is the item's own** (``StateUpdate.created_at`` / ``SteeringEvent.created_at``;
the insert time only for an item without one): identical on every retry and replay of the item,
so on a partitioned schema (:mod:`.partitioning`, keyed by it) a retry lands in the partition of
its first write and its unique key ``(session_id, id, created_at)`` skips it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from guarded.codec import RecordCodec, RecordTypes
from guarded.errors import InvalidPayloadError

from .connection import Database
from .json_codec import check_text, check_text_opt, dump_json, loads_json, to_db_text, to_db_text_opt
from .schema_names import qualified

StreamRow = tuple[str, str, str, str, str, float | None]
"""(session_id, task_id, item id, item type, doc, created_at in Unix seconds)."""


def _created_at(doc: dict[str, Any]) -> float | None:
    """The item's ``created_at`` in Unix seconds (a naive one read as UTC), if it has one. Sent as a
    number (``to_timestamp`` on the server: cheaper than a ``timestamptz`` parameter), identical for
    every save of the item."""
    text = doc.get("created_at")
    if not isinstance(text, str):
        return None
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


class Stream:
    """SQL of one stream table (``state_updates`` or ``steering_events``)."""

    def __init__(
        self,
        db: Database,
        schema: str,
        types: RecordTypes,
        *,
        table: str,
        id_field: str,
        type_field: str,
        codec: RecordCodec[Any],
    ) -> None:
        self._db = db
        self._types = types
        self._codec = codec
        self._appending = asyncio.Lock()
        """Held while an insert runs: appends commit in call order (see the module docstring)."""
        self.id_field = id_field
        self.type_field = type_field
        self._name = qualified(schema, table)
        self.partitioned = False
        """Whether the table is partitioned (:meth:`use_partitioned_table`)."""
        self._statements(partitioned=False)

    def _statements(self, *, partitioned: bool) -> None:
        name, id_field = self._name, self.id_field
        columns = f"session_id, task_id, {id_field}, {self.type_field}, doc"
        # A partitioned table's unique key holds created_at too: an item saved again with another
        # created_at (a new object with the same id) is skipped by looking for its id first.
        unseen = (
            f"NOT EXISTS (SELECT 1 FROM {name} AS stored "
            f"WHERE stored.session_id = {{session}} AND stored.{id_field} = {{item}})"
        )
        created_at = "COALESCE(to_timestamp($6::float8), now())"
        if partitioned:
            self.insert_one = (
                f"INSERT INTO {name} ({columns}, created_at) "
                f"SELECT $1::text, $2::text, $3::text, $4::text, $5::json, {created_at} "
                f"WHERE {unseen.format(session='$1', item='$3')} ON CONFLICT DO NOTHING"
            )
        else:
            self.insert_one = (
                f"INSERT INTO {name} ({columns}, created_at) "
                f"VALUES ($1, $2, $3, $4, $5, {created_at}) ON CONFLICT DO NOTHING"
            )
        where = (
            f"WHERE {unseen.format(session='batch.session_id', item=f'batch.{id_field}')} "
            if partitioned
            else ""
        )
        self.insert_many = (
            f"INSERT INTO {name} ({columns}, created_at) "
            f"SELECT {columns}, COALESCE(to_timestamp(created_at), now()) "
            "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::json[], $6::float8[]) "
            f"WITH ORDINALITY AS batch({columns}, created_at, ord) {where}ORDER BY ord ON CONFLICT DO NOTHING"
        )
        # min(): on a partitioned table two writers in two processes may both store one id.
        cursor = "min(cursor.id)" if partitioned else "cursor.id"
        after = (
            f"id > COALESCE((SELECT {cursor} FROM {name} AS cursor "
            f"WHERE cursor.session_id = $1 AND cursor.{id_field} = $2), 0)"
        )
        self._list: dict[bool, str] = {}
        for with_task in (False, True):
            condition = f"session_id = $1 AND {after}" + (" AND task_id = $4" if with_task else "")
            self._list[with_task] = f"SELECT doc FROM {name} WHERE {condition} ORDER BY id DESC LIMIT $3"

    def use_partitioned_table(self) -> None:
        """The table is partitioned (its unique key includes ``created_at``): keep one item per id
        whatever its ``created_at``, as on an unpartitioned table."""
        self.partitioned = True
        self._statements(partitioned=True)

    def encode(self, item: Any) -> StreamRow:
        """Validate ``item`` and return its row (``InvalidPayloadError`` names the field)."""
        doc = self._codec.encode(item)
        item_type = doc[self.type_field]
        return (
            to_db_text(str(doc["session_id"])),
            to_db_text(str(doc["task_id"])),
            to_db_text(str(doc[self.id_field])),
            str(item_type),
            dump_json(doc),
            _created_at(doc),
        )

    def encode_many(self, items: Sequence[Any]) -> list[StreamRow]:
        rows = []
        for index, item in enumerate(items):
            try:
                rows.append(self.encode(item))
            except InvalidPayloadError as exc:
                raise exc.at(f"updates[{index}]") from None
        return rows

    async def save(self, row: StreamRow) -> None:
        async with self._appending:
            await self._db.execute(self.insert_one, *row)

    async def save_many(self, rows: Sequence[StreamRow]) -> None:
        if not rows:
            return
        if self.partitioned and len({(row[0], row[2]) for row in rows}) != len(rows):
            seen: set[tuple[str, str]] = set()
            unique = []
            for row in rows:  # the first of one id wins, as ON CONFLICT DO NOTHING would
                if (row[0], row[2]) not in seen:
                    seen.add((row[0], row[2]))
                    unique.append(row)
            rows = unique
        if len(rows) == 1:
            await self.save(rows[0])
            return
        async with self._appending:
            await self._db.execute(self.insert_many, *zip(*rows, strict=True))

    async def list(
        self, session_id: Any, *, task_id: Any = None, since_id: Any = None, limit: Any = 500
    ) -> list[Any]:
        session = to_db_text(check_text(session_id, "session_id"))
        task = to_db_text_opt(check_text_opt(task_id, "task_id"))
        cursor = to_db_text_opt(check_text_opt(since_id, "since_id")) or None
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidPayloadError(f"expected an integer, got {type(limit).__name__}", path="limit")
        # LIMIT NULL is no limit: limit <= 0 reads every matching item and slices as PenguiFlow.
        args: list[Any] = [session, cursor, limit if limit > 0 else None]
        if task is not None:
            args.append(task)
        records = await self._db.fetch(self._list[task is not None], *args)
        records.reverse()
        if limit < 0:
            records = records[-limit:]
        return [self._codec.decode(loads_json(record[0]), self._types) for record in records]


__all__ = ["Stream", "StreamRow"]
