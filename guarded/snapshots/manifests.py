"""Records from stored manifests, whatever their format: what ``get`` and ``list`` return in every
backend (the file backend's ``manifest.json``, the PostgreSQL backend's ``manifest`` column)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .migrations import MigrationRegistry, format_version_of
from .record import Snapshot
from .snapshot_errors import MigrationFailedError, SnapshotCorruptError


def stored_record(manifest: dict[str, Any], snapshot_id: str) -> Snapshot:
    """The :class:`Snapshot` of a manifest of the current format, stored under ``snapshot_id``
    (``SnapshotCorruptError`` when it is not one, or names another id)."""
    try:
        snapshot = Snapshot.from_manifest(manifest)
    except ValidationError as exc:
        raise SnapshotCorruptError(
            f"snapshot {snapshot_id!r}: invalid manifest ({exc.error_count()} errors)"
        ) from exc
    if snapshot.id != snapshot_id:
        raise SnapshotCorruptError(f"snapshot {snapshot_id!r} holds snapshot {snapshot.id!r}")
    return snapshot


def listed_record(manifest: dict[str, Any], snapshot_id: str, migrations: MigrationRegistry) -> Snapshot:
    """The record of a stored manifest of any format: an older one's manifest is migrated (its
    ``format_version`` stays the stored one, so a listing shows what ``load`` will migrate); a
    newer one keeps the fields this code knows."""
    version = format_version_of(manifest)
    if version == migrations.current:
        return stored_record(manifest, snapshot_id)
    if version > migrations.current:
        known = {name: manifest[name] for name in Snapshot.model_fields if name in manifest}
        return stored_record(known, snapshot_id)
    migrated = dict(manifest)
    for step in migrations.plan(version):
        try:
            migrated = step.manifest(migrated)
        except Exception as exc:
            raise MigrationFailedError(
                found=version,
                current=migrations.current,
                step_from=step.from_version,
                step_to=step.to_version,
                reason=f"{type(exc).__name__}: {exc}",
            ) from exc
    return stored_record({**migrated, "format_version": version}, snapshot_id)


__all__ = ["listed_record", "stored_record"]
