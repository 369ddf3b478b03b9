"""The runtime audit log: ``save_event`` / ``save_events`` / ``load_history`` on ``flow_events``.

Idempotency: the primary key is ``(trace_id, event_fp)`` where ``event_fp`` is the SHA-256 of the
canonical JSON (sorted keys, compact) of ``{trace_id, ts, kind, node_name, node_id, payload}``
-- the spec's recipe and the in-memory reference's :func:`guarded.codec.event_fingerprint`,
with ``ts`` as a float and ``trace_id=None`` (or empty) normalised to ``"__global__"`` (the
event reads back with that trace id). A retried save hits ``ON CONFLICT DO NOTHING``.

Bulk writes (:meth:`Events.save_many`) go through ``COPY`` when the events are new and fall
back to one ``INSERT ... SELECT FROM unnest(...) WITH ORDINALITY ORDER BY ordinality ON
CONFLICT DO NOTHING`` when some are already stored; either way row ids follow batch order (so
equal-``ts`` ties keep the order saved) and duplicates are skipped.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from json.encoder import encode_basestring
from typing import Any

import asyncpg
import orjson

from guarded.codec import RecordTypes
from guarded.errors import InvalidPayloadError
from guarded.models import GLOBAL_TRACE_ID

from .connection import Connection, Database
from .json_codec import (
    ORJSON_AGREES,
    check_text,
    dump_canonical_pair,
    fixed_float,
    from_db_text,
    loads_json,
    orjson_ready,
    to_db_text,
    to_float,
)
from .schema_names import qualified

EventRow = tuple[str, float, str, str | None, str | None, bytes, str]
"""(trace_id, ts, kind, node_name, node_id, event_fp, payload)."""

_MISSING = object()
_orjson_dumps = orjson.dumps
_SORT_KEYS = orjson.OPT_SORT_KEYS
_OrjsonError = orjson.JSONEncodeError
_sha256 = hashlib.sha256
_event_fields = operator.attrgetter("trace_id", "ts", "kind", "node_name", "node_id", "payload")
_MIN_FIXED, _MAX_FIXED = 1e-4, 1e16
"""The magnitudes :func:`~.json_codec.fixed_float` accepts (besides zero)."""


def _field(event: Any, name: str) -> Any:
    value = getattr(event, name, _MISSING)
    if value is _MISSING:
        raise InvalidPayloadError(f"{type(event).__name__} has no attribute {name!r}", path=name)
    return value


def _text(value: Any, path: str) -> str:
    # Fast path for the usual plain ASCII string; check_text handles the rest.
    return value if type(value) is str and value.isascii() else check_text(value, path)


def _json_string(value: str | None) -> str:
    return "null" if value is None else encode_basestring(value)


def _orjson_fingerprint(
    trace_id: str, ts: float, kind: str, node_name: str | None, node_id: str | None, payload: Any
) -> tuple[bytes, str]:
    """The event's fingerprint and its stored payload text, both written by ``orjson``: the SHA-256
    of the identity document ``{kind, node_id, node_name, payload, trace_id, ts}`` with sorted keys,
    and the payload in its own key order. Raises ``orjson.JSONEncodeError`` (or ``RecursionError``)
    where ``orjson`` cannot write them; the caller then takes the C encoder's way."""
    identity = _orjson_dumps(
        {
            "kind": kind,
            "node_id": node_id,
            "node_name": node_name,
            "payload": payload,
            "trace_id": trace_id,
            "ts": ts,
        },
        option=_SORT_KEYS,
    )
    return _sha256(identity).digest(), _orjson_dumps(payload).decode()


def encode_event(event: Any) -> EventRow:
    """Validate ``event`` and return its row; raise :class:`InvalidPayloadError` naming the field.

    The usual event (ASCII texts, a ``float`` ``ts`` without exponent, an :func:`orjson_ready`
    payload dict) takes a path with no function call per field; anything else, and every error,
    goes through :func:`encode_event_checked`, whose row and errors this path reproduces exactly.
    """
    try:
        raw_trace, ts, kind, node_name, node_id, raw_payload = _event_fields(event)
    except AttributeError:
        return encode_event_checked(event)
    if (
        ORJSON_AGREES
        and type(raw_payload) is dict
        and type(ts) is float
        and (_MIN_FIXED <= abs(ts) < _MAX_FIXED or ts == 0.0)
        and type(kind) is str
        and kind.isascii()
        and (raw_trace is None or (type(raw_trace) is str and raw_trace.isascii()))
        and (node_name is None or (type(node_name) is str and node_name.isascii()))
        and (node_id is None or (type(node_id) is str and node_id.isascii()))
    ):
        trace_id = raw_trace or GLOBAL_TRACE_ID
        try:
            if orjson_ready(raw_payload):
                fingerprint, payload = _orjson_fingerprint(
                    trace_id, ts, kind, node_name, node_id, raw_payload
                )
                # ASCII text holds no escape sentinel: only a NUL needs the text-column escape.
                return (
                    trace_id if "\x00" not in trace_id else to_db_text(trace_id),
                    ts,
                    kind if "\x00" not in kind else to_db_text(kind),
                    node_name if node_name is None or "\x00" not in node_name else to_db_text(node_name),
                    node_id if node_id is None or "\x00" not in node_id else to_db_text(node_id),
                    fingerprint,
                    payload,
                )
        except (_OrjsonError, RecursionError):
            pass
    return encode_event_checked(event)


def encode_event_checked(event: Any) -> EventRow:
    """:func:`encode_event`, one field at a time: every check, every path, the error that names
    the field.

    This is the hot path of bulk writes. The fingerprint hashes the canonical JSON of
    ``{kind, node_id, node_name, payload, trace_id, ts}`` exactly as ``json.dumps({...},
    sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` writes it; the stored payload
    keeps its key order.

    Usually (:func:`~.json_codec.orjson_ready` payloads and a ``ts`` without exponent) one walk
    checks the payload and ``orjson`` writes two texts: the whole identity document with sorted
    keys, hashed as it comes (no separate canonical payload, no string assembly, no re-encoding),
    and the stored payload. Otherwise the C encoder writes the canonical and stored payload texts
    and the identity is assembled around them: the same bytes, as ``tests/postgres/
    test_event_encoding_pins.py`` checks against rows written before this path existed.
    """
    raw_trace = _field(event, "trace_id")
    trace_id = (None if raw_trace is None else _text(raw_trace, "trace_id")) or GLOBAL_TRACE_ID
    ts = to_float(_field(event, "ts"), "ts")
    kind = _text(_field(event, "kind"), "kind")
    raw_name, raw_id = _field(event, "node_name"), _field(event, "node_id")
    node_name = None if raw_name is None else _text(raw_name, "node_name")
    node_id = None if raw_id is None else _text(raw_id, "node_id")
    raw_payload = _field(event, "payload")
    fingerprint = payload = None
    if ORJSON_AGREES and type(raw_payload) is dict and fixed_float(ts):
        try:
            if not orjson_ready(raw_payload):
                raise _OrjsonError
            fingerprint, payload = _orjson_fingerprint(trace_id, ts, kind, node_name, node_id, raw_payload)
        except (_OrjsonError, RecursionError):  # see orjson_ready: the C encoder's way decides
            payload = None
    if payload is None or fingerprint is None:
        canonical, payload = dump_canonical_pair(raw_payload, "payload")
        identity_text = (
            f'{{"kind":{encode_basestring(kind)},"node_id":{_json_string(node_id)},'
            f'"node_name":{_json_string(node_name)},"payload":{canonical},'
            f'"trace_id":{encode_basestring(trace_id)},"ts":{float.__repr__(ts)}}}'
        )
        fingerprint = _sha256(identity_text.encode("utf-8")).digest()
    return (
        to_db_text(trace_id),
        ts,
        to_db_text(kind),
        None if node_name is None else to_db_text(node_name),
        None if node_id is None else to_db_text(node_id),
        fingerprint,
        payload,
    )


def encode_events(events: Sequence[Any]) -> list[EventRow]:
    """:func:`encode_event` for each event; the error path names the event (``events[3].payload``)."""
    try:
        return [encode_event(event) for event in events]
    except InvalidPayloadError:
        pass  # again, one by one, to name the event
    rows = []
    for index, event in enumerate(events):
        try:
            rows.append(encode_event(event))
        except InvalidPayloadError as exc:
            raise exc.at(f"events[{index}]") from None
    return rows


COPY_THRESHOLD = 2
"""Batches at least this large are first tried with ``COPY`` (see :meth:`Events.save_many`): from
two rows up, ``COPY`` commits a batch sooner than ``INSERT ... SELECT FROM unnest(...)`` despite
its second round trip (the server's row-at-a-time conflict checks and the client's array
encoding cost more)."""

_COLUMNS = ("trace_id", "ts", "kind", "node_name", "node_id", "event_fp", "payload")


class Events:
    """SQL of the ``flow_events`` table."""

    def __init__(self, db: Database, schema: str, types: RecordTypes) -> None:
        self._db = db
        self._types = types
        self._schema = schema
        table = qualified(schema, "flow_events")
        columns = ", ".join(_COLUMNS)
        self.insert_one = (
            f"INSERT INTO {table} ({columns}) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING"
        )
        self.insert_many = (
            f"INSERT INTO {table} ({columns}) "
            f"SELECT {columns} FROM unnest($1::text[], $2::float8[], $3::text[], $4::text[], $5::text[], "
            "$6::bytea[], $7::json[]) WITH ORDINALITY "
            f"AS batch({columns}, ord) ORDER BY ord ON CONFLICT DO NOTHING"
        )
        self.history = (
            f"SELECT ts, kind, node_name, node_id, payload FROM {table} WHERE trace_id = $1 ORDER BY ts, id"
        )

    async def save(self, row: EventRow) -> None:
        await self._db.execute(self.insert_one, *row)

    async def save_many(self, rows: Sequence[EventRow]) -> None:
        """Insert ``rows``, skipping those already stored, ids in batch order.

        A batch of :data:`COPY_THRESHOLD` rows or more is first sent with ``COPY`` (binary,
        PostgreSQL's bulk-load path) in its own statement: fresh events -- the normal case -- go in
        at ``COPY`` speed. When some
        event is already stored (a retried batch) the ``COPY`` fails on the unique key, rolls
        back, and the batch is sent again as ``INSERT ... ON CONFLICT DO NOTHING``; the same
        fallback handles a deadlock with a concurrent writer of overlapping events.
        """
        if not rows:
            return
        unique: Sequence[EventRow] = rows
        if len({row[5] for row in rows}) != len(rows):  # distinct fingerprints: distinct keys
            seen: set[tuple[str, bytes]] = set()
            unique = []
            for row in rows:  # the first of duplicates wins, as with ON CONFLICT DO NOTHING
                if (row[0], row[5]) not in seen:
                    seen.add((row[0], row[5]))
                    unique.append(row)
        if len(unique) == 1:
            await self.save(unique[0])
            return
        if len(unique) >= COPY_THRESHOLD:

            async def copy(conn: Connection) -> bool:
                # One COPY statement is atomic on its own: no BEGIN/COMMIT round trips around it.
                try:
                    await conn.copy_records_to_table(
                        "flow_events", schema_name=self._schema, columns=_COLUMNS, records=unique
                    )
                except (asyncpg.UniqueViolationError, asyncpg.DeadlockDetectedError):
                    return False
                return True

            if await self._db.run(copy):
                return
        await self._db.execute(self.insert_many, *zip(*unique, strict=True))

    async def load(self, trace_id: str) -> list[Any]:
        records = await self._db.fetch(self.history, to_db_text(trace_id))
        if not records:
            return []
        # One json.loads of all payloads joined into an array: much cheaper than one call per row.
        payloads = loads_json("[" + ",".join([record[4] for record in records]) + "]")
        build = self._types.StoredEvent
        return [
            build(
                trace_id=trace_id,
                ts=ts,
                kind=from_db_text(kind),
                node_name=None if node_name is None else from_db_text(node_name),
                node_id=None if node_id is None else from_db_text(node_id),
                payload=payload,
            )
            for (ts, kind, node_name, node_id, _), payload in zip(records, payloads, strict=True)
        ]


__all__ = ["COPY_THRESHOLD", "EventRow", "Events", "encode_event", "encode_event_checked", "encode_events"]
