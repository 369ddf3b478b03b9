"""A snapshot's content as streams of canonical JSON lines, and the local files that hold it.

Every backend exchanges content as :class:`SnapshotContent`: per section, batches of canonical
JSON lines (``bytes``, no newline), plus artifact blobs by SHA-256. Nothing here holds a whole
section in memory: lines are read and written in batches of :data:`BATCH` and sections are
gzip-compressed JSON-lines files (``<section>.jsonl.gz``), the format of the file backend and of
the local spool a capture or a migration writes into.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, Self, TypeVar, runtime_checkable

import orjson

from ..codec import JSONObject
from .record import SECTIONS, Snapshot
from .safe_files import (
    BATCH,
    BLOB_CHUNK_BYTES,
    MAX_LINE_BYTES,
    SectionCheck,
    blob_chunks_of_file,
    checked_digest,
    declared_of,
    read_section_file,
)
from .snapshot_errors import (
    BlobMismatchError,
    SectionMismatchError,
    SnapshotCorruptError,
    SnapshotTooLargeError,
)

GZIP_LEVEL = 3
T = TypeVar("T")


def canonical(record: JSONObject) -> bytes:
    """The canonical JSON line of a record: sorted keys, no spaces, UTF-8, no newline."""
    try:
        return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer beyond 64 bits: the stdlib encoder takes it
        return json.dumps(
            record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")


def parse_line(line: bytes) -> JSONObject:
    """The JSON object of a line written by :func:`canonical`."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        value = json.loads(line)  # an integer beyond 64 bits
    if not isinstance(value, dict):
        raise SnapshotCorruptError("a section line is not a JSON object")
    return value


def content_hash(section_hashes: Mapping[str, str]) -> str:
    """The SHA-256 identifying a content: over ``name:hash`` of every section in :data:`SECTIONS` order."""
    digest = hashlib.sha256()
    for name in SECTIONS:
        digest.update(f"{name}:{section_hashes.get(name, _EMPTY)}\n".encode())
    return digest.hexdigest()


_EMPTY = hashlib.sha256(b"").hexdigest()


@runtime_checkable
class SnapshotContent(Protocol):
    """A snapshot and a way to stream its content; what ``save`` takes and ``load`` returns.

    Close it (``await content.aclose()``, or ``async with``) when done: it may hold local files.
    """

    @property
    def snapshot(self) -> Snapshot:
        """The record of this content."""
        ...

    def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        """Batches of canonical JSON lines of ``section``, in order."""
        ...

    async def read_blob(self, digest: str) -> bytes:
        """The artifact blob with this SHA-256 (``SnapshotCorruptError`` when missing)."""
        ...

    async def aclose(self) -> None:
        """Release what the content holds (temporary files); idempotent."""
        ...


async def records(content: SnapshotContent, section: str) -> AsyncIterator[JSONObject]:
    """The JSON objects of ``section``, one at a time."""
    async for batch in content.lines(section):
        for line in batch:
            yield parse_line(line)


# --- section files --------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SectionWriter:
    """Writes one section file, hashing and counting what it writes (call :meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw: IO[bytes] = path.open("wb")
        self._gzip = gzip.GzipFile(
            filename="", mode="wb", fileobj=self._raw, compresslevel=GZIP_LEVEL, mtime=0
        )
        self._hash = hashlib.sha256()
        self.count = 0
        self.size = 0

    def write(self, lines: list[bytes]) -> None:
        """Append lines (canonical JSON, no newline)."""
        if not lines:
            return
        longest = max(map(len, lines))
        if longest > MAX_LINE_BYTES:
            raise SnapshotTooLargeError(
                f"a record of {longest} bytes in {self.path.name}: a section line may hold {MAX_LINE_BYTES} "
                "at most (a longer one could not be loaded back)"
            )
        data = b"\n".join(lines) + b"\n"
        self._gzip.write(data)
        self._hash.update(data)
        self.count += len(lines)
        self.size += len(data) - len(lines)

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        """Finish the gzip stream and fsync the file."""
        self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()

    def abandon(self) -> None:
        """Close without caring about the file (it is about to be removed)."""
        with contextlib.suppress(OSError, ValueError):
            self._gzip.close()
        with contextlib.suppress(OSError):
            self._raw.close()


def read_section(path: Path, *, root: Path | None = None) -> Iterator[list[bytes]]:
    """Batches of the lines of a section file, read confined to ``root`` (by default the file's
    directory) and bounded (:func:`~.safe_files.read_section_file`), with nothing declared to check
    against (an old format's section, a store's own artifact references)."""
    check = SectionCheck("", path.name.removesuffix(".jsonl.gz"), None)
    return read_section_file(root or path.parent, path, check, describe=f"section file {path.name}")


async def iterate_in_thread(batches: Iterator[T]) -> AsyncIterator[T]:
    """Drive a blocking iterator (of batches, of chunks) from a worker thread, one item at a time."""
    done = object()
    try:
        while True:
            batch = await asyncio.to_thread(next, batches, done)
            if batch is done:
                return
            yield batch  # type: ignore[misc]
    finally:
        close = getattr(batches, "close", None)
        if callable(close):
            close()


async def write_chunks(chunks: AsyncIterator[bytes], target: Path) -> int:
    """Write a blob's ``chunks`` (verified as they are read) to a new file ``target`` (fsynced);
    returns its size."""
    size = 0
    handle = await asyncio.to_thread(target.open, "wb")
    try:
        async for chunk in chunks:
            await asyncio.to_thread(handle.write, chunk)
            size += len(chunk)
        await asyncio.to_thread(_flush, handle)
    finally:
        await asyncio.to_thread(handle.close)
    return size


def _flush(handle: IO[bytes]) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def write_file(path: Path, data: bytes) -> None:
    """Write and fsync ``data`` to a new file ``path``."""
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


async def verify_content(content: SnapshotContent) -> None:
    """Read ``content`` once, writing nothing, and check it against its record: every section's
    records, bytes and SHA-256, the content hash, every artifact record's blob name (a content
    address) and size, and every blob's size and SHA-256. Raises the first difference (a
    :class:`SnapshotCorruptError` naming the section or blob and what differed); memory stays
    bounded (a batch of lines, a chunk of a blob).

    ``restore`` runs it before it writes anything, so a damaged or tampered content restores
    nothing."""
    snapshot = content.snapshot
    rehash = not getattr(content, "verifies_as_it_reads", False)
    blobs: dict[str, int] = {}
    artifact_bytes = 0
    for section in SECTIONS:
        check = SectionCheck(snapshot.id, section, declared_of(snapshot, section))
        async for batch in content.lines(section):
            if rehash:
                check.update_lines(batch)
            if section == "artifacts":
                for line in batch:
                    digest, size = _blob_of(parse_line(line))
                    if blobs.setdefault(digest, size) != size:
                        raise BlobMismatchError(digest, "bytes", blobs[digest], size)
                    artifact_bytes += size
        if rehash:
            check.finish()
    if content_hash(snapshot.section_hashes) != snapshot.content_hash:
        raise SnapshotCorruptError(
            f"snapshot {snapshot.id!r}: its content hash does not match its sections' hashes"
        )
    declared = snapshot.sizes.get("artifacts", 0)
    if artifact_bytes != declared:
        raise SectionMismatchError(snapshot.id, "artifacts", "blob bytes", declared, artifact_bytes)
    for digest, size in blobs.items():
        await _verify_blob(content, digest, size)


def _blob_of(record: JSONObject) -> tuple[str, int]:
    digest = checked_digest(record.get("blob"))
    size = record.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise SnapshotCorruptError(f"artifact blob {digest}: its size {size!r} is not a byte count")
    return digest, size


async def _verify_blob(content: SnapshotContent, digest: str, size: int) -> None:
    streaming = getattr(content, "blob_chunks", None)
    found = 0
    if callable(streaming):  # a local file or a database's chunks: the hash is checked as it streams
        async for chunk in streaming(digest, size):
            found += len(chunk)
            if found > size:
                raise BlobMismatchError(digest, "bytes", size, f"more than {size}")
    else:
        data = await content.read_blob(digest)
        found = len(data)
        if hashlib.sha256(data).hexdigest() != digest:
            raise BlobMismatchError(digest, "hash", f"sha256 {digest}", "another")
    if found != size:
        raise BlobMismatchError(digest, "bytes", size, found)


class ClosingContent:
    """An async context manager closing the content on exit (``aclose``: nothing to release here)."""

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class DirectoryContent(ClosingContent):
    """Content stored as section files in ``sections_dir`` and blobs found by ``blob_path``.

    What the file backend's ``load`` returns, and the base of :class:`SpooledSnapshot`. Every file
    is read as untrusted input (:mod:`.safe_files`): confined to ``root`` (sections; by default the
    parent of ``sections_dir``) and ``blob_root`` (blobs; by default ``root``), regular files only,
    bounded, and checked against the record as it is read: a section's records, bytes and hash
    (:class:`~.errors.SectionMismatchError` at the first difference or at its end), a blob's hash
    and size (:class:`~.errors.BlobMismatchError`).
    """

    verifies_as_it_reads = True
    """:func:`verify_content` need not hash the lines again."""

    def __init__(
        self,
        snapshot: Snapshot,
        sections_dir: Path,
        blob_path: Callable[[str], Path],
        *,
        root: Path | None = None,
        blob_root: Path | None = None,
    ) -> None:
        self._snapshot = snapshot
        self.sections_dir = sections_dir
        self.blob_path = blob_path
        self.root = root or sections_dir.parent
        self.blob_root = blob_root or self.root

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def section_path(self, section: str) -> Path:
        """The file of ``section``."""
        if section not in SECTIONS:
            raise ValueError(f"unknown section {section!r}")
        return self.sections_dir / f"{section}.jsonl.gz"

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        check = SectionCheck(self._snapshot.id, section, declared_of(self._snapshot, section))
        batches = read_section_file(self.root, self.section_path(section), check)
        async for batch in iterate_in_thread(batches):
            yield batch

    def file_chunks(self, digest: str, size: int | None = None) -> Iterator[bytes]:
        """The blob ``digest`` in chunks (blocking), verified as it is read: its size against
        ``size`` (or at most the record's artifact bytes) before it is read, its hash at the end."""
        return blob_chunks_of_file(
            self.blob_root,
            self.blob_path(checked_digest(digest)),
            digest,
            size=size,
            limit=self._snapshot.sizes.get("artifacts", 0),
        )

    async def blob_chunks(self, digest: str, size: int | None = None) -> AsyncIterator[bytes]:
        """The blob ``digest`` in chunks, verified as it is read (see :meth:`file_chunks`).

        A content offering ``blob_chunks(digest, size)`` streams blobs (``save`` and
        :func:`verify_content` use it) and must check the hash (and may check ``size``, the
        record's) as it streams."""
        async for chunk in iterate_in_thread(self.file_chunks(digest, size)):
            yield chunk

    async def read_blob(self, digest: str) -> bytes:
        return await asyncio.to_thread(lambda: b"".join(self.file_chunks(digest)))


class SpooledSnapshot(DirectoryContent):
    """Content in a private temporary directory (a capture, a migrated load): removed on close,
    or when garbage-collected."""

    def __init__(self, snapshot: Snapshot, directory: Path) -> None:
        super().__init__(
            snapshot, directory / "sections", lambda digest: directory / "blobs" / checked_digest(digest)
        )
        self.directory = directory
        self.not_enumerated: tuple[str, ...] = ()
        """For a capture: the sections it read only for the keys it was given or could derive,
        because the store cannot list them (:func:`~guarded.snapshots.capture`)."""
        self._finalizer = weakref.finalize(self, shutil.rmtree, directory, True)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._finalizer)


class SpoolWriter:
    """Builds a :class:`SpooledSnapshot` section by section in a temporary directory."""

    def __init__(
        self, directory: Path | None = None, *, on_lines: Callable[[str, int], None] | None = None
    ) -> None:
        self._on_lines = on_lines
        """Told ``(section, count)`` as each record is added (progress of a capture)."""
        self.directory = Path(tempfile.mkdtemp(prefix="guarded-snapshot-", dir=directory))
        (self.directory / "sections").mkdir()
        (self.directory / "blobs").mkdir()
        self._writers = {
            name: SectionWriter(self.directory / "sections" / f"{name}.jsonl.gz") for name in SECTIONS
        }
        self._pending: dict[str, list[bytes]] = {name: [] for name in SECTIONS}
        self._blob_sizes: dict[str, int] = {}
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.directory, True)

    async def add(self, section: str, record: JSONObject) -> None:
        """Append a record to ``section``."""
        await self.add_line(section, canonical(record))

    async def add_line(self, section: str, line: bytes) -> None:
        """Append a canonical line to ``section``."""
        pending = self._pending[section]
        pending.append(line)
        if self._on_lines is not None:
            self._on_lines(section, 1)
        if len(pending) >= BATCH:
            self._pending[section] = []
            await asyncio.to_thread(self._writers[section].write, pending)

    async def add_blob(self, data: bytes) -> str:
        """Store an artifact blob; returns its SHA-256."""
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self._blob_sizes:
            await asyncio.to_thread(write_file, self.directory / "blobs" / digest, data)
            self._blob_sizes[digest] = len(data)
        return digest

    @property
    def blob_bytes(self) -> int:
        return sum(self._blob_sizes.values())

    async def finish(self, **fields: Any) -> SpooledSnapshot:
        """Close the sections and return the content; ``fields`` are the :class:`Snapshot`'s
        other fields (counts, sizes and hashes are computed here)."""
        await asyncio.to_thread(self._close)
        counts = {name: writer.count for name, writer in self._writers.items()}
        sizes = {name: writer.size for name, writer in self._writers.items()}
        sizes["artifacts"] = self._artifact_bytes()
        hashes = {name: writer.digest for name, writer in self._writers.items()}
        snapshot = Snapshot(
            **fields, counts=counts, sizes=sizes, section_hashes=hashes, content_hash=content_hash(hashes)
        )
        spooled = SpooledSnapshot(snapshot, self.directory)
        self._finalizer.detach()
        return spooled

    def _artifact_bytes(self) -> int:
        total = 0
        for batch in read_section(self._writers["artifacts"].path):
            for line in batch:
                size = parse_line(line).get("size")
                total += size if isinstance(size, int) else 0
        return total

    def _close(self) -> None:
        for name, writer in self._writers.items():
            writer.write(self._pending[name])
            self._pending[name] = []
            writer.close()

    def abandon(self) -> None:
        """Drop everything written so far."""
        for writer in self._writers.values():
            writer.abandon()
        self._finalizer()


__all__ = [
    "BATCH",
    "BLOB_CHUNK_BYTES",
    "DirectoryContent",
    "SectionWriter",
    "SnapshotContent",
    "SpoolWriter",
    "SpooledSnapshot",
    "canonical",
    "content_hash",
    "write_chunks",
    "fsync_dir",
    "iterate_in_thread",
    "parse_line",
    "read_section",
    "records",
    "verify_content",
    "write_file",
]
