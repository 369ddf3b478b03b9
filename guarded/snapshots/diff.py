"""``diff_contents``: what changed between two snapshots' contents (S3 of spec 004).

Streams both contents once each. What it holds: the line hashes of ``a``'s append-only sections
(32 bytes a record) and both snapshots' keyed sections (memory, tasks, trajectories, bindings,
pauses, artifact refs), plus the records it reports.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..codec import JSONObject
from .content import SnapshotContent, parse_line
from .record import Change, SnapshotDiff

_LOGS = ("events", "planner_events", "updates", "steering")
_KEYED: dict[str, Callable[[dict[str, Any]], str]] = {
    "memory": lambda r: str(r["key"]),
    "tasks": lambda r: str(r["task_id"]),
    "trajectories": lambda r: str(r["trace_id"]),
    "bindings": lambda r: f"{r['trace_id']}|{r.get('context_id')}|{r['task_id']}",
    "pauses": lambda r: str(r["token"]),
    "artifacts": lambda r: str(r["ref"]["id"]),
}


async def _keyed(content: SnapshotContent, section: str) -> dict[str, dict[str, Any]]:
    key = _KEYED[section]
    found: dict[str, dict[str, Any]] = {}
    async for batch in content.lines(section):
        for line in batch:
            record = parse_line(line)
            found[key(record)] = record
    return found


async def _log(
    a: SnapshotContent, b: SnapshotContent, section: str
) -> tuple[list[JSONObject], list[JSONObject]]:
    """Records of ``b`` beyond ``a`` (multiset), and records of ``a`` missing from ``b``."""
    before: Counter[bytes] = Counter()
    async for batch in a.lines(section):
        before.update(hashlib.sha256(line).digest() for line in batch)
    added: list[JSONObject] = []
    async for batch in b.lines(section):
        for line in batch:
            digest = hashlib.sha256(line).digest()
            if before[digest] > 0:
                before[digest] -= 1
            else:
                added.append(parse_line(line))
    removed: list[JSONObject] = []
    if +before:
        async for batch in a.lines(section):
            for line in batch:
                digest = hashlib.sha256(line).digest()
                if before[digest] > 0:
                    before[digest] -= 1
                    removed.append(parse_line(line))
    return added, removed


def _changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> tuple[Change, ...]:
    return tuple(
        Change(key, before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    )


async def diff_contents(a: SnapshotContent, b: SnapshotContent) -> SnapshotDiff:
    """What changed from ``a`` to ``b``."""
    logs = {section: await _log(a, b, section) for section in _LOGS}
    keyed = {section: (await _keyed(a, section), await _keyed(b, section)) for section in _KEYED}
    artifacts_a, artifacts_b = keyed["artifacts"]
    return SnapshotDiff(
        a=a.snapshot.id,
        b=b.snapshot.id,
        events_added=tuple(logs["events"][0]),
        events_removed=tuple(logs["events"][1]),
        planner_events_added=tuple(logs["planner_events"][0]),
        updates_added=tuple(logs["updates"][0]),
        steering_added=tuple(logs["steering"][0]),
        memory_changed=_changes(*keyed["memory"]),
        tasks_changed=_changes(*keyed["tasks"]),
        trajectories_changed=_changes(*keyed["trajectories"]),
        bindings_changed=_changes(*keyed["bindings"]),
        pauses_changed=_changes(*keyed["pauses"]),
        artifacts_added=tuple(artifacts_b[k]["ref"] for k in artifacts_b if k not in artifacts_a),
        artifacts_removed=tuple(artifacts_a[k]["ref"] for k in artifacts_a if k not in artifacts_b),
        removed={s: len(logs[s][1]) for s in ("planner_events", "updates", "steering") if logs[s][1]},
    )


__all__ = ["diff_contents"]
