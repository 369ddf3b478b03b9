"""The ``SnapshotStore`` protocol: what every snapshot backend offers.

A backend stores contents (:class:`~guarded.snapshots.content.SnapshotContent`) and their
:class:`~guarded.snapshots.record.Snapshot` records, and shares artifact blobs between snapshots
by SHA-256. :func:`guarded.testing.snapshot_contract.run_snapshot_contracts` checks a backend
against every rule below.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import datetime
from typing import Protocol, runtime_checkable

from .content import SnapshotContent
from .record import GcReport, RetentionPolicy, Snapshot, SnapshotDiff, SnapshotPage, SubjectKind


@runtime_checkable
class SnapshotStore(Protocol):
    """A place snapshots are saved to and loaded from.

    Every method is safe to call concurrently, from several processes when the backend says so.
    A snapshot is visible (``load``, ``list``, ``lineage``) only once ``save`` has returned, in
    full or not at all.
    """

    async def save(self, content: SnapshotContent) -> Snapshot:
        """Store ``content`` under ``content.snapshot.id`` and return its record.

        Idempotent: saving the same id with the same ``content_hash`` again returns the stored
        record. Another content under a saved id raises ``SnapshotConflictError``; content that
        does not match its record (counts, hashes, a missing blob) ``SnapshotCorruptError``.
        """
        ...

    async def load(self, snapshot_id: str) -> SnapshotContent:
        """The content of a snapshot, migrated to the current format when older; close it after use.

        Raises ``SnapshotNotFoundError``, ``FormatTooNewError``, ``MissingMigrationError`` or
        ``MigrationFailedError`` -- before returning anything.
        """
        ...

    async def get(self, snapshot_id: str) -> Snapshot:
        """The record of a snapshot as stored (``SnapshotNotFoundError``); no migration, no content."""
        ...

    async def list(
        self,
        *,
        subject_kind: SubjectKind | None = None,
        subject_id: str | None = None,
        tag: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> SnapshotPage:
        """Snapshots matching every filter given, oldest first (``created_at``, then id).

        ``since`` is inclusive, ``until`` exclusive. ``cursor`` is a previous page's
        ``next_cursor`` (``InvalidCursorError`` for anything else); pages never repeat or skip a
        snapshot that exists throughout the listing.
        """
        ...

    async def delete(self, snapshot_id: str) -> bool:
        """Delete a snapshot (its blobs stay until ``gc``); ``False`` when there was none."""
        ...

    async def tag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        """Add tags; returns the updated record (``SnapshotNotFoundError``)."""
        ...

    async def untag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        """Remove tags (absent ones are ignored); returns the updated record."""
        ...

    async def lineage(self, snapshot_id: str) -> builtins.list[Snapshot]:
        """The snapshot, then its parent, grandparent... up to the root or the first deleted
        ancestor (whose id is the last item's ``parent_id``)."""
        ...

    async def diff(self, a: str, b: str) -> SnapshotDiff:
        """What changed from snapshot ``a`` to snapshot ``b``."""
        ...

    async def gc(self, policy: RetentionPolicy | None = None) -> GcReport:
        """Delete the snapshots ``policy`` no longer retains, then every artifact blob no snapshot
        references (older than ``policy.grace``)."""
        ...


__all__ = ["SnapshotStore"]
