"""The row work of a dead-letter spill file's write transactions: inserting waiting and parked
writes, deleting waiting ones, refusing a transaction past the size cap, and copying another file's
rows in (adoption). Each runs inside the caller's transaction and keeps its counts."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from .entries import DeadLetter, ParkedWrite
from .spill_errors import SourceReadError, SpillCapError
from .spill_format import CHUNK, INDEX_COLUMNS_PLAIN, PARKED_COLUMNS, PENDING_COLUMNS, RAW_COLUMNS
from .spill_quarantine import RowQuarantine
from .spill_records import RowInfo, SpillCounts, dumps
from .spill_rows import deleted_info, int_or_zero

if TYPE_CHECKING:
    from .spill import SpillFile

_INSERT_PENDING = f"INSERT INTO pending ({PENDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def delete_pending(
    db: sqlite3.Connection, rows: RowQuarantine, counts: SpillCounts, seqs: Sequence[int]
) -> list[RowInfo]:
    """Delete the waiting entries ``seqs``; returns those that were there, in order."""
    deleted: list[RowInfo] = []
    for start in range(0, len(seqs), CHUNK):
        chunk = seqs[start : start + CHUNK]
        marks = ",".join("?" * len(chunk))
        found = rows.select(f"SELECT rowid, {INDEX_COLUMNS_PLAIN} FROM pending WHERE seq IN ({marks})", chunk)
        deleted.extend(deleted_info(row) for row in found)
        db.execute(f"DELETE FROM pending WHERE seq IN ({marks})", chunk)
    deleted.sort(key=lambda row: row.seq)
    counts.pending -= len(deleted)
    counts.pending_bytes -= sum(row.size for row in deleted)
    return deleted


def check_cap(counts: SpillCounts, before: int, max_bytes: int) -> None:
    """Refuse a transaction that grew the file's encoded bytes from ``before`` past ``max_bytes``
    (raises :class:`SpillCapError`, the caller's transaction rolls back): nothing the file holds is
    ever dropped to make room."""
    after = counts.pending_bytes + counts.parked_bytes
    if after > max_bytes and after > before:
        raise SpillCapError(f"the spill file would hold {after} bytes, past its cap of {max_bytes}")


def insert_pending(
    db: sqlite3.Connection,
    counts: SpillCounts,
    entries: Sequence[DeadLetter],
    *,
    generation: int,
    generations: Mapping[int, int] | None,
    texts: Mapping[int, str] | None,
) -> None:
    """Insert waiting ``entries`` (see :meth:`~.spill.SpillFile.write`)."""
    found_generation = generations.get if generations else None
    found_text = texts.get if texts else None
    db.executemany(
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
    counts.pending += len(entries)
    counts.pending_bytes += sum(entry.size for entry in entries)


def insert_parked(db: sqlite3.Connection, counts: SpillCounts, writes: Sequence[ParkedWrite]) -> None:
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
    counts.parked += len(writes)
    counts.parked_bytes += sum(write.size for write in writes)


def copy_from(
    db: sqlite3.Connection,
    counts: SpillCounts,
    source: SpillFile,
    pending: Mapping[int, int],
    parked: Mapping[int, int],
    *,
    has_quarantine: bool,
) -> None:
    """Copy ``source``'s waiting entries named in ``pending`` and parked writes named in ``parked``
    (old seq -> new seq) as entries of generation 0, and its quarantined rows (see
    :meth:`~.spill.SpillFile.take_over`)."""
    for rows in _from_source(source, source.raw_rows("pending", PENDING_COLUMNS)):
        chosen = [
            (pending[int_or_zero(row[0])], *row[1:6], 0, *row[7:])
            for row in rows
            if int_or_zero(row[0]) in pending
        ]
        db.executemany(_INSERT_PENDING, chosen)
        counts.pending += len(chosen)
        counts.pending_bytes += sum(int_or_zero(row[8]) for row in chosen)
    for rows in _from_source(source, source.raw_rows("parked", PARKED_COLUMNS)):
        moved = [(parked[int_or_zero(row[0])], *row[1:]) for row in rows if int_or_zero(row[0]) in parked]
        db.executemany(f"INSERT INTO parked ({PARKED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", moved)
        counts.parked += len(moved)
        counts.parked_bytes += sum(int_or_zero(row[5]) for row in moved)
    if has_quarantine:
        names = ", ".join(("source", "reason", "quarantined_at", *RAW_COLUMNS))
        marks = ", ".join("?" * (3 + len(RAW_COLUMNS)))
        for rows in _from_source(source, source.raw_quarantine_rows()):
            db.executemany(f"INSERT INTO quarantine ({names}) VALUES ({marks})", rows)
            counts.quarantined += len(rows)


def _from_source(
    source: SpillFile, chunks: Iterator[list[tuple[object, ...]]]
) -> Iterator[list[tuple[object, ...]]]:
    """``chunks`` of ``source``'s raw rows; its failures become :class:`SourceReadError`."""
    while True:
        try:
            rows = next(chunks)
        except StopIteration:
            return
        except sqlite3.Error as exc:
            raise SourceReadError(f"reading {source.path!r} failed: {exc}") from exc
        yield rows


__all__ = ["check_cap", "copy_from", "delete_pending", "insert_parked", "insert_pending"]
