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

The directory may come from an untrusted source, so nothing below ``<root>`` is followed when it
is a symbolic link: the directories above are checked when the store opens, and every path below
is walked one component at a time with ``O_NOFOLLOW`` (:mod:`.safe_files`); blob names are
content addresses only.

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
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .content import fsync_dir, write_file
from .safe_files import checked_digest, open_directory, read_small_file
from .snapshot_errors import SnapshotStoreNotFoundError, UnsafeSnapshotFileError


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
        for directory in (self.snapshots, self.blobs, self.staging, self.trash, self.locks):
            if not read_only:
                directory.mkdir(parents=True, exist_ok=True)
            try:
                mode = os.lstat(directory).st_mode
            except FileNotFoundError:
                continue  # read-only: a directory the store never needed yet
            if not stat.S_ISDIR(mode):
                raise UnsafeSnapshotFileError(
                    directory.name, "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
                )

    def snapshot_dir(self, snapshot_id: str) -> Path:
        return self.snapshots / snapshot_id

    def manifest(self, snapshot_id: str) -> Path:
        return self.snapshots / snapshot_id / "manifest.json"

    def blob(self, digest: str) -> Path:
        """The file of blob ``digest`` (:class:`~.errors.InvalidBlobNameError` unless a content address)."""
        return self.blobs / checked_digest(digest)[:2] / digest

    def read_manifest(self, snapshot_id: str) -> dict[str, Any]:
        """The manifest of ``snapshot_id`` (an id already checked), read confined and bounded
        (``FileNotFoundError`` when missing, ``ValueError`` when not a JSON object)."""
        return _json_object(read_small_file(self.root, self.manifest(snapshot_id)), "manifest.json")

    def has_blob(self, digest: str) -> bool:
        """Whether blob ``digest`` is stored; refreshes its time (``gc``'s grace counts from it).
        A non-regular entry under its name (a link, a FIFO) is removed: a save replaces it."""
        try:
            prefix = open_directory(self.root, ("blobs", digest[:2]))
        except FileNotFoundError:
            return False
        try:
            mode = os.lstat(digest, dir_fd=prefix).st_mode
            if stat.S_ISREG(mode):
                os.utime(digest, dir_fd=prefix, follow_symlinks=False)
                return True
            if stat.S_ISDIR(mode):
                raise UnsafeSnapshotFileError(f"blobs/{digest[:2]}/{digest}", "a directory")
            os.unlink(digest, dir_fd=prefix)
            return False
        except FileNotFoundError:
            return False
        finally:
            os.close(prefix)

    def install_blob(self, temporary: Path, digest: str) -> None:
        """Move ``temporary`` (a verified, fsynced blob file) into place as blob ``digest``."""
        blobs = open_directory(self.root, ("blobs",))
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(digest[:2], dir_fd=blobs)
        finally:
            os.close(blobs)
        prefix = open_directory(self.root, ("blobs", digest[:2]))
        try:
            os.replace(
                temporary, digest, dst_dir_fd=prefix
            )  # same content, same name: a racing writer is harmless
            os.fsync(prefix)
        finally:
            os.close(prefix)

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


def _json_object(data: bytes, name: str) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not a JSON object")
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


__all__ = ["Layout", "write_json_atomically"]
