"""The content of a snapshot stored in PostgreSQL, read back batch by batch and chunk by chunk.

:class:`PostgresContent` is what :meth:`PostgresSnapshotStore.load
<backends.postgres.snapshots.PostgresSnapshotStore.load>` returns for a snapshot of the current
format: ``lines(section)`` fetches one ``snapshot_lines`` row (one batch) per query, and blobs are
read from their 1 MiB ``snapshot_blob_chunks``; nothing holds a whole section in memory, and no
connection or transaction is held between batches. A snapshot deleted while it is read raises
:class:`~guarded.snapshots.SnapshotCorruptError` at the first batch it lacks, never a short read.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from guarded.snapshots.content import (
    CHUNK,
    ClosingContent,
    DirectoryContent,
    SnapshotContent,
    SpooledSnapshot,
)
from guarded.snapshots.errors import SnapshotCorruptError
from guarded.snapshots.record import SECTIONS, Snapshot

from .connection import Database
from .schema_names import qualified


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
            raise SnapshotCorruptError(f"artifact blob {digest} is missing")
        hasher = hashlib.sha256()
        for index in range(count):
            data = await self._db.fetchval(
                f"SELECT data FROM {self._chunks} WHERE digest = $1 AND chunk = $2", digest, index
            )
            if data is None:
                raise SnapshotCorruptError(f"artifact blob {digest} is missing (chunk {index} of {count})")
            hasher.update(data)
            yield bytes(data)
        if hasher.hexdigest() != digest:
            raise SnapshotCorruptError(f"artifact blob {digest} does not match its hash")

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
        async for batch in read_section(self._db, self._lines, self._snapshot.id, section, self._batches):
            yield batch

    async def read_blob(self, digest: str) -> bytes:
        return await self.blobs.read(digest)

    def blob_chunks(self, digest: str) -> AsyncIterator[bytes]:
        """The blob in chunks (a PostgreSQL-to-PostgreSQL copy never holds a whole blob)."""
        return self.blobs.chunks(digest)


async def read_section(
    db: Database, table: str, snapshot_id: str, section: str, batches: Mapping[str, int]
) -> AsyncIterator[list[bytes]]:
    """Batches of a stored section (of any format: the migration reads old sections this way)."""
    for index in range(batches.get(section, 0)):
        data = await db.fetchval(
            f"SELECT lines FROM {table} WHERE snapshot_id = $1 AND section = $2 AND batch = $3",
            snapshot_id,
            section,
            index,
        )
        if data is None:
            raise SnapshotCorruptError(
                f"snapshot {snapshot_id!r}: batch {index} of section {section} is missing "
                "(deleted while it was read?)"
            )
        yield split_batch(bytes(data))


class MigratedContent(SpooledSnapshot):
    """An older snapshot migrated into a local spool; its blobs are still read from the database."""

    def __init__(self, spooled: SpooledSnapshot, blobs: BlobReader) -> None:
        super().__init__(spooled.snapshot, spooled.directory)
        spooled._finalizer.detach()  # this object owns the spool now
        self.blobs = blobs

    async def read_blob(self, digest: str) -> bytes:
        return await self.blobs.read(digest)

    def blob_chunks(self, digest: str) -> AsyncIterator[bytes]:
        return self.blobs.chunks(digest)


async def blob_chunks(content: SnapshotContent, digest: str) -> AsyncIterator[bytes]:
    """A content's blob in chunks of at most :data:`CHUNK` bytes, without reading it whole when the
    content can stream it (a local file, a PostgreSQL content); not verified here."""
    streaming = getattr(content, "blob_chunks", None)
    if callable(streaming):
        async for chunk in streaming(digest):
            for start in range(0, len(chunk), CHUNK):
                yield chunk[start : start + CHUNK]
        return
    if isinstance(content, DirectoryContent):
        path: Path = content.blob_path(digest)
        try:
            handle = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError:
            raise SnapshotCorruptError(f"artifact blob {digest} is missing") from None
        try:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk
        finally:
            await asyncio.to_thread(handle.close)
        return
    data = await content.read_blob(digest)
    for start in range(0, max(len(data), 1), CHUNK):
        yield data[start : start + CHUNK]


__all__ = [
    "BlobReader",
    "MigratedContent",
    "PostgresContent",
    "blob_chunks",
    "read_section",
    "split_batch",
]
