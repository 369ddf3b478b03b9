"""What the ``guarded snapshot`` actions print: one JSON object (``--json``) or text, a snapshot's
record counts, and a content whose lines advance a :class:`~guarded.cli.progress.Progress` as they
are read."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

from ..snapshots import SECTIONS, DirectoryContent, Snapshot, SnapshotContent
from .progress import Progress


def emit(args: argparse.Namespace, data: Any, text: Callable[[], None]) -> None:
    """Print ``data`` as one JSON object with ``--json``, else call ``text``."""
    if args.json:
        print(json.dumps(data, ensure_ascii=False, default=_json_default))
    else:
        text()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Snapshot):
        return value.manifest()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def total_records(snapshot: Snapshot) -> int:
    """How many records ``snapshot`` holds, in every section."""
    return sum(snapshot.counts.get(name, 0) for name in SECTIONS)


def counted(content: SnapshotContent, progress: Progress) -> SnapshotContent:
    """``content`` whose lines advance ``progress`` as they are read."""
    if isinstance(content, DirectoryContent):
        return _CountedDirectory(content, progress)
    return _CountedContent(content, progress)


class _CountedDirectory(DirectoryContent):
    def __init__(self, content: DirectoryContent, progress: Progress) -> None:
        super().__init__(
            content.snapshot,
            content.sections_dir,
            content.blob_path,
            root=content.root,
            blob_root=content.blob_root,
        )
        self._progress = progress

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        async for batch in super().lines(section):
            self._progress.advance(len(batch), detail=section)
            yield batch


class _CountedContent:
    def __init__(self, content: SnapshotContent, progress: Progress) -> None:
        self._content = content
        self._progress = progress

    @property
    def snapshot(self) -> Snapshot:
        return self._content.snapshot

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        async for batch in self._content.lines(section):
            self._progress.advance(len(batch), detail=section)
            yield batch

    async def read_blob(self, digest: str) -> bytes:
        return await self._content.read_blob(digest)

    async def aclose(self) -> None:
        await self._content.aclose()


def counts_line(snapshot: Snapshot) -> str:
    """``1,200 events, 3 tasks``: the sections ``snapshot`` has records in (``empty`` for none)."""
    parts = [f"{snapshot.counts[name]:,} {name}" for name in SECTIONS if snapshot.counts.get(name)]
    return ", ".join(parts) or "empty"


__all__ = ["counted", "counts_line", "emit", "total_records"]
