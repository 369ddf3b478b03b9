"""The checks of the SnapshotStore contract suite and the synthetic contents they save.

Each check gets a fresh, empty store (see :mod:`guarded.testing.snapshot_contract`), returns when
the store honours its rule and raises :class:`~guarded.testing.ContractViolation` when it does not.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..codec import JSONObject
from ..snapshots.content import SpooledSnapshot, SpoolWriter, records
from ..snapshots.record import SECTIONS, RetentionPolicy, Snapshot
from ..snapshots.snapshot_errors import (
    InvalidCursorError,
    SnapshotConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
)
from ._base import difference, violation

SnapshotCheck = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SnapshotContract:
    """One rule of :class:`~guarded.snapshots.SnapshotStore`."""

    name: str
    description: str
    check: SnapshotCheck


SNAPSHOT_REGISTRY: dict[str, SnapshotContract] = {}


def snapshot_contract(name: str, description: str) -> Callable[[SnapshotCheck], SnapshotCheck]:
    def decorate(check: SnapshotCheck) -> SnapshotCheck:
        if name in SNAPSHOT_REGISTRY:
            raise ValueError(f"snapshot contract {name!r} is already registered")
        SNAPSHOT_REGISTRY[name] = SnapshotContract(name, description, check)
        return check

    return decorate


async def make_content(
    subject_id: str,
    *,
    events: int = 3,
    memory: JSONObject | None = None,
    blobs: Sequence[bytes] = (b"blob-a",),
    snapshot_id: str | None = None,
    parent_id: str | None = None,
    tags: Sequence[str] = (),
    created_at: datetime | None = None,
    task_status: str = "RUNNING",
    updates: int = 2,
) -> SpooledSnapshot:
    """A small synthetic content for a session ``subject_id`` (no StateStore needed)."""
    writer = SpoolWriter()
    for index in range(events):
        payload: JSONObject = {"index": index, "text": "héllo\x00", "big": 2**53 + 1}
        event: JSONObject = {
            "trace_id": f"{subject_id}-t",
            "ts": float(index),
            "kind": "node_start",
            "node_name": None,
        }
        await writer.add("events", {**event, "node_id": None, "payload": payload})
    await writer.add("memory", {"key": f"a:u:{subject_id}", "state": memory or {"turns": 1}})
    await writer.add("tasks", {"task_id": f"{subject_id}-k", "session_id": subject_id, "status": task_status})
    for index in range(updates):
        await writer.add("updates", {"session_id": subject_id, "update_id": f"u{index}", "content": index})
    await writer.add("steering", {"session_id": subject_id, "event_id": "e0", "payload": {}})
    for index, data in enumerate(blobs):
        digest = await writer.add_blob(data)
        ref: JSONObject = {"id": f"art_{index}_{digest[:8]}", "size_bytes": len(data)}
        await writer.add("artifacts", {"ref": ref, "blob": digest, "size": len(data)})
    return await writer.finish(
        id=snapshot_id or uuid.uuid4().hex,
        subject_kind="session",
        subject_id=subject_id,
        created_at=created_at or datetime.now(UTC),
        tags=tuple(tags),
        parent_id=parent_id,
    )


async def _lines(content: Any) -> dict[str, list[bytes]]:
    found: dict[str, list[bytes]] = {}
    for section in SECTIONS:
        found[section] = [line async for batch in content.lines(section) for line in batch]
    return found


async def _saved(store: Any, content: SpooledSnapshot) -> Snapshot:
    try:
        saved: Snapshot = await store.save(content)
        return saved
    finally:
        await content.aclose()


async def _raises(kind: type[BaseException], call: Awaitable[Any], what: str) -> None:
    try:
        await call
    except kind:
        return
    except Exception as exc:
        raise violation(f"{what} raised {type(exc).__name__}: {exc}, expected {kind.__name__}") from exc
    raise violation(f"{what} returned normally, expected {kind.__name__}")


def _same(expected: Any, actual: Any, path: str) -> None:
    found = difference(expected, actual, path)
    if found:
        raise violation(found)


@snapshot_contract("round_trip", "load returns every line and blob save was given, and get the same record")
async def check_round_trip(store: Any) -> None:
    content = await make_content("s-round", blobs=(b"one", b"\x00two" * 1000))
    expected = await _lines(content)
    blobs = [await content.read_blob(str(r["blob"])) async for r in records(content, "artifacts")]
    saved = await _saved(store, content)
    if saved != content.snapshot:
        raise violation(f"save returned {saved!r}, expected the content's record")
    _same(saved.model_dump(), (await store.get(saved.id)).model_dump(), "get(id)")
    loaded = await store.load(saved.id)
    try:
        _same(saved.model_dump(), loaded.snapshot.model_dump(), "load(id).snapshot")
        actual = await _lines(loaded)
        for section in SECTIONS:
            if actual[section] != expected[section]:
                raise violation(f"section {section} came back with other lines")
        found = [await loaded.read_blob(str(r["blob"])) async for r in records(loaded, "artifacts")]
        if found != blobs:
            raise violation("artifact blobs came back different")
    finally:
        await loaded.aclose()


@snapshot_contract(
    "save_idempotent", "the same content saved twice is one snapshot; other content under its id conflicts"
)
async def check_save_idempotent(store: Any) -> None:
    content = await make_content("s-idem", snapshot_id="idem-1")
    first = await store.save(content)
    second = await store.save(content)
    await content.aclose()
    _same(first.model_dump(), second.model_dump(), "second save")
    other = await make_content("s-idem", snapshot_id="idem-1", events=5)
    try:
        await _raises(SnapshotConflictError, store.save(other), "saving other content under a saved id")
    finally:
        await other.aclose()
    page = await store.list(subject_id="s-idem")
    if [s.id for s in page.items] != ["idem-1"]:
        raise violation(f"list shows {[s.id for s in page.items]}, expected one snapshot")


@snapshot_contract(
    "not_found", "load, get, tag and lineage of an unknown id raise SnapshotNotFoundError; delete says False"
)
async def check_not_found(store: Any) -> None:
    for what, call in (
        ("load", store.load("nope")),
        ("get", store.get("nope")),
        ("tag", store.tag("nope", ["x"])),
        ("lineage", store.lineage("nope")),
    ):
        await _raises(SnapshotNotFoundError, call, f"{what} of an unknown id")
    if await store.delete("nope") is not False:
        raise violation("delete of an unknown id did not return False")


@snapshot_contract("corrupt_refused", "content that does not match its record is refused and never visible")
async def check_corrupt_refused(store: Any) -> None:
    content = await make_content("s-corrupt")
    forged = content.snapshot.model_copy(update={"counts": {**content.snapshot.counts, "events": 99}})
    content._snapshot = forged
    try:
        await _raises(SnapshotCorruptError, store.save(content), "saving content whose counts lie")
    finally:
        await content.aclose()
    if (await store.list(subject_id="s-corrupt")).items:
        raise violation("a refused content is listed")
    await _raises(SnapshotNotFoundError, store.load(forged.id), "load of a refused content")


@snapshot_contract(
    "list_filters_and_pages", "list filters by subject, tag and time, pages oldest first without repeats"
)
async def check_list(store: Any) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    ids = []
    for index in range(5):
        subject = "s-list-a" if index % 2 == 0 else "s-list-b"
        tags = ["even"] if index % 2 == 0 else []
        when = base + timedelta(minutes=index)
        saved = await _saved(
            store, await make_content(subject, created_at=when, tags=tags, snapshot_id=f"list-{index}")
        )
        ids.append(saved.id)
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list(limit=2, cursor=cursor)
        seen.extend(s.id for s in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    if seen != ids:
        raise violation(f"paging with limit=2 gave {seen}, expected {ids}")
    checks: list[tuple[str, dict[str, Any], list[str]]] = [
        ("subject_id", {"subject_id": "s-list-b"}, ids[1::2]),
        ("subject_kind", {"subject_kind": "trace"}, []),
        ("tag", {"tag": "even"}, ids[0::2]),
        (
            "since/until",
            {"since": base + timedelta(minutes=1), "until": base + timedelta(minutes=3)},
            ids[1:3],
        ),
    ]
    for what, filters, expected in checks:
        got = [s.id for s in (await store.list(**filters)).items]
        if got != expected:
            raise violation(f"list by {what} gave {got}, expected {expected}")
    await _raises(InvalidCursorError, store.list(cursor="not-a-cursor"), "list with a forged cursor")


@snapshot_contract("tags", "tag and untag change only tags, persistently; list by tag follows")
async def check_tags(store: Any) -> None:
    saved = await _saved(store, await make_content("s-tags", tags=["b"]))
    tagged = await store.tag(saved.id, ["a", "c", "a"])
    if tagged.tags != ("a", "b", "c"):
        raise violation(f"tag gave tags {tagged.tags}, expected ('a', 'b', 'c')")
    untagged = await store.untag(saved.id, ["b", "zzz"])
    stored = await store.get(saved.id)
    if untagged.tags != ("a", "c") or stored.tags != ("a", "c"):
        raise violation(f"untag gave {untagged.tags}, stored {stored.tags}, expected ('a', 'c')")
    if stored.content_hash != saved.content_hash or stored.created_at != saved.created_at:
        raise violation("tagging changed more than the tags")
    if [s.id for s in (await store.list(tag="c")).items] != [saved.id]:
        raise violation("list(tag='c') does not find the tagged snapshot")
    if (await store.list(tag="b")).items:
        raise violation("list(tag='b') still finds the untagged snapshot")


@snapshot_contract("delete", "a deleted snapshot is gone from load, get and list; a second delete says False")
async def check_delete(store: Any) -> None:
    saved = await _saved(store, await make_content("s-delete"))
    if await store.delete(saved.id) is not True:
        raise violation("delete of a saved snapshot did not return True")
    await _raises(SnapshotNotFoundError, store.load(saved.id), "load after delete")
    if (await store.list(subject_id="s-delete")).items:
        raise violation("a deleted snapshot is listed")
    if await store.delete(saved.id) is not False:
        raise violation("a second delete did not return False")


@snapshot_contract("lineage", "lineage walks parent ids up to the root, and stops at a deleted ancestor")
async def check_lineage(store: Any) -> None:
    root = await _saved(store, await make_content("s-line", snapshot_id="line-root"))
    middle = await _saved(store, await make_content("s-line", snapshot_id="line-mid", parent_id=root.id))
    leaf = await _saved(store, await make_content("s-line", snapshot_id="line-leaf", parent_id=middle.id))
    chain = [s.id for s in await store.lineage(leaf.id)]
    if chain != ["line-leaf", "line-mid", "line-root"]:
        raise violation(f"lineage gave {chain}")
    await store.delete(middle.id)
    chain = [s.id for s in await store.lineage(leaf.id)]
    if chain != ["line-leaf"]:
        raise violation(f"lineage past a deleted parent gave {chain}, expected ['line-leaf']")


@snapshot_contract(
    "diff", "diff reports events and updates added, memory and tasks changed, artifacts added and removed"
)
async def check_diff(store: Any) -> None:
    a = await _saved(store, await make_content("s-diff", events=2, updates=1, blobs=(b"old",)))
    b = await _saved(
        store,
        await make_content(
            "s-diff", events=4, updates=3, memory={"turns": 2}, task_status="COMPLETE", blobs=(b"new",)
        ),
    )
    diff = await store.diff(a.id, b.id)
    facts = {
        "events_added": [e["payload"]["index"] for e in diff.events_added] == [2, 3],
        "updates_added": [u["update_id"] for u in diff.updates_added] == ["u1", "u2"],
        "memory_changed": [c.after["state"] for c in diff.memory_changed] == [{"turns": 2}],
        "tasks_changed": [c.after["status"] for c in diff.tasks_changed] == ["COMPLETE"],
        "artifacts_added": len(diff.artifacts_added) == 1 and len(diff.artifacts_removed) == 1,
        "steering unchanged": diff.steering_added == (),
    }
    wrong = [name for name, ok in facts.items() if not ok]
    if wrong:
        raise violation(f"diff got {wrong} wrong: {diff!r}")
    if not (await store.diff(a.id, a.id)).empty:
        raise violation("a snapshot diffed with itself is not empty")


@snapshot_contract(
    "gc_blobs", "gc removes only blobs no snapshot references; shared blobs outlive one referrer"
)
async def check_gc_blobs(store: Any) -> None:
    shared, alone = b"shared-blob" * 100, b"alone-blob"
    keep = await _saved(store, await make_content("s-gc", blobs=(shared,)))
    gone = await _saved(store, await make_content("s-gc", blobs=(shared, alone)))
    report = await store.gc()
    if report.blobs_deleted:
        raise violation(f"gc deleted {report.blobs_deleted} blob(s) while every blob was referenced")
    await store.delete(gone.id)
    report = await store.gc()
    if report.blobs_deleted != 1 or report.bytes_freed != len(alone):
        raise violation(
            f"gc after a delete removed {report.blobs_deleted} blob(s), {report.bytes_freed} bytes; "
            f"expected 1, {len(alone)}"
        )
    loaded = await store.load(keep.id)
    try:
        found = [await loaded.read_blob(str(r["blob"])) async for r in records(loaded, "artifacts")]
    finally:
        await loaded.aclose()
    if found != [shared]:
        raise violation("the blob a remaining snapshot shares was removed")


@snapshot_contract("gc_retention", "gc applies keep_last per subject and max_age, sparing tagged snapshots")
async def check_gc_retention(store: Any) -> None:
    base = datetime.now(UTC) - timedelta(days=10)
    for index, tags in enumerate(([], ["keep"], [], [])):
        content = await make_content(
            "s-ret", created_at=base + timedelta(days=index), tags=tags, snapshot_id=f"ret-{index}"
        )
        await _saved(store, content)
    report = await store.gc(RetentionPolicy(keep_last=1))
    if sorted(report.snapshots_deleted) != ["ret-0", "ret-2"]:
        raise violation(f"keep_last=1 deleted {report.snapshots_deleted}, expected ['ret-0', 'ret-2']")
    report = await store.gc(RetentionPolicy(max_age=timedelta(days=5)))
    if report.snapshots_deleted != ("ret-3",):
        raise violation(
            f"max_age=5 days deleted {report.snapshots_deleted}, expected ('ret-3',) (ret-1 is tagged)"
        )


@snapshot_contract(
    "concurrent_saves", "concurrent saves of different snapshots all succeed and are all listed"
)
async def check_concurrent_saves(store: Any) -> None:
    contents = [await make_content("s-conc", blobs=(b"same", bytes([index]))) for index in range(6)]
    try:
        saved = await asyncio.gather(*(store.save(content) for content in contents))
    finally:
        for content in contents:
            await content.aclose()
    listed = {s.id for s in (await store.list(subject_id="s-conc")).items}
    if listed != {s.id for s in saved}:
        raise violation(f"{len(listed)} of {len(saved)} concurrent saves are listed")
