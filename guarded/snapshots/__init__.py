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
* Everything above is exported here, so a store of your own imports ``guarded.snapshots`` and
  nothing deeper (the file store uses the same helpers): :func:`parse_line` reads a stored line,
  :func:`content_hash` combines section hashes; :class:`SectionCheck` with :func:`declared_of`
  checks a section as it is read, :data:`MAX_LINE_BYTES` bounds a line and
  :data:`BLOB_CHUNK_BYTES` a blob chunk; :class:`ClosingContent` makes a loaded content an async
  context manager; :func:`checked_id` refuses an impossible id before any lookup and
  :func:`normalize_tags` puts tags in their stored form; :func:`format_version_of` reads a stored
  manifest's version and :func:`listed_record` turns a manifest of any version into its record;
  :func:`encode_position` / :func:`decode_cursor` make and read the opaque cursor from a
  ``(created_at, id)`` position, :func:`retention_victims` applies a :class:`RetentionPolicy`;
  :func:`lineage_of` and :func:`diff_of` implement ``lineage`` and ``diff`` over any store.
* Run the contract suite: :func:`guarded.testing.snapshot_contract.run_snapshot_contracts`, or
  subclass :class:`guarded.testing.snapshot_contract.SnapshotStoreContract` with a
  ``snapshot_store`` fixture.
"""

from .capture import capture
from .content import (
    ClosingContent,
    DirectoryContent,
    SnapshotContent,
    SpooledSnapshot,
    content_hash,
    parse_line,
    records,
    verify_content,
)
from .derived import diff_of, lineage_of
from .diff import diff_contents
from .file_store import FileSnapshotStore
from .listing import decode_cursor, encode_position, retention_victims
from .manifests import listed_record
from .migrations import DEFAULT_MIGRATIONS, Migration, MigrationRegistry, format_version_of, migrate
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
    checked_id,
    normalize_tags,
)
from .restore import RestoreReport, restore
from .safe_files import BLOB_CHUNK_BYTES, MAX_LINE_BYTES, SectionCheck, declared_of
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
    # the snapshot-store interface: what a store implementation uses
    "BLOB_CHUNK_BYTES",
    "MAX_LINE_BYTES",
    "ClosingContent",
    "SectionCheck",
    "checked_id",
    "content_hash",
    "declared_of",
    "decode_cursor",
    "diff_of",
    "encode_position",
    "format_version_of",
    "lineage_of",
    "listed_record",
    "normalize_tags",
    "parse_line",
    "retention_victims",
]
