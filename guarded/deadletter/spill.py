"""The durable part of the dead-letter buffer: one SQLite file (stdlib ``sqlite3``, WAL mode).

A :class:`SpillFile` opened for writing holds an exclusive ``flock`` on ``<path>.lock`` for its
lifetime, so two live processes never write the same file; the kernel releases the lock when
the process dies, however it dies. Read-only opens (``guarded dlq list``/``stats``) take no lock
and work beside a live writer. Every method is synchronous and commits before it returns; the
buffer runs them on one dedicated worker thread.

Layout versions: 1 had no notion of the backend a file's writes belong to; 2 records it in
``meta.target`` (absent for a file of unknown target). A version 1 file is migrated forward when
it is opened for writing; a file of a newer version is refused without being touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from ..errors import GuardedError
from .entries import DeadLetter, ParkedWrite

SCHEMA_VERSION = 2
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
_PARKED_COLUMNS = "seq, method, call, reason, parked_at, size, key, scope"
_CHUNK = 500
_LOCK_ATTEMPTS = 20

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


@dataclass(frozen=True, slots=True)
class SpillTotals:
    """Counts and encoded bytes of the file's entries, and its oldest waiting entry."""

    pending: int
    pending_bytes: int
    parked: int
    parked_bytes: int
    oldest: tuple[int, float] | None
    """``(seq, enqueued_at)`` of the oldest waiting entry."""


EMPTY_TOTALS = SpillTotals(0, 0, 0, 0, None)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write transaction removed, and the file's totals after it."""

    deleted: list[RowInfo]
    """Entries removed because the caller asked (superseded, replayed, taken, parked)."""
    dropped: list[RowInfo]
    """Entries removed to keep the file under its size cap (oldest first)."""
    totals: SpillTotals


class SourceReadError(SpillFileError):
    """Reading the other file of :meth:`SpillFile.take_over` failed (that file's fault, not ours)."""


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: object) -> str:
    """Compact JSON text of an encoded call, as stored."""
    return _ENCODER.encode(value)


# --- the lock ---------------------------------------------------------------------------------------


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


def _unlink(name: str) -> None:
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
    _unlink(path + "-shm")
    os.rename(path, target)
    return target


def remove_files(path: str) -> None:
    """Delete a spill file with its WAL and shared memory (the WAL first, so a crash midway never
    leaves a WAL beside a newer file of the same name). Call with its lock held; the lock file
    itself is removed by :meth:`SpillFile.remove`."""
    _unlink(path + "-wal")
    _unlink(path + "-shm")
    _unlink(path)


def _loads(text: object) -> Any:
    """A stored call's JSON, or ``None`` when the text is damaged (its replay parks it then)."""
    try:
        return json.loads(str(text))
    except ValueError:
        return None


def _pending(row: Sequence[object]) -> DeadLetter:
    seq, method, call, key, scope, stamp, _generation, enqueued_at, size, error = row
    loaded = _loads(call)
    return DeadLetter(
        seq=int(seq),  # type: ignore[call-overload]
        method=str(method),
        call=loaded if isinstance(loaded, dict) else {"damaged": True},
        key=None if key is None else str(key),
        scope=None if scope is None else str(scope),
        stamp=int(stamp),  # type: ignore[call-overload]
        enqueued_at=float(enqueued_at),  # type: ignore[arg-type]
        size=int(size),  # type: ignore[call-overload]
        error=str(error),
    )


def _wrap(exc: sqlite3.Error, path: str, doing: str) -> SpillFileError:
    """``exc`` of opening ``path`` as the matching :class:`SpillFileError` (chained by the caller)."""
    if _sqlite_code(exc) in _CORRUPT_CODES:
        return SpillFileCorruptError(f"dead-letter spill file {path!r} is damaged ({doing}): {exc}")
    return SpillFileError(f"cannot open dead-letter spill file {path!r} ({doing}): {exc}")


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
        self._recount()

    # --- opening ----------------------------------------------------------------------------------

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
        taken here. With ``check_target``, a file recording another target than ``target`` is refused
        (:class:`SpillFileTargetError`, nothing written) while it holds writes, and re-targeted when
        it holds none; a file with no recorded target gets ``target`` recorded
        (:attr:`legacy_entries` says how many writes it held). The generation becomes at least
        ``min_generation``.

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
                remove_files(path)  # a WAL without its database must never meet a new one
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                spill = cls._prepare(
                    db,
                    path,
                    lock_fd,
                    synchronous=synchronous,
                    target=target,
                    check_target=check_target,
                    min_generation=min_generation,
                )
            except sqlite3.Error as exc:
                db.close()
                raise _wrap(exc, path, "opening") from exc
            except BaseException:
                db.close()
                raise
        except BaseException:
            if own_lock:
                os.close(lock_fd)
            raise
        return spill

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
        db.execute("PRAGMA busy_timeout = 5000")
        created = not cls._is_ours(db, path)
        recorded = None if created else cls._meta(db, "target")
        retarget = legacy = False
        if check_target and not created and recorded != target:
            held = cls._count(db)
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
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(
                    "INSERT INTO meta (name, value) VALUES ('schema_version', ?), ('generation', '0')",
                    (str(SCHEMA_VERSION),),
                )
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                retarget = target is not None
            else:
                cls._migrate(db)
            if retarget:
                db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('target', ?)", (target,))
                recorded = target
            generation = max(int(cls._meta(db, "generation") or 0) + 1, min_generation)
            db.execute("UPDATE meta SET value = ? WHERE name = 'generation'", (str(generation),))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        spill = cls(db, path, lock_fd=lock_fd, generation=generation, target=recorded)
        if legacy:
            spill.legacy_entries = spill._pending + spill._parked
        return spill

    @staticmethod
    def _count(db: sqlite3.Connection) -> int:
        row = db.execute("SELECT (SELECT count(*) FROM pending) + (SELECT count(*) FROM parked)").fetchone()
        return int(row[0])

    @classmethod
    def _migrate(cls, db: sqlite3.Connection) -> None:
        """Bring an older layout forward (in the caller's transaction)."""
        version = int(cls._meta(db, "schema_version") or 0)
        if version < 2:
            # 1 -> 2: a file may record its target in meta; none recorded means unknown.
            db.execute("UPDATE meta SET value = '2' WHERE name = 'schema_version'")

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
            raise _wrap(exc, path, "reading") from exc
        try:
            db.execute("PRAGMA busy_timeout = 5000")
            if not cls._is_ours(db, path):
                raise SpillFileForeignError(f"{path!r} is an empty database, not a dead-letter spill file")
            generation = int(cls._meta(db, "generation") or 0)
            target = cls._meta(db, "target")
            return cls(db, path, lock_fd=None, generation=generation, target=target)
        except sqlite3.Error as exc:
            db.close()
            raise _wrap(exc, path, "reading") from exc
        except BaseException:
            db.close()
            raise

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
            raise SpillFileForeignError(f"{path!r} is not a guarded dead-letter spill file")
        version = int(cls._meta(db, "schema_version") or 0)
        if version > SCHEMA_VERSION:
            raise SpillFileVersionError(
                f"{path!r} was written by a newer guarded (spill file schema {version}, "
                f"this version reads up to {SCHEMA_VERSION})"
            )
        return True

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
            remove_files(self.path)
            if self._lock_fd is not None:
                _unlink(lock_path(self.path))
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

    @property
    def is_empty(self) -> bool:
        """Whether the file holds no waiting and no parked write (as last counted)."""
        return self._pending == 0 and self._parked == 0

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
            "SELECT seq, method, key, scope, stamp, generation, size, enqueued_at FROM pending ORDER BY seq"
        )
        for seq, method, key, scope, stamp, generation, size, enqueued_at in cursor:
            yield RowInfo(seq, method, key, scope, stamp, generation, size, enqueued_at=enqueued_at)

    def parked_seqs(self) -> list[int]:
        """Sequence numbers of the parked writes, in order."""
        return [int(row[0]) for row in self._db.execute("SELECT seq FROM parked ORDER BY seq")]

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
                call=None if call is None or not isinstance(loaded := _loads(call), dict) else loaded,
                reason=reason,
                parked_at=parked_at,
                size=size,
            )
            for seq, method, call, reason, parked_at, size in rows
        ]

    def _raw(self, table: str, columns: str) -> Iterator[list[tuple[object, ...]]]:
        last = -1
        while True:
            rows = self._db.execute(
                f"SELECT {columns} FROM {table} WHERE seq > ? ORDER BY seq LIMIT ?", (last, _CHUNK)
            ).fetchall()
            if not rows:
                return
            last = _int(rows[-1][0])
            yield rows

    # --- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise SpillFileError(f"dead-letter spill file {self.path!r} is open read-only")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
            self.commits += 1
        except BaseException:
            try:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._recount()
            except sqlite3.Error:
                pass  # the original error says more; a rollback that failed leaves the file as it was
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

    def _insert_parked(self, db: sqlite3.Connection, writes: Sequence[ParkedWrite]) -> None:
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
        parked writes ``parked``), then drop the oldest entries while the file's encoded bytes
        exceed ``max_bytes``.

        Entries are stored with ``generation`` unless ``generations`` (by seq) says otherwise;
        ``texts`` (by seq) are their calls already encoded with :func:`dumps`.
        """
        with self._transaction() as db:
            deleted = self._delete_pending(db, delete) if delete else []
            if entries:
                found_generation = generations.get if generations else None
                found_text = texts.get if texts else None
                db.executemany(
                    f"INSERT INTO pending ({_PENDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                self._insert_parked(db, parked)
            dropped = self._enforce(db, max_bytes) if max_bytes is not None else []
        return WriteResult(deleted, dropped, self.totals())

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
        new seq), as entries of generation 0 (older than any write of the adopting process).

        A failure reading ``source`` raises :class:`SourceReadError` (nothing written here).
        """
        with self._transaction() as db:
            deleted = self._delete_pending(db, delete) if delete else []
            for rows in _read_source(source, "pending", _PENDING_COLUMNS):
                chosen = [
                    (pending[_int(row[0])], *row[1:6], 0, *row[7:]) for row in rows if _int(row[0]) in pending
                ]
                db.executemany(
                    f"INSERT INTO pending ({_PENDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", chosen
                )
                self._pending += len(chosen)
                self._pending_bytes += sum(_int(row[8]) for row in chosen)
            for rows in _read_source(source, "parked", _PARKED_COLUMNS):
                moved = [(parked[_int(row[0])], *row[1:]) for row in rows if _int(row[0]) in parked]
                db.executemany(
                    f"INSERT INTO parked ({_PARKED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", moved
                )
                self._parked += len(moved)
                self._parked_bytes += sum(_int(row[5]) for row in moved)
            dropped = self._enforce(db, max_bytes) if max_bytes is not None else []
        return WriteResult(deleted, dropped, self.totals())

    def shift(self, offset: int) -> None:
        """Add ``offset`` (larger than any sequence number stored) to every sequence number, in one
        transaction: makes room below for entries numbered elsewhere."""
        if offset <= self.max_seq():
            raise ValueError("the offset must exceed every stored sequence number")
        with self._transaction() as db:
            db.execute("UPDATE pending SET seq = seq + ?", (offset,))
            db.execute("UPDATE parked SET seq = seq + ?", (offset,))

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
            self._insert_parked(db, writes)
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


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


def _read_source(source: SpillFile, table: str, columns: str) -> Iterator[list[tuple[object, ...]]]:
    """Chunks of ``source``'s raw rows; its failures become :class:`SourceReadError`."""
    chunks = source._raw(table, columns)
    while True:
        try:
            rows = next(chunks)
        except StopIteration:
            return
        except sqlite3.Error as exc:
            raise SourceReadError(f"reading {source.path!r} failed: {exc}") from exc
        yield rows


__all__ = [
    "APPLICATION_ID",
    "EMPTY_TOTALS",
    "SCHEMA_VERSION",
    "RowInfo",
    "SourceReadError",
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
    "remove_files",
    "set_aside",
]
