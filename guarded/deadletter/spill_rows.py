"""Reading rows of a dead-letter spill file that may be damaged: each column is checked, and a row
that cannot be read raises :class:`BadRow` with the reason (column names and types, never values),
so the file can quarantine it (see :mod:`.spill`)."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from .entries import DeadLetter, ParkedWrite
from .spill_records import RawValue, RowInfo, SetAside


class _NotUtf8:
    """A text value whose bytes are not UTF-8 (read with the connection's bytes text factory)."""

    __slots__ = ()


NOT_UTF8 = _NotUtf8()


class BadRow(Exception):
    """A row cannot be read: the message is the reason (column names and types, never values)."""


def is_decode_error(exc: sqlite3.Error) -> bool:
    return "decode" in str(exc).lower()


def _kind(value: object) -> str:
    if value is None:
        return "NULL"
    if value is NOT_UTF8:
        return "text that is not UTF-8"
    if isinstance(value, bytes):
        return "a blob"
    if isinstance(value, bool | int):
        return "an integer"
    if isinstance(value, float):
        return "a real"
    return "text"


def _text_of(value: object, column: str, *, optional: bool = False, empty: bool = True) -> str | None:
    if value is None and optional:
        return None
    if value is NOT_UTF8:
        raise BadRow(f"column {column!r} holds text that is not UTF-8")
    if not isinstance(value, str):
        raise BadRow(f"column {column!r} holds {_kind(value)}, not text")
    if not empty and not value:
        raise BadRow(f"column {column!r} is empty")
    return value


def _int_of(value: object, column: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRow(f"column {column!r} holds {_kind(value)}, not an integer")
    return value


def _real_of(value: object, column: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        raise BadRow(f"column {column!r} holds {_kind(value)}, not a number")
    return float(value)


def _json_key(value: str | None) -> str | None:
    if value is not None:
        try:
            found = json.loads(value)
        except ValueError:
            raise BadRow("column 'key' is not JSON") from None
        if not isinstance(found, str | list):
            raise BadRow("column 'key' is not a JSON string or list")
    return value


def _json_call(value: str | None, *, optional: bool = False) -> dict[str, Any] | None:
    if value is None and optional:
        return None
    try:
        found = json.loads(value or "")
    except (ValueError, RecursionError):
        raise BadRow("column 'call' is not JSON") from None
    if not isinstance(found, dict):
        raise BadRow("column 'call' is not a JSON object")
    return found


def read_pending(row: Sequence[object]) -> DeadLetter:
    """A waiting entry from ``rowid, seq, method, call, key, scope, stamp, generation, enqueued_at,
    size, error``; raises :class:`BadRow`."""
    _rowid, seq, method, call, key, scope, stamp, generation, enqueued_at, size, error = row
    text = _text_of(call, "call")
    _int_of(generation, "generation")
    return DeadLetter(
        seq=_int_of(seq, "seq"),
        method=_text_of(method, "method", empty=False) or "",
        call=_json_call(text) or {},
        key=_json_key(_text_of(key, "key", optional=True)),
        scope=_text_of(scope, "scope", optional=True),
        stamp=_int_of(stamp, "stamp"),
        enqueued_at=_real_of(enqueued_at, "enqueued_at"),
        size=_int_of(size, "size"),
        error=_text_of(error, "error") or "",
    )


def read_row_info(row: Sequence[object]) -> RowInfo:
    """The metadata of a waiting entry from ``rowid,`` :data:`INDEX_COLUMNS`; raises :class:`BadRow`."""
    (
        _rowid,
        seq,
        method,
        key,
        scope,
        stamp,
        generation,
        size,
        enqueued_at,
        error_type,
        call_state,
        key_state,
    ) = row
    if (  # the common case, in one test
        type(seq) is int
        and type(method) is str
        and method
        and (key is None or type(key) is str)
        and (scope is None or type(scope) is str)
        and type(stamp) is int
        and type(generation) is int
        and type(size) is int
        and type(enqueued_at) is float
        and error_type == "text"
        and call_state == "ok"
        and (key_state == "ok" or (key_state is None and key is None))
    ):
        return RowInfo(seq, method, key, scope, stamp, generation, size, enqueued_at=enqueued_at)
    info = RowInfo(
        _int_of(seq, "seq"),
        _text_of(method, "method", empty=False) or "",
        _text_of(key, "key", optional=True),
        _text_of(scope, "scope", optional=True),
        _int_of(stamp, "stamp"),
        _int_of(generation, "generation"),
        _int_of(size, "size"),
        enqueued_at=_real_of(enqueued_at, "enqueued_at"),
    )
    if error_type != "text":
        raise BadRow(f"column 'error' holds {_SQL_KINDS.get(str(error_type), 'a value')}, not text")
    if call_state == "not json":
        raise BadRow("column 'call' is not JSON")
    if call_state == "not object":
        raise BadRow("column 'call' is not a JSON object")
    if call_state != "ok":
        raise BadRow(f"column 'call' holds {_SQL_KINDS.get(str(call_state), 'a value')}, not text")
    if key_state == "not json":
        raise BadRow("column 'key' is not JSON")
    if key_state == "not key":
        raise BadRow("column 'key' is not a JSON string or list")
    if key_state is None:  # not looked at by SQLite
        _json_key(info.key)
    return info


def read_parked(row: Sequence[object]) -> ParkedWrite:
    """A parked write from ``rowid, seq, method, call, reason, parked_at, size, key, scope``;
    raises :class:`BadRow`."""
    _rowid, seq, method, call, reason, parked_at, size, key, scope = row
    _text_of(key, "key", optional=True)
    _text_of(scope, "scope", optional=True)
    return ParkedWrite(
        seq=_int_of(seq, "seq"),
        method=_text_of(method, "method", empty=False) or "",
        call=_json_call(_text_of(call, "call", optional=True), optional=True),
        reason=_text_of(reason, "reason") or "",
        parked_at=_real_of(parked_at, "parked_at"),
        size=_int_of(size, "size"),
    )


_SQL_KINDS = {"null": "NULL", "integer": "an integer", "real": "a real", "blob": "a blob", "text": "text"}


def _readable(value: object) -> str | None:
    return value if isinstance(value, str) else None


def set_aside_of(table: str, row: Sequence[object], reason: str, *, counted: bool) -> SetAside:
    """What is known of an unreadable row (``rowid, seq, method, ...`` as read)."""
    rowid, seq, method = row[0], row[1], row[2]
    key = scope = None
    if table == "pending" and len(row) == 11:  # a page row
        key, scope = _readable(row[4]), _readable(row[5])
    elif table == "pending":  # an index row
        key, scope = _readable(row[3]), _readable(row[4])
    return SetAside(
        table,
        seq if isinstance(seq, int) else None,
        reason,
        method=_readable(method),
        key=key,
        scope=scope,
        counted=counted,
        rowid=rowid if isinstance(rowid, int) else 0,
    )


def decoded(value: object) -> object:
    """A value read with bytes for text: the text, or :data:`NOT_UTF8`."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return NOT_UTF8
    return value


def deleted_info(row: Sequence[object], *, parked: bool = False) -> RowInfo:
    """The metadata of a row being deleted: whatever it holds, it is deleted all the same (a row
    that cannot be read whole comes back ``damaged``, with what could be read)."""
    try:
        info = read_row_info(row)
    except BadRow:
        seq, method, key, scope, size = row[1], row[2], row[3], row[4], row[7]
        try:
            readable_key = _json_key(_readable(key))
        except BadRow:
            readable_key = None
        return RowInfo(
            seq if isinstance(seq, int) else 0,
            _readable(method) or "unknown",
            readable_key,
            _readable(scope),
            0,
            0,
            size if isinstance(size, int) else 0,
            parked=parked,
            damaged=True,
        )
    if parked:
        return RowInfo(info.seq, info.method, info.key, info.scope, 0, 0, info.size, parked=True)
    return info


def as_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def raw_values(names: Sequence[str], values: Sequence[object]) -> tuple[tuple[str, str, RawValue], ...]:
    """``(name, SQLite type, value)`` of columns read as ``typeof(c), c`` pairs with bytes for text."""
    found: list[tuple[str, str, RawValue]] = []
    for index, name in enumerate(names):
        kind, value = as_text(values[2 * index]), values[2 * index + 1]
        if not isinstance(value, bytes | int | float) or isinstance(value, bool):
            value = None
        found.append((name, kind, value))
    return tuple(found)


def raw_int(raw: Sequence[tuple[str, str, RawValue]], name: str) -> int | None:
    for column, kind, value in raw:
        if column == name and kind == "integer" and isinstance(value, int):
            return value
    return None


def raw_text(raw: Sequence[tuple[str, str, RawValue]], name: str) -> str | None:
    for column, kind, value in raw:
        if column == name and kind == "text" and isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
    return None


def int_or_zero(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


__all__ = [
    "NOT_UTF8",
    "BadRow",
    "as_text",
    "decoded",
    "deleted_info",
    "int_or_zero",
    "is_decode_error",
    "raw_int",
    "raw_text",
    "raw_values",
    "read_parked",
    "read_pending",
    "read_row_info",
    "set_aside_of",
]
