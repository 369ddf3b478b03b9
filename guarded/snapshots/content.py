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
from typing import IO, Any, Protocol, Self, runtime_checkable

import orjson

from ..codec import JSONObject
from .errors import SnapshotCorruptError
from .record import SECTIONS, Snapshot

BATCH = 2_000
"""Lines per batch read from or written to a section file."""
CHUNK = 1 << 20
"""Bytes per read when a blob is copied."""
GZIP_LEVEL = 3


def canonical(record: JSONObject) -> bytes:
    """The canonical JSON line of a record: sorted keys, no spaces, UTF-8, no newline."""
    try:
        return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer beyond 64 bits: the stdlib encoder takes it
        return json.dumps(
            record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")


def parse(line: bytes) -> JSONObject:
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
            yield parse(line)


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


def read_section(path: Path) -> Iterator[list[bytes]]:
    """Batches of the lines of a section file (``SnapshotCorruptError`` when missing or unreadable)."""
    try:
        with gzip.open(path, "rb") as handle:
            batch: list[bytes] = []
            for line in handle:
                batch.append(line.rstrip(b"\n"))
                if len(batch) >= BATCH:
                    yield batch
                    batch = []
            if batch:
                yield batch
    except FileNotFoundError:
        raise SnapshotCorruptError(f"section file {path.name} is missing") from None
    except (OSError, EOFError) as exc:
        raise SnapshotCorruptError(f"section file {path.name} is unreadable: {exc}") from exc


async def iterate_in_thread(batches: Iterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
    """Drive a blocking iterator of batches from a worker thread, one batch at a time."""
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


def copy_blob(source: Path, target: Path, digest: str) -> int:
    """Copy a blob file in chunks to ``target`` (fsynced), checking its SHA-256; returns its size."""
    hasher = hashlib.sha256()
    size = 0
    try:
        with source.open("rb") as src, target.open("wb") as dst:
            while chunk := src.read(CHUNK):
                hasher.update(chunk)
                dst.write(chunk)
                size += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except FileNotFoundError:
        raise SnapshotCorruptError(f"artifact blob {digest} is missing") from None
    if hasher.hexdigest() != digest:
        raise SnapshotCorruptError(f"artifact blob {digest} does not match its hash")
    return size


def write_file(path: Path, data: bytes) -> None:
    """Write and fsync ``data`` to a new file ``path``."""
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


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

    What the file backend's ``load`` returns, and the base of :class:`SpooledSnapshot`.
    """

    def __init__(self, snapshot: Snapshot, sections_dir: Path, blob_path: Callable[[str], Path]) -> None:
        self._snapshot = snapshot
        self.sections_dir = sections_dir
        self.blob_path = blob_path

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def section_path(self, section: str) -> Path:
        """The file of ``section``."""
        if section not in SECTIONS:
            raise ValueError(f"unknown section {section!r}")
        return self.sections_dir / f"{section}.jsonl.gz"

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        async for batch in iterate_in_thread(read_section(self.section_path(section))):
            yield batch

    async def read_blob(self, digest: str) -> bytes:
        try:
            data = await asyncio.to_thread(self.blob_path(digest).read_bytes)
        except FileNotFoundError:
            raise SnapshotCorruptError(f"artifact blob {digest} is missing") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise SnapshotCorruptError(f"artifact blob {digest} does not match its hash")
        return data


class SpooledSnapshot(DirectoryContent):
    """Content in a private temporary directory (a capture, a migrated load): removed on close,
    or when garbage-collected."""

    def __init__(self, snapshot: Snapshot, directory: Path) -> None:
        super().__init__(snapshot, directory / "sections", lambda digest: directory / "blobs" / digest)
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
                size = parse(line).get("size")
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
    "DirectoryContent",
    "SectionWriter",
    "SnapshotContent",
    "SpoolWriter",
    "SpooledSnapshot",
    "canonical",
    "content_hash",
    "copy_blob",
    "fsync_dir",
    "iterate_in_thread",
    "parse",
    "read_section",
    "records",
    "write_file",
]
