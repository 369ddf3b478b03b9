"""Write snapshots in old formats straight into a file store's directory, as older code did."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from guarded.snapshots import SnapshotContent
from guarded.snapshots.content import canonical, parse_line
from guarded.snapshots.migrations import V1_SECTIONS


async def _lines(content: SnapshotContent, section: str) -> list[bytes]:
    return [line async for batch in content.lines(section) for line in batch]


async def write_v1(root: Path, content: SnapshotContent, **manifest_changes: Any) -> str:
    """Store ``content`` as format 1 (``subject`` string, ``session_log`` section) under ``root``
    (a FileSnapshotStore directory); its blobs are expected there already. Returns the id."""
    snapshot = content.snapshot
    directory = root / "snapshots" / snapshot.id
    (directory / "sections").mkdir(parents=True)
    sections: dict[str, list[bytes]] = {}
    for name in V1_SECTIONS:
        if name == "session_log":
            updates = [
                {"type": "update", "record": parse_line(line)} for line in await _lines(content, "updates")
            ]
            steering = [
                {"type": "steering", "record": parse_line(line)} for line in await _lines(content, "steering")
            ]
            sections[name] = [canonical(record) for record in (*updates, *steering)]
        else:
            sections[name] = await _lines(content, name)
        with gzip.open(directory / "sections" / f"{name}.jsonl.gz", "wb") as handle:
            handle.write(b"".join(line + b"\n" for line in sections[name]))
    manifest = {
        "format_version": 1,
        "id": snapshot.id,
        "subject": f"{snapshot.subject_kind}:{snapshot.subject_id}",
        "created_at": snapshot.created_at.isoformat(),
        "tags": list(snapshot.tags),
        "description": snapshot.description,
        "parent_id": snapshot.parent_id,
        "counts": {name: len(lines) for name, lines in sections.items()},
        **manifest_changes,
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return snapshot.id
