"""Group commit: concurrent puts share one spill transaction; each caller returns once the
transaction holding its entry committed; last-write-wins holds within and across groups."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.deadletter import DeadLetter, DeadLetterBuffer, SpillFile
from guarded.errors import WriteNotKeptError
from tests.deadletter.support import buffer, event, sample

pytestmark = pytest.mark.asyncio

MEMORY = "save_memory_state"


def committed_seqs(target: DeadLetterBuffer, monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Sequence numbers of the entries the spill file has committed, recorded as each write
    transaction returns (on the worker thread, before the buffer hears of it)."""
    spill = target._spill
    assert spill is not None
    seen: set[int] = set()
    real_write = spill.write

    def write(entries: Any, **kwargs: Any) -> Any:
        result = real_write(entries, **kwargs)
        seen.update(entry.seq for entry in entries)
        return result

    monkeypatch.setattr(spill, "write", write)
    return seen


def on_disk(path: Path) -> list[DeadLetter]:
    reader = SpillFile.open_read_only(str(path))
    try:
        return reader.page(0, None)
    finally:
        reader.close()


async def test_concurrent_puts_share_transactions_and_return_once_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        await target.put("save_event", (event("warm", 0),), {}, scope="warm", stamp=0, error="x")
        spill = target._spill
        assert spill is not None
        committed = committed_seqs(target, monkeypatch)
        before = spill.commits
        returned_uncommitted: list[int] = []

        async def caller(index: int) -> None:
            key = f"k{index}"
            entry = await target.put(MEMORY, (key, {"v": index}), {}, key=key, stamp=index + 1, error="x")
            if entry.seq not in committed:
                returned_uncommitted.append(entry.seq)

        await asyncio.gather(*(caller(index) for index in range(100)))
        assert returned_uncommitted == []
        commits = spill.commits - before
        assert 1 <= commits < 100
        assert len(on_disk(path)) == target.depth == 101
    finally:
        await target.aclose()


async def test_last_write_wins_within_a_group(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        await target.put(MEMORY, ("warm", {}), {}, key="warm", stamp=0, error="x")
        stamps = list(range(1, 41))
        random.Random(7).shuffle(stamps)
        await asyncio.gather(
            *(
                target.put(MEMORY, ("k", {"v": stamp}), {}, key="k", stamp=stamp, error="x")
                for stamp in stamps
            )
        )
        assert await target.latest_for_key(MEMORY, "k") == (("k", {"v": 40}), {})
        assert [entry.key for entry in on_disk(path)] == ['"warm"', '"k"']
        assert (await target.stats()).superseded_total == 39
    finally:
        await target.aclose()


async def test_last_write_wins_across_groups_and_direct_writes(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        first = asyncio.gather(
            *(
                target.put(MEMORY, ("k", {"v": stamp}), {}, key="k", stamp=stamp, error="x")
                for stamp in (5, 3)
            )
        )
        await asyncio.sleep(0)  # the first group is being committed; these form the next one
        second = asyncio.gather(
            target.put(MEMORY, ("k", {"v": 4}), {}, key="k", stamp=4, error="x"),
            target.put(MEMORY, ("k", {"v": 7}), {}, key="k", stamp=7, error="x"),
        )
        await asyncio.gather(first, second)
        assert await target.latest_for_key(MEMORY, "k") == (("k", {"v": 7}), {})
        assert await target.supersede(MEMORY, "k", 8) == 1
        await target.put(MEMORY, ("k", {"v": 6}), {}, key="k", stamp=6, error="x")  # older than 8
        assert target.depth == 0
        assert on_disk(path) == []
    finally:
        await target.aclose()


async def test_a_failed_group_commit_refuses_every_caller_of_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        await target.put("save_event", (event("warm", 0),), {}, scope="warm", stamp=0, error="x")
        spill = target._spill
        assert spill is not None

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(spill, "write", failing)
        answers = await asyncio.gather(
            *(
                target.put("save_event", (event("t", index),), {}, scope="t", stamp=index, error="x")
                for index in range(20)
            ),
            return_exceptions=True,
        )
        assert all(isinstance(answer, WriteNotKeptError) for answer in answers)
        assert len({id(answer) for answer in answers}) == 20  # each caller its own
        assert (target.depth, target.memory_only) == (1, 0)  # the acknowledged write stays
        assert await target.pending_for_scope("save_event", "t") == []
    finally:
        await target.aclose()


async def test_at_the_cap_each_caller_of_a_group_is_answered_for_its_own_write(tmp_path: Path) -> None:
    """Concurrent puts share a transaction; past the byte cap the writes that fit are committed and
    acknowledged, the others refused, caller by caller; nothing already kept is evicted."""
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.db", registry, max_disk_bytes=4_000)
    try:
        first = await target.put("save_event", (event("warm", 0),), {}, scope="warm", stamp=0, error="x")
        answers = await asyncio.gather(
            *(
                target.put(
                    "save_event", (event("t", index, blob="y" * 100),), {}, scope="t", stamp=index, error="x"
                )
                for index in range(1, 41)
            ),
            return_exceptions=True,
        )
        kept = [answer for answer in answers if not isinstance(answer, BaseException)]
        refused = [answer for answer in answers if isinstance(answer, WriteNotKeptError)]
        assert kept
        assert refused
        assert len(kept) + len(refused) == 40
        on_file = [entry.seq for entry in await target.entries()]
        assert on_file == [first.seq, *sorted(entry.seq for entry in kept)]
        assert sample(
            registry, "guarded_deadletter_refused_total", method="save_event", reason="disk_cap"
        ) == len(refused)
    finally:
        await target.aclose()
