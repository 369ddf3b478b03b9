"""Planner events: append-only, in emission order.

Each event is stored as its lossless record encoding (``doc``) with ``trace_id``, ``event_type``
and ``ts`` as columns for ops queries and retention; emission order is the ``id`` identity
column. Like the in-memory reference, events are *not* de-duplicated by content: identical
stream chunks with equal timestamps are legitimate.

A retry must still not duplicate an event. A planner event has no id, so the retry is
recognised by the caller's idempotency key (:mod:`guarded.backend`, the same for every
attempt of one logical call): the ``n``-th event of a call is stored with
``call_key = "<key>:<n>"`` under a unique index on ``(trace_id, call_key)``, and a repeat is
skipped by ``ON CONFLICT DO NOTHING``. Without a key the event is simply appended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guarded.backend import current_idempotency_key, current_item_keys
from guarded.codec import PLANNER_EVENT, RecordTypes
from guarded.errors import InvalidPayloadError

from .connection import Database
from .json_codec import check_text, dump_json, loads_json, to_db_text, to_float
from .schema_names import qualified

PlannerEventRow = tuple[str, str, float, str | None, str]
"""(trace_id, event_type, ts, call_key, doc)."""


def encode_planner_event(trace_id: Any, event: Any, call_key: str | None = None) -> PlannerEventRow:
    """Validate a ``save_planner_event`` call and return its row."""
    trace = check_text(trace_id, "trace_id")
    try:
        doc = PLANNER_EVENT.encode(event)
        text = dump_json(doc)
    except InvalidPayloadError as exc:
        raise exc.at("event") from None
    return (
        to_db_text(trace),
        to_db_text(str(doc["event_type"])),
        to_float(doc["ts"], "event.ts"),
        call_key,
        text,
    )


def encode_planner_events(items: Sequence[tuple[Any, Any]]) -> list[PlannerEventRow]:
    """Validate a ``save_planner_events`` call and return its rows (a bad item's path names it)."""
    pairs = list(items)
    keys = call_keys(len(pairs))
    rows = []
    for index, (trace_id, event) in enumerate(pairs):
        try:
            rows.append(encode_planner_event(trace_id, event, keys[index]))
        except InvalidPayloadError as exc:
            raise exc.at(f"items[{index}]") from None
    return rows


def call_keys(count: int) -> list[str | None]:
    """The ``call_key`` of each of ``count`` events saved by the current logical call (the guard's
    per-item keys when it set them for a flush or replay of its own)."""
    items = current_item_keys()
    if items is not None and len(items) == count:
        return [to_db_text(check_text(item, "idempotency_key")) for item in items]
    key = current_idempotency_key()
    if key is None:
        return [None] * count
    key = to_db_text(check_text(key, "idempotency_key"))
    return [f"{key}:{index}" for index in range(count)]


class PlannerEvents:
    """SQL of the ``planner_events`` table."""

    def __init__(self, db: Database, schema: str, types: RecordTypes) -> None:
        self._db = db
        self._types = types
        table = qualified(schema, "planner_events")
        columns = "trace_id, event_type, ts, call_key, doc"
        self.insert_one = (
            f"INSERT INTO {table} ({columns}) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
        )
        self.insert_many = (
            f"INSERT INTO {table} ({columns}) SELECT {columns} "
            "FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[], $5::json[]) WITH ORDINALITY "
            f"AS batch({columns}, ord) ORDER BY ord ON CONFLICT DO NOTHING"
        )
        self.select = f"SELECT doc FROM {table} WHERE trace_id = $1 ORDER BY id"

    async def save_many(self, rows: Sequence[PlannerEventRow]) -> None:
        if not rows:
            return
        # Without call keys a repeated statement would append twice: only keyed writes are repeat-safe.
        repeat_safe = all(row[3] is not None for row in rows)
        if len(rows) == 1:
            await self._db.execute(self.insert_one, *rows[0], repeat_safe=repeat_safe)
        else:
            await self._db.execute(self.insert_many, *zip(*rows, strict=True), repeat_safe=repeat_safe)

    async def list(self, trace_id: Any) -> list[Any]:
        records = await self._db.fetch(self.select, to_db_text(check_text(trace_id, "trace_id")))
        return [PLANNER_EVENT.decode(loads_json(record[0]), self._types) for record in records]


__all__ = ["PlannerEventRow", "PlannerEvents", "call_keys", "encode_planner_event", "encode_planner_events"]
