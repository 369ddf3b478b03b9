"""What a dead-letter spill file reports: row metadata, totals, unreadable rows, write results;
and the JSON text calls are stored as."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

import orjson

from .spill_format import SIZE_SUM


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


EMPTY_TOTALS = SpillTotals(0, 0, 0, 0, None)


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


@dataclass(slots=True)
class SpillCounts:
    """What a writer knows its file holds (kept up to date by its writes; :meth:`recount` counts
    afresh)."""

    pending: int = 0
    pending_bytes: int = 0
    parked: int = 0
    parked_bytes: int = 0
    quarantined: int = 0

    def recount(self, db: sqlite3.Connection, *, has_quarantine: bool) -> None:
        self.pending, self.pending_bytes = db.execute(f"SELECT count(*), {SIZE_SUM} FROM pending").fetchone()
        self.parked, self.parked_bytes = db.execute(f"SELECT count(*), {SIZE_SUM} FROM parked").fetchone()
        self.quarantined = (
            db.execute("SELECT count(*) FROM quarantine").fetchone()[0] if has_quarantine else 0
        )


__all__ = [
    "EMPTY_TOTALS",
    "QuarantinedRow",
    "RawValue",
    "RowInfo",
    "SetAside",
    "SpillCounts",
    "SpillTotals",
    "WriteResult",
    "dumps",
]
