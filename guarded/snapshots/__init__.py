"""Snapshots: versioned, tagged, diffable checkpoints of what a StateStore holds for one session or
trace (spec 004, "State Recovery System"; its pipeline replay engine is out of scope).

.. code-block:: python

    from guarded.snapshots import FileSnapshotStore, capture, restore

    snapshots = FileSnapshotStore("/var/lib/agent-snapshots")
    async with await capture(production_store, session_id="s-42", tags=["before-migration"]) as captured:
        record = await snapshots.save(captured)
    ...
    async with await snapshots.load(record.id) as content:
        await restore(content, staging_store)           # any StateStore; twice is the same as once
        await restore(content, production_store, rollback=True)  # newer data wins unless rolling back

Pieces, one job each:

* :mod:`.record`: :class:`Snapshot` (the record), :data:`SECTIONS`, pages, diffs, retention;
* :mod:`.content`: :class:`SnapshotContent` (a snapshot's content as batches of canonical JSON
  lines per section, plus blobs by SHA-256) and its local files;
* :mod:`.capture` / :mod:`.restore`: to and from any StateStore through its public methods;
* :mod:`.protocol`: :class:`SnapshotStore`, what every backend offers;
* :mod:`.file_store`: :class:`FileSnapshotStore`, one directory, safe for concurrent processes
  (its files and locks: :mod:`.file_layout`);
* :mod:`.listing`: the filter, paging, cursor and retention rules every backend shares;
* :mod:`.migrations`: format versions and the migrations between them (loading fails loudly);
* :mod:`.diff`: what changed between two snapshots;
* :mod:`.errors`: every error, all :class:`SnapshotError`.

**Writing a backend** (PostgreSQL, object storage, ...): implement :class:`SnapshotStore`.

* ``save(content)`` consumes ``content.lines(section)`` for every name of :data:`SECTIONS` and
  ``content.read_blob(digest)`` for every ``blob`` the ``artifacts`` section names, stores lines as
  they are (bytes in, the same bytes out) and publishes the snapshot atomically (one transaction,
  or one rename). Re-hash what you store with :class:`~.content.SectionWriter` or
  ``hashlib.sha256`` over ``line + b"\\n"`` and compare with ``snapshot.section_hashes`` and
  :func:`~.content.content_hash`: refuse a mismatch with :class:`SnapshotCorruptError`. The same id
  saved again with the same ``content_hash`` returns the stored record; with another,
  :class:`SnapshotConflictError`.
* ``load(id)`` returns a :class:`SnapshotContent` whose ``lines`` give back the stored lines,
  checked against the record as they are read (:class:`~.safe_files.SectionCheck`), every read
  bounded: what you store may have been written by anyone (:mod:`.safe_files`).
  Read ``format_version`` first: for an older one call :func:`~.migrations.migrate` with your
  section reader (it spools the migrated content locally and raises the format errors); never
  hand out a partly migrated content.
* ``list`` filters by subject, tag and time range and pages with an opaque cursor, oldest first
  (``created_at``, then id); ``tag``/``untag`` change only tags; ``lineage`` follows
  ``parent_id``; ``diff`` may simply call :func:`diff_contents` on two loads; ``gc`` applies the
  :class:`RetentionPolicy` then deletes blobs no snapshot references, never one a save in progress
  is about to reference (the file backend holds a lock; a database would use a transaction).
* Run the contract suite: :func:`guarded.testing.snapshot_contract.run_snapshot_contracts`, or
  subclass :class:`guarded.testing.snapshot_contract.SnapshotStoreContract` with a
  ``snapshot_store`` fixture.
"""

from .capture import capture
from .content import DirectoryContent, SnapshotContent, SpooledSnapshot, records, verify_content
from .diff import diff_contents
from .file_store import FileSnapshotStore
from .migrations import DEFAULT_MIGRATIONS, Migration, MigrationRegistry, migrate
from .record import (
    FORMAT_VERSION,
    SECTIONS,
    Change,
    GcReport,
    RetentionPolicy,
    Snapshot,
    SnapshotDiff,
    SnapshotPage,
    SubjectKind,
)
from .restore import RestoreReport, restore
from .snapshot_errors import (
    BlobMismatchError,
    FormatTooNewError,
    FormatVersionError,
    InvalidBlobNameError,
    InvalidCursorError,
    InvalidSnapshotIdError,
    MigrationFailedError,
    MissingMigrationError,
    SectionMismatchError,
    SnapshotConflictError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotStagingError,
    SnapshotStoreNotFoundError,
    SnapshotStoreReadOnlyError,
    SnapshotStoreUnavailableError,
    SnapshotTooLargeError,
    UnsafeSnapshotFileError,
)
from .snapshot_store import SnapshotStore

__all__ = [
    "verify_content",
    "UnsafeSnapshotFileError",
    "SnapshotTooLargeError",
    "SectionMismatchError",
    "InvalidSnapshotIdError",
    "InvalidBlobNameError",
    "BlobMismatchError",
    "DEFAULT_MIGRATIONS",
    "FORMAT_VERSION",
    "SECTIONS",
    "Change",
    "DirectoryContent",
    "FileSnapshotStore",
    "FormatTooNewError",
    "FormatVersionError",
    "GcReport",
    "InvalidCursorError",
    "Migration",
    "MigrationFailedError",
    "MigrationRegistry",
    "MissingMigrationError",
    "RestoreReport",
    "RetentionPolicy",
    "Snapshot",
    "SnapshotConflictError",
    "SnapshotContent",
    "SnapshotCorruptError",
    "SnapshotDiff",
    "SnapshotError",
    "SnapshotNotFoundError",
    "SnapshotPage",
    "SnapshotStore",
    "SnapshotStagingError",
    "SnapshotStoreNotFoundError",
    "SnapshotStoreReadOnlyError",
    "SnapshotStoreUnavailableError",
    "SpooledSnapshot",
    "SubjectKind",
    "capture",
    "diff_contents",
    "migrate",
    "records",
    "restore",
]
