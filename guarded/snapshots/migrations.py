"""Snapshot format versions and the migrations between them; loading fails loudly, never partly.

A backend reads a stored snapshot's ``format_version`` before anything else:

* the current version (:data:`~guarded.snapshots.record.FORMAT_VERSION`) loads as is;
* a newer one raises :class:`~guarded.snapshots.snapshot_errors.FormatTooNewError`;
* an older one is migrated by :func:`migrate`, step by step (``v -> v+1``) through the
  :class:`Migration` records of a :class:`MigrationRegistry`, into a local spool: a missing step
  raises :class:`~guarded.snapshots.snapshot_errors.MissingMigrationError` before any work, and a step
  that raises (on the manifest or on any record) raises
  :class:`~guarded.snapshots.snapshot_errors.MigrationFailedError`, naming the versions; the spool is then
  removed and nothing is returned. The stored snapshot is never rewritten.

A migration changes the manifest (a JSON object) and maps each record of a section to records of
the next format's sections (none, one or several), so it streams. Counts, sizes and hashes are
recomputed from the migrated content.

Format history:

* **1**: ``subject`` was one string ``"<kind>:<id>"``; updates and steering shared one section,
  ``session_log``, each line ``{"type": "update" | "steering", "record": {...}}``; no sizes or
  hashes in the manifest.
* **2** (current): ``subject_kind`` and ``subject_id``; ``updates`` and ``steering`` are
  sections of their own; per-section sizes and hashes and a content hash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..codec import JSONObject
from .content import SpooledSnapshot, SpoolWriter, canonical, parse_line
from .record import FORMAT_VERSION, SECTIONS
from .snapshot_errors import FormatTooNewError, MigrationFailedError, MissingMigrationError

RecordStep = Callable[[str, JSONObject], Iterable[tuple[str, JSONObject]]]
"""Maps one record of a section to ``(section, record)`` pairs of the next format."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One step from ``from_version`` to ``from_version + 1``.

    ``sections`` are the section names of the *source* format; ``manifest`` maps the stored
    manifest; ``record`` maps each record.
    """

    from_version: int
    sections: tuple[str, ...]
    manifest: Callable[[JSONObject], JSONObject]
    record: RecordStep

    @property
    def to_version(self) -> int:
        return self.from_version + 1


class MigrationRegistry:
    """The migrations a backend runs, by source version; ``current`` is the version they lead to."""

    def __init__(self, migrations: Iterable[Migration] = (), *, current: int = FORMAT_VERSION) -> None:
        self.current = current
        self._steps: dict[int, Migration] = {}
        for migration in migrations:
            self.register(migration)

    def register(self, migration: Migration) -> None:
        """Add a step; one per source version."""
        if migration.from_version in self._steps:
            raise ValueError(
                f"a migration from format version {migration.from_version} is already registered"
            )
        self._steps[migration.from_version] = migration

    def plan(self, found: int) -> list[Migration]:
        """The steps from ``found`` to :attr:`current`; raises the format errors."""
        if found > self.current:
            raise FormatTooNewError(found=found, current=self.current)
        steps = []
        for version in range(found, self.current):
            step = self._steps.get(version)
            if step is None:
                raise MissingMigrationError(found=found, current=self.current, missing_from=version)
            steps.append(step)
        return steps


def format_version_of(manifest: Mapping[str, Any]) -> int:
    """The ``format_version`` of a stored manifest (``MigrationFailedError`` when unreadable)."""
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise MigrationFailedError(
            found=0,
            current=FORMAT_VERSION,
            step_from=0,
            step_to=FORMAT_VERSION,
            reason=f"the manifest has no valid format_version ({type(version).__name__})",
        )
    return version


SectionLines = Callable[[str], AsyncIterator[list[bytes]]]
"""How :func:`migrate` reads a stored section of the old format: batches of its lines."""


async def migrate(
    manifest: JSONObject, lines: SectionLines, registry: MigrationRegistry, *, spool_dir: Path | None = None
) -> SpooledSnapshot:
    """Migrate a stored snapshot of an older format into a spooled one of ``registry.current``.

    Raises the format errors of :meth:`MigrationRegistry.plan`, or
    :class:`MigrationFailedError` when a step fails; nothing is left behind then.
    """
    found = format_version_of(manifest)
    steps = registry.plan(found)
    current = registry.current
    if not steps:
        raise ValueError(f"format version {found} is current: there is nothing to migrate")

    def failure(step: Migration, exc: BaseException) -> MigrationFailedError:
        error = MigrationFailedError(
            found=found,
            current=current,
            step_from=step.from_version,
            step_to=step.to_version,
            reason=f"{type(exc).__name__}: {exc}",
        )
        error.__cause__ = exc
        return error

    migrated = dict(manifest)
    for step in steps:
        try:
            migrated = step.manifest(dict(migrated))
        except Exception as exc:
            raise failure(step, exc) from exc
    writer = SpoolWriter(spool_dir)
    try:
        for section in steps[0].sections:
            async for batch in lines(section):
                for line in batch:
                    pending: list[tuple[str, JSONObject]] = [(section, parse_line(line))]
                    for step in steps:
                        try:
                            pending = [out for name, record in pending for out in step.record(name, record)]
                        except Exception as exc:
                            raise failure(step, exc) from exc
                    for name, record in pending:
                        if name not in SECTIONS:
                            raise failure(steps[-1], ValueError(f"a record of unknown section {name!r}"))
                        await writer.add_line(name, canonical(record))
        try:
            fields: dict[str, Any] = {
                name: migrated[name]
                for name in (
                    "id",
                    "subject_kind",
                    "subject_id",
                    "created_at",
                    "tags",
                    "description",
                    "parent_id",
                )
                if name in migrated
            }
            if isinstance(fields.get("created_at"), str):
                fields["created_at"] = datetime.fromisoformat(str(fields["created_at"]))
            return await writer.finish(**fields, format_version=current)
        except (ValidationError, TypeError, ValueError) as exc:
            raise failure(steps[-1], exc) from exc
    except BaseException:
        writer.abandon()
        raise


# --- the migrations of this code ------------------------------------------------------------------

V1_SECTIONS = (
    "events",
    "planner_events",
    "trajectories",
    "memory",
    "tasks",
    "session_log",
    "bindings",
    "pauses",
    "artifacts",
)
"""The sections of format 1."""


def _v1_manifest(manifest: JSONObject) -> JSONObject:
    subject = manifest.pop("subject")
    if not isinstance(subject, str) or ":" not in subject:
        raise ValueError("format 1 'subject' must be '<kind>:<id>'")
    kind, _, subject_id = subject.partition(":")
    manifest.update(subject_kind=kind, subject_id=subject_id, format_version=2)
    for stale in ("counts", "sizes", "section_hashes", "content_hash"):
        manifest.pop(stale, None)
    return manifest


def _v1_record(section: str, record: JSONObject) -> Iterable[tuple[str, JSONObject]]:
    if section != "session_log":
        return [(section, record)]
    kind = record.get("type")
    inner = record.get("record")
    if kind not in ("update", "steering") or not isinstance(inner, dict):
        raise ValueError(
            "a format 1 session_log line must be {'type': 'update' | 'steering', 'record': {...}}"
        )
    return [("updates" if kind == "update" else "steering", inner)]


V1_TO_V2 = Migration(from_version=1, sections=V1_SECTIONS, manifest=_v1_manifest, record=_v1_record)
"""Format 1 -> 2: split ``subject`` and the ``session_log`` section."""

DEFAULT_MIGRATIONS = MigrationRegistry([V1_TO_V2])
"""The registry backends use unless given another."""


__all__ = [
    "DEFAULT_MIGRATIONS",
    "V1_SECTIONS",
    "V1_TO_V2",
    "Migration",
    "MigrationRegistry",
    "RecordStep",
    "SectionLines",
    "format_version_of",
    "migrate",
]
