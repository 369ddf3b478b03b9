"""The durable part of the dead-letter buffer: one SQLite file (stdlib ``sqlite3``, WAL mode).

A :class:`SpillFile` opened for writing holds an exclusive ``flock`` on ``<path>.lock`` for its
lifetime, so two live processes never write the same file; the kernel releases the lock when
the process dies, however it dies. Read-only opens (``guarded dlq list``/``stats``) take no lock
and work beside a live writer. Every method is synchronous and commits before it returns; the
buffer runs them on one dedicated worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

from ..errors import GuardedError
from .entries import DeadLetter, ParkedWrite

SCHEMA_VERSION = 1
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
_CHUNK = 500


class SpillFileError(GuardedError):
    """The spill file cannot be used: not a dead-letter file, a newer layout, unreadable."""


class SpillFileLockedError(SpillFileError):
    """Another live process has the spill file open for writing."""


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


@dataclass(frozen=True, slots=True)
class SpillTotals:
    """Counts and encoded bytes of the file's entries, and its oldest waiting entry."""

    pending: int
    pending_bytes: int
    parked: int
    parked_bytes: int
    oldest: tuple[int, float] | None
    """``(seq, enqueued_at)`` of the oldest waiting entry."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write transaction removed, and the file's totals after it."""

    deleted: list[RowInfo]
    """Entries removed because the caller asked (superseded, replayed, taken, parked)."""
    dropped: list[RowInfo]
    """Entries removed to keep the file under its size cap (oldest first)."""
    totals: SpillTotals


def dumps(value: object) -> str:
    """Compact JSON text of an encoded call, as stored."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _lock(path: str) -> int:
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise SpillFileLockedError(
            f"dead-letter spill file {path!r} is in use by another process{who}; "
            "each process needs its own spill file (use '{name}' in the path)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode("ascii"))
    return fd


def _pending(row: Sequence[object]) -> DeadLetter:
    seq, method, call, key, scope, stamp, _generation, enqueued_at, size, error = row
    return DeadLetter(
        seq=int(seq),  # type: ignore[call-overload]
        method=str(method),
        call=json.loads(str(call)),
        key=None if key is None else str(key),
        scope=None if scope is None else str(scope),
        stamp=int(stamp),  # type: ignore[call-overload]
        enqueued_at=float(enqueued_at),  # type: ignore[arg-type]
        size=int(size),  # type: ignore[call-overload]
        error=str(error),
    )


class SpillFile:
    """One dead-letter spill file. Use :meth:`open` (writer, locked) or :meth:`open_read_only`."""

    def __init__(
        self, connection: sqlite3.Connection, path: str, *, lock_fd: int | None, generation: int
    ) -> None:
        self._db = connection
        self.path = path
        self._lock_fd = lock_fd
        self.generation = generation
        """Incremented at every writable open: stamps of earlier generations are older than any
        stamp of this one (call-order counters restart with the process)."""
        self.read_only = lock_fd is None
        self._pending = self._pending_bytes = self._parked = self._parked_bytes = 0
        self._recount()

    # --- opening ----------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, *, synchronous: Literal["NORMAL", "FULL"] = "NORMAL") -> SpillFile:
        """Open ``path`` for writing, creating it (mode 0600) and its schema when missing.

        Raises :class:`SpillFileLockedError` when another live process has it open for writing and
        :class:`SpillFileError` when it is not a dead-letter file or has a newer layout.
        """
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        lock_fd = _lock(path)
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                db.execute("PRAGMA busy_timeout = 5000")
                cls._check_or_create(db, path)
                db.execute("PRAGMA journal_mode = WAL")
                db.execute(f"PRAGMA synchronous = {synchronous}")
                generation = cls._next_generation(db)
            except sqlite3.DatabaseError as exc:
                db.close()
                raise SpillFileError(f"cannot open dead-letter spill file {path!r}: {exc}") from exc
            except BaseException:
                db.close()
                raise
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(db, path, lock_fd=lock_fd, generation=generation)

    @classmethod
    def open_read_only(cls, path: str) -> SpillFile:
        """Open an existing file for reading only, without the lock (works beside a live writer)."""
        if not os.path.isfile(path):
            raise SpillFileError(f"no dead-letter spill file at {path!r}")
        try:
            db = sqlite3.connect(
                f"file:{quote(os.path.abspath(path))}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise SpillFileError(f"cannot open dead-letter spill file {path!r}: {exc}") from exc
        try:
            db.execute("PRAGMA busy_timeout = 5000")
            if not cls._is_ours(db, path):
                raise SpillFileError(f"{path!r} is an empty database, not a dead-letter spill file")
            generation = int(cls._meta(db, "generation") or 0)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise SpillFileError(f"cannot read dead-letter spill file {path!r}: {exc}") from exc
        except BaseException:
            db.close()
            raise
        return cls(db, path, lock_fd=None, generation=generation)

    @staticmethod
    def _meta(db: sqlite3.Connection, name: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    @classmethod
    def _is_ours(cls, db: sqlite3.Connection, path: str) -> bool:
        """Whether the file holds our schema (``False``: an empty database); raises otherwise."""
        application_id = db.execute("PRAGMA application_id").fetchone()[0]
        if application_id != APPLICATION_ID:
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if application_id == 0 and tables == 0:
                return False
            raise SpillFileError(f"{path!r} is not a guarded dead-letter spill file")
        version = int(cls._meta(db, "schema_version") or 0)
        if version > SCHEMA_VERSION:
            raise SpillFileError(
                f"{path!r} was written by a newer guarded (spill file schema {version}, "
                f"this version reads up to {SCHEMA_VERSION})"
            )
        return True

    @classmethod
    def _check_or_create(cls, db: sqlite3.Connection, path: str) -> None:
        if cls._is_ours(db, path):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute(
                "INSERT INTO meta (name, value) VALUES ('schema_version', ?), ('generation', '0')",
                (str(SCHEMA_VERSION),),
            )
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @classmethod
    def _next_generation(cls, db: sqlite3.Connection) -> int:
        generation = int(cls._meta(db, "generation") or 0) + 1
        db.execute("UPDATE meta SET value = ? WHERE name = 'generation'", (str(generation),))
        return generation

    def close(self) -> None:
        """Close the database and release the lock."""
        try:
            self._db.close()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # --- reading ----------------------------------------------------------------------------------

    def _recount(self) -> None:
        self._pending, self._pending_bytes = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM pending"
        ).fetchone()
        self._parked, self._parked_bytes = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM parked"
        ).fetchone()

    def totals(self) -> SpillTotals:
        """Counts, encoded bytes and the oldest waiting entry (kept up to date by the writer; a
        read-only instance counts afresh)."""
        if self.read_only:
            self._recount()
        head = self._db.execute("SELECT seq, enqueued_at FROM pending ORDER BY seq LIMIT 1").fetchone()
        return SpillTotals(
            self._pending,
            self._pending_bytes,
            self._parked,
            self._parked_bytes,
            None if head is None else (head[0], head[1]),
        )

    def by_method(self) -> list[tuple[str, int, int]]:
        """``(method, waiting entries, encoded bytes)`` per method, by method name."""
        rows = self._db.execute(
            "SELECT method, count(*), sum(size) FROM pending GROUP BY method ORDER BY method"
        ).fetchall()
        return [(str(method), int(count), int(size)) for method, count, size in rows]

    def max_seq(self) -> int:
        """The largest sequence number ever stored and still present (0 for an empty file)."""
        row = self._db.execute(
            "SELECT max(coalesce((SELECT max(seq) FROM pending), 0), "
            "coalesce((SELECT max(seq) FROM parked), 0))"
        ).fetchone()
        return int(row[0])

    def index_rows(self) -> Iterator[RowInfo]:
        """Metadata of every waiting entry, in sequence order (to rebuild the in-memory index)."""
        cursor = self._db.execute(
            "SELECT seq, method, key, scope, stamp, generation, size FROM pending ORDER BY seq"
        )
        for row in cursor:
            yield RowInfo(*row)

    def page(self, after: int, limit: int | None) -> list[DeadLetter]:
        """Waiting entries with ``seq > after`` in sequence order, at most ``limit``."""
        rows = self._db.execute(
            f"SELECT {_PENDING_COLUMNS} FROM pending WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, -1 if limit is None else limit),
        ).fetchall()
        return [_pending(row) for row in rows]

    def fetch(self, seqs: Sequence[int]) -> list[DeadLetter]:
        """The waiting entries among ``seqs``, in sequence order."""
        found: list[DeadLetter] = []
        for start in range(0, len(seqs), _CHUNK):
            chunk = seqs[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            found.extend(
                _pending(row)
                for row in self._db.execute(
                    f"SELECT {_PENDING_COLUMNS} FROM pending WHERE seq IN ({marks})", chunk
                )
            )
        found.sort(key=lambda entry: entry.seq)
        return found

    def for_scope(self, method: str, scope: str) -> list[DeadLetter]:
        """The waiting entries of ``method`` in ``scope``, in sequence order."""
        rows = self._db.execute(
            f"SELECT {_PENDING_COLUMNS} FROM pending WHERE method = ? AND scope = ? ORDER BY seq",
            (method, scope),
        ).fetchall()
        return [_pending(row) for row in rows]

    def parked(self, limit: int | None = None) -> list[ParkedWrite]:
        """Parked writes in sequence order, at most ``limit``."""
        rows = self._db.execute(
            "SELECT seq, method, call, reason, parked_at, size FROM parked ORDER BY seq LIMIT ?",
            (-1 if limit is None else limit,),
        ).fetchall()
        return [
            ParkedWrite(
                seq=seq,
                method=method,
                call=None if call is None else json.loads(call),
                reason=reason,
                parked_at=parked_at,
                size=size,
            )
            for seq, method, call, reason, parked_at, size in rows
        ]

    # --- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise SpillFileError(f"dead-letter spill file {self.path!r} is open read-only")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self._recount()
            raise

    def _delete_pending(self, db: sqlite3.Connection, seqs: Sequence[int]) -> list[RowInfo]:
        deleted: list[RowInfo] = []
        for start in range(0, len(seqs), _CHUNK):
            chunk = seqs[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            deleted.extend(
                RowInfo(*row)
                for row in db.execute(
                    f"DELETE FROM pending WHERE seq IN ({marks}) "
                    "RETURNING seq, method, key, scope, stamp, generation, size",
                    chunk,
                ).fetchall()
            )
        deleted.sort(key=lambda row: row.seq)
        self._pending -= len(deleted)
        self._pending_bytes -= sum(row.size for row in deleted)
        return deleted

    def _enforce(self, db: sqlite3.Connection, max_bytes: int) -> list[RowInfo]:
        excess = self._pending_bytes + self._parked_bytes - max_bytes
        if excess <= 0:
            return []
        dropped: list[RowInfo] = []
        for table, parked in (("pending", False), ("parked", True)):
            stamp = "stamp, generation" if not parked else "0, 0"
            last = None
            query = f"SELECT seq, method, key, scope, {stamp}, size FROM {table} ORDER BY seq"
            for seq, method, key, scope, stamp_value, generation, size in db.execute(query):
                info = RowInfo(seq, method, key, scope, stamp_value, generation, size, parked=parked)
                dropped.append(info)
                last = info.seq
                excess -= info.size
                if excess <= 0:
                    break
            if last is not None:
                db.execute(f"DELETE FROM {table} WHERE seq <= ?", (last,))
                removed = [row for row in dropped if row.parked is parked]
                if parked:
                    self._parked -= len(removed)
                    self._parked_bytes -= sum(row.size for row in removed)
                else:
                    self._pending -= len(removed)
                    self._pending_bytes -= sum(row.size for row in removed)
            if excess <= 0:
                break
        return dropped

    def write(
        self,
        entries: Sequence[DeadLetter],
        *,
        generation: int,
        delete: Sequence[int] = (),
        max_bytes: int | None = None,
    ) -> WriteResult:
        """In one transaction: delete the waiting entries ``delete``, insert ``entries``, then drop
        the oldest entries while the file's encoded bytes exceed ``max_bytes``."""
        with self._transaction() as db:
            deleted = self._delete_pending(db, delete) if delete else []
            if entries:
                db.executemany(
                    f"INSERT INTO pending ({_PENDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            entry.seq,
                            entry.method,
                            dumps(entry.call),
                            entry.key,
                            entry.scope,
                            entry.stamp,
                            generation,
                            entry.enqueued_at,
                            entry.size,
                            entry.error,
                        )
                        for entry in entries
                    ],
                )
                self._pending += len(entries)
                self._pending_bytes += sum(entry.size for entry in entries)
            dropped = self._enforce(db, max_bytes) if max_bytes is not None else []
        return WriteResult(deleted, dropped, self.totals())

    def delete(self, seqs: Sequence[int]) -> WriteResult:
        """Delete the waiting entries ``seqs``; the result lists those that were still there."""
        with self._transaction() as db:
            deleted = self._delete_pending(db, seqs)
        return WriteResult(deleted, [], self.totals())

    def park(
        self,
        writes: Sequence[ParkedWrite],
        *,
        delete: Sequence[int] = (),
        max_bytes: int | None = None,
    ) -> WriteResult:
        """In one transaction: delete the waiting entries ``delete`` and store ``writes`` as parked."""
        with self._transaction() as db:
            deleted = self._delete_pending(db, delete) if delete else []
            db.executemany(
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
            dropped = self._enforce(db, max_bytes) if max_bytes is not None else []
        return WriteResult(deleted, dropped, self.totals())

    def park_pending(self, seq: int, *, reason: str, parked_at: float) -> WriteResult:
        """Move the waiting entry ``seq`` to the parked writes with ``reason`` (one transaction)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO parked (seq, method, call, reason, parked_at, size, key, scope) "
                "SELECT seq, method, call, ?, ?, size, key, scope FROM pending WHERE seq = ?",
                (reason, parked_at, seq),
            )
            deleted = self._delete_pending(db, [seq])
            self._parked += len(deleted)
            self._parked_bytes += sum(row.size for row in deleted)
        return WriteResult(deleted, [], self.totals())

    def unpark(self, limit: int | None = None) -> WriteResult:
        """Move parked writes that kept their call back to the waiting entries (same ``seq``, the
        oldest stamp and generation, so any newer write of their key wins over them)."""
        with self._transaction() as db:
            db.execute(
                f"INSERT INTO pending ({_PENDING_COLUMNS}) "
                "SELECT seq, method, call, key, scope, 0, 0, parked_at, size, 'unparked: ' || reason "
                "FROM parked WHERE call IS NOT NULL ORDER BY seq LIMIT ?",
                (-1 if limit is None else limit,),
            )
            db.execute("DELETE FROM parked WHERE seq IN (SELECT seq FROM pending)")
            self._recount()
        return WriteResult([], [], self.totals())

    def purge(self, *, pending: bool, parked: bool) -> int:
        """Delete every waiting and/or parked entry; returns how many were deleted."""
        removed = 0
        with self._transaction() as db:
            if pending:
                removed += db.execute("DELETE FROM pending").rowcount
                self._pending = self._pending_bytes = 0
            if parked:
                removed += db.execute("DELETE FROM parked").rowcount
                self._parked = self._parked_bytes = 0
        return removed


__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "RowInfo",
    "SpillFile",
    "SpillFileError",
    "SpillFileLockedError",
    "SpillTotals",
    "WriteResult",
    "dumps",
]
