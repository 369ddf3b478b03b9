"""The writing half of a PostgreSQL snapshot save: one snapshot's rows, in the save's transaction.

:func:`write_snapshot` claims the ``snapshots`` row of the id, writes each section as
``snapshot_lines`` rows (:class:`SectionRows`: batches of at most :data:`LINES_PER_ROW` lines or
:data:`BYTES_PER_ROW` bytes, hashed and counted as they go), checks them against the record, then
stores the artifact blobs chunk by chunk (:func:`put_blob`) and their references. The transaction,
its advisory lock and what a taken id means belong to the store (:mod:`.snapshots`); reading a
snapshot back is :mod:`.snapshot_content`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from guarded.snapshots import SECTIONS, SnapshotContent, SnapshotCorruptError, content_hash, parse_line

from .connection import Connection
from .snapshot_content import blob_chunks

LINES_PER_ROW = 2_000
"""Lines per ``snapshot_lines`` row at most."""
BYTES_PER_ROW = 1 << 20
"""Bytes of lines per ``snapshot_lines`` row at most (a row holds at least one line)."""


class SnapshotTaken(Exception):
    """The id was saved (committed) by someone else: compare hashes outside the transaction."""


async def write_snapshot(conn: Connection, tables: Mapping[str, str], content: SnapshotContent) -> None:
    """(In a save's transaction.) Write ``content``: its ``snapshots`` row, its sections as
    ``snapshot_lines`` rows, then its blobs and their references, checking each section and the
    content hash against the record (:class:`~guarded.snapshots.SnapshotCorruptError` when one
    does not match). Raises :class:`SnapshotTaken` when the id was saved by someone else."""
    snapshot = content.snapshot
    claimed = await conn.fetchval(
        f"INSERT INTO {tables['snapshots']} (id, subject_kind, subject_id, created_at, "
        "format_version, tags, content_hash, manifest, batches) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, '{}') ON CONFLICT (id) DO NOTHING RETURNING true",
        snapshot.id,
        snapshot.subject_kind,
        snapshot.subject_id,
        snapshot.created_at,
        snapshot.format_version,
        list(snapshot.tags),
        snapshot.content_hash,
        json.dumps(snapshot.manifest(), ensure_ascii=False),
    )
    if not claimed:
        raise SnapshotTaken
    hashes: dict[str, str] = {}
    batches: dict[str, int] = {}
    digests: set[str] = set()
    for section in SECTIONS:
        writer = SectionRows(conn, tables["snapshot_lines"], snapshot.id, section)
        async for batch in content.lines(section):
            if section == "artifacts":
                digests.update(str(parse_line(line)["blob"]) for line in batch)
            await writer.add(batch)
        await writer.flush()
        hashes[section] = writer.digest
        batches[section] = writer.rows
        recorded = snapshot.counts.get(section, 0), snapshot.section_hashes.get(section)
        if (writer.count, writer.digest) != recorded:
            raise SnapshotCorruptError(
                f"snapshot {snapshot.id!r}: section {section} does not match its record "
                f"({writer.count} records, {snapshot.counts.get(section, 0)} recorded)"
            )
    if content_hash(hashes) != snapshot.content_hash:
        raise SnapshotCorruptError(f"snapshot {snapshot.id!r}: content hash does not match its record")
    for digest in sorted(digests):  # one order for every save: no deadlock on shared blob rows
        await put_blob(conn, tables, content, digest)
        await conn.execute(
            f"INSERT INTO {tables['snapshot_blob_refs']} (snapshot_id, digest) VALUES ($1, $2)",
            snapshot.id,
            digest,
        )
    await conn.execute(
        f"UPDATE {tables['snapshots']} SET batches = $2 WHERE id = $1", snapshot.id, json.dumps(batches)
    )


async def put_blob(
    conn: Connection, tables: Mapping[str, str], content: SnapshotContent, digest: str
) -> None:
    """(In a save's transaction.) Store the blob ``digest`` of ``content`` in chunks, checking its
    hash; a blob already stored is only touched (its bytes are not sent again)."""
    inserted = await conn.fetchval(
        f"INSERT INTO {tables['snapshot_blobs']} (digest, size, chunks) VALUES ($1, 0, 0) "
        "ON CONFLICT (digest) DO UPDATE SET touched_at = now() RETURNING (xmax = 0)",
        digest,
    )
    if not inserted:
        return  # stored (committed) by an earlier save: its bytes are there
    hasher = hashlib.sha256()
    size = index = 0
    async for chunk in blob_chunks(content, digest):
        hasher.update(chunk)
        size += len(chunk)
        await conn.execute(
            f"INSERT INTO {tables['snapshot_blob_chunks']} (digest, chunk, data) VALUES ($1, $2, $3)",
            digest,
            index,
            chunk,
        )
        index += 1
    if hasher.hexdigest() != digest:
        raise SnapshotCorruptError(f"artifact blob {digest} does not match its hash")
    await conn.execute(
        f"UPDATE {tables['snapshot_blobs']} SET size = $2, chunks = $3 WHERE digest = $1",
        digest,
        size,
        index,
    )


class SectionRows:
    """Writes one section as ``snapshot_lines`` rows, hashing and counting the lines."""

    def __init__(self, conn: Connection, table: str, snapshot_id: str, section: str) -> None:
        self._conn = conn
        self._sql = (
            f"INSERT INTO {table} (snapshot_id, section, batch, line_count, lines) "
            "VALUES ($1, $2, $3, $4, $5)"
        )
        self._snapshot_id = snapshot_id
        self._section = section
        self._hash = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.count = 0
        self.rows = 0

    async def add(self, lines: list[bytes]) -> None:
        for line in lines:
            self._hash.update(line + b"\n")
            self._pending.append(line)
            self._pending_bytes += len(line) + 1
            if len(self._pending) >= LINES_PER_ROW or self._pending_bytes >= BYTES_PER_ROW:
                await self.flush()
        self.count += len(lines)

    async def flush(self) -> None:
        if not self._pending:
            return
        await self._conn.execute(
            self._sql,
            self._snapshot_id,
            self._section,
            self.rows,
            len(self._pending),
            b"\n".join(self._pending),
        )
        self.rows += 1
        self._pending = []
        self._pending_bytes = 0

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()


__all__ = ["BYTES_PER_ROW", "LINES_PER_ROW", "SectionRows", "SnapshotTaken", "put_blob", "write_snapshot"]
