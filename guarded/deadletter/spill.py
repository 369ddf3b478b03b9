"""The durable part of the dead-letter buffer: one SQLite file (stdlib ``sqlite3``, WAL mode).

A :class:`SpillFile` opened for writing holds an exclusive ``flock`` on ``<path>.lock`` for its
lifetime (:func:`acquire_lock`), so two live processes never write the same file; the kernel
releases the lock when the process dies, however it dies, and the lock file names the pid of its
last holder (:func:`holder_pid`). Read-only opens (``guarded dlq list``/``stats``) take no lock,
work beside a live writer and create or change no file. Every method is synchronous and commits
before it returns; the buffer runs them on one dedicated worker thread.

Layout versions: 1 had no notion of the backend a file's writes belong to; 2 records it in
``meta.target`` (absent for a file of unknown target); 3 adds the ``quarantine`` table. A file of
an older version is migrated forward when it is opened for writing; a file of a newer version is
refused without being touched. A damaged file is renamed aside for inspection (:func:`set_aside`).

**Unreadable rows are quarantined.** A row that cannot be read — a column of the wrong type, a
``NULL`` where a value belongs, text that is not UTF-8, a key or a call that is not JSON (a disk
error, a tool that edited the file) — never makes a read raise. A file open for writing moves it
to its ``quarantine`` table with its raw column values (bytes as stored) and the reason, and
reports it (:meth:`SpillFile.take_set_aside`); a read-only open leaves it in place and skips it.
Rows are checked as they are read: waiting writes' metadata when the file is indexed
(:meth:`SpillFile.index_rows`), their calls when they are read (:meth:`SpillFile.page`, ...), and
every parked write when the file is opened. :meth:`SpillFile.quarantined` lists them. The reason
names columns and their types, never values.

**Nothing is dropped to make room.** A write transaction that would take the file's encoded bytes
past its cap is rolled back whole (:class:`SpillCapError`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import orjson

from ..errors import GuardedError
from .entries import DeadLetter, ParkedWrite

R = TypeVar("R")

# --- the layout -----------------------------------------------------------------------------------

SCHEMA_VERSION = 3
"""Version of the file layout this code writes; files of a newer version are refused."""
APPLICATION_ID = 0x67444C51
"""SQLite ``application_id`` of a guarded dead-letter file ("gDLQ")."""

_SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE pending (
        seq INTEGER PRIMARY KEY,
        method TEXT NOT NULL,
        call TEXT NOT NULL,
        key TEXT,
        scope TEXT,
        stamp INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        enqueued_at REAL NOT NULL,
        size INTEGER NOT NULL,
        error TEXT NOT NULL
    )""",
    "CREATE INDEX pending_by_key ON pending (method, key) WHERE key IS NOT NULL",
    "CREATE INDEX pending_by_scope ON pending (method, scope) WHERE scope IS NOT NULL",
    """CREATE TABLE parked (
        seq INTEGER PRIMARY KEY,
        method TEXT NOT NULL,
        call TEXT,
        reason TEXT NOT NULL,
        parked_at REAL NOT NULL,
        size INTEGER NOT NULL,
        key TEXT,
        scope TEXT
    )""",
)

_PENDING_COLUMNS = "seq, method, call, key, scope, stamp, generation, enqueued_at, size, error"
_PENDING_NAMES = tuple(_PENDING_COLUMNS.split(", "))
_PARKED_COLUMNS = "seq, method, call, reason, parked_at, size, key, scope"
_META_COLUMNS = "seq, method, key, scope, stamp, generation, size, enqueued_at"
_INDEX_COLUMNS = (
    f"{_META_COLUMNS}, typeof(error), CASE WHEN typeof(call) != 'text' THEN typeof(call) "
    "WHEN NOT json_valid(call) THEN 'not json' WHEN substr(ltrim(call), 1, 1) != '{' THEN 'not object' "
    "ELSE 'ok' END, CASE WHEN typeof(key) != 'text' THEN 'ok' WHEN NOT json_valid(key) THEN 'not json' "
    "WHEN json_type(key) NOT IN ('text', 'array') THEN 'not key' ELSE 'ok' END"
)
"""What the index needs of a waiting entry, and whether its other columns look readable: the type
of ``error``, whether ``call`` is a JSON object and ``key`` JSON text or a list (checked by SQLite,
without bringing the call here)."""
_INDEX_COLUMNS_PLAIN = f"{_META_COLUMNS}, typeof(error), 'ok', NULL"
""":data:`_INDEX_COLUMNS` without SQLite's look at ``call`` and ``key`` (SQLite without JSON
functions; deletions): the key is then parsed here."""
_INSERT_PENDING = f"INSERT INTO pending ({_PENDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SEQ_AFTER = "WHERE typeof(seq) = 'integer' AND seq > ? ORDER BY seq LIMIT ?"
"""The rows with an integer ``seq`` after the first parameter, in order, at most the second."""

_QUARANTINE_TABLE = """CREATE TABLE IF NOT EXISTS quarantine (
    qid INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    quarantined_at REAL NOT NULL,
    seq, method, call, key, scope, stamp, generation, at, size, detail
)"""
"""Rows moved aside because they cannot be read: ``source`` is the table they were in, the columns
after ``quarantined_at`` (declared without a type, so SQLite stores each value exactly as it was)
are the row's own; ``at`` is its ``enqueued_at`` or ``parked_at``, ``detail`` its ``error`` or
parking ``reason``. Added by layout 3."""
_RAW_COLUMNS = ("seq", "method", "call", "key", "scope", "stamp", "generation", "at", "size", "detail")
_AS_QUARANTINED = {
    "pending": _PENDING_NAMES,
    "parked": ("seq", "method", "call", "key", "scope", "NULL", "NULL", "parked_at", "size", "reason"),
}
"""What each table holds under the names of :data:`_RAW_COLUMNS` (a parked write has no stamp and
no generation)."""
_QUARANTINE_COLUMNS = ", ".join(("source", "reason", "quarantined_at", *_RAW_COLUMNS))

_BEFORE_ANY_SEQ = -(2**63)
_SIZE_SUM = "coalesce(sum(CASE WHEN typeof(size) = 'integer' THEN size ELSE 0 END), 0)"
_NUMERIC_AT = "typeof(enqueued_at) IN ('integer', 'real')"
_CHUNK = 500
_LOCK_ATTEMPTS = 20

# --- errors ---------------------------------------------------------------------------------------

_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_FULL_CODES = frozenset({sqlite3.SQLITE_FULL})
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class SpillFileError(GuardedError):
    """The spill file cannot be used: not a dead-letter file, a newer layout, unreadable."""


class SpillFileLockedError(SpillFileError):
    """Another live process has the spill file open for writing."""


class SpillFileCorruptError(SpillFileError):
    """The file is not an SQLite database, or its database is damaged (malformed)."""


class SpillFileVersionError(SpillFileError):
    """The file was written by a newer guarded (a newer layout); it is left untouched."""


class SpillFileForeignError(SpillFileError):
    """The file is an SQLite database of something else, not a dead-letter spill file."""


class SpillFileTargetError(SpillFileError):
    """The file holds writes for another backend target; it is never claimed nor replayed here."""


class SpillCapError(SpillFileError):
    """A write transaction would take the file past its byte cap (``max_disk_bytes``): it is rolled
    back, nothing in the file is dropped to make room. The file itself is fine."""


class SourceReadError(SpillFileError):
    """Reading the other file of :meth:`SpillFile.take_over` failed (that file's fault, not ours)."""


def _sqlite_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_corruption(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says the database file is damaged or not a database."""
    for found in (exc, exc.__cause__):
        if found is None:
            continue
        if isinstance(found, SpillFileCorruptError) or _sqlite_code(found) in _CORRUPT_CODES:
            return True
    return False


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is ``SQLITE_FULL`` or an ``ENOSPC``/``EDQUOT`` OS error."""
    for found in (exc, exc.__cause__):
        if found is None:
            continue
        if _sqlite_code(found) in _FULL_CODES:
            return True
        if isinstance(found, OSError) and found.errno in _FULL_ERRNOS:
            return True
    return False


def _open_error(exc: sqlite3.Error, path: str, doing: str) -> SpillFileError:
    """``exc`` of opening ``path`` as the matching :class:`SpillFileError` (chained by the caller)."""
    if _sqlite_code(exc) in _CORRUPT_CODES:
        return SpillFileCorruptError(f"dead-letter spill file {path!r} is damaged ({doing}): {exc}")
    return SpillFileError(f"cannot open dead-letter spill file {path!r} ({doing}): {exc}")


# --- what the file reports ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowInfo:
    """The metadata of a stored entry (no payload): what the buffer's in-memory index needs."""

    seq: int
    method: str
    key: str | None
    scope: str | None
    stamp: int
    generation: int
    size: int
    parked: bool = False
    enqueued_at: float = 0.0
    damaged: bool = False
    """The row could not be read whole (a deleted row damaged meanwhile): only ``seq`` is sure."""


@dataclass(frozen=True, slots=True)
class SpillTotals:
    """Counts and encoded bytes of the file's entries, and its oldest waiting entry."""

    pending: int
    pending_bytes: int
    parked: int
    parked_bytes: int
    oldest: tuple[int, float] | None
    """``(seq, enqueued_at)`` of the oldest waiting entry."""
    quarantined: int = 0
    """Unreadable rows moved to the quarantine table (a read-only open also counts those it found
    still in place)."""


EMPTY_TOTALS = SpillTotals(0, 0, 0, 0, None)

RawValue = bytes | int | float | None
"""A column value as stored: text and blobs as their bytes."""


@dataclass(frozen=True, slots=True)
class SetAside:
    """An unreadable row found by a read: moved to the quarantine table (a file open for writing)
    or skipped (read-only). ``method``, ``key`` and ``scope`` are the row's values when readable.
    ``counted`` says whether the row had been counted as a waiting write before (found by a read
    of rows already indexed) rather than found while indexing the file."""

    table: str
    seq: int | None
    reason: str
    method: str | None = None
    key: str | None = None
    scope: str | None = None
    counted: bool = False
    rowid: int = 0


@dataclass(frozen=True, slots=True)
class QuarantinedRow:
    """A row of the quarantine table (``id``), or, in a read-only open, an unreadable row still in
    its table (``id`` and ``quarantined_at`` are ``None``). ``raw`` holds the row's columns as
    stored: ``(name, SQLite type, value)``; print it only when payloads may be shown."""

    id: int | None
    source: str
    seq: int | None
    method: str | None
    reason: str
    quarantined_at: float | None
    raw: tuple[tuple[str, str, RawValue], ...]


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write transaction removed, and the file's totals after it."""

    deleted: list[RowInfo]
    """Entries removed because the caller asked (superseded, replayed, taken, parked)."""
    totals: SpillTotals


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: object) -> str:
    """Compact JSON text of an encoded call (plain JSON values only), as stored.

    ``orjson`` writes it several times faster than the standard encoder; the standard encoder
    takes what ``orjson`` refuses (an integer beyond 64 bits) and refuses what is not JSON."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _ENCODER.encode(value)


# --- the lock and the files -----------------------------------------------------------------------


def lock_path(path: str) -> str:
    """The lock file of the spill file ``path``."""
    return path + ".lock"


def acquire_lock(path: str) -> int:
    """Take the exclusive ``flock`` of ``path``'s lock file without waiting; returns its descriptor.

    After the lock is taken, the lock file's path must still name the locked inode: a process
    that removes a spill file (adoption) unlinks the lock file while holding it, and a lock taken
    on the unlinked inode protects nothing, so it is dropped and the open retried.

    Raises :class:`SpillFileLockedError` when a live process holds it, :class:`OSError` when the
    lock file cannot be created.
    """
    name = lock_path(path)
    for _ in range(_LOCK_ATTEMPTS):
        fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise SpillFileLockedError(
                f"dead-letter spill file {path!r} is in use by another process{who}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            held, named = os.fstat(fd), os.stat(name)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode("ascii"))
        except OSError:
            pass  # the pid is for messages only; a full disk must not cost the lock
        return fd
    raise SpillFileLockedError(f"the lock file of {path!r} keeps being replaced; try again")


def is_locked(path: str) -> bool:
    """Whether a live process holds ``path``'s lock (``False`` when there is no lock file)."""
    try:
        fd = os.open(lock_path(path), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def holder_pid(path: str) -> int | None:
    """The pid written into ``path``'s lock file by its last holder, if any."""
    try:
        with open(lock_path(path), "rb") as handle:
            text = handle.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _unlink_quietly(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def set_aside(path: str, *, now: Callable[[], float] = time.time) -> str:
    """Rename a damaged spill file (and its WAL) to ``<path>.corrupt-<UTC timestamp>`` for
    inspection and drop its shared-memory file; returns the new name. Call with its lock held."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now()))
    target = f"{path}.corrupt-{stamp}Z"
    counter = 1
    while os.path.exists(target):
        counter += 1
        target = f"{path}.corrupt-{stamp}Z-{counter}"
    if os.path.exists(path + "-wal"):
        os.rename(path + "-wal", target + "-wal")
    _unlink_quietly(path + "-shm")
    os.rename(path, target)
    return target


def _remove_files(path: str) -> None:
    """Delete a spill file with its WAL and shared memory (the WAL first, so a crash midway never
    leaves a WAL beside a newer file of the same name). Call with its lock held."""
    _unlink_quietly(path + "-wal")
    _unlink_quietly(path + "-shm")
    _unlink_quietly(path)


# --- reading rows that may be damaged -------------------------------------------------------------


class _NotUtf8:
    """A text value whose bytes are not UTF-8 (read with the connection's bytes text factory)."""

    __slots__ = ()


_NOT_UTF8 = _NotUtf8()


class _BadRow(Exception):
    """A row cannot be read: the message is the reason (column names and types, never values)."""


def _is_decode_error(exc: sqlite3.Error) -> bool:
    return "decode" in str(exc).lower()


def _decoded(value: object) -> object:
    """A value read with bytes for text: the text, or :data:`_NOT_UTF8`."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return _NOT_UTF8
    return value


def _kind(value: object) -> str:
    if value is None:
        return "NULL"
    if value is _NOT_UTF8:
        return "text that is not UTF-8"
    if isinstance(value, bytes):
        return "a blob"
    if isinstance(value, bool | int):
        return "an integer"
    if isinstance(value, float):
        return "a real"
    return "text"


_SQL_KINDS = {"null": "NULL", "integer": "an integer", "real": "a real", "blob": "a blob", "text": "text"}


def _text_of(value: object, column: str, *, optional: bool = False, empty: bool = True) -> str | None:
    if value is None and optional:
        return None
    if value is _NOT_UTF8:
        raise _BadRow(f"column {column!r} holds text that is not UTF-8")
    if not isinstance(value, str):
        raise _BadRow(f"column {column!r} holds {_kind(value)}, not text")
    if not empty and not value:
        raise _BadRow(f"column {column!r} is empty")
    return value


def _int_of(value: object, column: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadRow(f"column {column!r} holds {_kind(value)}, not an integer")
    return value


def _real_of(value: object, column: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        raise _BadRow(f"column {column!r} holds {_kind(value)}, not a number")
    return float(value)


def _json_key(value: str | None) -> str | None:
    if value is not None:
        try:
            found = json.loads(value)
        except ValueError:
            raise _BadRow("column 'key' is not JSON") from None
        if not isinstance(found, str | list):
            raise _BadRow("column 'key' is not a JSON string or list")
    return value


def _json_call(value: str | None, *, optional: bool = False) -> dict[str, Any] | None:
    if value is None and optional:
        return None
    try:
        found = json.loads(value or "")
    except (ValueError, RecursionError):
        raise _BadRow("column 'call' is not JSON") from None
    if not isinstance(found, dict):
        raise _BadRow("column 'call' is not a JSON object")
    return found


def _read_pending(row: Sequence[object]) -> DeadLetter:
    """A waiting entry from ``rowid,`` :data:`_PENDING_COLUMNS`; raises :class:`_BadRow`."""
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


def _read_row_info(row: Sequence[object]) -> RowInfo:
    """The metadata of a waiting entry from ``rowid,`` :data:`_INDEX_COLUMNS`; raises :class:`_BadRow`."""
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
        raise _BadRow(f"column 'error' holds {_SQL_KINDS.get(str(error_type), 'a value')}, not text")
    if call_state == "not json":
        raise _BadRow("column 'call' is not JSON")
    if call_state == "not object":
        raise _BadRow("column 'call' is not a JSON object")
    if call_state != "ok":
        raise _BadRow(f"column 'call' holds {_SQL_KINDS.get(str(call_state), 'a value')}, not text")
    if key_state == "not json":
        raise _BadRow("column 'key' is not JSON")
    if key_state == "not key":
        raise _BadRow("column 'key' is not a JSON string or list")
    if key_state is None:  # not looked at by SQLite
        _json_key(info.key)
    return info


def _read_parked(row: Sequence[object]) -> ParkedWrite:
    """A parked write from ``rowid,`` :data:`_PARKED_COLUMNS`; raises :class:`_BadRow`."""
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


def _readable(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_zero(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _set_aside_of(table: str, row: Sequence[object], reason: str, *, counted: bool) -> SetAside:
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


def _deleted_info(row: Sequence[object]) -> RowInfo:
    """The metadata of a waiting entry being deleted (``rowid,`` :data:`_INDEX_COLUMNS_PLAIN`):
    whatever it holds, it is deleted all the same (a row that cannot be read whole comes back
    ``damaged``, with what could be read)."""
    try:
        return _read_row_info(row)
    except _BadRow:
        seq, method, key, scope, size = row[1], row[2], row[3], row[4], row[7]
        try:
            readable_key = _json_key(_readable(key))
        except _BadRow:
            readable_key = None
        return RowInfo(
            _int_or_zero(seq),
            _readable(method) or "unknown",
            readable_key,
            _readable(scope),
            0,
            0,
            _int_or_zero(size),
            damaged=True,
        )


def _as_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _raw_values(names: Sequence[str], values: Sequence[object]) -> tuple[tuple[str, str, RawValue], ...]:
    """``(name, SQLite type, value)`` of columns read as ``typeof(c), c`` pairs with bytes for text."""
    found: list[tuple[str, str, RawValue]] = []
    for index, name in enumerate(names):
        kind, value = _as_text(values[2 * index]), values[2 * index + 1]
        if not isinstance(value, bytes | int | float) or isinstance(value, bool):
            value = None
        found.append((name, kind, value))
    return tuple(found)


def _raw_int(raw: Sequence[tuple[str, str, RawValue]], name: str) -> int | None:
    for column, kind, value in raw:
        if column == name and kind == "integer" and isinstance(value, int):
            return value
    return None


def _raw_text(raw: Sequence[tuple[str, str, RawValue]], name: str) -> str | None:
    for column, kind, value in raw:
        if column == name and kind == "text" and isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
    return None


_Select = Callable[[str, Sequence[object]], list[tuple[object, ...]]]


def _chunks(select: _Select, sql: str, *, after: int, key: int = 0) -> Iterator[list[tuple[object, ...]]]:
    """The rows of ``sql`` a chunk at a time: its parameters are the key to start after and the
    chunk's size; column ``key`` of the last row read starts the next chunk."""
    while True:
        rows = select(sql, (after, _CHUNK))
        if not rows:
            return
        after = _int_or_zero(rows[-1][key])
        yield rows


def _seq_chunks(seqs: Sequence[int]) -> Iterator[tuple[Sequence[int], str]]:
    """``seqs`` a chunk at a time, each with its ``?`` marks for ``IN (...)``."""
    for start in range(0, len(seqs), _CHUNK):
        chunk = seqs[start : start + _CHUNK]
        yield chunk, ",".join("?" * len(chunk))


# --- opening --------------------------------------------------------------------------------------


def _has_json(db: sqlite3.Connection) -> bool:
    """Whether SQLite has its JSON functions (built in since 3.38)."""
    try:
        db.execute("SELECT json_valid('{}')").fetchone()
    except sqlite3.Error:
        return False
    return True


def _meta(db: sqlite3.Connection, name: str) -> str | None:
    row = db.execute("SELECT CAST(value AS BLOB) FROM meta WHERE name = ?", (name,)).fetchone()
    if row is None or row[0] is None:
        return None
    try:
        return bytes(row[0]).decode("utf-8")
    except UnicodeDecodeError:
        raise SpillFileCorruptError(f"the meta value {name!r} is not UTF-8 text") from None


def _meta_int(db: sqlite3.Connection, name: str) -> int:
    text = _meta(db, name)
    try:
        return int(text or 0)
    except ValueError:
        raise SpillFileCorruptError(f"the meta value {name!r} is not a number") from None


def _is_ours(db: sqlite3.Connection, path: str) -> bool:
    """Whether the file holds our schema (``False``: an empty database); raises otherwise."""
    application_id = db.execute("PRAGMA application_id").fetchone()[0]
    if application_id != APPLICATION_ID:
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if application_id == 0 and tables == 0:
            return False
        raise SpillFileForeignError(f"{path!r} is not a guarded dead-letter spill file")
    version = _meta_int(db, "schema_version")
    if version > SCHEMA_VERSION:
        raise SpillFileVersionError(
            f"{path!r} was written by a newer guarded (spill file schema {version}, "
            f"this version reads up to {SCHEMA_VERSION})"
        )
    return True


def _writes_held(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT (SELECT count(*) FROM pending) + (SELECT count(*) FROM parked)").fetchone()
    return int(row[0])


def _migrate(db: sqlite3.Connection) -> None:
    """Bring an older layout forward (in the caller's transaction)."""
    version = _meta_int(db, "schema_version")
    # 1 -> 2: a file may record its target in meta; none recorded means unknown.
    if version < 3:
        # 2 -> 3: unreadable rows are moved to a quarantine table.
        db.execute(_QUARANTINE_TABLE)
    if version < SCHEMA_VERSION:
        db.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),))


@contextlib.contextmanager
def _closed_on_failure(db: sqlite3.Connection, path: str, doing: str) -> Iterator[None]:
    """Close ``db`` when the block fails; a SQLite error becomes the matching :class:`SpillFileError`."""
    try:
        yield
    except sqlite3.Error as exc:
        db.close()
        raise _open_error(exc, path, doing) from exc
    except BaseException:
        db.close()
        raise


class _CopyConnection(sqlite3.Connection):
    """A connection to a private copy of a spill file that deletes the copy when it is closed."""

    copy_dir: str | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.copy_dir is not None:
                shutil.rmtree(self.copy_dir, ignore_errors=True)
                self.copy_dir = None


def _uri(path: str, options: str) -> str:
    return f"file:{quote(os.path.abspath(path))}?{options}"


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to ``path`` that leaves every file beside it as it was (see
    :meth:`SpillFile.open_read_only`)."""
    if is_locked(path):
        return sqlite3.connect(_uri(path, "mode=ro"), uri=True, isolation_level=None, check_same_thread=False)
    if not os.path.exists(path + "-wal"):
        return sqlite3.connect(
            _uri(path, "mode=ro&immutable=1"), uri=True, isolation_level=None, check_same_thread=False
        )
    copy_dir = tempfile.mkdtemp(prefix="guarded-dlq-read-")
    try:
        copy = os.path.join(copy_dir, os.path.basename(path))
        shutil.copyfile(path, copy)
        shutil.copyfile(path + "-wal", copy + "-wal")
        db = sqlite3.connect(copy, isolation_level=None, check_same_thread=False, factory=_CopyConnection)
    except BaseException:
        shutil.rmtree(copy_dir, ignore_errors=True)
        raise
    db.copy_dir = copy_dir
    return db


# --- the file -------------------------------------------------------------------------------------


class SpillFile:
    """One dead-letter spill file. Use :meth:`open` (writer, locked) or :meth:`open_read_only`."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        path: str,
        *,
        lock_fd: int | None,
        generation: int,
        target: str | None = None,
    ) -> None:
        self._db = connection
        self.path = path
        self._lock_fd = lock_fd
        self.generation = generation
        """Incremented at every writable open: stamps of earlier generations are older than any
        stamp of this one (call-order counters restart with the process)."""
        self.target = target
        """The backend target this file's writes belong to (``None``: unknown, e.g. written by a
        guarded that did not record targets)."""
        self.read_only = lock_fd is None
        self.commits = 0
        """Write transactions committed through this instance (group commit shares them)."""
        self.previous_pid: int | None = None
        """The pid the lock file named before this process took it (set for adopted files)."""
        self.legacy_entries = 0
        """Waiting and parked writes the file held when it was opened with no recorded target and
        was then recorded as ``target`` (see :meth:`open`)."""
        self._pending = self._pending_bytes = self._parked = self._parked_bytes = 0
        self._quarantined = 0
        """What the file holds, as last counted (kept up to date by the writes)."""
        self._set_aside: collections.deque[SetAside] = collections.deque()
        """Unreadable rows moved to the quarantine table by committed transactions, not yet taken."""
        self._staged: list[SetAside] = []
        """Unreadable rows moved by the transaction under way (reported once it commits)."""
        self._in_place: dict[tuple[str, int], SetAside] = {}
        """Read-only: unreadable rows found in their table (by ``(table, rowid)``)."""
        self._has_quarantine = self._table_exists("quarantine")
        self._index_columns = _INDEX_COLUMNS if _has_json(connection) else _INDEX_COLUMNS_PLAIN
        self._recount()

    # --- opening and closing ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        lock_fd: int | None = None,
        target: str | None = None,
        check_target: bool = False,
        min_generation: int = 0,
    ) -> SpillFile:
        """Open ``path`` for writing, creating it (mode 0600) and its schema when missing.

        ``lock_fd`` is the lock already taken with :func:`acquire_lock`: kept by the file and
        released by :meth:`close`, still the caller's when this raises. Without it the lock is
        taken here (and released when this raises). With ``check_target``, a file recording another
        target than ``target`` is refused (:class:`SpillFileTargetError`, nothing written) while it
        holds writes, and re-targeted when it holds none; a file with no recorded target gets
        ``target`` recorded (:attr:`legacy_entries` says how many writes it held). The generation
        becomes at least ``min_generation``.

        Raises :class:`SpillFileLockedError` when another live process holds the file,
        :class:`SpillFileCorruptError`, :class:`SpillFileVersionError` (nothing written),
        :class:`SpillFileForeignError` (nothing written), :class:`SpillFileError` or
        :class:`OSError` otherwise.
        """
        own_lock = lock_fd is None
        if lock_fd is None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            lock_fd = acquire_lock(path)
        try:
            if not os.path.exists(path):
                _remove_files(path)  # a WAL without its database must never meet a new one
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            with _closed_on_failure(db, path, "opening"):
                return cls._prepare(
                    db,
                    path,
                    lock_fd,
                    synchronous=synchronous,
                    target=target,
                    check_target=check_target,
                    min_generation=min_generation,
                )
        except BaseException:
            if own_lock:
                os.close(lock_fd)
            raise

    @classmethod
    def _prepare(
        cls,
        db: sqlite3.Connection,
        path: str,
        lock_fd: int,
        *,
        synchronous: str,
        target: str | None,
        check_target: bool,
        min_generation: int,
    ) -> SpillFile:
        """Create or migrate the schema of the locked file ``db``, check its target and count its
        generation (see :meth:`open`)."""
        db.execute("PRAGMA busy_timeout = 5000")
        created = not _is_ours(db, path)
        recorded = None if created else _meta(db, "target")
        retarget = legacy = False
        if check_target and not created and recorded != target:
            held = _writes_held(db)
            if recorded is not None and held:
                raise SpillFileTargetError(
                    f"dead-letter spill file {path!r} holds {held} write(s) for another target "
                    f"({recorded}); it is never replayed into {target or 'an unknown target'}"
                )
            retarget = target is not None
            legacy = recorded is None and held > 0
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {synchronous}")
        db.execute("BEGIN IMMEDIATE")
        try:
            if created:
                for statement in (*_SCHEMA, _QUARANTINE_TABLE):
                    db.execute(statement)
                db.execute(
                    "INSERT INTO meta (name, value) VALUES ('schema_version', ?), ('generation', '0')",
                    (str(SCHEMA_VERSION),),
                )
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                retarget = target is not None
            else:
                _migrate(db)
            if retarget:
                db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('target', ?)", (target,))
                recorded = target
            generation = max(_meta_int(db, "generation") + 1, min_generation)
            db.execute("UPDATE meta SET value = ? WHERE name = 'generation'", (str(generation),))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        spill = cls(db, path, lock_fd=lock_fd, generation=generation, target=recorded)
        if legacy:
            spill.legacy_entries = spill._pending + spill._parked
        spill.check_parked()
        return spill

    @classmethod
    def open_read_only(cls, path: str) -> SpillFile:
        """Open an existing file for reading only, without the lock (works beside a live writer).

        Reading creates and changes nothing beside the file: a file no live process holds is read
        as immutable (SQLite creates no ``-wal`` or ``-shm``), and one a crashed writer left with
        its WAL is read from a private copy of both (the WAL's writes counted, the originals
        untouched). Only beside a live writer does it read through that writer's WAL and shared
        memory."""
        if not os.path.isfile(path):
            if os.path.exists(path):
                raise SpillFileError(f"cannot read dead-letter spill file {path!r}: it is not a regular file")
            raise SpillFileError(f"no dead-letter spill file at {path!r}")
        try:
            db = _connect_read_only(path)
        except sqlite3.Error as exc:
            raise _open_error(exc, path, "reading") from exc
        except OSError as exc:  # copying a file a crashed writer left
            raise SpillFileError(f"cannot read dead-letter spill file {path!r}: {exc}") from exc
        with _closed_on_failure(db, path, "reading"):
            db.execute("PRAGMA busy_timeout = 5000")
            if not _is_ours(db, path):
                raise SpillFileForeignError(f"{path!r} is an empty database, not a dead-letter spill file")
            spill = cls(
                db, path, lock_fd=None, generation=_meta_int(db, "generation"), target=_meta(db, "target")
            )
            spill.check_parked()
            return spill

    def _table_exists(self, name: str) -> bool:
        row = self._db.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return bool(row[0])

    def close(self) -> None:
        """Close the database and release the lock."""
        try:
            self._db.close()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def close_keeping_lock(self) -> int | None:
        """Close the database but keep the lock; returns its descriptor (now the caller's)."""
        fd, self._lock_fd = self._lock_fd, None
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        return fd

    def remove(self) -> None:
        """Close and delete the file, its WAL and shared memory, then its lock file, releasing the
        lock last (see :func:`acquire_lock` for why the unlinked lock cannot be reused)."""
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        try:
            _remove_files(self.path)
            if self._lock_fd is not None:
                _unlink_quietly(lock_path(self.path))
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # --- counting ---------------------------------------------------------------------------------

    def _recount(self) -> None:
        self._pending, self._pending_bytes = self._db.execute(
            f"SELECT count(*), {_SIZE_SUM} FROM pending"
        ).fetchone()
        self._parked, self._parked_bytes = self._db.execute(
            f"SELECT count(*), {_SIZE_SUM} FROM parked"
        ).fetchone()
        self._quarantined = (
            self._db.execute("SELECT count(*) FROM quarantine").fetchone()[0] if self._has_quarantine else 0
        )

    @property
    def is_empty(self) -> bool:
        """Whether the file holds no waiting and no parked write (as last counted)."""
        return self._pending == 0 and self._parked == 0

    def totals(self) -> SpillTotals:
        """Counts, encoded bytes and the oldest waiting entry (kept up to date by the writer; a
        read-only instance counts afresh, leaving out the unreadable rows it found)."""
        if self.read_only:
            return self._read_only_totals()
        head = self._db.execute(
            f"SELECT seq, enqueued_at FROM pending WHERE {_NUMERIC_AT} ORDER BY seq LIMIT 1"
        ).fetchone()
        return SpillTotals(
            self._pending,
            self._pending_bytes,
            self._parked,
            self._parked_bytes,
            None if head is None else (head[0], float(head[1])),
            self._quarantined,
        )

    def _read_only_totals(self) -> SpillTotals:
        self._recount()
        for _ in self.index_rows():  # rows whose seq is not a number are met here
            pass
        pending = pending_bytes = 0
        oldest: tuple[int, float] | None = None
        for entry in self._entries():
            pending += 1
            pending_bytes += entry.size
            if oldest is None:
                oldest = (entry.seq, entry.enqueued_at)
        parked = self.parked()
        return SpillTotals(
            pending,
            pending_bytes,
            len(parked),
            sum(write.size for write in parked),
            oldest,
            self._quarantined + len(self._in_place),
        )

    def by_method(self) -> list[tuple[str, int, int]]:
        """``(method, waiting entries, encoded bytes)`` per method, by method name (readable rows)."""
        counts: dict[str, list[int]] = {}
        rows: Iterator[RowInfo | DeadLetter] = self._entries() if self.read_only else self.index_rows()
        for info in rows:
            found = counts.setdefault(info.method, [0, 0])
            found[0] += 1
            found[1] += info.size
        return [(method, count, size) for method, (count, size) in sorted(counts.items())]

    def max_seq(self) -> int:
        """The largest sequence number ever stored and still present (0 for an empty file)."""
        row = self._db.execute(
            "SELECT max(coalesce((SELECT max(seq) FROM pending WHERE typeof(seq) = 'integer'), 0), "
            "coalesce((SELECT max(seq) FROM parked WHERE typeof(seq) = 'integer'), 0))"
        ).fetchone()
        return int(row[0])

    # --- reading ----------------------------------------------------------------------------------

    def index_rows(self) -> Iterator[RowInfo]:
        """Metadata of every waiting entry, in sequence order (to rebuild the in-memory index).
        Unreadable rows are set aside (reported with ``counted=False``)."""
        # Rows whose seq is not an integer (NULL, text: a table rebuilt without its constraints)
        # are met first; they are set aside like any unreadable row.
        rows = self._select(
            f"SELECT rowid, {self._index_columns} FROM pending WHERE typeof(seq) != 'integer' ORDER BY rowid"
        )
        self._checked("pending", rows, _read_row_info, counted=False)
        yield from self._in_order(self._index_columns, _read_row_info)

    def _entries(self) -> Iterator[DeadLetter]:
        """Every readable waiting entry, in sequence order (unreadable ones are set aside)."""
        return self._in_order(_PENDING_COLUMNS, _read_pending)

    def _in_order(self, columns: str, read: Callable[[Sequence[object]], R]) -> Iterator[R]:
        """``read`` of every waiting row with an integer seq, in sequence order, a chunk at a time."""
        sql = f"SELECT rowid, {columns} FROM pending {_SEQ_AFTER}"
        for rows in _chunks(self._select, sql, after=_BEFORE_ANY_SEQ, key=1):
            yield from self._checked("pending", rows, read, counted=False)

    def parked_seqs(self) -> list[int]:
        """Sequence numbers of the parked writes, in order."""
        return [
            int(row[0])
            for row in self._db.execute("SELECT seq FROM parked WHERE typeof(seq) = 'integer' ORDER BY seq")
        ]

    def page(self, after: int, limit: int | None) -> list[DeadLetter]:
        """Waiting entries with ``seq > after`` in sequence order, at most ``limit`` (unreadable
        rows are set aside and not counted against the limit)."""
        return self._paged("pending", _PENDING_COLUMNS, _read_pending, after, limit, counted=True)

    def fetch(self, seqs: Sequence[int]) -> list[DeadLetter]:
        """The waiting entries among ``seqs``, in sequence order."""
        found: list[DeadLetter] = []
        for chunk, marks in _seq_chunks(seqs):
            rows = self._select(
                f"SELECT rowid, {_PENDING_COLUMNS} FROM pending WHERE seq IN ({marks})", chunk
            )
            found.extend(self._checked("pending", rows, _read_pending, counted=True))
        found.sort(key=lambda entry: entry.seq)
        return found

    def for_scope(self, method: str, scope: str) -> list[DeadLetter]:
        """The waiting entries of ``method`` in ``scope``, in sequence order."""
        rows = self._select(
            f"SELECT rowid, {_PENDING_COLUMNS} FROM pending WHERE method = ? AND scope = ? ORDER BY seq",
            (method, scope),
        )
        return self._checked("pending", rows, _read_pending, counted=True)

    def parked(self, limit: int | None = None) -> list[ParkedWrite]:
        """Parked writes in sequence order, at most ``limit`` (unreadable ones are set aside)."""
        if limit is None or limit > 0:
            rows = self._select(f"SELECT rowid, {_PARKED_COLUMNS} FROM parked WHERE typeof(seq) != 'integer'")
            self._checked("parked", rows, _read_parked, counted=False)
        return self._paged("parked", _PARKED_COLUMNS, _read_parked, _BEFORE_ANY_SEQ, limit, counted=False)

    def _paged(
        self,
        table: str,
        columns: str,
        read: Callable[[Sequence[object]], R],
        after: int,
        limit: int | None,
        *,
        counted: bool,
    ) -> list[R]:
        """Rows of ``table`` with an integer ``seq > after`` in sequence order, read by ``read``, at
        most ``limit``; unreadable rows are set aside and not counted against the limit."""
        found: list[R] = []
        while True:
            want = None if limit is None else limit - len(found)
            if want is not None and want <= 0:
                return found
            rows = self._select(
                f"SELECT rowid, {columns} FROM {table} {_SEQ_AFTER}", (after, -1 if want is None else want)
            )
            if not rows:
                return found
            after = _int_or_zero(rows[-1][1])
            found.extend(self._checked(table, rows, read, counted=counted))
            if want is None or len(rows) < want:
                return found

    # --- reads that survive unreadable rows -------------------------------------------------------

    def _strict_select(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        """``sql``'s rows; text that is not UTF-8 fails the read."""
        return self._db.execute(sql, params).fetchall()

    def _bytes_select(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        """``sql``'s rows with bytes for text."""
        factory = self._db.text_factory
        self._db.text_factory = bytes
        try:
            return self._db.execute(sql, params).fetchall()
        finally:
            self._db.text_factory = factory

    def _select(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """``sql``'s rows; text that is not UTF-8 comes back as :data:`_NOT_UTF8` instead of failing
        the whole read (such a read is done again with bytes for text)."""
        try:
            return self._strict_select(sql, params)
        except (sqlite3.OperationalError, sqlite3.DataError) as exc:
            if not _is_decode_error(exc):
                raise
        rows = self._bytes_select(sql, params)
        return [tuple(_decoded(value) for value in row) for row in rows]

    def _checked(
        self,
        table: str,
        rows: Sequence[Sequence[object]],
        read: Callable[[Sequence[object]], R],
        *,
        counted: bool,
    ) -> list[R]:
        """``read`` of each row; rows it cannot read are set aside (see the module docs)."""
        good: list[R] = []
        bad: list[SetAside] = []
        known = self._in_place
        for row in rows:
            if known and (table, row[0]) in known:
                continue  # read-only: found unreadable before
            try:
                good.append(read(row))
            except _BadRow as exc:
                bad.append(_set_aside_of(table, row, str(exc), counted=counted))
        if bad:
            self._put_aside(bad)
        return good

    # --- unreadable rows --------------------------------------------------------------------------

    def _put_aside(self, found: Sequence[SetAside]) -> None:
        """Move unreadable rows to the quarantine table (in the transaction under way, if any: they
        are reported once it commits), or, read-only, remember them as found in place."""
        if self.read_only or not self._has_quarantine:
            for item in found:
                self._in_place[(item.table, item.rowid)] = item
            return
        now = time.time()
        own = not self._db.in_transaction
        if own:
            self._db.execute("BEGIN IMMEDIATE")
        try:
            for item in found:
                columns = ", ".join(_AS_QUARANTINED[item.table])
                self._db.execute(
                    f"INSERT INTO quarantine ({_QUARANTINE_COLUMNS}) "
                    f"SELECT ?, ?, ?, {columns} FROM {item.table} WHERE rowid = ?",
                    (item.table, item.reason, now, item.rowid),
                )
                self._db.execute(f"DELETE FROM {item.table} WHERE rowid = ?", (item.rowid,))
            self._staged.extend(found)
            self._recount()
            if own:
                self._db.execute("COMMIT")
                self._publish()
        except BaseException:
            if own:
                self._abandon()
            raise

    def _publish(self) -> None:
        """The transaction committed: report the rows it set aside."""
        self._set_aside.extend(self._staged)
        self._staged.clear()

    def _abandon(self) -> None:
        """The transaction failed: roll it back, forget the rows it set aside and count afresh."""
        self._staged.clear()
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self._recount()
        except sqlite3.Error:
            pass  # the original error says more

    def take_set_aside(self) -> list[SetAside]:
        """The unreadable rows moved to the quarantine table since the last call (any thread)."""
        taken: list[SetAside] = []
        while True:
            try:
                taken.append(self._set_aside.popleft())
            except IndexError:
                return taken

    def check_parked(self) -> None:
        """Read every parked write once, setting aside those that cannot be read (done at open)."""
        self.parked()

    def check_all(self) -> None:
        """Read every row, calls included, setting aside those that cannot be read (before a file
        is adopted, so that copying its rows never meets one)."""
        for _ in self.index_rows():
            pass
        for _ in self._entries():
            pass
        self.parked()

    def quarantined(self, limit: int | None = None, *, with_raw: bool = True) -> list[QuarantinedRow]:
        """The quarantined rows, oldest first, at most ``limit``; a read-only open lists the
        unreadable rows it found still in their tables after them. ``raw`` is empty unless
        ``with_raw``."""
        found: list[QuarantinedRow] = []
        if self._has_quarantine:
            raw_columns = ", ".join(f"typeof({name}), {name}" for name in _RAW_COLUMNS)
            rows = self._bytes_select(
                "SELECT qid, CAST(source AS BLOB), CAST(reason AS BLOB), quarantined_at, "
                f"{raw_columns} FROM quarantine ORDER BY qid LIMIT ?",
                (-1 if limit is None else limit,),
            )
            for row in rows:
                raw = _raw_values(_RAW_COLUMNS, row[4:])
                found.append(
                    QuarantinedRow(
                        id=_int_or_zero(row[0]),
                        source=_as_text(row[1]),
                        seq=_raw_int(raw, "seq"),
                        method=_raw_text(raw, "method"),
                        reason=_as_text(row[2]),
                        quarantined_at=row[3] if isinstance(row[3], int | float) else None,
                        raw=raw if with_raw else (),
                    )
                )
        for item in list(self._in_place.values()):
            if limit is not None and len(found) >= limit:
                break
            names = _AS_QUARANTINED[item.table]
            rows = self._bytes_select(
                f"SELECT {', '.join(f'typeof({name}), {name}' for name in names)} "
                f"FROM {item.table} WHERE rowid = ?",
                (item.rowid,),
            )
            raw = _raw_values(_RAW_COLUMNS, rows[0]) if rows else ()
            found.append(
                QuarantinedRow(
                    id=None,
                    source=item.table,
                    seq=item.seq,
                    method=item.method,
                    reason=item.reason,
                    quarantined_at=None,
                    raw=raw if with_raw else (),
                )
            )
        return found

    # --- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, max_bytes: int | None = None) -> Iterator[None]:
        """One write transaction; past ``max_bytes`` of encoded bytes, if the block added any, it
        is rolled back (:class:`SpillCapError`): nothing the file holds is dropped to make room."""
        if self.read_only:
            raise SpillFileError(f"dead-letter spill file {self.path!r} is open read-only")
        self._db.execute("BEGIN IMMEDIATE")
        before = self._pending_bytes + self._parked_bytes
        try:
            yield
            after = self._pending_bytes + self._parked_bytes
            if max_bytes is not None and after > max_bytes and after > before:
                raise SpillCapError(f"the spill file would hold {after} bytes, past its cap of {max_bytes}")
            self._db.execute("COMMIT")
            self.commits += 1
            self._publish()
        except BaseException:
            self._abandon()
            raise

    def _delete_pending(self, seqs: Sequence[int]) -> list[RowInfo]:
        """Delete the waiting entries ``seqs``; returns those that were there, in order."""
        deleted: list[RowInfo] = []
        for chunk, marks in _seq_chunks(seqs):
            found = self._select(
                f"SELECT rowid, {_INDEX_COLUMNS_PLAIN} FROM pending WHERE seq IN ({marks})", chunk
            )
            deleted.extend(_deleted_info(row) for row in found)
            self._db.execute(f"DELETE FROM pending WHERE seq IN ({marks})", chunk)
        deleted.sort(key=lambda row: row.seq)
        self._pending -= len(deleted)
        self._pending_bytes -= sum(row.size for row in deleted)
        return deleted

    def _insert_parked(self, writes: Sequence[ParkedWrite]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO parked (seq, method, call, reason, parked_at, size) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    write.seq,
                    write.method,
                    None if write.call is None else dumps(write.call),
                    write.reason,
                    write.parked_at,
                    write.size,
                )
                for write in writes
            ],
        )
        self._parked += len(writes)
        self._parked_bytes += sum(write.size for write in writes)

    def write(
        self,
        entries: Sequence[DeadLetter],
        *,
        generation: int,
        delete: Sequence[int] = (),
        max_bytes: int | None = None,
        generations: Mapping[int, int] | None = None,
        texts: Mapping[int, str] | None = None,
        parked: Sequence[ParkedWrite] = (),
    ) -> WriteResult:
        """In one transaction: delete the waiting entries ``delete``, insert ``entries`` (and the
        parked writes ``parked``). Raises :class:`SpillCapError` (nothing written) when that would
        take the file's encoded bytes past ``max_bytes``: nothing is dropped to make room.

        Entries are stored with ``generation`` unless ``generations`` (by seq) says otherwise;
        ``texts`` (by seq) are their calls already encoded with :func:`dumps`.
        """
        with self._transaction(max_bytes):
            deleted = self._delete_pending(delete)
            if entries:
                found_generation = generations.get if generations else None
                found_text = texts.get if texts else None
                self._db.executemany(
                    _INSERT_PENDING,
                    [
                        (
                            entry.seq,
                            entry.method,
                            (found_text(entry.seq) if found_text else None) or dumps(entry.call),
                            entry.key,
                            entry.scope,
                            entry.stamp,
                            found_generation(entry.seq, generation) if found_generation else generation,
                            entry.enqueued_at,
                            entry.size,
                            entry.error,
                        )
                        for entry in entries
                    ],
                )
                self._pending += len(entries)
                self._pending_bytes += sum(entry.size for entry in entries)
            if parked:
                self._insert_parked(parked)
        return WriteResult(deleted, self.totals())

    def take_over(
        self,
        source: SpillFile,
        pending: Mapping[int, int],
        parked: Mapping[int, int],
        *,
        delete: Sequence[int] = (),
        max_bytes: int | None = None,
    ) -> WriteResult:
        """In one transaction: delete our waiting entries ``delete`` and copy the waiting entries
        of ``source`` named in ``pending`` and its parked writes named in ``parked`` (old seq ->
        new seq), as entries of generation 0 (older than any write of the adopting process), and
        every row of its quarantine table. Read every row of ``source`` first
        (:meth:`check_all`), so that none that cannot be read is met here.

        A failure reading ``source`` raises :class:`SourceReadError` (nothing written here); past
        ``max_bytes``, :class:`SpillCapError` (nothing written: the source keeps its rows).
        """
        with self._transaction(max_bytes):
            deleted = self._delete_pending(delete)
            for rows in source._rows_to_copy("pending", _PENDING_COLUMNS):
                chosen = [
                    (pending[_int_or_zero(row[0])], *row[1:6], 0, *row[7:])
                    for row in rows
                    if _int_or_zero(row[0]) in pending
                ]
                self._db.executemany(_INSERT_PENDING, chosen)
                self._pending += len(chosen)
                self._pending_bytes += sum(_int_or_zero(row[8]) for row in chosen)
            for rows in source._rows_to_copy("parked", _PARKED_COLUMNS):
                moved = [
                    (parked[_int_or_zero(row[0])], *row[1:]) for row in rows if _int_or_zero(row[0]) in parked
                ]
                self._db.executemany(
                    f"INSERT INTO parked ({_PARKED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", moved
                )
                self._parked += len(moved)
                self._parked_bytes += sum(_int_or_zero(row[5]) for row in moved)
            if self._has_quarantine:
                marks = ", ".join("?" * (3 + len(_RAW_COLUMNS)))
                for rows in source._quarantine_to_copy():
                    self._db.executemany(
                        f"INSERT INTO quarantine ({_QUARANTINE_COLUMNS}) VALUES ({marks})", rows
                    )
                    self._quarantined += len(rows)
        return WriteResult(deleted, self.totals())

    def _rows_to_copy(self, table: str, columns: str) -> Iterator[list[tuple[object, ...]]]:
        """Chunks of ``table``'s rows as stored (``columns``, the first the ``seq``), read for
        :meth:`take_over` into another file."""
        sql = f"SELECT {columns} FROM {table} {_SEQ_AFTER}"
        return self._as_source(_chunks(self._strict_select, sql, after=-1))

    def _quarantine_to_copy(self) -> Iterator[list[tuple[object, ...]]]:
        """Chunks of the quarantined rows as stored (:data:`_QUARANTINE_COLUMNS`), read for
        :meth:`take_over` into another file."""
        if not self._has_quarantine:
            return iter(())
        sql = f"SELECT qid, {_QUARANTINE_COLUMNS} FROM quarantine WHERE qid > ? ORDER BY qid LIMIT ?"
        return self._as_source(
            [row[1:] for row in rows] for rows in _chunks(self._bytes_select, sql, after=-1)
        )

    def _as_source(self, chunks: Iterator[list[tuple[object, ...]]]) -> Iterator[list[tuple[object, ...]]]:
        """``chunks`` of this file's rows; a failure reading them becomes :class:`SourceReadError`
        (this file's fault, not that of the file taking them over)."""
        while True:
            try:
                rows = next(chunks)
            except StopIteration:
                return
            except sqlite3.Error as exc:
                raise SourceReadError(f"reading {self.path!r} failed: {exc}") from exc
            yield rows

    def shift(self, offset: int) -> None:
        """Add ``offset`` (larger than any sequence number stored) to every sequence number, in one
        transaction: makes room below for entries numbered elsewhere."""
        if offset <= self.max_seq():
            raise ValueError("the offset must exceed every stored sequence number")
        with self._transaction():
            self._db.execute("UPDATE pending SET seq = seq + ?", (offset,))
            self._db.execute("UPDATE parked SET seq = seq + ?", (offset,))

    def delete(self, seqs: Sequence[int]) -> WriteResult:
        """Delete the waiting entries ``seqs``; the result lists those that were still there."""
        with self._transaction():
            deleted = self._delete_pending(seqs)
        return WriteResult(deleted, self.totals())

    def park(
        self,
        writes: Sequence[ParkedWrite],
        *,
        delete: Sequence[int] = (),
        max_bytes: int | None = None,
    ) -> WriteResult:
        """In one transaction: delete the waiting entries ``delete`` and store ``writes`` as parked
        (:class:`SpillCapError`, nothing written, past ``max_bytes``)."""
        with self._transaction(max_bytes):
            deleted = self._delete_pending(delete)
            self._insert_parked(writes)
        return WriteResult(deleted, self.totals())

    def park_pending(self, seq: int, *, reason: str, parked_at: float) -> WriteResult:
        """Move the waiting entry ``seq`` to the parked writes with ``reason`` (one transaction)."""
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO parked (seq, method, call, reason, parked_at, size, key, scope) "
                "SELECT seq, method, call, ?, ?, size, key, scope FROM pending WHERE seq = ?",
                (reason, parked_at, seq),
            )
            deleted = self._delete_pending([seq])
            self._parked += len(deleted)
            self._parked_bytes += sum(row.size for row in deleted)
        return WriteResult(deleted, self.totals())

    def unpark(self, limit: int | None = None) -> WriteResult:
        """Move parked writes that kept their call back to the waiting entries (same ``seq``, the
        oldest stamp and generation, so any newer write of their key wins over them)."""
        with self._transaction():
            self._db.execute(
                f"INSERT INTO pending ({_PENDING_COLUMNS}) "
                "SELECT seq, method, call, key, scope, 0, 0, parked_at, size, 'unparked: ' || reason "
                "FROM parked WHERE call IS NOT NULL ORDER BY seq LIMIT ?",
                (-1 if limit is None else limit,),
            )
            self._db.execute("DELETE FROM parked WHERE seq IN (SELECT seq FROM pending)")
            self._recount()
        return WriteResult([], self.totals())

    def purge(self, *, pending: bool, parked: bool, quarantined: bool = False) -> int:
        """Delete every waiting, parked and/or quarantined row; returns how many were deleted."""
        removed = 0
        with self._transaction():
            if pending:
                removed += self._db.execute("DELETE FROM pending").rowcount
                self._pending = self._pending_bytes = 0
            if parked:
                removed += self._db.execute("DELETE FROM parked").rowcount
                self._parked = self._parked_bytes = 0
            if quarantined and self._has_quarantine:
                removed += self._db.execute("DELETE FROM quarantine").rowcount
                self._quarantined = 0
        return removed


__all__ = [
    "APPLICATION_ID",
    "EMPTY_TOTALS",
    "SCHEMA_VERSION",
    "QuarantinedRow",
    "RawValue",
    "RowInfo",
    "SetAside",
    "SourceReadError",
    "SpillCapError",
    "SpillFile",
    "SpillFileCorruptError",
    "SpillFileError",
    "SpillFileForeignError",
    "SpillFileLockedError",
    "SpillFileTargetError",
    "SpillFileVersionError",
    "SpillTotals",
    "WriteResult",
    "acquire_lock",
    "dumps",
    "holder_pid",
    "is_corruption",
    "is_disk_full",
    "is_locked",
    "lock_path",
    "set_aside",
]
