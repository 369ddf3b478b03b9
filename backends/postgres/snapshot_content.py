"""The content of a snapshot stored in PostgreSQL, read back batch by batch and chunk by chunk.

:class:`PostgresContent` is what :meth:`PostgresSnapshotStore.load
<backends.postgres.snapshots.PostgresSnapshotStore.load>` returns for a snapshot of the current
format: ``lines(section)`` fetches one ``snapshot_lines`` row (one batch) per query, and blobs are
read from their 1 MiB ``snapshot_blob_chunks``; nothing holds a whole section in memory, and no
connection or transaction is held between batches. A snapshot deleted while it is read raises
:class:`~guarded.snapshots.SnapshotCorruptError` at the first batch it lacks, never a short read.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping

from guarded.snapshots import (
    BLOB_CHUNK_BYTES,
    MAX_LINE_BYTES,
    SECTIONS,
    BlobMismatchError,
    ClosingContent,
    SectionCheck,
    Snapshot,
    SnapshotContent,
    SnapshotCorruptError,
    SnapshotTooLargeError,
    SpooledSnapshot,
    declared_of,
)

from .connection import Database
from .schema_names import qualified

ROW_LIMIT = MAX_LINE_BYTES + BLOB_CHUNK_BYTES
"""Bytes a stored batch may hold (a save writes at most 1 MiB, or one line): a larger row is
refused without being fetched."""


def split_batch(data: bytes) -> list[bytes]:
    """The lines of one stored batch (lines joined by newlines; canonical JSON has no raw newline)."""
    return data.split(b"\n") if data else []


class BlobReader:
    """Reads content-addressed blobs of one schema, checking their SHA-256."""

    def __init__(self, db: Database, schema: str) -> None:
        self._db = db
        self._blobs = qualified(schema, "snapshot_blobs")
        self._chunks = qualified(schema, "snapshot_blob_chunks")

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes in stored chunks, verified at the end (``SnapshotCorruptError``)."""
        count = await self._db.fetchval(f"SELECT chunks FROM {self._blobs} WHERE digest = $1", digest)
        if count is None:
            raise BlobMismatchError(digest, "missing")
        hasher = hashlib.sha256()
        for index in range(count):
            row = await self._db.fetchrow(
                f"SELECT CASE WHEN octet_length(data) <= $3 THEN data END AS data, "
                f"octet_length(data) AS size FROM {self._chunks} WHERE digest = $1 AND chunk = $2",
                digest,
                index,
                BLOB_CHUNK_BYTES,
            )
            if row is None:
                raise SnapshotCorruptError(f"artifact blob {digest} is missing (chunk {index} of {count})")
            if row["data"] is None:
                raise SnapshotTooLargeError(
                    f"artifact blob {digest}: chunk {index} holds {row['size']} bytes, more than the "
                    f"{BLOB_CHUNK_BYTES} a chunk may: refused unread"
                )
            hasher.update(row["data"])
            yield bytes(row["data"])
        if hasher.hexdigest() != digest:
            raise BlobMismatchError(digest, "hash", f"sha256 {digest}", f"sha256 {hasher.hexdigest()}")

    async def read(self, digest: str) -> bytes:
        return b"".join([chunk async for chunk in self.chunks(digest)])


class PostgresContent(ClosingContent):
    """A stored snapshot's content, read from the database on demand (a :class:`SnapshotContent`)."""

    def __init__(
        self, snapshot: Snapshot, db: Database, schema: str, batches: Mapping[str, int], blobs: BlobReader
    ) -> None:
        self._snapshot = snapshot
        self._db = db
        self._lines = qualified(schema, "snapshot_lines")
        self._batches = dict(batches)
        self.blobs = blobs

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        if section not in SECTIONS and section not in self._batches:
            raise ValueError(f"unknown section {section!r}")
        check = SectionCheck(self._snapshot.id, section, declared_of(self._snapshot, section))
        async for batch in read_section(
            self._db, self._lines, self._snapshot.id, section, self._batches, check
        ):
            yield batch

    async def read_blob(self, digest: str) -> bytes:
        return await self.blobs.read(digest)

    def blob_chunks(self, digest: str, size: int | None = None) -> AsyncIterator[bytes]:
        """The blob in chunks (a PostgreSQL-to-PostgreSQL copy never holds a whole blob), its hash
        checked as it streams (its ``size`` is checked by the reader, as ``verify_content`` does)."""
        return self.blobs.chunks(digest)


async def read_section(
    db: Database,
    table: str,
    snapshot_id: str,
    section: str,
    batches: Mapping[str, int],
    check: SectionCheck | None = None,
) -> AsyncIterator[list[bytes]]:
    """Batches of a stored section (of any format: the migration reads old sections this way),
    each row at most :data:`ROW_LIMIT` bytes, checked by ``check`` as they are read (by default
    only counted: an old format declares no hashes)."""
    check = check or SectionCheck(snapshot_id, section, None)
    for index in range(batches.get(section, 0)):
        row = await db.fetchrow(
            f"SELECT CASE WHEN octet_length(lines) <= $4 THEN lines END AS lines, "
            f"octet_length(lines) AS size FROM {table} "
            "WHERE snapshot_id = $1 AND section = $2 AND batch = $3",
            snapshot_id,
            section,
            index,
            ROW_LIMIT,
        )
        if row is None:
            raise SnapshotCorruptError(
                f"snapshot {snapshot_id!r}: batch {index} of section {section} is missing "
                "(deleted while it was read?)"
            )
        if row["lines"] is None:
            raise SnapshotTooLargeError(
                f"snapshot {snapshot_id!r}: batch {index} of section {section} holds {row['size']} "
                f"bytes, more than the {ROW_LIMIT} a batch may: refused unread"
            )
        data = bytes(row["lines"])
        lines = split_batch(data)
        if lines:
            check.update(data + b"\n", len(lines))
        yield lines
    check.finish()


class MigratedContent(SpooledSnapshot):
    """An older snapshot migrated into a local spool; its blobs are still read from the database."""

    def __init__(self, spooled: SpooledSnapshot, blobs: BlobReader) -> None:
        super().__init__(spooled.snapshot, spooled.directory)
        spooled._finalizer.detach()  # this object owns the spool now
        self.blobs = blobs

    async def read_blob(self, digest: str) -> bytes:
        return await self.blobs.read(digest)

    def blob_chunks(self, digest: str, size: int | None = None) -> AsyncIterator[bytes]:
        return self.blobs.chunks(digest)


async def blob_chunks(content: SnapshotContent, digest: str) -> AsyncIterator[bytes]:
    """A content's blob in chunks of at most :data:`BLOB_CHUNK_BYTES` bytes, without reading it whole when the
    content can stream it (a local file, a PostgreSQL content: their streams check the hash)."""
    streaming = getattr(content, "blob_chunks", None)
    if callable(streaming):
        async for chunk in streaming(digest):
            for start in range(0, len(chunk), BLOB_CHUNK_BYTES):
                yield chunk[start : start + BLOB_CHUNK_BYTES]
        return
    data = await content.read_blob(digest)
    for start in range(0, max(len(data), 1), BLOB_CHUNK_BYTES):
        yield data[start : start + BLOB_CHUNK_BYTES]


__all__ = [
    "BlobReader",
    "MigratedContent",
    "PostgresContent",
    "blob_chunks",
    "read_section",
    "split_batch",
]
