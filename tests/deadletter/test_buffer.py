"""DeadLetterBuffer: write-through, coalescing, supersede, caps and drops, parking, reads, metrics."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.deadletter import DeadLetterBuffer, SpillFile
from guarded.errors import InvalidPayloadError, WriteNotKeptError
from tests.deadletter.support import STORE, buffer, config, event, put_events, sample

pytestmark = pytest.mark.asyncio

MEMORY = "save_memory_state"


def on_disk(path: Path) -> list[int]:
    reader = SpillFile.open_read_only(str(path))
    try:
        return [entry.seq for entry in reader.page(0, None)]
    finally:
        reader.close()


async def put_memory(target: DeadLetterBuffer, key: str, value: Any, stamp: int) -> None:
    await target.put(MEMORY, (key, {"v": value}), {}, key=key, stamp=stamp, error="TimeoutError")


async def test_an_acknowledged_put_is_already_committed_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        entry = await target.put(
            "save_event", (event("t1", 0),), {}, scope="t1", stamp=1, error="ConnectionResetError"
        )
        assert on_disk(path) == [entry.seq]
        assert entry.method == "save_event"
        assert entry.scope == "t1"
        assert entry.key is None
        assert entry.size > 0
        assert entry.error == "ConnectionResetError"
        assert target.depth == 1
        assert not target.is_empty
    finally:
        await target.aclose()


async def test_name_placeholder_in_the_path(tmp_path: Path) -> None:
    target = DeadLetterBuffer(
        config(tmp_path / "{name}.db"), store_name="tenant/a", registry=CollectorRegistry()
    )
    await put_events(target, "t", 1)
    await target.aclose()
    assert (tmp_path / "tenant_a.db").exists()


async def test_nothing_is_created_before_the_first_put(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    assert await target.open() == 0
    assert await target.entries() == []
    await target.replay(_never_called)
    assert not path.exists()
    await target.aclose()


async def _never_called(method: str, args: Any, kwargs: Any) -> Any:
    raise AssertionError("nothing should be replayed")


@pytest.mark.parametrize("durable", [True, False], ids=["spill", "memory"])
async def test_a_newer_write_of_a_key_replaces_the_waiting_one(tmp_path: Path, durable: bool) -> None:
    registry = CollectorRegistry()
    path = tmp_path / "dlq.db" if durable else None
    target = buffer(path, registry)
    try:
        await put_memory(target, "k", 1, stamp=1)
        await put_memory(target, "k", 2, stamp=2)
        await put_memory(target, "other", 9, stamp=3)
        assert target.depth == 2
        assert await target.latest_for_key(MEMORY, "k") == (("k", {"v": 2}), {})
        await put_memory(target, "k", 0, stamp=0)
        assert await target.latest_for_key(MEMORY, "k") == (("k", {"v": 2}), {})
        assert target.depth == 2
        assert sample(registry, "guarded_deadletter_superseded_total") == 2
        assert sample(registry, "guarded_deadletter_enqueued_total", method=MEMORY) == 4
        if path is not None:
            assert len(on_disk(path)) == 2
        await target.put("save_planner_state", ("k", {"p": 1}), {}, key="k", stamp=4, error="x")
        assert target.depth == 3
    finally:
        await target.aclose()


async def test_tuple_keys_are_canonical_json(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        entry = await target.put(
            "save_trajectory", ("t", "s", {"steps": []}), {}, key=("t", "s"), stamp=1, error="x"
        )
        assert entry.key == '["t","s"]'
        await target.put(
            "save_trajectory", ("t", "s", {"steps": [1]}), {}, key=["t", "s"], stamp=2, error="x"
        )
        assert target.depth == 1
        assert await target.latest_for_key("save_trajectory", ("t", "s")) == (("t", "s", {"steps": [1]}), {})
    finally:
        await target.aclose()


@pytest.mark.parametrize("durable", [True, False], ids=["spill", "memory"])
async def test_supersede_drops_only_older_entries_of_the_key(tmp_path: Path, durable: bool) -> None:
    registry = CollectorRegistry()
    path = tmp_path / "dlq.db" if durable else None
    target = buffer(path, registry)
    try:
        assert await target.supersede(MEMORY, "absent", 100) == 0
        await put_memory(target, "k", 1, stamp=5)
        await put_memory(target, "j", 1, stamp=6)
        assert await target.supersede(MEMORY, "k", 4) == 0
        assert await target.supersede("save_planner_state", "k", 9) == 0
        assert target.depth == 2
        assert await target.supersede(MEMORY, "k", 7) == 1
        assert target.depth == 1
        assert await target.latest_for_key(MEMORY, "k") is None
        assert sample(registry, "guarded_deadletter_superseded_total") == 1
        if path is not None:
            assert len(on_disk(path)) == 1
    finally:
        await target.aclose()


async def test_an_older_write_failing_after_a_newer_one_succeeded_is_not_kept(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        await target.supersede(MEMORY, "k", 10)
        await put_memory(target, "k", "stale", stamp=9)
        assert target.depth == 0
        await put_memory(target, "k", "newer", stamp=11)
        assert target.depth == 1
    finally:
        await target.aclose()


async def test_entries_of_an_earlier_process_are_older_than_any_new_write(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    first = buffer(path)
    await put_memory(first, "k", "from the crashed process", stamp=1_000_000)
    await first.aclose()
    second = buffer(path)
    try:
        assert await second.open() == 1
        assert await second.supersede(MEMORY, "k", 1) == 1
        assert second.depth == 0
        await put_memory(second, "j", "old", stamp=1)
    finally:
        await second.aclose()
    third = buffer(path)
    try:
        await third.open()
        await put_memory(third, "j", "new", stamp=0)
        assert third.depth == 1
        assert await third.latest_for_key(MEMORY, "j") == (("j", {"v": "new"}), {})
    finally:
        await third.aclose()


async def test_sequence_numbers_continue_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    first = buffer(path)
    await put_events(first, "t", 3)
    await first.aclose()
    second = buffer(path)
    try:
        entry = await second.put("save_event", (event("t", 9),), {}, scope="t", stamp=0, error="x")
        assert entry.seq == 4
        assert [item.seq for item in await second.entries()] == [1, 2, 3, 4]
    finally:
        await second.aclose()


async def test_take_removes_every_entry_of_the_key_and_returns_the_newest(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        await target.put("save_planner_state", ("tok", {"step": 1}), {}, key="tok", stamp=1, error="x")
        assert await target.take("save_planner_state", "missing") is None
        assert await target.take("save_planner_state", "tok") == (("tok", {"step": 1}), {})
        assert await target.take("save_planner_state", "tok") is None
        assert target.depth == 0
        assert await target.entries() == []
    finally:
        await target.aclose()


async def test_pending_for_scope_merges_memory_and_disk_in_order(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db", max_memory_entries=3)
    try:
        await put_events(target, "t1", 5)
        await put_events(target, "t2", 2)
        stats = await target.stats()
        assert stats.depth == 7
        assert stats.memory_entries == 3
        calls = await target.pending_for_scope("save_event", "t1")
        assert [args[0].payload["i"] for args, _ in calls] == [0, 1, 2, 3, 4]
        assert len(await target.pending_for_scope("save_event", "t2")) == 2
        assert await target.pending_for_scope("save_update", "t1") == []
    finally:
        await target.aclose()


async def test_reads_of_absent_scopes_and_keys_do_not_touch_the_file(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db", max_memory_entries=1)
    try:
        await put_events(target, "t1", 3)
        spill = target._spill
        assert spill is not None

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the spill file was read")

        spill.for_scope = refuse  # type: ignore[method-assign]
        spill.fetch = refuse  # type: ignore[method-assign]
        spill.delete = refuse  # type: ignore[method-assign]
        assert await target.pending_for_scope("save_event", "other") == []
        assert await target.latest_for_key(MEMORY, "k") is None
        assert await target.take(MEMORY, "k") is None
        assert await target.supersede(MEMORY, "k", 1) == 0
    finally:
        await target.aclose()


async def test_memory_stays_bounded_while_the_file_grows(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.db", registry, max_memory_entries=10, max_memory_bytes=2_000)
    try:
        for start in range(0, 200, 50):
            await target.put_many(
                [
                    ("save_event", (event("t", index, blob="x" * 50),), {}, None, "t", index, "x")
                    for index in range(start, start + 50)
                ]
            )
            stats = await target.stats()
            assert stats.memory_entries <= 10
            assert stats.memory_bytes <= 2_000
        stats = await target.stats()
        assert stats.depth == 200
        assert stats.disk_bytes > 10 * stats.memory_bytes
        assert sample(registry, "guarded_deadletter_depth") == 200
        assert sample(registry, "guarded_deadletter_bytes", location="memory") == stats.memory_bytes
        assert sample(registry, "guarded_deadletter_bytes", location="disk") == stats.disk_bytes
        assert (
            sample(registry, "guarded_deadletter_dropped_total", method="save_event", reason="disk_full") == 0
        )
    finally:
        await target.aclose()


async def test_without_a_file_writes_past_the_caps_are_refused_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    target = buffer(None, registry, max_memory_entries=5)
    refusals: list[WriteNotKeptError] = []
    with caplog.at_level(logging.ERROR, logger="guarded.deadletter"):
        for index in range(8):
            try:
                await target.put(
                    "save_event", (event("t", index, secret="s3cr3t"),), {}, scope="t", stamp=index, error="x"
                )
            except WriteNotKeptError as exc:
                refusals.append(exc)
    assert len(refusals) == 3
    assert {refusal.method for refusal in refusals} == {"save_event"}
    assert all("s3cr3t" not in str(refusal) for refusal in refusals)
    assert target.depth == 5
    assert [entry.seq for entry in await target.entries()] == [1, 2, 3, 4, 5]  # the oldest stay
    assert (
        sample(registry, "guarded_deadletter_refused_total", method="save_event", reason="memory_full") == 3
    )
    stats = await target.stats()
    assert stats.dropped_total == 0
    assert stats.refused_total == 3
    assert stats.enqueued_total == 5
    records = [record for record in caplog.records if getattr(record, "event", None) == "deadletter_refused"]
    assert records
    assert records[0].store == STORE
    assert records[0].reason == "memory_full"
    assert all("s3cr3t" not in record.getMessage() for record in caplog.records)
    await target.aclose()


async def test_a_full_file_refuses_new_writes_and_keeps_its_oldest(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.db", registry, max_disk_bytes=5_000)
    kept: list[int] = []
    try:
        for index in range(100):
            try:
                entry = await target.put(
                    "save_event", (event("t", index, blob="y" * 100),), {}, scope="t", stamp=index, error="x"
                )
            except WriteNotKeptError:
                continue
            kept.append(entry.seq)
        stats = await target.stats()
        assert stats.disk_bytes <= 5_000
        refused = sample(registry, "guarded_deadletter_refused_total", method="save_event", reason="disk_cap")
        assert refused > 0
        assert stats.depth + refused == 100
        assert stats.dropped_total == 0
        entries = await target.entries()
        assert [entry.seq for entry in entries] == kept == list(range(1, stats.depth + 1))
        calls = await target.pending_for_scope("save_event", "t")
        assert len(calls) == stats.depth
    finally:
        await target.aclose()


async def test_put_many_is_all_or_nothing_when_a_call_is_bad(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        bad = event("t", 1, score=float("nan"))
        with pytest.raises(InvalidPayloadError, match="payload"):
            await target.put_many(
                [
                    ("save_event", (event("t", 0),), {}, None, "t", 0, "x"),
                    ("save_event", (bad,), {}, None, "t", 1, "x"),
                ]
            )
        assert target.depth == 0
        entries = await target.put_many(
            [("save_event", (event("t", index),), {}, None, "t", index, "x") for index in range(1000)]
        )
        assert [entry.seq for entry in entries] == list(range(1, 1001))
        assert len(on_disk(path)) == 1000
    finally:
        await target.aclose()


@pytest.mark.parametrize("durable", [True, False], ids=["spill", "memory"])
async def test_parked_writes_keep_their_reason_and_are_not_replayed(tmp_path: Path, durable: bool) -> None:
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.db" if durable else None, registry)
    try:
        kept = await target.park(MEMORY, ("k", {"v": 1}), {}, reason="rejected by the backend")
        assert kept.call == {"args": ["k", {"v": 1}], "kwargs": {}}
        lost = await target.park(MEMORY, ("k", {"v": float("nan")}), {}, reason="")
        assert lost.call is None
        assert lost.size == 0
        assert "state[key #0 (str)]" in lost.reason
        assert "nan" in lost.reason
        assert [write.seq for write in await target.parked()] == [kept.seq, lost.seq]
        assert target.depth == 0
        assert sample(registry, "guarded_deadletter_parked_writes") == 2
        assert sample(registry, "guarded_deadletter_parked_total", method=MEMORY) == 2
        summary = await target.replay(_never_called)
        assert summary.replayed == 0
        assert await target.unpark() == 1
        assert [entry.seq for entry in await target.entries()] == [kept.seq]
        assert [write.seq for write in await target.parked()] == [lost.seq]
    finally:
        await target.aclose()


async def test_gauges_and_counters_of_two_stores_share_a_registry(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=True)
    now = [1000.0]
    first = DeadLetterBuffer(
        config(tmp_path / "a.db"), store_name="a", registry=registry, clock=lambda: now[0]
    )
    second = DeadLetterBuffer(config(None), store_name="b", registry=registry, clock=lambda: now[0])
    try:
        await put_events(first, "t", 2)
        now[0] += 30
        await put_events(second, "t", 3)
        now[0] += 15
        assert registry.get_sample_value("guarded_deadletter_depth", {"store": "a"}) == 2
        assert registry.get_sample_value("guarded_deadletter_depth", {"store": "b"}) == 3
        assert registry.get_sample_value("guarded_deadletter_oldest_age_seconds", {"store": "a"}) == 45
        assert registry.get_sample_value("guarded_deadletter_oldest_age_seconds", {"store": "b"}) == 15
        assert registry.get_sample_value("guarded_deadletter_bytes", {"store": "b", "location": "disk"}) == 0
        assert (
            registry.get_sample_value(
                "guarded_deadletter_enqueued_total", {"store": "b", "method": "save_event"}
            )
            == 3
        )
        assert (await first.stats()).oldest_age == 45
    finally:
        await first.aclose()
        await second.aclose()
    assert registry.get_sample_value("guarded_deadletter_depth", {"store": "a"}) is None
    assert (
        registry.get_sample_value("guarded_deadletter_enqueued_total", {"store": "a", "method": "save_event"})
        == 2
    )


async def test_a_cancelled_put_leaves_memory_and_file_in_step(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        await put_events(target, "t", 1)
        tasks = [
            asyncio.create_task(target.put("save_event", (event("t", i),), {}, scope="t", stamp=i, error="x"))
            for i in range(1, 40)
        ]
        await asyncio.sleep(0)
        for task in tasks[::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert tasks[0].cancelled()
        # Group commit: a put queued before its caller was cancelled is still committed (its caller
        # cannot know either way, as with a direct write); memory and file agree on every one.
        assert target.depth == len(on_disk(path)) == 1 + len(tasks)
        assert len(await target.pending_for_scope("save_event", "t")) == target.depth
    finally:
        await target.aclose()


async def test_a_closed_buffer_refuses_writes_and_releases_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    await put_events(target, "t", 1)
    await target.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await put_events(target, "t", 1)
    other = buffer(path)
    assert await other.open() == 1
    await other.aclose()


async def test_purge(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        await put_events(target, "t", 3)
        await target.park(MEMORY, ("k", {}), {}, reason="bad")
        assert await target.purge(pending=True, parked=False) == 3
        assert target.is_empty
        assert await target.pending_for_scope("save_event", "t") == []
        assert len(await target.parked()) == 1
        assert await target.purge(pending=False, parked=True) == 1
        assert (await target.stats()).parked == 0
    finally:
        await target.aclose()


async def test_an_unusable_spill_path_refuses_the_put(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = buffer(blocker / "dlq.db")
    with pytest.raises(WriteNotKeptError, match="unavailable"):
        await put_events(target, "t", 1)
    assert target.depth == 0
    assert not target.spill_available
    assert target.memory_only == 0
    assert target.spill_error is not None
    assert "NotADirectoryError" in target.spill_error or "FileExistsError" in target.spill_error
    await target.aclose()
