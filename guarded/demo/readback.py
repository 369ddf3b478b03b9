"""Read what PostgreSQL holds, behind the store's back, in the shape of the demo's ledger.

A plain asyncpg connection reads the tables of the demo's schema directly (no guard, no
store code on the read path), so the verdict does not trust the code it judges. Identifier
columns hold the store's NUL-escaped text and are unescaped here; JSON columns are parsed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from guarded.backends.postgres.json_codec import from_db_text
from guarded.backends.postgres.schema_names import validate_schema_name

from .ledger import APPEND_KINDS, UPSERT_KINDS, WriteKind


@dataclass(frozen=True, slots=True)
class StoredPause:
    """A row of ``planner_pauses``: its payload and whether a resume consumed it."""

    payload: Any
    consumed: bool


@dataclass
class Snapshot:
    """What the database holds, keyed like :class:`~guarded.demo.ledger.Ledger`."""

    appends: dict[WriteKind, dict[Hashable, Any]] = field(
        default_factory=lambda: {kind: {} for kind in APPEND_KINDS}
    )
    """Per append kind: identity -> stored content."""
    copies: dict[WriteKind, Counter[Hashable]] = field(
        default_factory=lambda: {kind: Counter() for kind in APPEND_KINDS}
    )
    """Per append kind: rows per identity (more than one is a duplicate)."""
    upserts: dict[WriteKind, dict[Hashable, Any]] = field(
        default_factory=lambda: {kind: {} for kind in UPSERT_KINDS}
    )
    pauses: dict[str, StoredPause] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    """Artifact id -> sha256."""

    def put(self, kind: WriteKind, key: Hashable, content: Any) -> None:
        self.appends[kind][key] = content
        self.copies[kind][key] += 1


KIND_METHODS: dict[WriteKind, str] = {
    WriteKind.EVENT: "save_event",
    WriteKind.UPDATE: "save_update",
    WriteKind.STEERING: "save_steering",
    WriteKind.PLANNER_EVENT: "save_planner_event",
    WriteKind.TASK: "save_task",
    WriteKind.MEMORY: "save_memory_state",
    WriteKind.PAUSE: "save_planner_state",
    WriteKind.TRAJECTORY: "save_trajectory",
    WriteKind.ARTIFACT: "artifact_store",
}
"""The store method that writes each kind (what a composed store routes)."""


def merge_snapshots(sources: Mapping[WriteKind, Snapshot]) -> Snapshot:
    """One snapshot taking each kind from its source (a composed store keeps each kind in one part)."""
    merged = Snapshot()
    for kind, source in sources.items():
        if kind in APPEND_KINDS:
            merged.appends[kind] = source.appends[kind]
            merged.copies[kind] = source.copies[kind]
        elif kind in UPSERT_KINDS:
            merged.upserts[kind] = source.upserts[kind]
        elif kind is WriteKind.PAUSE:
            merged.pauses = source.pauses
        else:
            merged.artifacts = source.artifacts
    return merged


def _text(value: str | None) -> str | None:
    return None if value is None else from_db_text(value)


def task_summary(status: str, progress: Any) -> dict[str, Any]:
    """What the verdict compares of a task: its status and the demo's revision number."""
    revision = progress.get("rev") if isinstance(progress, dict) else None
    return {"status": status, "rev": revision}


async def read_back(dsn: str, schema: str) -> Snapshot:
    """Everything the demo's tables in ``schema`` hold, read with a fresh plain connection."""
    q = f'"{validate_schema_name(schema)}"'
    found = Snapshot()
    conn = await asyncpg.connect(dsn)
    try:
        for row in await conn.fetch(f"SELECT trace_id, kind, node_id, ts, payload FROM {q}.flow_events"):
            event = (_text(row["trace_id"]), _text(row["kind"]), _text(row["node_id"]), row["ts"])
            found.put(WriteKind.EVENT, event, json.loads(row["payload"]))
        for row in await conn.fetch(f"SELECT session_id, update_id, doc FROM {q}.state_updates"):
            key = (_text(row["session_id"]), _text(row["update_id"]))
            found.put(WriteKind.UPDATE, key, json.loads(row["doc"])["content"])
        for row in await conn.fetch(f"SELECT session_id, event_id, doc FROM {q}.steering_events"):
            key = (_text(row["session_id"]), _text(row["event_id"]))
            found.put(WriteKind.STEERING, key, json.loads(row["doc"])["payload"])
        for row in await conn.fetch(f"SELECT trace_id, event_type, ts, doc FROM {q}.planner_events"):
            planner_event = (_text(row["trace_id"]), _text(row["event_type"]), row["ts"])
            found.put(WriteKind.PLANNER_EVENT, planner_event, json.loads(row["doc"])["extra"])
        for row in await conn.fetch(f"SELECT task_id, doc FROM {q}.task_states"):
            doc = json.loads(row["doc"])
            found.upserts[WriteKind.TASK][_text(row["task_id"])] = task_summary(
                doc["status"], doc["progress"]
            )
        for row in await conn.fetch(f"SELECT key, state FROM {q}.memory_states"):
            found.upserts[WriteKind.MEMORY][_text(row["key"])] = json.loads(row["state"])
        for row in await conn.fetch(f"SELECT trace_id, session_id, doc FROM {q}.trajectories"):
            value = (_text(row["session_id"]), json.loads(row["doc"])["value"])
            found.upserts[WriteKind.TRAJECTORY][_text(row["trace_id"])] = value
        for row in await conn.fetch(f"SELECT token, payload, consumed_at FROM {q}.planner_pauses"):
            token = from_db_text(row["token"])
            found.pauses[token] = StoredPause(json.loads(row["payload"]), row["consumed_at"] is not None)
        for row in await conn.fetch(f"SELECT artifact_id, sha256 FROM {q}.artifacts"):
            found.artifacts[from_db_text(row["artifact_id"])] = row["sha256"]
    finally:
        await conn.close()
    return found


__all__ = ["KIND_METHODS", "Snapshot", "StoredPause", "merge_snapshots", "read_back", "task_summary"]
