"""The directory of a :class:`~guarded.snapshots.file_store.FileSnapshotStore` and its locks.

::

    <root>/
      snapshots/<id>/manifest.json          the Snapshot record (JSON); written last
      snapshots/<id>/sections/<name>.jsonl.gz   one file per section (gzip JSON lines)
      blobs/<sha256[:2]>/<sha256>           artifact blobs, shared by every snapshot
      staging/<id>.<random>/                a save in progress (or abandoned by a killed process)
      trash/<id>.<random>/                  a deleted snapshot being removed
      locks/meta.lock                       exclusive: publish, delete, tag, untag
      locks/gc.lock                         shared by every save for its whole duration; exclusive by gc

A snapshot is published by one ``rename`` of its complete staging directory into ``snapshots/``
(every file fsynced before, the directory after), so a reader sees all of it or nothing, whatever
kills the writer. Locks are ``flock``s on files under ``locks/`` (POSIX; a local filesystem), taken
in a worker thread; the kernel drops them when their process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .content import fsync_dir, write_file
from .errors import SnapshotStoreNotFoundError


class Layout:
    """Paths of one store directory. ``create``: a missing store is created; otherwise ``root``
    must hold one (:class:`SnapshotStoreNotFoundError`). ``read_only``: nothing is created, not
    even the missing directories of a store an older version or another tool left."""

    def __init__(self, root: Path, *, create: bool = True, read_only: bool = False) -> None:
        self.root = root
        self.snapshots = root / "snapshots"
        self.blobs = root / "blobs"
        self.staging = root / "staging"
        self.trash = root / "trash"
        self.locks = root / "locks"
        if (read_only or not create) and not self.snapshots.is_dir():
            raise SnapshotStoreNotFoundError(str(root))
        if not read_only:
            for directory in (self.snapshots, self.blobs, self.staging, self.trash, self.locks):
                directory.mkdir(parents=True, exist_ok=True)

    def snapshot_dir(self, snapshot_id: str) -> Path:
        return self.snapshots / snapshot_id

    def manifest(self, snapshot_id: str) -> Path:
        return self.snapshots / snapshot_id / "manifest.json"

    def blob(self, digest: str) -> Path:
        return self.blobs / digest[:2] / digest

    def new_staging(self, snapshot_id: str) -> Path:
        path = self.staging / f"{snapshot_id}.{uuid.uuid4().hex}"
        (path / "sections").mkdir(parents=True)
        return path

    def new_trash(self, snapshot_id: str) -> Path:
        return self.trash / f"{snapshot_id}.{uuid.uuid4().hex}"

    @contextlib.contextmanager
    def lock(self, name: str, *, shared: bool = False) -> Iterator[None]:
        """Hold ``locks/<name>.lock`` (blocking; call from a worker thread)."""
        fd = os.open(self.locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file (``FileNotFoundError`` when missing, ``ValueError`` when not an object)."""
    value = json.loads(path.read_bytes())
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return value


def write_json_atomically(path: Path, value: dict[str, Any]) -> None:
    """Replace ``path`` with ``value``: temporary file, fsync, rename, fsync of the directory."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        write_file(temporary, json.dumps(value, ensure_ascii=False, sort_keys=True, indent=1).encode("utf-8"))
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    fsync_dir(path.parent)


__all__ = ["Layout", "read_json", "write_json_atomically"]
