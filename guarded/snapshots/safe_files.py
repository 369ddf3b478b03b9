"""Reading a snapshot directory as untrusted input: confined, typed, bounded and verified.

A snapshot directory may come from anywhere (another operator, a ticket attachment), so every file
is opened as hostile input:

* **confined**: a path is walked one component at a time from a trusted directory (the store's
  root, a spool's directory) with ``O_NOFOLLOW``, so no symbolic link is followed, at any depth;
* **typed**: only regular files are opened (checked before opening, then on the open descriptor:
  a FIFO, a device or a socket is refused, never read, and never blocks: ``O_NONBLOCK``);
* **bounded**: a section is decompressed a chunk at a time, with caps on a line's length
  (:data:`MAX_LINE_BYTES`), on its expansion from its compressed size (:data:`MAX_EXPANSION`) and on what
  its manifest declares; a manifest on its size (:data:`MAX_MANIFEST`); a blob on its declared size;
* **verified as it is read**: a section's records, bytes and SHA-256 against its manifest
  (:class:`SectionCheck`), a blob's size and SHA-256 against its name and record.

Every refusal is a :class:`~guarded.snapshots.snapshot_errors.SnapshotCorruptError` naming the file and the
cause.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from .record import Snapshot
from .snapshot_errors import (
    BlobMismatchError,
    InvalidBlobNameError,
    SectionMismatchError,
    SnapshotCorruptError,
    SnapshotTooLargeError,
    UnsafeSnapshotFileError,
)

MAX_LINE_BYTES = 16 << 20
"""Bytes a section line may hold: a longer one is refused when read, and when written."""
MAX_EXPANSION = 256
"""Times its compressed size a section may decompress to (above :data:`EXPANSION_ALLOWANCE`).
Sections are written at gzip level 3, which compresses the most compressible input (one repeated
byte) 229 times: a section this code wrote never reaches it; a bomb (up to 1,032 times) does."""
EXPANSION_ALLOWANCE = 1 << 20
"""Decompressed bytes any section may hold whatever its compressed size (small sections)."""
MAX_MANIFEST = 4 << 20
"""Bytes a manifest may hold."""
BATCH = 2_000
"""Lines per batch read from or written to a section file."""
BATCH_BYTES = 4 << 20
"""A batch ends before it holds more bytes than this (or :data:`BATCH` lines)."""
BLOB_CHUNK_BYTES = 1 << 20
"""Bytes per read of a blob."""
_READ = 64 << 10
_INFLATE = 256 << 10
"""Decompressed bytes per step of a section."""
_GZIP = 16 + zlib.MAX_WBITS
_DIGEST = re.compile(r"[0-9a-f]{64}")


def checked_digest(name: object) -> str:
    """``name`` when it is a content address (a SHA-256 in lowercase hex); else
    :class:`InvalidBlobNameError` (a path, a device, anything that could lead out of a store)."""
    if not isinstance(name, str) or _DIGEST.fullmatch(name) is None:
        raise InvalidBlobNameError(name)
    return name


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _relative(root: Path, path: Path) -> tuple[str, ...]:
    parts = path.relative_to(root).parts  # ValueError: a path this code built outside its root
    if not parts or any(part in ("..", ".") for part in parts):
        raise ValueError(f"{path} is not a file under {root}")
    return parts


def open_directory(root: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of directory ``root/parts...``, no component of ``parts`` followed when it is a
    symbolic link (:class:`UnsafeSnapshotFileError`); ``FileNotFoundError`` when missing."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(parts):
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                mode = os.lstat(name, dir_fd=fd).st_mode
                raise UnsafeSnapshotFileError("/".join(parts[: depth + 1]), _kind(mode)) from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(root: Path, path: Path) -> int:
    """A read-only descriptor of regular file ``path`` under ``root``, opened without following a
    symbolic link at any depth under ``root`` and without blocking; anything else than a regular
    file is refused unopened (:class:`UnsafeSnapshotFileError`). ``FileNotFoundError`` when missing."""
    parts = _relative(root, path)
    shown = "/".join(parts)
    directory = open_directory(root, parts[:-1])
    try:
        mode = os.lstat(parts[-1], dir_fd=directory).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeSnapshotFileError(shown, _kind(mode))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    finally:
        os.close(directory)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # replaced between the check and the open
        os.close(fd)
        raise UnsafeSnapshotFileError(shown, _kind(mode))
    return fd


def read_small_file(root: Path, path: Path, limit: int = MAX_MANIFEST) -> bytes:
    """The bytes of a small regular file (a manifest), refused above ``limit`` bytes unread."""
    fd = open_regular(root, path)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise SnapshotTooLargeError(
                f"{path.name} holds {size} bytes, more than the {limit} a manifest may"
            )
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise SnapshotTooLargeError(f"{path.name} holds more than the {limit} bytes a manifest may")
    return data


# --- sections -------------------------------------------------------------------------------------


class Declared(NamedTuple):
    """What a manifest declares of a section: records, bytes of its lines (``None``: not known, as
    for ``artifacts``, whose size counts blob bytes) and SHA-256 of its file's content."""

    records: int
    size: int | None
    digest: str


_EMPTY = hashlib.sha256(b"").hexdigest()


def declared_of(snapshot: Snapshot, section: str) -> Declared:
    """What ``snapshot``'s record declares of ``section``."""
    return Declared(
        snapshot.counts.get(section, 0),
        None if section == "artifacts" else snapshot.sizes.get(section, 0),
        snapshot.section_hashes.get(section, _EMPTY),
    )


class SectionCheck:
    """Counts, sizes and hashes a section's content as it is read, and compares with what is
    declared: past a declared count or size at once, the hash at :meth:`finish`
    (:class:`SectionMismatchError`). With nothing declared, it only counts."""

    def __init__(self, snapshot_id: str, section: str, declared: Declared | None) -> None:
        self.snapshot_id = snapshot_id
        self.section = section
        self.declared = declared
        self._hash = hashlib.sha256() if declared is not None else None
        self.count = 0
        self.size = 0

    def update(self, data: bytes, lines: int) -> None:
        """Account for ``data``: ``lines`` newline-terminated lines as stored (newlines included)."""
        self.count += lines
        self.size += len(data) - lines
        if self._hash is None or self.declared is None:
            return
        self._hash.update(data)
        if self.count > self.declared.records:
            self._mismatch("records", self.declared.records, f"more than {self.declared.records}")
        if self.declared.size is not None and self.size > self.declared.size:
            self._mismatch("bytes", self.declared.size, f"more than {self.declared.size}")

    def update_lines(self, lines: list[bytes]) -> None:
        """Account for a batch of lines (without their newlines)."""
        if lines:
            self.update(b"\n".join(lines) + b"\n", len(lines))

    def finish(self, *, complete: bool = True) -> None:
        """Compare with what is declared; ``complete=False``: the section ended early (truncated)."""
        declared = self.declared
        if declared is None or self._hash is None:
            return
        if not complete:
            self._mismatch("bytes", declared.size, f"{self.size} (the file ends early)")
        if self.count != declared.records:
            self._mismatch("records", declared.records, self.count)
        if declared.size is not None and self.size != declared.size:
            self._mismatch("bytes", declared.size, self.size)
        if self._hash.hexdigest() != declared.digest:
            self._mismatch("hash", f"sha256 {declared.digest}", f"sha256 {self._hash.hexdigest()}")

    def _mismatch(self, what: str, declared: object, found: object) -> None:
        raise SectionMismatchError(self.snapshot_id, self.section, what, declared, found)


def _inflate(read: Callable[[int], bytes], describe: str, budget: int) -> Iterator[bytes]:
    """The decompressed chunks of a gzip stream read by ``read`` (members concatenated), at most
    ``budget`` bytes; ``SnapshotCorruptError`` for an invalid stream, ``_Truncated`` for a short one."""
    decompressor = zlib.decompressobj(_GZIP)
    total = 0
    data: bytes = read(_READ)
    if not data:
        return  # an empty file: an empty section
    try:
        while True:
            out = decompressor.decompress(data, _INFLATE)
            data = decompressor.unconsumed_tail
            if out:
                total += len(out)
                if total > budget:
                    raise SnapshotTooLargeError(
                        f"{describe} decompresses to more than {budget} bytes (its compressed bytes "
                        f"times {MAX_EXPANSION}): refused as a compression bomb"
                    )
                yield out
            if decompressor.eof:
                data = decompressor.unused_data or read(_READ)
                if not data:
                    return
                decompressor = zlib.decompressobj(_GZIP)
            elif not data and not out:
                data = read(_READ)
                if not data:
                    raise _Truncated
    except zlib.error as exc:
        raise SnapshotCorruptError(f"{describe} is not a valid gzip stream ({exc})") from exc


class _Truncated(Exception):
    """The gzip stream of a section ends before its end marker."""


def read_section_file(
    root: Path, path: Path, check: SectionCheck, *, describe: str | None = None
) -> Iterator[list[bytes]]:
    """Batches of the lines of gzip JSON-lines file ``path`` under ``root``, read confined and
    bounded, and checked by ``check`` as they are read (``check.finish()`` at the end).

    ``SnapshotCorruptError`` (or a subclass naming the cause) when the file is missing, not a
    regular file, invalid, truncated, too large, or differs from what ``check`` declares."""
    describe = describe or f"section {check.section} of snapshot {check.snapshot_id!r}"
    try:
        fd = open_regular(root, path)
    except FileNotFoundError:
        raise SnapshotCorruptError(f"{describe}: its file {path.name} is missing") from None
    except OSError as exc:
        raise SnapshotCorruptError(f"{describe}: its file {path.name} is unreadable ({exc})") from exc
    with os.fdopen(fd, "rb", buffering=0) as handle:
        budget = max(os.fstat(fd).st_size * MAX_EXPANSION, EXPANSION_ALLOWANCE)
        pending = b""
        batch: list[bytes] = []
        held = 0
        try:
            for chunk in _inflate(handle.read, describe, budget):
                newlines = chunk.count(b"\n")
                check.update(chunk, newlines)
                if not newlines:
                    pending += chunk
                    _check_line(pending, describe)
                    continue
                lines = chunk.split(b"\n")
                lines[0] = pending + lines[0]
                _check_line(lines[0], describe)
                pending = lines.pop()
                _check_line(pending, describe)
                batch.extend(lines)
                held += len(chunk)
                while len(batch) >= BATCH:
                    yield batch[:BATCH]
                    batch = batch[BATCH:]
                    held = sum(map(len, batch))
                if held >= BATCH_BYTES:
                    yield batch
                    batch, held = [], 0
        except _Truncated:
            check.finish(complete=False)
            raise SnapshotCorruptError(f"{describe} is truncated (its gzip stream ends early)") from None
        except OSError as exc:
            raise SnapshotCorruptError(f"{describe} is unreadable ({exc})") from exc
        if pending:  # a last line without its newline (not written by this code)
            check.update(b"", 1)
            batch.append(pending)
        check.finish()
        if batch:
            yield batch


def _check_line(line: bytes, describe: str) -> None:
    if len(line) > MAX_LINE_BYTES:
        raise SnapshotTooLargeError(f"{describe} holds a line longer than {MAX_LINE_BYTES} bytes: refused")


# --- blobs ----------------------------------------------------------------------------------------


def blob_chunks_of_file(
    root: Path, path: Path, digest: str, *, size: int | None, limit: int
) -> Iterator[bytes]:
    """The bytes of blob file ``path`` under ``root`` in chunks of :data:`BLOB_CHUNK_BYTES`, read confined;
    its size checked against ``size`` (its record's; else at most ``limit``) before anything is
    read, its SHA-256 against ``digest`` at the end (:class:`BlobMismatchError`)."""
    try:
        fd = open_regular(root, path)
    except FileNotFoundError:
        raise BlobMismatchError(digest, "missing") from None
    except OSError as exc:
        raise SnapshotCorruptError(f"artifact blob {digest} is unreadable ({exc})") from exc
    with os.fdopen(fd, "rb", buffering=0) as handle:
        found = os.fstat(fd).st_size
        if size is not None and found != size:
            raise BlobMismatchError(digest, "bytes", size, found)
        if found > limit:
            raise BlobMismatchError(digest, "bytes", f"at most {limit} (all its blobs)", found)
        hasher = hashlib.sha256()
        read = 0
        while read < found and (chunk := handle.read(min(BLOB_CHUNK_BYTES, found - read))):
            hasher.update(chunk)
            read += len(chunk)
            yield chunk
        if read != found:
            raise BlobMismatchError(digest, "bytes", found, read)
    if hasher.hexdigest() != digest:
        raise BlobMismatchError(digest, "hash", f"sha256 {digest}", f"sha256 {hasher.hexdigest()}")


__all__ = [
    "BATCH",
    "BATCH_BYTES",
    "BLOB_CHUNK_BYTES",
    "EXPANSION_ALLOWANCE",
    "MAX_EXPANSION",
    "MAX_LINE_BYTES",
    "MAX_MANIFEST",
    "Declared",
    "SectionCheck",
    "blob_chunks_of_file",
    "checked_digest",
    "declared_of",
    "open_directory",
    "open_regular",
    "read_section_file",
    "read_small_file",
]
