"""Reading a dead-letter spill file's rows so that unreadable ones never fail a read, and their
quarantine.

A row that cannot be read never makes a read raise. A file open for writing moves it to its
``quarantine`` table with its raw column values (bytes as stored) and the reason, and reports it
(:meth:`RowQuarantine.take_set_aside`); a read-only open leaves it in place and skips it.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from .entries import DeadLetter
from .spill_format import CHUNK, PENDING_COLUMNS, RAW_COLUMNS, SOURCE_COLUMNS, SOURCE_NAMES
from .spill_records import QuarantinedRow, RowInfo, SetAside, SpillCounts
from .spill_rows import (
    BadRow,
    as_text,
    decoded,
    int_or_zero,
    is_decode_error,
    raw_int,
    raw_text,
    raw_values,
    read_pending,
    read_row_info,
    set_aside_of,
)

R = TypeVar("R")


class RowQuarantine:
    """The unreadable rows of one open spill file (see the module docs)."""

    def __init__(
        self, db: sqlite3.Connection, counts: SpillCounts, *, read_only: bool, has_quarantine: bool
    ) -> None:
        self._db = db
        self._counts = counts
        self.read_only = read_only
        self.has_quarantine = has_quarantine
        self._set_aside: collections.deque[SetAside] = collections.deque()
        self._staged: list[SetAside] = []
        self.in_place: dict[tuple[str, int], SetAside] = {}
        """Read-only: unreadable rows found in their table (by ``(table, rowid)``)."""

    def recount(self) -> None:
        self._counts.recount(self._db, has_quarantine=self.has_quarantine)

    # --- reads that survive unreadable rows -------------------------------------------------------

    def select(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """``sql``'s rows; text that is not UTF-8 comes back as :data:`~.spill_rows.NOT_UTF8`
        instead of failing the whole read (such a read is done again with bytes for text)."""
        try:
            return self._db.execute(sql, params).fetchall()
        except (sqlite3.OperationalError, sqlite3.DataError) as exc:
            if not is_decode_error(exc):
                raise
        rows = self.bytes_select(sql, params)
        return [tuple(decoded(value) for value in row) for row in rows]

    def bytes_select(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        """``sql``'s rows with bytes for text."""
        factory = self._db.text_factory
        self._db.text_factory = bytes
        try:
            return self._db.execute(sql, params).fetchall()
        finally:
            self._db.text_factory = factory

    def checked(
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
        known = self.in_place
        for row in rows:
            if known and (table, row[0]) in known:
                continue  # read-only: found unreadable before
            try:
                good.append(read(row))
            except BadRow as exc:
                bad.append(set_aside_of(table, row, str(exc), counted=counted))
        if bad:
            self._put_aside(bad)
        return good

    def index(self, index_columns: str, *, counted: bool) -> Iterator[RowInfo]:
        """Metadata of every waiting entry (``rowid,`` ``index_columns``), in sequence order."""
        # Rows whose seq is not an integer (NULL, text: a table rebuilt without its constraints)
        # are met first; they are set aside like any unreadable row.
        rows = self.select(
            f"SELECT rowid, {index_columns} FROM pending WHERE typeof(seq) != 'integer' ORDER BY rowid"
        )
        self.checked("pending", rows, read_row_info, counted=counted)
        yield from self._in_order(index_columns, read_row_info, counted=counted)

    def entries(self, *, counted: bool) -> Iterator[DeadLetter]:
        """Every readable waiting entry, in sequence order (unreadable ones are set aside)."""
        return self._in_order(PENDING_COLUMNS, read_pending, counted=counted)

    def _in_order(self, columns: str, read: Callable[[Sequence[object]], R], *, counted: bool) -> Iterator[R]:
        """``read`` of every waiting row with an integer seq, in sequence order, a chunk at a time."""
        after = -(2**63)
        while True:
            rows = self.select(
                f"SELECT rowid, {columns} FROM pending "
                "WHERE typeof(seq) = 'integer' AND seq > ? ORDER BY seq LIMIT ?",
                (after, CHUNK),
            )
            if not rows:
                return
            after = int(rows[-1][1])  # type: ignore[call-overload]
            yield from self.checked("pending", rows, read, counted=counted)

    def paged(
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
            rows = self.select(
                f"SELECT rowid, {columns} FROM {table} "
                "WHERE typeof(seq) = 'integer' AND seq > ? ORDER BY seq LIMIT ?",
                (after, -1 if want is None else want),
            )
            if not rows:
                return found
            after = int(rows[-1][1])  # type: ignore[call-overload]
            found.extend(self.checked(table, rows, read, counted=counted))
            if want is None or len(rows) < want:
                return found

    def raw_chunks_of(self, table: str, columns: str) -> Iterator[list[tuple[object, ...]]]:
        """Chunks of ``table``'s rows as stored (``columns``, the first the ``seq``), to copy them."""
        last = -1
        while True:
            rows = self._db.execute(
                f"SELECT {columns} FROM {table} WHERE typeof(seq) = 'integer' AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (last, CHUNK),
            ).fetchall()
            if not rows:
                return
            last = int_or_zero(rows[-1][0])
            yield rows

    # --- moving them aside ------------------------------------------------------------------------

    def _put_aside(self, found: Sequence[SetAside]) -> None:
        """Move unreadable rows to the quarantine table (in the transaction under way, if any: they
        are reported once it commits), or, read-only, remember them as found in place."""
        if self.read_only or not self.has_quarantine:
            for item in found:
                self.in_place[(item.table, item.rowid)] = item
            return
        now = time.time()
        own = not self._db.in_transaction
        if own:
            self._db.execute("BEGIN IMMEDIATE")
        try:
            for item in found:
                columns = SOURCE_COLUMNS[item.table]
                self._db.execute(
                    f"INSERT INTO quarantine (source, reason, quarantined_at, {', '.join(RAW_COLUMNS)}) "
                    f"SELECT ?, ?, ?, {columns} FROM {item.table} WHERE rowid = ?",
                    (item.table, item.reason, now, item.rowid),
                )
                self._db.execute(f"DELETE FROM {item.table} WHERE rowid = ?", (item.rowid,))
            self._staged.extend(found)
            self.recount()
            if own:
                self._db.execute("COMMIT")
                self.publish()
        except BaseException:
            if own:
                self.abandon()
            raise

    def publish(self) -> None:
        """The transaction committed: report the rows it set aside."""
        self._set_aside.extend(self._staged)
        self._staged.clear()

    def abandon(self) -> None:
        """The transaction failed: roll it back, forget the rows it set aside and count afresh."""
        self._staged.clear()
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self.recount()
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

    # --- listing them -----------------------------------------------------------------------------

    def listing(self, limit: int | None, *, with_raw: bool) -> list[QuarantinedRow]:
        """The quarantined rows, oldest first, at most ``limit``; a read-only open lists the
        unreadable rows it found still in their tables after them. ``raw`` is empty unless
        ``with_raw``."""
        found: list[QuarantinedRow] = []
        if self.has_quarantine:
            raw_columns = ", ".join(f"typeof({name}), {name}" for name in RAW_COLUMNS)
            rows = self.bytes_select(
                "SELECT qid, CAST(source AS BLOB), CAST(reason AS BLOB), quarantined_at, "
                f"{raw_columns} FROM quarantine ORDER BY qid LIMIT ?",
                (-1 if limit is None else limit,),
            )
            for row in rows:
                raw = raw_values(RAW_COLUMNS, row[4:])
                found.append(
                    QuarantinedRow(
                        id=int(row[0]),  # type: ignore[call-overload]
                        source=as_text(row[1]),
                        seq=raw_int(raw, "seq"),
                        method=raw_text(raw, "method"),
                        reason=as_text(row[2]),
                        quarantined_at=row[3] if isinstance(row[3], int | float) else None,
                        raw=raw if with_raw else (),
                    )
                )
        for item in list(self.in_place.values()):
            if limit is not None and len(found) >= limit:
                break
            names = SOURCE_NAMES[item.table]
            rows = self.bytes_select(
                f"SELECT {', '.join(f'typeof({name}), {name}' for name in names)} "
                f"FROM {item.table} WHERE rowid = ?",
                (item.rowid,),
            )
            raw = raw_values(RAW_COLUMNS, rows[0]) if rows else ()
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

    def raw_chunks(self) -> Iterator[list[tuple[object, ...]]]:
        """Every quarantined row as stored (``source, reason, quarantined_at,`` raw columns), in
        chunks (to copy them into another file)."""
        if not self.has_quarantine:
            return
        last = -1
        columns = ", ".join(("source", "reason", "quarantined_at", *RAW_COLUMNS))
        while True:
            rows = self.bytes_select(
                f"SELECT qid, {columns} FROM quarantine WHERE qid > ? ORDER BY qid LIMIT ?", (last, CHUNK)
            )
            if not rows:
                return
            last = int_or_zero(rows[-1][0])
            yield [row[1:] for row in rows]


__all__ = ["RowQuarantine"]
