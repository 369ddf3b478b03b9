"""The records of :mod:`guarded.snapshots`: :class:`Snapshot` and what the store methods return.

A snapshot's *content* is a fixed list of sections (:data:`SECTIONS`), each a sequence of JSON
objects (the records of :mod:`guarded.codec`), plus the artifact blobs the ``artifacts`` section
references by SHA-256. :class:`Snapshot` is the record *about* that content: who it is of, when,
how big, and the hash that identifies the content.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..codec import JSONObject
from .snapshot_errors import InvalidSnapshotIdError

FORMAT_VERSION = 2
"""The format version this code writes (see :mod:`guarded.snapshots.migrations`)."""

SNAPSHOT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""What a snapshot id may be: letters, digits, ``.``, ``_`` and ``-``, 128 at most, safe as a file name."""

_SNAPSHOT_ID = re.compile(SNAPSHOT_ID_PATTERN)


def checked_id(snapshot_id: object) -> str:
    """``snapshot_id`` when a snapshot can have it (:data:`SNAPSHOT_ID_PATTERN`); else
    :class:`~guarded.snapshots.snapshot_errors.InvalidSnapshotIdError`, before any file or row is
    looked up."""
    if not isinstance(snapshot_id, str) or _SNAPSHOT_ID.fullmatch(snapshot_id) is None:
        raise InvalidSnapshotIdError(snapshot_id)
    return snapshot_id


SubjectKind = Literal["session", "trace"]
"""What a snapshot is of: everything a store holds for one session, or for one trace."""

SECTIONS: tuple[str, ...] = (
    "events",
    "planner_events",
    "trajectories",
    "memory",
    "tasks",
    "updates",
    "steering",
    "bindings",
    "pauses",
    "artifacts",
)
"""The sections of a snapshot's content, in the order they are hashed, written and restored.

Each line is a canonical JSON object (:func:`guarded.snapshots.content.canonical`):

* ``events``: a :data:`~guarded.codec.STORED_EVENT` (its ``trace_id`` says which trace);
* ``planner_events``: ``{"trace_id", "event": PLANNER_EVENT}``, emission order per trace;
* ``trajectories``: ``{"trace_id", "session_id", "trajectory": envelope}``, oldest save first;
* ``memory``: ``{"key", "state"}``;
* ``tasks``: a :data:`~guarded.codec.TASK_STATE`;
* ``updates`` / ``steering``: a ``STATE_UPDATE`` / ``STEERING_EVENT``, oldest first;
* ``bindings``: a ``REMOTE_BINDING``;
* ``pauses``: ``{"token", "payload"}`` (only when a capture was asked for pauses);
* ``artifacts``: ``{"ref": ARTIFACT_REF, "blob": sha256 hex, "size": bytes}``.
"""


def normalize_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """Tags as a snapshot keeps them: unique and sorted; ``ValueError`` for an empty one or one with
    surrounding whitespace."""
    found = tuple(tags)
    for tag in found:
        if not isinstance(tag, str) or not tag or tag != tag.strip():
            raise ValueError("a tag is a non-empty string without surrounding whitespace")
    return tuple(sorted(set(found)))


class Snapshot(BaseModel):
    """What is known about one saved snapshot (its content is read through a store's ``load``).

    ``counts`` and ``sizes`` are per section (every name of :data:`SECTIONS`): records, and bytes
    of canonical JSON (for ``artifacts``: bytes of the blobs). ``content_hash`` is the SHA-256 of
    the content (:func:`guarded.snapshots.content.content_hash`): two snapshots with the same
    hash hold the same state. ``tags`` and ``description`` may change after the save (``tag``,
    ``untag``); nothing else does.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=SNAPSHOT_ID_PATTERN)
    subject_kind: SubjectKind
    subject_id: str = Field(min_length=1)
    created_at: datetime
    format_version: int = FORMAT_VERSION
    tags: tuple[str, ...] = ()
    description: str = ""
    parent_id: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    sizes: dict[str, int] = Field(default_factory=dict)
    section_hashes: dict[str, str] = Field(default_factory=dict)
    content_hash: str = ""

    @field_validator("tags")
    @classmethod
    def _sorted_tags(cls, tags: tuple[str, ...]) -> tuple[str, ...]:
        return normalize_tags(tags)

    @field_validator("created_at")
    @classmethod
    def _aware(cls, created_at: datetime) -> datetime:
        if created_at.tzinfo is None or created_at.utcoffset() != timedelta(0):
            raise ValueError("created_at must be an aware UTC datetime")
        return created_at

    @property
    def total_bytes(self) -> int:
        """Bytes of every section, artifact blobs included."""
        return sum(self.sizes.values())

    def with_tags(self, tags: Iterable[str]) -> Snapshot:
        """A copy with ``tags`` instead of the current ones."""
        return self.model_copy(update={"tags": normalize_tags(tags)})

    def manifest(self) -> JSONObject:
        """The JSON form stored beside the content."""
        data: JSONObject = self.model_dump(mode="json")
        return data

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> Snapshot:
        """Rebuild from :meth:`manifest` (pydantic's ``ValidationError`` for anything else)."""
        return cls.model_validate(dict(data))


@dataclass(frozen=True, slots=True)
class SnapshotPage:
    """One page of :meth:`SnapshotStore.list`: oldest first; ``next_cursor`` is ``None`` on the last."""

    items: tuple[Snapshot, ...]
    next_cursor: str | None = None


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which snapshots :meth:`SnapshotStore.gc` deletes before it removes unreferenced blobs.

    ``max_age``: snapshots created longer ago are deleted. ``keep_last``: per subject, only the
    newest ``keep_last`` are kept. Tagged snapshots are never deleted by retention when
    ``keep_tagged`` (the default). ``grace``: a blob younger than this is never removed (the file
    backend needs none: its ``gc`` waits for every save in progress, through a lock).
    ``None`` disables a rule; the default policy deletes no snapshot.
    """

    max_age: timedelta | None = None
    keep_last: int | None = None
    keep_tagged: bool = True
    grace: timedelta = timedelta(0)


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :meth:`SnapshotStore.gc` removed."""

    snapshots_deleted: tuple[str, ...] = ()
    blobs_deleted: int = 0
    bytes_freed: int = 0
    blobs_kept: int = 0
    staging_removed: int = 0


@dataclass(frozen=True, slots=True)
class Change:
    """One key whose value differs between two snapshots; ``None`` where it is absent."""

    key: str
    before: Any
    after: Any


DIFF_FIELDS = (
    "events_added",
    "events_removed",
    "planner_events_added",
    "updates_added",
    "steering_added",
    "memory_changed",
    "tasks_changed",
    "trajectories_changed",
    "bindings_changed",
    "pauses_changed",
    "artifacts_added",
    "artifacts_removed",
)
"""The fields of :class:`SnapshotDiff` that list changed records, in the order they are shown."""


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """What changed from snapshot ``a`` to snapshot ``b`` (records as their JSON objects).

    Appended logs (events, planner events, updates, steering) are compared as multisets:
    ``*_added`` holds what ``b`` has beyond ``a``, ``*_removed`` what ``a`` had that ``b`` lacks
    (a store's bound dropped it, or the snapshots are of different states). Keyed state (memory by
    key, tasks by ``task_id``, trajectories by trace, bindings by ``(trace, context, task)``,
    pauses by token) is reported as :class:`Change` records. Artifacts are compared by id.
    """

    a: str
    b: str
    events_added: tuple[JSONObject, ...] = ()
    events_removed: tuple[JSONObject, ...] = ()
    planner_events_added: tuple[JSONObject, ...] = ()
    updates_added: tuple[JSONObject, ...] = ()
    steering_added: tuple[JSONObject, ...] = ()
    memory_changed: tuple[Change, ...] = ()
    tasks_changed: tuple[Change, ...] = ()
    trajectories_changed: tuple[Change, ...] = ()
    bindings_changed: tuple[Change, ...] = ()
    pauses_changed: tuple[Change, ...] = ()
    artifacts_added: tuple[JSONObject, ...] = ()
    artifacts_removed: tuple[JSONObject, ...] = ()
    removed: dict[str, int] = field(default_factory=dict)
    """Counts of records of ``a``'s append-only sections missing from ``b`` (other than events)."""

    @property
    def empty(self) -> bool:
        """Whether the two snapshots hold the same state."""
        return not any(getattr(self, name) for name in (*DIFF_FIELDS, "removed"))


__all__ = [
    "DIFF_FIELDS",
    "FORMAT_VERSION",
    "SECTIONS",
    "SNAPSHOT_ID_PATTERN",
    "Change",
    "GcReport",
    "RetentionPolicy",
    "Snapshot",
    "SnapshotDiff",
    "SnapshotPage",
    "SubjectKind",
    "checked_id",
    "normalize_tags",
]
