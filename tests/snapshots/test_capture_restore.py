"""Capture from one store, restore into an empty store of another kind: every read answers the same.

Stores: guarded's in-memory reference store and PenguiFlow 3.11's own ``InMemoryStateStore``, in
both directions, over random sessions (fixed seeds). Restoring twice must equal restoring once.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from penguiflow.state import InMemoryStateStore as PenguiFlowStore

from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from guarded.errors import CapabilityError
from guarded.snapshots import FileSnapshotStore, capture, restore

from ._sessions import memory_key, observe, populate

STORES: dict[str, Callable[[], Any]] = {
    "guarded": lambda: InMemoryStateStore(record_types=penguiflow_types()),
    "penguiflow": PenguiFlowStore,
}
PAIRS = [(a, b) for a in STORES for b in STORES]
SEEDS = range(6)


@pytest.mark.asyncio
@pytest.mark.parametrize(("source_kind", "target_kind"), PAIRS)
@pytest.mark.parametrize("seed", SEEDS)
async def test_restore_answers_every_read_like_the_source(
    tmp_path: Path, source_kind: str, target_kind: str, seed: int
) -> None:
    rng = random.Random(seed)
    source = STORES[source_kind]()
    traces = await populate(source, rng, "s1")
    await populate(source, rng, "other")  # another session in the same store: never captured
    snapshots = FileSnapshotStore(tmp_path)
    async with await capture(
        source, session_id="s1", memory_keys=["custom:s1"], pause_tokens=["s1-pause"]
    ) as c:
        record = await snapshots.save(c)
    assert record.counts["memory"] == 2
    assert record.counts["pauses"] == 1
    target = STORES[target_kind]()
    async with await snapshots.load(record.id) as content:
        await restore(content, target, include_pauses=True, rollback=True)
    expected = await observe(source, "s1", traces)
    assert await observe(target, "s1", traces) == expected
    assert await target.load_planner_state("s1-pause") == {"resume": "here"}
    assert await source.load_planner_state("s1-pause") == {"resume": "here"}  # capture put it back
    assert await target.list_tasks("other") == []

    async with await snapshots.load(record.id) as content:
        report = await restore(content, target)  # twice: nothing new
    assert await observe(target, "s1", traces) == expected
    assert (
        sum(report.written[name] for name in ("updates", "steering", "planner_events", "tasks", "artifacts"))
        == 0
    )


@pytest.mark.asyncio
async def test_memory_keys_are_derived_from_tenant_and_user(tmp_path: Path) -> None:
    source = PenguiFlowStore()  # cannot list its memory keys
    await populate(source, random.Random(1), "s1")
    async with await capture(source, session_id="s1") as captured:
        from guarded.snapshots import records

        keys = [record["key"] async for record in records(captured, "memory")]
    assert keys == [memory_key("s1")]  # the custom key is found only when named (or listed)


@pytest.mark.asyncio
async def test_pauses_are_not_restored_unless_asked(tmp_path: Path) -> None:
    source = InMemoryStateStore()
    await populate(source, random.Random(2), "s1")
    async with await capture(source, session_id="s1", pause_tokens=["s1-pause"]) as captured:
        target = InMemoryStateStore()
        report = await restore(captured, target)
    assert report.written["pauses"] == 0
    assert await target.load_planner_state("s1-pause") is None


@pytest.mark.asyncio
async def test_a_newer_task_in_the_target_is_kept(tmp_path: Path) -> None:
    source = InMemoryStateStore()
    await populate(source, random.Random(3), "s1")
    async with await capture(source, session_id="s1") as captured:
        target = InMemoryStateStore()
        await restore(captured, target)
        [task, *_] = await target.list_tasks("s1")
        task.update_status(task.status)  # updated_at is now later than the snapshot's
        task.result = {"newer": True}
        await target.save_task(task)
        report = await restore(captured, target)
    assert report.skipped["tasks"] >= 1
    assert {"newer": True} in [t.result for t in await target.list_tasks("s1")]


class _EventsOnly:
    """A store with only the required core."""

    def __init__(self) -> None:
        self.inner = InMemoryStateStore()
        self.save_event = self.inner.save_event
        self.load_history = self.inner.load_history
        self.save_remote_binding = self.inner.save_remote_binding


@pytest.mark.asyncio
async def test_capture_skips_what_a_store_does_not_offer_and_restore_refuses_it() -> None:
    full = InMemoryStateStore()
    traces = await populate(full, random.Random(4), "s1")
    bare = _EventsOnly()
    for trace in traces:
        for event in await full.load_history(trace):
            await bare.save_event(event)
    async with await capture(bare, session_id="s1", trace_ids=traces) as captured:
        assert captured.snapshot.counts["events"] > 0
        assert captured.snapshot.counts["tasks"] == 0
    async with await capture(full, session_id="s1") as captured:
        with pytest.raises(CapabilityError, match="tasks"):
            await restore(captured, _EventsOnly())
        target = _EventsOnly()
        report = await restore(captured, target, skip_unsupported=True)
        assert "tasks" in report.unsupported
        assert [await target.load_history(t) for t in traces] == [await full.load_history(t) for t in traces]


@pytest.mark.asyncio
async def test_trace_subject(tmp_path: Path) -> None:
    source = InMemoryStateStore()
    traces = await populate(source, random.Random(5), "s1")
    trace = traces[0]
    async with await capture(source, trace_id=trace, session_id="s1") as captured:
        assert (captured.snapshot.subject_kind, captured.snapshot.subject_id) == ("trace", trace)
        target = InMemoryStateStore()
        await restore(captured, target)
    assert [e for e in await target.load_history(trace)] == list(await source.load_history(trace))
    assert await target.get_trajectory(trace, "s1") == await source.get_trajectory(trace, "s1")
    assert await target.list_tasks("s1") == []


@pytest.mark.asyncio
async def test_diff_of_two_captures_shows_what_a_turn_changed(tmp_path: Path) -> None:
    from penguiflow.state.models import StateUpdate, StoredEvent, UpdateType

    source = InMemoryStateStore(record_types=penguiflow_types())
    traces = await populate(source, random.Random(7), "s1")
    snapshots = FileSnapshotStore(tmp_path)
    async with await capture(source, session_id="s1") as captured:
        before = await snapshots.save(captured)
    # one turn: an event, an update, a memory change, a task finished, an artifact
    await source.save_event(StoredEvent(traces[0], 999.0, "turn", None, None, {"n": 1}))
    await source.save_update(
        StateUpdate(
            session_id="s1", task_id="s1-k0", update_id="turn-u", update_type=UpdateType.RESULT, content=1
        )
    )
    await source.save_memory_state(memory_key("s1"), {"turns": [1, 2]})
    [task, *_] = await source.list_tasks("s1")
    task.result = {"done": True}
    task.update_status(task.status)
    await source.save_task(task)
    scope = penguiflow_types().ArtifactScope(session_id="s1", tenant_id="acme", user_id="u1")
    await source.artifact_store.put_bytes(b"new artifact", scope=scope)
    async with await capture(source, session_id="s1", parent=before) as captured:
        after = await snapshots.save(captured)
    assert after.parent_id == before.id
    assert [s.id for s in await snapshots.lineage(after.id)] == [after.id, before.id]

    diff = await snapshots.diff(before.id, after.id)
    assert [event["kind"] for event in diff.events_added] == ["turn"]
    assert [update["update_id"] for update in diff.updates_added] == ["turn-u"]
    assert [(c.key, c.after["state"]) for c in diff.memory_changed] == [(memory_key("s1"), {"turns": [1, 2]})]
    assert [(c.key, c.after["result"]) for c in diff.tasks_changed] == [(task.task_id, {"done": True})]
    assert [ref["size_bytes"] for ref in diff.artifacts_added] == [len(b"new artifact")]
    assert diff.artifacts_removed == diff.events_removed == diff.steering_added == ()
    assert not diff.empty
    assert (await snapshots.diff(after.id, after.id)).empty


@pytest.mark.asyncio
async def test_the_same_state_captured_twice_has_one_content_hash() -> None:
    source = InMemoryStateStore()
    await populate(source, random.Random(8), "s1")
    async with (
        await capture(source, session_id="s1") as first,
        await capture(source, session_id="s1") as second,
    ):
        assert first.snapshot.id != second.snapshot.id
        assert first.snapshot.content_hash == second.snapshot.content_hash
        assert first.snapshot.counts == second.snapshot.counts


@pytest.mark.asyncio
async def test_restore_never_overwrites_a_write_newer_than_the_restore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from guarded import backend as logical_clock
    from guarded.backend import next_logical_time
    from guarded.logical_time import logical_times

    source = InMemoryStateStore()
    await populate(source, random.Random(9), "s1")
    target = InMemoryStateStore()
    async with await capture(source, session_id="s1") as captured:
        later = next_logical_time() + 60_000_000  # a write made (by another worker) after the restore began
        seen = logical_clock._last
        # The process clock comes back to this after the test, not to the time ahead it merges below.
        monkeypatch.setattr(logical_clock, "_last", seen)
        with logical_times((later,)):
            await target.save_memory_state(memory_key("s1"), {"newer": True})
        monkeypatch.setattr(logical_clock, "_last", seen)  # that worker's time: this process never saw it
        report = await restore(captured, target)
        assert await target.load_memory_state(memory_key("s1")) == {"newer": True}
        assert report.skipped["memory"] == 1

        older = InMemoryStateStore()  # a write from before the restore is overwritten
        with logical_times((1,)):
            await older.save_memory_state(memory_key("s1"), {"older": True})
        await restore(captured, older)
        assert await older.load_memory_state(memory_key("s1")) == await source.load_memory_state(
            memory_key("s1")
        )


@pytest.mark.asyncio
async def test_memory_keys_listed_by_the_store_are_captured_diffed_and_restored(tmp_path: Path) -> None:
    source = InMemoryStateStore(record_types=penguiflow_types())
    await populate(source, random.Random(10), "s1")
    await populate(source, random.Random(11), "other")
    unnamed = "acme:u2:s1"  # a user neither a binding nor an artifact names
    await source.save_memory_state(unnamed, {"turns": [1]})
    snapshots = FileSnapshotStore(tmp_path)
    async with await capture(source, session_id="s1") as captured:  # no memory key named
        assert captured.not_enumerated == ("pauses",)
        before = await snapshots.save(captured)
    assert before.counts["memory"] == 3  # derived, custom:s1 and the unnamed user's
    await source.save_memory_state(unnamed, {"turns": [1, 2]})
    await source.save_memory_state("custom:s1", {"x": 2})
    async with await capture(source, session_id="s1", parent=before) as captured:
        after = await snapshots.save(captured)
    diff = await snapshots.diff(before.id, after.id)
    assert sorted((c.key, c.after["state"]) for c in diff.memory_changed) == [
        ("acme:u2:s1", {"turns": [1, 2]}),
        ("custom:s1", {"x": 2}),
    ]
    assert not diff.empty
    target = InMemoryStateStore(record_types=penguiflow_types())
    async with await snapshots.load(after.id) as content:
        await restore(content, target)
    for key in (memory_key("s1"), "custom:s1", unnamed):
        assert await target.load_memory_state(key) == await source.load_memory_state(key)
    assert await target.load_memory_state(memory_key("other")) is None


@pytest.mark.asyncio
async def test_a_capture_says_which_sections_it_could_not_enumerate() -> None:
    source = PenguiFlowStore()  # no list_memory_keys
    await populate(source, random.Random(12), "s1")
    async with await capture(source, session_id="s1") as captured:
        assert captured.not_enumerated == ("memory", "pauses")
        assert captured.snapshot.counts["memory"] == 1  # only the derived key
