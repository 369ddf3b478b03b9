"""At the spill file's byte cap nothing kept is evicted: adopting an orphan whose writes do not fit
leaves the orphan's file as it is (its writes are still kept there), to be adopted once there is
room; a write refused as bad data is not parked past the cap (counted as refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.deadletter import DeadLetterBuffer, SpillFile
from tests.deadletter.support import buffer, put_events, sample
from tests.deadletter.test_slots import orphan, target_buffer

pytestmark = pytest.mark.asyncio


def exists(path: str) -> bool:
    return Path(path).exists()


def waiting_in(path: str) -> int:
    reader = SpillFile.open_read_only(path)
    try:
        return reader.totals().pending
    finally:
        reader.close()


async def test_an_orphan_that_does_not_fit_under_the_cap_is_left_for_later(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"

    async def fill(target: DeadLetterBuffer) -> None:
        await put_events(target, "t", 20)

    name = await orphan(path, fill)
    survivor = target_buffer(path, max_disk_bytes=1_000)  # room for the holder's event, not 20 more
    try:
        assert await survivor.open() == 1
        assert await survivor.adopt_orphans() == 0
        assert exists(name)
    finally:
        await survivor.aclose()
    assert waiting_in(name) == 20  # nothing of the orphan was lost or evicted
    roomier = target_buffer(path)
    try:
        assert await roomier.open() == 1 + 20
        assert not exists(name)
    finally:
        await roomier.aclose()


async def test_a_parked_write_past_the_cap_is_refused_not_kept_over_a_held_one(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.sqlite", registry, max_disk_bytes=400)
    try:
        await put_events(target, "t", 1)
        parked = await target.park("save_memory_state", ("k", {"blob": "x" * 1_000}), {}, reason="bad data")
        assert parked.size > 400
        assert target.depth == 1
        assert (await target.stats()).parked == 0
        assert len(await target.entries()) == 1  # the held write was not evicted for it
        refused = "guarded_deadletter_refused_total"
        assert sample(registry, refused, method="save_memory_state", reason="disk_cap") == 1
    finally:
        await target.aclose()
