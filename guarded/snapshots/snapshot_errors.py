"""The errors of :mod:`guarded.snapshots`; every one is a :class:`SnapshotError`.

Format-version errors name the versions involved, so an operator reading the message knows which
migration to write or which release to upgrade to. Nothing is ever half loaded: a load raises one
of these before it returns anything.
"""

from __future__ import annotations

from ..errors import GuardedError


class SnapshotError(GuardedError):
    """Base class of every snapshot error."""


def shortened(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (with the full length): hostile input can be long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class SnapshotNotFoundError(SnapshotError, LookupError):
    """No snapshot has this id (never saved, or deleted)."""

    def __init__(self, snapshot_id: str) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(f"no snapshot {snapshot_id!r}")


class SnapshotStoreNotFoundError(SnapshotError, LookupError):
    """A file snapshot store opened without creating it (read-only, or ``create=False``) names a
    directory that is not one: missing, or without a store's ``snapshots/`` directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        super().__init__(f"no snapshot store at {root!r}")


class SnapshotStoreReadOnlyError(SnapshotError):
    """A writing method (save, delete, tag, untag, gc) of a snapshot store opened read-only."""


class InvalidSnapshotIdError(SnapshotNotFoundError):
    """A snapshot id that no snapshot can have (see ``SNAPSHOT_ID_PATTERN``): refused before any
    file or row is looked up."""

    def __init__(self, snapshot_id: object) -> None:
        super().__init__(str(snapshot_id))
        self.args = (
            f"{shortened(snapshot_id)} is not a snapshot id (letters, digits, '.', '_', '-'; 128 at most)",
        )


class SnapshotConflictError(SnapshotError):
    """A snapshot with this id is already saved with other content (a save is idempotent only for
    the same content)."""

    def __init__(self, snapshot_id: str) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(f"snapshot {snapshot_id!r} is already saved with different content")


class SnapshotCorruptError(SnapshotError):
    """Stored content does not match its record (hash, counts, a missing blob or section)."""


class SectionMismatchError(SnapshotCorruptError):
    """A section read back differs from what its manifest declares: ``what`` is ``"hash"``,
    ``"records"`` or ``"bytes"``, ``declared`` and ``found`` the two values (a truncated or
    unreadable section is reported with what was read before it ended)."""

    def __init__(self, snapshot_id: str, section: str, what: str, declared: object, found: object) -> None:
        self.snapshot_id = snapshot_id
        self.section = section
        self.what = what
        super().__init__(
            f"snapshot {snapshot_id!r}: section {section} does not match its manifest: "
            f"{what} {found} read, {declared} declared"
        )


class BlobMismatchError(SnapshotCorruptError):
    """An artifact blob differs from what the snapshot declares: ``what`` is ``"hash"`` or
    ``"bytes"`` (its size), or ``"missing"``."""

    def __init__(self, digest: str, what: str, declared: object = None, found: object = None) -> None:
        self.digest = digest
        self.what = what
        if what == "missing":
            detail = "is missing"
        elif what == "hash":
            detail = f"does not match its hash: {found} read"
        else:
            detail = f"does not match its size: {found} bytes found, {declared} declared"
        super().__init__(f"artifact blob {digest} {detail}")


class InvalidBlobNameError(SnapshotCorruptError):
    """An ``artifacts`` record names its blob with something other than a content address (64
    lowercase hexadecimal digits): a path, a device, anything that could lead out of the store."""

    def __init__(self, name: object) -> None:
        self.name = name
        super().__init__(
            f"artifact blob name {shortened(name)} is not a content address (64 lowercase hex digits)"
        )


class UnsafeSnapshotFileError(SnapshotCorruptError):
    """A file or directory of the store is not what it must be (a symbolic link, a FIFO, a device,
    a socket...): it is neither followed nor opened. ``path`` is relative to the store."""

    def __init__(self, path: str, kind: str) -> None:
        self.path = path
        self.kind = kind
        super().__init__(f"{path} is {kind}, not a regular file or directory of the store: refused")


class SnapshotTooLargeError(SnapshotCorruptError):
    """A read would go past a limit (a line's length, a manifest's size, a section's expansion
    from its compressed size): refused before it is held in memory."""


class InvalidCursorError(SnapshotError, ValueError):
    """A ``list`` cursor this store did not hand out."""


class FormatVersionError(SnapshotError):
    """A snapshot's format version cannot be loaded by this code.

    ``found`` is the snapshot's version, ``current`` the version this code writes.
    """

    def __init__(self, message: str, *, found: int, current: int) -> None:
        self.found = found
        self.current = current
        super().__init__(message)


class FormatTooNewError(FormatVersionError):
    """The snapshot was written by newer code (format ``found`` > ``current``): upgrade guarded."""

    def __init__(self, *, found: int, current: int) -> None:
        super().__init__(
            f"snapshot format version {found} is newer than this code's {current}: "
            "upgrade guarded to load it",
            found=found,
            current=current,
        )


class MissingMigrationError(FormatVersionError):
    """No registered migration leads from format ``missing_from`` towards ``current``."""

    def __init__(self, *, found: int, current: int, missing_from: int) -> None:
        self.missing_from = missing_from
        super().__init__(
            f"snapshot format version {found} cannot be migrated to {current}: "
            f"no migration registered from version {missing_from}",
            found=found,
            current=current,
        )


class MigrationFailedError(FormatVersionError):
    """The migration from ``step_from`` to ``step_to`` raised (the cause is chained); nothing was
    loaded."""

    def __init__(self, *, found: int, current: int, step_from: int, step_to: int, reason: str) -> None:
        self.step_from = step_from
        self.step_to = step_to
        super().__init__(
            f"migrating snapshot format version {found} to {current} failed at step "
            f"{step_from} -> {step_to}: {reason}",
            found=found,
            current=current,
        )


class SnapshotStoreUnavailableError(SnapshotError, ConnectionError):
    """A guarded snapshot store could not answer (the backend failed, timed out or its circuit is
    open) and had no stale answer to give: nothing was saved, deleted or collected by this call
    unless its answer was lost (``save`` again: it is idempotent; ``get`` tells after a ``delete``).
    The backend's error is chained."""

    def __init__(self, method: str, reason: str) -> None:
        self.method = method
        super().__init__(f"the snapshot store could not answer {method}: {reason}")


class SnapshotStagingError(SnapshotStoreUnavailableError):
    """A guarded save the backend could not take could not be held either: its content could not
    be staged on local disk (a full or unwritable disk, an unreadable source) or its call could not
    be kept in the dead-letter buffer. Nothing was saved or held: save again. The staging failure
    is chained (``__cause__``); the backend's failure is named in the message."""

    def __init__(self, snapshot_id: str, backend_failure: str, failure: str) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(
            "save",
            f"{backend_failure}; and snapshot {snapshot_id!r} could not be staged to be held "
            f"({failure}): nothing was saved or held",
        )


__all__ = [
    "BlobMismatchError",
    "InvalidBlobNameError",
    "InvalidSnapshotIdError",
    "SectionMismatchError",
    "SnapshotTooLargeError",
    "UnsafeSnapshotFileError",
    "FormatTooNewError",
    "FormatVersionError",
    "InvalidCursorError",
    "MigrationFailedError",
    "MissingMigrationError",
    "SnapshotConflictError",
    "SnapshotCorruptError",
    "SnapshotError",
    "SnapshotNotFoundError",
    "SnapshotStagingError",
    "SnapshotStoreNotFoundError",
    "SnapshotStoreReadOnlyError",
    "SnapshotStoreUnavailableError",
]
