-- Snapshots (guarded.snapshots, issue 17): PostgresSnapshotStore's tables, in the store's schema.
--
-- A snapshot is one `snapshots` row (its record, as the JSON manifest every backend stores) plus
-- its content: `snapshot_lines` holds each section as batches of canonical JSON lines (one row per
-- batch, the lines joined by newlines, exactly the bytes saved), and `snapshot_blob_refs` names
-- the artifact blobs it references. Blobs are content-addressed (SHA-256) and shared by every
-- snapshot: one `snapshot_blobs` row each, its bytes in 1 MiB `snapshot_blob_chunks`. A save is
-- one transaction, so a snapshot is visible in full or not at all; gc deletes blobs no snapshot
-- references under an advisory lock every save holds shared (see backends/postgres/snapshots.py).
CREATE TABLE snapshots (
    id              text COLLATE "C" PRIMARY KEY,   -- listed in Python's order (code points)
    subject_kind    text NOT NULL,
    subject_id      text NOT NULL,
    created_at      timestamptz NOT NULL,
    format_version  integer NOT NULL,
    tags            text[] NOT NULL DEFAULT '{}',
    content_hash    text NOT NULL,
    manifest        json NOT NULL,            -- the record as saved; `tags` above is the live copy
    batches         json NOT NULL,            -- {section: number of snapshot_lines rows}
    saved_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX snapshots_listing ON snapshots (created_at, id);
CREATE INDEX snapshots_subject ON snapshots (subject_kind, subject_id, created_at, id);
CREATE INDEX snapshots_tags ON snapshots USING gin (tags);

CREATE TABLE snapshot_lines (
    snapshot_id  text NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    section      text NOT NULL,
    batch        integer NOT NULL,
    line_count   integer NOT NULL,
    lines        bytea NOT NULL,
    PRIMARY KEY (snapshot_id, section, batch)
);

CREATE TABLE snapshot_blobs (
    digest      text PRIMARY KEY,               -- SHA-256 hex of the blob
    size        bigint NOT NULL,
    chunks      integer NOT NULL,
    touched_at  timestamptz NOT NULL DEFAULT now()   -- last save referencing it; gc's grace
);

CREATE TABLE snapshot_blob_chunks (
    digest  text NOT NULL REFERENCES snapshot_blobs (digest) ON DELETE CASCADE,
    chunk   integer NOT NULL,
    data    bytea NOT NULL,
    PRIMARY KEY (digest, chunk)
);
-- Blob bytes are mostly compressed already (images, archives): store them out of line, uncompressed.
ALTER TABLE snapshot_blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE snapshot_blob_refs (
    snapshot_id  text NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    digest       text NOT NULL REFERENCES snapshot_blobs (digest),
    PRIMARY KEY (snapshot_id, digest)
);
CREATE INDEX snapshot_blob_refs_digest ON snapshot_blob_refs (digest);
