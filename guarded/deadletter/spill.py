"""The durable part of the dead-letter buffer: one SQLite file (stdlib ``sqlite3``, WAL mode).

A :class:`SpillFile` opened for writing holds an exclusive ``flock`` on ``<path>.lock`` for its
lifetime, so two live processes never write the same file; the kernel releases the lock when
the process dies, however it dies. Read-only opens (``guarded dlq list``/``stats``) take no lock
and work beside a live writer. Every method is synchronous and commits before it returns; the
buffer runs them on one dedicated worker thread.

Layout versions: 1 had no notion of the backend a file's writes belong to; 2 records it in
``meta.target`` (absent for a file of unknown target); 3 adds the ``quarantine`` table. A file of
an older version is migrated forward when it is opened for writing; a file of a newer version is
refused without being touched.

**Unreadable rows are quarantined.** A row that cannot be read — a column of the wrong type, a
``NULL`` where a value belongs, text that is not UTF-8, a key or a call that is not JSON (a disk
error, a tool that edited the file) — never makes a read raise. A file open for writing moves it
to its ``quarantine`` table with its raw column values (bytes as stored) and the reason, and
reports it (:meth:`SpillFile.take_set_aside`); a read-only open leaves it in place and skips it.
Rows are checked as they are read: waiting writes' metadata when the file is indexed
(:meth:`SpillFile.index_rows`), their calls when they are read (:meth:`SpillFile.page`, ...), and
every parked write when the file is opened for writing. :meth:`SpillFile.quarantined` lists them.
"""

from __future__ import annotations

import contextlib
import fcntl  # noqa: F401  (the lock module's flock: tests replace spill.fcntl.flock)
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

from .entries import DeadLetter, ParkedWrite
from .spill_errors import (
    SourceReadError,
    SpillCapError,
    SpillFileCorruptError,
    SpillFileError,
    SpillFileForeignError,
    SpillFileLockedError,
    SpillFileTargetError,
    SpillFileVersionError,
    is_corruption,
    is_disk_full,
)
from .spill_format import (
    APPLICATION_ID,
    CHUNK,
    INDEX_COLUMNS,
    INDEX_COLUMNS_PLAIN,
    NUMERIC_AT,
    PARKED_COLUMNS,
    PENDING_COLUMNS,
    SCHEMA_VERSION,
    has_json,
)
from .spill_lock import (
    acquire_lock,
    holder_pid,
    is_locked,
    lock_path,
    remove_files,
    set_aside,
    unlink_quietly,
)
from .spill_open import open_read_only, open_writable
from .spill_quarantine import RowQuarantine
from .spill_records import (
    EMPTY_TOTALS,
    QuarantinedRow,
    RawValue,
    RowInfo,
    SetAside,
    SpillCounts,
    SpillTotals,
    WriteResult,
    dumps,
)
from .spill_rows import read_parked, read_pending
from .spill_writes import check_cap, copy_from, delete_pending, insert_parked, insert_pending


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
        self.counts = SpillCounts()
        """What the file holds, as last counted."""
        self._rows = RowQuarantine(
            connection, self.counts, read_only=self.read_only, has_quarantine=self._table_exists("quarantine")
        )
        self._index_columns = INDEX_COLUMNS if has_json(connection) else INDEX_COLUMNS_PLAIN
        self._rows.recount()

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
        return open_writable(
            cls,
            path,
            synchronous=synchronous,
            lock_fd=lock_fd,
            target=target,
            check_target=check_target,
            min_generation=min_generation,
        )

    @classmethod
    def open_read_only(cls, path: str) -> SpillFile:
        """Open an existing file for reading only, without the lock (works beside a live writer)."""
        return open_read_only(cls, path)

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
            remove_files(self.path)
            if self._lock_fd is not None:
                unlink_quietly(lock_path(self.path))
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # --- reading ----------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        """Whether the file holds no waiting and no parked write (as last counted)."""
        return self.counts.pending == 0 and self.counts.parked == 0

    def totals(self) -> SpillTotals:
        """Counts, encoded bytes and the oldest waiting entry (kept up to date by the writer; a
        read-only instance counts afresh, leaving out the unreadable rows it found)."""
        if self.read_only:
            return self._read_only_totals()
        head = self._db.execute(
            f"SELECT seq, enqueued_at FROM pending WHERE {NUMERIC_AT} ORDER BY seq LIMIT 1"
        ).fetchone()
        return SpillTotals(
            self.counts.pending,
            self.counts.pending_bytes,
            self.counts.parked,
            self.counts.parked_bytes,
            None if head is None else (head[0], float(head[1])),
            self.counts.quarantined,
        )

    def _read_only_totals(self) -> SpillTotals:
        self._rows.recount()
        for _ in self._rows.index(
            self._index_columns, counted=False
        ):  # rows whose seq is not a number are met here
            pass
        pending = pending_bytes = 0
        oldest: tuple[int, float] | None = None
        for entry in self._rows.entries(counted=False):
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
            self.counts.quarantined + len(self._rows.in_place),
        )

    def by_method(self) -> list[tuple[str, int, int]]:
        """``(method, waiting entries, encoded bytes)`` per method, by method name (readable rows)."""
        counts: dict[str, list[int]] = {}
        rows: Iterator[RowInfo | DeadLetter] = (
            self._rows.entries(counted=False)
            if self.read_only
            else self._rows.index(self._index_columns, counted=False)
        )
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

    # --- unreadable rows --------------------------------------------------------------------------

    def take_set_aside(self) -> list[SetAside]:
        """The unreadable rows moved to the quarantine table since the last call (any thread)."""
        return self._rows.take_set_aside()

    def check_parked(self) -> None:
        """Read every parked write once, setting aside those that cannot be read (done at open)."""
        self.parked()

    def check_all(self) -> None:
        """Read every row, calls included, setting aside those that cannot be read (before a file
        is adopted, so that copying its rows never meets one)."""
        for _ in self._rows.index(self._index_columns, counted=False):
            pass
        for _ in self._rows.entries(counted=False):
            pass
        self.parked()

    def quarantined(self, limit: int | None = None, *, with_raw: bool = True) -> list[QuarantinedRow]:
        """The quarantined rows, oldest first, at most ``limit``; a read-only open lists the
        unreadable rows it found still in their tables after them. ``raw`` is empty unless
        ``with_raw``."""
        return self._rows.listing(limit, with_raw=with_raw)

    # --- reading ----------------------------------------------------------------------------------

    def index_rows(self) -> Iterator[RowInfo]:
        """Metadata of every waiting entry, in sequence order (to rebuild the in-memory index).
        Unreadable rows are set aside (reported with ``counted=False``)."""
        return self._rows.index(self._index_columns, counted=False)

    def parked_seqs(self) -> list[int]:
        """Sequence numbers of the parked writes, in order."""
        return [
            int(row[0])
            for row in self._db.execute("SELECT seq FROM parked WHERE typeof(seq) = 'integer' ORDER BY seq")
        ]

    def page(self, after: int, limit: int | None) -> list[DeadLetter]:
        """Waiting entries with ``seq > after`` in sequence order, at most ``limit`` (unreadable
        rows are set aside and not counted against the limit)."""
        return self._rows.paged("pending", PENDING_COLUMNS, read_pending, after, limit, counted=True)

    def fetch(self, seqs: Sequence[int]) -> list[DeadLetter]:
        """The waiting entries among ``seqs``, in sequence order."""
        found: list[DeadLetter] = []
        for start in range(0, len(seqs), CHUNK):
            chunk = seqs[start : start + CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = self._rows.select(
                f"SELECT rowid, {PENDING_COLUMNS} FROM pending WHERE seq IN ({marks})", chunk
            )
            found.extend(self._rows.checked("pending", rows, read_pending, counted=True))
        found.sort(key=lambda entry: entry.seq)
        return found

    def for_scope(self, method: str, scope: str) -> list[DeadLetter]:
        """The waiting entries of ``method`` in ``scope``, in sequence order."""
        rows = self._rows.select(
            f"SELECT rowid, {PENDING_COLUMNS} FROM pending WHERE method = ? AND scope = ? ORDER BY seq",
            (method, scope),
        )
        return self._rows.checked("pending", rows, read_pending, counted=True)

    def parked(self, limit: int | None = None) -> list[ParkedWrite]:
        """Parked writes in sequence order, at most ``limit`` (unreadable ones are set aside)."""
        if limit is None or limit > 0:
            rows = self._rows.select(
                f"SELECT rowid, {PARKED_COLUMNS} FROM parked WHERE typeof(seq) != 'integer'"
            )
            self._rows.checked("parked", rows, read_parked, counted=False)
        return self._rows.paged("parked", PARKED_COLUMNS, read_parked, -(2**63), limit, counted=False)

    def raw_rows(self, table: str, columns: str) -> Iterator[list[tuple[object, ...]]]:
        """Chunks of ``table``'s rows as stored (``columns``, the first the ``seq``), to copy them."""
        return self._rows.raw_chunks_of(table, columns)

    def raw_quarantine_rows(self) -> Iterator[list[tuple[object, ...]]]:
        """Chunks of the quarantined rows as stored, to copy them."""
        return self._rows.raw_chunks()

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
            self._rows.publish()
        except BaseException:
            self._rows.abandon()
            raise

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
        with self._transaction() as db:
            before = self.counts.pending_bytes + self.counts.parked_bytes
            deleted = delete_pending(db, self._rows, self.counts, delete) if delete else []
            if entries:
                insert_pending(
                    db, self.counts, entries, generation=generation, generations=generations, texts=texts
                )
            if parked:
                insert_parked(db, self.counts, parked)
            if max_bytes is not None:
                check_cap(self.counts, before, max_bytes)
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
        with self._transaction() as db:
            before = self.counts.pending_bytes + self.counts.parked_bytes
            deleted = delete_pending(db, self._rows, self.counts, delete) if delete else []
            copy_from(db, self.counts, source, pending, parked, has_quarantine=self._rows.has_quarantine)
            if max_bytes is not None:
                check_cap(self.counts, before, max_bytes)
        return WriteResult(deleted, self.totals())

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
            deleted = delete_pending(db, self._rows, self.counts, seqs)
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
        with self._transaction() as db:
            before = self.counts.pending_bytes + self.counts.parked_bytes
            deleted = delete_pending(db, self._rows, self.counts, delete) if delete else []
            insert_parked(db, self.counts, writes)
            if max_bytes is not None:
                check_cap(self.counts, before, max_bytes)
        return WriteResult(deleted, self.totals())

    def park_pending(self, seq: int, *, reason: str, parked_at: float) -> WriteResult:
        """Move the waiting entry ``seq`` to the parked writes with ``reason`` (one transaction)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO parked (seq, method, call, reason, parked_at, size, key, scope) "
                "SELECT seq, method, call, ?, ?, size, key, scope FROM pending WHERE seq = ?",
                (reason, parked_at, seq),
            )
            deleted = delete_pending(db, self._rows, self.counts, [seq])
            self.counts.parked += len(deleted)
            self.counts.parked_bytes += sum(row.size for row in deleted)
        return WriteResult(deleted, self.totals())

    def unpark(self, limit: int | None = None) -> WriteResult:
        """Move parked writes that kept their call back to the waiting entries (same ``seq``, the
        oldest stamp and generation, so any newer write of their key wins over them)."""
        with self._transaction() as db:
            db.execute(
                f"INSERT INTO pending ({PENDING_COLUMNS}) "
                "SELECT seq, method, call, key, scope, 0, 0, parked_at, size, 'unparked: ' || reason "
                "FROM parked WHERE call IS NOT NULL ORDER BY seq LIMIT ?",
                (-1 if limit is None else limit,),
            )
            db.execute("DELETE FROM parked WHERE seq IN (SELECT seq FROM pending)")
            self._rows.recount()
        return WriteResult([], self.totals())

    def purge(self, *, pending: bool, parked: bool, quarantined: bool = False) -> int:
        """Delete every waiting, parked and/or quarantined row; returns how many were deleted."""
        removed = 0
        with self._transaction() as db:
            if pending:
                removed += db.execute("DELETE FROM pending").rowcount
                self.counts.pending = self.counts.pending_bytes = 0
            if parked:
                removed += db.execute("DELETE FROM parked").rowcount
                self.counts.parked = self.counts.parked_bytes = 0
            if quarantined and self._rows.has_quarantine:
                removed += db.execute("DELETE FROM quarantine").rowcount
                self.counts.quarantined = 0
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
    "remove_files",
    "set_aside",
]
