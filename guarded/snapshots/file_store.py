"""``FileSnapshotStore``: snapshots in one directory, safe for concurrent processes.

See :mod:`guarded.snapshots.file_layout` for the files. Guarantees:

* **atomic saves**: a snapshot is staged (every section file and blob fsynced), then published by
  one ``rename``; a process killed mid-save leaves only staging files, invisible to ``load`` and
  ``list`` and removed by the next ``gc``.
* **verified saves**: the content is re-hashed while it is written; a content that does not match
  its record is refused (``SnapshotCorruptError``) and nothing is published.
* **shared blobs**: an artifact blob is stored once, by SHA-256, whatever the number of snapshots
  referencing it; ``gc`` removes the ones no snapshot references.
* **concurrent processes**: saves run in parallel; publishing, deleting and tagging take an
  exclusive lock, ``gc`` waits for the saves in progress (they hold a shared lock).
* **bounded memory**: sections are copied batch by batch and blobs in 1 MiB chunks.
* **untrusted directories**: every file is read confined to the directory, regular files only,
  bounded and checked against its manifest as it is read (:mod:`.safe_files`); ids are checked
  once, when a method is called; ``gc`` never follows a link out of the directory.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from .content import (
    DirectoryContent,
    SectionWriter,
    SnapshotContent,
    content_hash,
    fsync_dir,
    iterate_in_thread,
    parse_line,
    read_section,
    write_chunks,
    write_file,
)
from .derived import diff_of, lineage_of
from .file_layout import Layout, write_json_atomically
from .listing import ListFilter, paginate, retention_victims
from .manifests import listed_record, stored_record
from .migrations import DEFAULT_MIGRATIONS, MigrationRegistry, format_version_of, migrate
from .record import (
    SECTIONS,
    GcReport,
    RetentionPolicy,
    Snapshot,
    SnapshotDiff,
    SnapshotPage,
    SubjectKind,
    checked_id,
    normalize_tags,
)
from .safe_files import checked_digest, open_directory
from .snapshot_errors import (
    SnapshotConflictError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotStoreReadOnlyError,
)

logger = logging.getLogger(__name__)


class FileSnapshotStore:
    """A :class:`~guarded.snapshots.snapshot_store.SnapshotStore` in directory ``root`` (created if needed).

    ``migrations``: the registry that loads older formats (:data:`DEFAULT_MIGRATIONS`).
    ``spool_dir``: where migrated loads are spooled (the system's temporary directory by default).
    ``create=False``: ``root`` must already hold a store (:class:`SnapshotStoreNotFoundError`
    otherwise), so a mistyped directory is an error, not a new empty store.
    ``read_only``: open an existing store for reading (``list``, ``get``, ``load``, ``lineage``,
    ``diff``): nothing is created or changed, not a directory, not a lock file; the writing methods
    raise :class:`SnapshotStoreReadOnlyError`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        migrations: MigrationRegistry = DEFAULT_MIGRATIONS,
        spool_dir: Path | None = None,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        self.layout = Layout(Path(root), create=create, read_only=read_only)
        self.migrations = migrations
        self.spool_dir = spool_dir
        self.read_only = read_only

    def _check_writable(self, method: str) -> None:
        if self.read_only:
            raise SnapshotStoreReadOnlyError(
                f"the snapshot store at {str(self.layout.root)!r} is open read-only: {method} is refused"
            )

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def target_identity(self) -> str:
        """Where this store writes (its directory): a guard's held saves belong to it alone, so a
        guard of another directory never adopts or replays them (:mod:`guarded.snapshots.staging`)."""
        return f"file-snapshots:{self.layout.root.resolve()}"

    # --- save --------------------------------------------------------------------------------------

    async def save(self, content: SnapshotContent) -> Snapshot:
        self._check_writable("save")
        snapshot = content.snapshot
        checked_id(snapshot.id)
        existing = await asyncio.to_thread(self._stored_hash, snapshot.id)
        if existing is not None:
            return await self._same_or_conflict(snapshot, existing)
        stack = contextlib.ExitStack()
        await asyncio.to_thread(stack.enter_context, self.layout.lock("gc", shared=True))
        try:
            staging = await asyncio.to_thread(self.layout.new_staging, snapshot.id)
            try:
                await self._stage(content, staging)
                published = await asyncio.to_thread(self._publish, snapshot, staging)
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, True)
        finally:
            await asyncio.to_thread(stack.close)
        if not published:
            return await self._same_or_conflict(
                snapshot, await asyncio.to_thread(self._stored_hash, snapshot.id)
            )
        return snapshot

    async def _same_or_conflict(self, snapshot: Snapshot, stored_hash: str | None) -> Snapshot:
        if stored_hash != snapshot.content_hash:
            raise SnapshotConflictError(snapshot.id)
        return await self.get(snapshot.id)

    def _stored_hash(self, snapshot_id: str) -> str | None:
        try:
            return str(self.layout.read_manifest(snapshot_id).get("content_hash", ""))
        except FileNotFoundError:
            return None

    async def _stage(self, content: SnapshotContent, staging: Path) -> None:
        snapshot = content.snapshot
        if snapshot.format_version != self.migrations.current:
            raise SnapshotCorruptError(
                f"snapshot {snapshot.id!r} claims format version {snapshot.format_version}; save takes "
                f"content of the current format {self.migrations.current} (load migrates older ones)"
            )
        hashes: dict[str, str] = {}
        digests: dict[str, None] = {}
        for section in SECTIONS:
            writer = await asyncio.to_thread(SectionWriter, staging / "sections" / f"{section}.jsonl.gz")
            try:
                async for batch in content.lines(section):
                    await asyncio.to_thread(writer.write, batch)
                    if section == "artifacts":
                        digests.update((checked_digest(parse_line(line).get("blob")), None) for line in batch)
            finally:
                await asyncio.to_thread(writer.close)
            hashes[section] = writer.digest
            if writer.count != snapshot.counts.get(
                section, 0
            ) or writer.digest != snapshot.section_hashes.get(section):
                raise SnapshotCorruptError(
                    f"snapshot {snapshot.id!r}: section {section} does not match its record "
                    f"({writer.count} records, {snapshot.counts.get(section, 0)} recorded)"
                )
        if content_hash(hashes) != snapshot.content_hash:
            raise SnapshotCorruptError(f"snapshot {snapshot.id!r}: content hash does not match its record")
        for digest in digests:
            await self._put_blob(content, digest, staging)
        await asyncio.to_thread(self._finish_staging, snapshot, staging)

    async def _put_blob(self, content: SnapshotContent, digest: str, staging: Path) -> None:
        if await asyncio.to_thread(self.layout.has_blob, digest):
            return
        temporary = staging / f"blob-{digest}"
        if isinstance(content, DirectoryContent):
            await write_chunks(content.blob_chunks(digest), temporary)
        else:
            data = await content.read_blob(digest)
            await asyncio.to_thread(write_file, temporary, data)
            del data
        await asyncio.to_thread(self.layout.install_blob, temporary, digest)

    def _finish_staging(self, snapshot: Snapshot, staging: Path) -> None:
        write_file(
            staging / "manifest.json", json.dumps(snapshot.manifest(), ensure_ascii=False, indent=1).encode()
        )
        fsync_dir(staging / "sections")
        fsync_dir(staging)

    def _publish(self, snapshot: Snapshot, staging: Path) -> bool:
        """Rename the staging directory into place; ``False`` when the id was taken meanwhile."""
        with self.layout.lock("meta"):
            target = self.layout.snapshot_dir(snapshot.id)
            if os.path.lexists(target):
                return False
            os.rename(staging, target)
            fsync_dir(self.layout.snapshots)
            return True

    # --- load --------------------------------------------------------------------------------------

    async def load(self, snapshot_id: str) -> SnapshotContent:
        manifest = await asyncio.to_thread(self._manifest, snapshot_id)
        sections = self.layout.snapshot_dir(snapshot_id) / "sections"
        version = format_version_of(manifest)
        if version == self.migrations.current:
            record = _record(manifest, snapshot_id)
            return DirectoryContent(record, sections, self.layout.blob, root=self.layout.root)
        self.migrations.plan(version)  # the format errors, before any work

        def lines(section: str) -> Any:
            return iterate_in_thread(read_section(sections / f"{section}.jsonl.gz", root=self.layout.root))

        spooled = await migrate(manifest, lines, self.migrations, spool_dir=self.spool_dir)
        spooled.blob_path = self.layout.blob
        spooled.blob_root = self.layout.root
        return spooled

    def _manifest(self, snapshot_id: str) -> dict[str, Any]:
        try:
            return self.layout.read_manifest(checked_id(snapshot_id))
        except FileNotFoundError:
            raise SnapshotNotFoundError(snapshot_id) from None
        except ValueError as exc:
            raise SnapshotCorruptError(f"snapshot {snapshot_id!r}: unreadable manifest ({exc})") from exc

    async def get(self, snapshot_id: str) -> Snapshot:
        manifest = await asyncio.to_thread(self._manifest, snapshot_id)
        return self._listed(manifest, snapshot_id)

    def _listed(self, manifest: dict[str, Any], snapshot_id: str) -> Snapshot:
        """The record of a stored manifest of any format (:func:`~.manifests.listed_record`)."""
        return listed_record(manifest, snapshot_id, self.migrations)

    # --- list --------------------------------------------------------------------------------------

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
        filters = ListFilter(subject_kind, subject_id, tag, since, until)
        return paginate(await asyncio.to_thread(self._all), filters, limit=limit, cursor=cursor)

    def _all(self) -> builtins.list[Snapshot]:
        snapshots = []
        for entry in os.scandir(self.layout.snapshots):
            try:
                snapshots.append(self._listed(self.layout.read_manifest(checked_id(entry.name)), entry.name))
            except FileNotFoundError:
                continue  # deleted while listing
            except (ValueError, SnapshotError) as exc:
                logger.warning("snapshot %s is not listable: %s", entry.name, exc)
        return snapshots

    # --- delete, tags, lineage, diff ---------------------------------------------------------------

    async def delete(self, snapshot_id: str) -> bool:
        self._check_writable("delete")
        trash = await asyncio.to_thread(self._unpublish, checked_id(snapshot_id))
        if trash is None:
            return False
        await asyncio.to_thread(_remove, trash)
        return True

    def _unpublish(self, snapshot_id: str) -> Path | None:
        with self.layout.lock("meta"):
            source = self.layout.snapshot_dir(snapshot_id)
            if not os.path.lexists(source):
                return None
            trash = self.layout.new_trash(snapshot_id)
            os.rename(source, trash)
            fsync_dir(self.layout.snapshots)
            return trash

    async def tag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        self._check_writable("tag")
        added = builtins.list(tags)
        return await asyncio.to_thread(self._retag, snapshot_id, lambda old: [*old, *added])

    async def untag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        self._check_writable("untag")
        removed = set(tags)
        return await asyncio.to_thread(
            self._retag, snapshot_id, lambda old: [t for t in old if t not in removed]
        )

    def _retag(self, snapshot_id: str, change: Any) -> Snapshot:
        with self.layout.lock("meta"):
            manifest = self._manifest(snapshot_id)
            manifest["tags"] = builtins.list(normalize_tags(change(manifest.get("tags") or [])))
            write_json_atomically(self.layout.manifest(snapshot_id), manifest)
        return self._listed(manifest, snapshot_id)

    async def lineage(self, snapshot_id: str) -> builtins.list[Snapshot]:
        return await lineage_of(self, checked_id(snapshot_id))

    async def diff(self, a: str, b: str) -> SnapshotDiff:
        return await diff_of(self, checked_id(a), checked_id(b))

    # --- gc ----------------------------------------------------------------------------------------

    async def gc(self, policy: RetentionPolicy | None = None) -> GcReport:
        self._check_writable("gc")
        return await asyncio.to_thread(self._gc, policy or RetentionPolicy())

    def _gc(self, policy: RetentionPolicy) -> GcReport:
        with self.layout.lock("gc"):  # waits for the saves in progress; no new one starts
            doomed = retention_victims(self._all(), policy)
            for snapshot_id in doomed:
                trash = self._unpublish(snapshot_id)
                if trash is not None:
                    _remove(trash)
            staging = 0
            for directory in (self.layout.staging, self.layout.trash):
                for entry in os.scandir(directory):  # abandoned by killed processes
                    _remove(Path(entry.path))
                    staging += directory is self.layout.staging
            referenced = self._referenced()
            oldest = time.time() - policy.grace.total_seconds()
            deleted = freed = kept = 0
            for prefix in os.scandir(self.layout.blobs):
                if not prefix.is_dir(follow_symlinks=False):
                    logger.warning("blobs/%s is not a directory of the store: left alone", prefix.name)
                    continue
                removed, size, left = _collect_blobs(self.layout.root, prefix.name, referenced, oldest)
                deleted, freed, kept = deleted + removed, freed + size, kept + left
        return GcReport(tuple(doomed), deleted, freed, kept, staging)

    def _referenced(self) -> set[str]:
        """The blobs the stored snapshots reference (a snapshot whose references cannot be read
        fails the gc: deleting its blobs could lose them)."""
        referenced: set[str] = set()
        for entry in os.scandir(self.layout.snapshots):
            if not entry.is_dir(follow_symlinks=False):
                continue  # not a snapshot of this store: never listed or loaded
            path = Path(entry.path) / "sections" / "artifacts.jsonl.gz"
            for batch in read_section(path, root=self.layout.root):
                referenced.update(str(parse_line(line).get("blob")) for line in batch)
        return referenced


def _collect_blobs(root: Path, prefix: str, referenced: set[str], oldest: float) -> tuple[int, int, int]:
    """Delete the unreferenced blobs older than ``oldest`` in ``blobs/<prefix>``, a directory
    opened without following links; (deleted, bytes freed, kept)."""
    fd = open_directory(root, ("blobs", prefix))
    deleted = freed = kept = 0
    try:
        for blob in os.scandir(fd):
            status = blob.stat(follow_symlinks=False)
            if blob.name in referenced or status.st_mtime > oldest or stat.S_ISDIR(status.st_mode):
                kept += 1
                continue
            os.unlink(blob.name, dir_fd=fd)  # a link is removed, never what it points to
            deleted += 1
            freed += status.st_size
        os.fsync(fd)
    finally:
        os.close(fd)
    return deleted, freed, kept


def _remove(path: Path) -> None:
    """Remove a directory tree of the store, or a link or file in its place, never following a link."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    shutil.rmtree(path, True)  # never follows links inside (it walks by descriptors)


def names_a_directory(snapshot_id: object) -> bool:
    """Whether ``snapshot_id`` is a valid snapshot id, safe to name a directory."""
    try:
        checked_id(snapshot_id)
    except SnapshotNotFoundError:
        return False
    return True


def _record(manifest: dict[str, Any], snapshot_id: str) -> Snapshot:
    return stored_record(manifest, snapshot_id)


__all__ = ["FileSnapshotStore"]
