"""``PostgresSnapshotStore``: a :class:`~guarded.snapshots.SnapshotStore` in a store's schema.

::

    snapshots = await PostgresSnapshotStore.connect(dsn, schema="tenant_a")   # own pool
    snapshots = PostgresSnapshotStore.of(state_store)       # the PostgresStateStore's pool and schema
    async with await capture(state_store, session_id="s-42") as captured:
        record = await snapshots.save(captured)

Tables (migration ``0004_snapshots``, applied with the store's other migrations under their
advisory lock): ``snapshots`` (one row per snapshot: its record as a JSON manifest, tags as a
``text[]``), ``snapshot_lines`` (each section as batches of its canonical JSON lines, one row per
batch of up to 2,000 lines or 1 MiB), ``snapshot_blobs`` / ``snapshot_blob_chunks`` (artifact
blobs by SHA-256 in 1 MiB chunks, shared by every snapshot) and ``snapshot_blob_refs`` (which
snapshot references which blob).

Guarantees, the file backend's in database terms:

* **atomic saves**: a save is one transaction; the snapshot is visible in full once it commits,
  and a connection lost or a process killed mid-save leaves nothing (the server rolls back).
* **verified saves**: lines are re-hashed and counted as they are written, blobs re-hashed; a
  content that does not match its record raises ``SnapshotCorruptError`` and rolls back.
* **streamed**: sections go in and out batch by batch and blobs chunk by chunk; a blob already
  stored is not sent again (a save only touches its row).
* **idempotent**: the same id and content hash saved again returns the stored record; concurrent
  saves of one id wait on its row, one wins, the other compares hashes.
* **gc** deletes what the retention policy no longer keeps, then blobs no snapshot references,
  holding the schema's snapshot advisory lock exclusively -- every save holds it shared for its
  whole transaction, so gc never removes a blob a save in progress is about to reference.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import asyncpg

from guarded.snapshots import (
    DEFAULT_MIGRATIONS,
    GcReport,
    MigrationRegistry,
    RetentionPolicy,
    Snapshot,
    SnapshotConflictError,
    SnapshotContent,
    SnapshotCorruptError,
    SnapshotDiff,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotPage,
    SubjectKind,
    checked_id,
    decode_cursor,
    diff_of,
    encode_position,
    format_version_of,
    lineage_of,
    listed_record,
    migrate,
    normalize_tags,
    retention_victims,
)

from . import schema_migrations as migrations_module
from .connection import Database, PoolSettings, create_pool, pool_settings
from .error_classifier import POSTGRES_ERRORS
from .schema_names import qualified, validate_schema_name
from .snapshot_content import BlobReader, MigratedContent, PostgresContent, read_section
from .snapshot_writes import BYTES_PER_ROW, LINES_PER_ROW, SnapshotTaken, write_snapshot
from .target import target_identity

logger = logging.getLogger("guarded.backends.postgres")


def snapshot_lock_key(schema: str) -> int:
    """The advisory lock key saves hold shared and ``gc`` exclusively (per schema)."""
    digest = hashlib.sha256(f"guarded.snapshots.gc:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresSnapshotStore:
    """Snapshots in PostgreSQL schema ``schema`` (the tables of migration ``0004_snapshots``).

    Build it with :meth:`connect` (its own pool), :meth:`from_pool` or :meth:`of` (a
    ``PostgresStateStore``'s pool and schema). ``migrations``: the registry that loads older
    snapshot formats; ``spool_dir``: where migrated loads are spooled. A plain store that may
    throw; ``guard(store)`` makes it safe (docs/snapshots.md "Guarded").
    """

    error_classifier = POSTGRES_ERRORS
    """How the guard classifies this backend's errors (by SQLSTATE, as the state store's)."""
    db_system_name = "postgresql"

    def __init__(
        self,
        db: Database,
        *,
        schema: str = "public",
        owns_pool: bool = False,
        migrations: MigrationRegistry = DEFAULT_MIGRATIONS,
        spool_dir: Path | None = None,
    ) -> None:
        self.schema = validate_schema_name(schema)
        self.migrations = migrations
        self.spool_dir = spool_dir
        self._db = db
        self._owns_pool = owns_pool
        self._blobs = BlobReader(db, self.schema)
        self._lock_key = snapshot_lock_key(self.schema)
        self._t = {
            name: qualified(self.schema, name)
            for name in (
                "snapshots",
                "snapshot_lines",
                "snapshot_blobs",
                "snapshot_blob_chunks",
                "snapshot_blob_refs",
            )
        }
        self.target_identity = f"postgresql://(application pool)/?schema={self.schema}#snapshots"
        """Which database and schema this store writes to, without credentials."""

    # --- lifecycle ----------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        dsn: str | None = None,
        *,
        schema: str = "public",
        pool: PoolSettings | Mapping[str, Any] | None = None,
        migrate: bool = True,
        migrations: MigrationRegistry = DEFAULT_MIGRATIONS,
        spool_dir: Path | None = None,
    ) -> Self:
        """A store on a new pool for ``dsn``; applies the schema's pending migrations (all of the
        backend's, under their advisory lock) unless ``migrate=False``, which requires them."""
        validate_schema_name(schema)
        settings = pool_settings("PostgresSnapshotStore.connect()", pool)
        created = await create_pool(dsn, settings)
        try:
            store = cls(
                Database(created, settings=settings),
                schema=schema,
                owns_pool=True,
                migrations=migrations,
                spool_dir=spool_dir,
            )
            await store._prepare(migrate)
        except BaseException:
            await created.close()
            raise
        store.target_identity = target_identity(dsn, store.schema) + "#snapshots"
        return store

    @classmethod
    async def from_pool(
        cls,
        pool: asyncpg.Pool,
        *,
        schema: str = "public",
        migrate: bool = True,
        migrations: MigrationRegistry = DEFAULT_MIGRATIONS,
        spool_dir: Path | None = None,
    ) -> Self:
        """A store on an application-owned pool (not closed by :meth:`close`)."""
        store = cls(Database(pool), schema=schema, migrations=migrations, spool_dir=spool_dir)
        await store._prepare(migrate)
        return store

    @classmethod
    def of(
        cls,
        state_store: Any,
        *,
        migrations: MigrationRegistry = DEFAULT_MIGRATIONS,
        spool_dir: Path | None = None,
    ) -> Self:
        """The snapshots of a ``PostgresStateStore``: its pool (opened lazily with it) and schema,
        which it migrated. Closing this store leaves the state store's pool open."""
        store = cls(state_store._db, schema=state_store.schema, migrations=migrations, spool_dir=spool_dir)
        store.target_identity = f"{state_store.target_identity}#snapshots"
        return store

    async def _prepare(self, migrate: bool) -> None:
        async with self._db.acquire() as conn:
            if migrate:
                await migrations_module.migrate(
                    conn, self.schema, transaction_scoped=self._db.transaction_pooled
                )
            else:
                await migrations_module.require_current(conn, self.schema)

    async def close(self) -> None:
        """Close the pool when this store owns it."""
        if self._owns_pool and self._db.is_open:
            await self._db.pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"PostgresSnapshotStore(schema={self.schema!r})"

    @property
    def max_concurrency(self) -> int | None:
        """Calls this store runs at once: its pool's maximum size (the guard's bulkhead reads it);
        ``None`` while a shared lazy pool is not open."""
        return self._db.pool_max_size() or None

    # --- save ---------------------------------------------------------------------------------------

    async def save(self, content: SnapshotContent) -> Snapshot:
        snapshot = content.snapshot
        if snapshot.format_version != self.migrations.current:
            raise SnapshotCorruptError(
                f"snapshot {snapshot.id!r} claims format version {snapshot.format_version}; save takes "
                f"content of the current format {self.migrations.current} (load migrates older ones)"
            )
        stored = await self._stored_hash(snapshot.id)
        if stored is not None:
            return await self._same_or_conflict(snapshot, stored)
        try:
            async with self._db.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock_shared($1)", self._lock_key)
                await write_snapshot(conn, self._t, content)
        except SnapshotTaken:
            return await self._same_or_conflict(snapshot, await self._stored_hash(snapshot.id))
        return snapshot

    async def _stored_hash(self, snapshot_id: str) -> str | None:
        value = await self._db.fetchval(
            f"SELECT content_hash FROM {self._t['snapshots']} WHERE id = $1", snapshot_id
        )
        return None if value is None else str(value)

    async def _same_or_conflict(self, snapshot: Snapshot, stored_hash: str | None) -> Snapshot:
        if stored_hash != snapshot.content_hash:
            raise SnapshotConflictError(snapshot.id)
        return await self.get(snapshot.id)

    # --- load, get ----------------------------------------------------------------------------------

    async def _row(self, snapshot_id: str) -> asyncpg.Record:
        row = await self._db.fetchrow(
            f"SELECT manifest, tags, batches FROM {self._t['snapshots']} WHERE id = $1",
            checked_id(snapshot_id),
        )
        if row is None:
            raise SnapshotNotFoundError(snapshot_id)
        return row

    async def load(self, snapshot_id: str) -> SnapshotContent:
        row = await self._row(snapshot_id)
        manifest = _manifest(row, snapshot_id)
        batches = {str(k): int(v) for k, v in json.loads(row["batches"]).items()}
        version = format_version_of(manifest)
        if version == self.migrations.current:
            record = listed_record(manifest, snapshot_id, self.migrations)
            return PostgresContent(record, self._db, self.schema, batches, self._blobs)
        self.migrations.plan(version)  # the format errors, before any work
        table = self._t["snapshot_lines"]

        def lines(section: str) -> AsyncIterator[list[bytes]]:
            return read_section(self._db, table, snapshot_id, section, batches)

        spooled = await migrate(manifest, lines, self.migrations, spool_dir=self.spool_dir)
        return MigratedContent(spooled, self._blobs)

    async def get(self, snapshot_id: str) -> Snapshot:
        row = await self._row(snapshot_id)
        return listed_record(_manifest(row, snapshot_id), snapshot_id, self.migrations)

    # --- list ---------------------------------------------------------------------------------------

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
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after_at, after_id = decode_cursor(cursor) if cursor is not None else (None, None)
        rows = await self._db.fetch(
            f"SELECT id, created_at, manifest, tags FROM {self._t['snapshots']} "
            "WHERE ($1::text IS NULL OR subject_kind = $1) AND ($2::text IS NULL OR subject_id = $2) "
            "AND ($3::text IS NULL OR tags @> ARRAY[$3::text]) "
            "AND ($4::timestamptz IS NULL OR created_at >= $4) "
            "AND ($5::timestamptz IS NULL OR created_at < $5) "
            'AND ($6::timestamptz IS NULL OR (created_at, id) > ($6, $7::text COLLATE "C")) '
            "ORDER BY created_at, id LIMIT $8",
            subject_kind,
            subject_id,
            tag,
            since,
            until,
            after_at,
            after_id,
            limit + 1,
        )
        items = [record for record in (self._listable(row) for row in rows[:limit]) if record is not None]
        more = len(rows) > limit
        last = rows[limit - 1] if more else None
        return SnapshotPage(
            tuple(items), encode_position(last["created_at"], last["id"]) if last is not None else None
        )

    def _listable(self, row: asyncpg.Record) -> Snapshot | None:
        try:
            return listed_record(_manifest(row, row["id"]), row["id"], self.migrations)
        except (ValueError, SnapshotError) as exc:
            logger.warning("snapshot %s is not listable: %s", row["id"], exc)
            return None

    # --- delete, tags, lineage, diff ----------------------------------------------------------------

    async def delete(self, snapshot_id: str) -> bool:
        deleted = await self._db.fetchval(
            f"DELETE FROM {self._t['snapshots']} WHERE id = $1 RETURNING true", checked_id(snapshot_id)
        )
        return bool(deleted)

    async def tag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        added = normalize_tags(tags)
        return await self._retag(snapshot_id, lambda old: [*old, *added])

    async def untag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        removed = set(tags)
        return await self._retag(snapshot_id, lambda old: [t for t in old if t not in removed])

    async def _retag(self, snapshot_id: str, change: Any) -> Snapshot:
        checked_id(snapshot_id)
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT manifest, tags FROM {self._t['snapshots']} WHERE id = $1 FOR UPDATE", snapshot_id
            )
            if row is None:
                raise SnapshotNotFoundError(snapshot_id)
            tags = builtins.list(normalize_tags(change(builtins.list(row["tags"]))))
            await conn.execute(
                f"UPDATE {self._t['snapshots']} SET tags = $2 WHERE id = $1", snapshot_id, tags
            )
        manifest = {**_manifest(row, snapshot_id), "tags": tags}
        return listed_record(manifest, snapshot_id, self.migrations)

    async def lineage(self, snapshot_id: str) -> builtins.list[Snapshot]:
        return await lineage_of(self, checked_id(snapshot_id))

    async def diff(self, a: str, b: str) -> SnapshotDiff:
        return await diff_of(self, checked_id(a), checked_id(b))

    # --- gc -----------------------------------------------------------------------------------------

    async def gc(self, policy: RetentionPolicy | None = None) -> GcReport:
        policy = policy or RetentionPolicy()
        rows = await self._db.fetch(f"SELECT id, created_at, manifest, tags FROM {self._t['snapshots']}")
        records = [record for record in (self._listable(row) for row in rows) if record is not None]
        del rows
        doomed = retention_victims(records, policy)
        deleted: builtins.list[str] = []
        if doomed:
            found = await self._db.fetch(
                f"DELETE FROM {self._t['snapshots']} WHERE id = ANY($1::text[]) RETURNING id", doomed
            )
            deleted = sorted(str(row["id"]) for row in found)
        async with self._db.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", self._lock_key)  # no save in progress
            freed = await conn.fetch(
                f"DELETE FROM {self._t['snapshot_blobs']} b WHERE NOT EXISTS "
                f"(SELECT 1 FROM {self._t['snapshot_blob_refs']} r WHERE r.digest = b.digest) "
                "AND b.touched_at <= clock_timestamp() - $1::interval RETURNING size",
                policy.grace,
            )
            kept = await conn.fetchval(f"SELECT count(*) FROM {self._t['snapshot_blobs']}")
        return GcReport(
            snapshots_deleted=tuple(deleted),
            blobs_deleted=len(freed),
            bytes_freed=sum(int(row["size"]) for row in freed),
            blobs_kept=int(kept),
            staging_removed=0,
        )


def _manifest(row: asyncpg.Record, snapshot_id: str) -> dict[str, Any]:
    """The stored manifest with the row's live tags."""
    try:
        manifest = json.loads(row["manifest"])
    except ValueError as exc:
        raise SnapshotCorruptError(f"snapshot {snapshot_id!r}: unreadable manifest ({exc})") from exc
    if not isinstance(manifest, dict):
        raise SnapshotCorruptError(f"snapshot {snapshot_id!r}: the manifest is not a JSON object")
    manifest["tags"] = builtins.list(row["tags"])
    return manifest


__all__ = ["BYTES_PER_ROW", "LINES_PER_ROW", "PostgresSnapshotStore", "snapshot_lock_key"]
