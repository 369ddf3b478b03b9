"""Filtering, paging and retention over snapshot records: the rules of ``list`` and ``gc`` that
every backend shares (a database backend may push the filter into SQL, but must page and order
the same way, and may reuse the cursor format).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from .record import RetentionPolicy, Snapshot, SnapshotPage, SubjectKind
from .snapshot_errors import InvalidCursorError


@dataclass(frozen=True, slots=True)
class ListFilter:
    """The filters of ``SnapshotStore.list``; ``None`` matches anything."""

    subject_kind: SubjectKind | None = None
    subject_id: str | None = None
    tag: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, snapshot: Snapshot) -> bool:
        """Whether ``snapshot`` passes every filter (``since`` inclusive, ``until`` exclusive)."""
        return (
            (self.subject_kind is None or snapshot.subject_kind == self.subject_kind)
            and (self.subject_id is None or snapshot.subject_id == self.subject_id)
            and (self.tag is None or self.tag in snapshot.tags)
            and (self.since is None or snapshot.created_at >= self.since)
            and (self.until is None or snapshot.created_at < self.until)
        )


def order_key(snapshot: Snapshot) -> tuple[datetime, str]:
    """The listing order: oldest first, then by id."""
    return snapshot.created_at, snapshot.id


def encode_cursor(snapshot: Snapshot) -> str:
    """An opaque cursor: the position after ``snapshot``."""
    return encode_position(snapshot.created_at, snapshot.id)


def encode_position(created_at: datetime, snapshot_id: str) -> str:
    """The cursor of :func:`encode_cursor` from a position (a database backend's columns)."""
    raw = json.dumps([created_at.isoformat(), snapshot_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor of :func:`encode_cursor` stands for (``InvalidCursorError`` otherwise)."""
    try:
        created, snapshot_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return datetime.fromisoformat(created), str(snapshot_id)
    except (ValueError, TypeError) as exc:
        raise InvalidCursorError(f"not a cursor of this store: {cursor!r}") from exc


def paginate(
    snapshots: Iterable[Snapshot], filters: ListFilter, *, limit: int, cursor: str | None
) -> SnapshotPage:
    """One page of the snapshots passing ``filters``, after ``cursor``, in :func:`order_key` order."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    after = decode_cursor(cursor) if cursor is not None else None
    found = sorted(
        (s for s in snapshots if filters.matches(s) and (after is None or order_key(s) > after)),
        key=order_key,
    )
    page = tuple(found[:limit])
    return SnapshotPage(page, encode_cursor(page[-1]) if len(found) > limit else None)


def retention_victims(snapshots: Iterable[Snapshot], policy: RetentionPolicy) -> list[str]:
    """Ids of the snapshots ``policy`` no longer keeps, sorted."""
    doomed: list[str] = []
    now = datetime.now(UTC)
    by_subject: dict[tuple[str, str], list[Snapshot]] = {}
    for snapshot in snapshots:
        by_subject.setdefault((snapshot.subject_kind, snapshot.subject_id), []).append(snapshot)
    for group in by_subject.values():
        group.sort(key=order_key, reverse=True)
        for rank, snapshot in enumerate(group):
            if policy.keep_tagged and snapshot.tags:
                continue
            too_old = policy.max_age is not None and now - snapshot.created_at > policy.max_age
            too_many = policy.keep_last is not None and rank >= policy.keep_last
            if too_old or too_many:
                doomed.append(snapshot.id)
    return sorted(doomed)


__all__ = [
    "ListFilter",
    "decode_cursor",
    "encode_cursor",
    "encode_position",
    "order_key",
    "paginate",
    "retention_victims",
]
