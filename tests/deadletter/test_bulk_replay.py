"""Bulk replay of keyed upserts through the KeyGate: a bulk write never carries a held write of a
key whose newer direct write is in flight, never overwrites what that write stored, and a direct
write arriving meanwhile waits for the bulk write. And a pass at ``rate=math.inf`` never waits."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from guarded.deadletter import DeadLetterBuffer, ReplayRejected, ReplayResult, TokenBucket
from tests.deadletter.support import buffer

pytestmark = pytest.mark.asyncio

MEMORY = "save_memory_state"
BULK = frozenset({MEMORY})


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``condition`` holds (no wall-clock race: a bounded number of turns)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def hold(target: DeadLetterBuffer, *keys: str) -> None:
    for stamp, key in enumerate(keys, start=1):
        await target.put(MEMORY, (key, {"v": f"held {key}"}), {}, key=key, stamp=stamp, error="x")


class Backend:
    """Records what replays send: bulk writes as lists of keys, single writes as keys."""

    def __init__(self) -> None:
        self.bulks: list[list[str]] = []
        self.singles: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.bulk_sent = asyncio.Event()

    async def send(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        self.singles.append(args[0])
        return ReplayResult.OK

    async def send_bulk(self, method: str, calls: list[Any]) -> ReplayResult:
        self.bulks.append([args[0] for args, _ in calls])
        self.bulk_sent.set()
        await self.release.wait()
        return ReplayResult.OK


@pytest.mark.parametrize("durable", [True, False], ids=["spill", "memory"])
async def test_a_bulk_run_leaves_out_a_key_with_a_newer_direct_write_in_flight(
    tmp_path: Path, durable: bool
) -> None:
    target = buffer(tmp_path / "dlq.db" if durable else None)
    backend = Backend()
    try:
        await hold(target, "k1", "k2", "k3", "k4")
        slot3 = target.slot(MEMORY, "k3")
        assert slot3 is not None
        assert target.gate.try_enter_direct(slot3, 100)  # a newer direct write of k3 is in flight
        replay = asyncio.ensure_future(
            target.replay(backend.send, send_bulk=backend.send_bulk, bulk_methods=BULK, rate=math.inf)
        )
        await until(lambda: backend.bulks == [["k1", "k2"]], "the bulk write of k1 and k2")
        await until(lambda: bool(target.gate._keys[slot3].waiters), "the replay waiting for k3")
        assert not replay.done()
        assert await target.supersede(MEMORY, "k3", 100) == 1  # the direct write succeeded
        target.gate.leave_direct(slot3, 100)
        summary = await asyncio.wait_for(replay, 10)
        assert backend.bulks == [["k1", "k2"]]
        assert backend.singles == ["k4"]  # k3 was never sent: its newer value stays
        assert (summary.replayed, summary.remaining) == (3, 0)
        assert len(target.gate) == 0
    finally:
        await target.aclose()


async def test_a_direct_write_waits_for_the_bulk_write_holding_its_key(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    backend = Backend()
    backend.release.clear()
    try:
        await hold(target, "k1", "k2", "k3")
        slot2 = target.slot(MEMORY, "k2")
        assert slot2 is not None
        replay = asyncio.ensure_future(
            target.replay(backend.send, send_bulk=backend.send_bulk, bulk_methods=BULK, rate=math.inf)
        )
        await asyncio.wait_for(backend.bulk_sent.wait(), 10)
        assert backend.bulks == [["k1", "k2", "k3"]]
        assert not target.gate.try_enter_direct(slot2, 50)
        direct = asyncio.ensure_future(target.gate.enter_direct(slot2, 50))
        await asyncio.sleep(0)
        assert not direct.done()  # it would commit before the bulk write and be overwritten
        backend.release.set()
        await asyncio.wait_for(direct, 10)
        target.gate.leave_direct(slot2, 50)
        summary = await asyncio.wait_for(replay, 10)
        assert summary.replayed == 3
    finally:
        await target.aclose()


async def test_a_rejected_keyed_bulk_write_falls_back_to_singles(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    sent: list[str] = []

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        sent.append(args[0])
        if args[0] == "k2":
            raise ReplayRejected("k2 is bad")
        return ReplayResult.OK

    async def send_bulk(method: str, calls: list[Any]) -> ReplayResult:
        return ReplayResult.REJECTED

    try:
        await hold(target, "k1", "k2", "k3")
        summary = await target.replay(send, send_bulk=send_bulk, bulk_methods=BULK, rate=math.inf)
        assert sent == ["k1", "k2", "k3"]
        assert (summary.replayed, summary.parked) == (2, 1)
        (parked,) = await target.parked()
        assert "k2 is bad" in parked.reason
    finally:
        await target.aclose()


async def test_two_held_writes_of_one_key_go_in_one_bulk_write_in_order(tmp_path: Path) -> None:
    """An unparked write of a key waits beside a newer write of it: one run enters the key's slot
    once (entering it twice would wait for itself) and sends both, the newer last."""
    target = buffer(tmp_path / "dlq.db")
    try:
        await target.put(MEMORY, ("k", {"v": "refused once"}), {}, key="k", stamp=1, error="x")

        async def refuse(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
            return ReplayResult.REJECTED

        assert (await target.replay(refuse, rate=math.inf)).parked == 1
        await target.put(MEMORY, ("k", {"v": "newer"}), {}, key="k", stamp=2, error="x")
        await target.put(MEMORY, ("j", {"v": "other"}), {}, key="j", stamp=3, error="x")
        assert await target.unpark() == 1
        assert [entry.key for entry in await target.entries()] == ['"k"', '"k"', '"j"']
        values: list[Any] = []

        async def send_bulk(method: str, calls: list[Any]) -> ReplayResult:
            values.extend(args[1]["v"] for args, _ in calls)
            return ReplayResult.OK

        summary = await asyncio.wait_for(
            target.replay(refuse, send_bulk=send_bulk, bulk_methods=BULK, rate=math.inf), 10
        )
        assert values == ["refused once", "newer", "other"]
        assert summary.replayed == 3
        assert len(target.gate) == 0
    finally:
        await target.aclose()


async def test_events_are_not_grouped_unless_asked(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    backend = Backend()
    try:
        await hold(target, "k1", "k2")
        await target.replay(backend.send, send_bulk=backend.send_bulk, rate=math.inf)  # default: events
        assert backend.bulks == []
        assert backend.singles == ["k1", "k2"]
    finally:
        await target.aclose()


async def test_an_unlimited_rate_never_waits() -> None:
    async def never(seconds: float) -> None:
        raise AssertionError(f"slept {seconds}s")

    bucket = TokenBucket(math.inf, sleep=never)
    for _ in range(1000):
        await bucket.take(100)
        bucket.debit(100)
    assert bucket.unlimited
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(float("nan"))


async def test_the_rate_still_paces_bulk_writes(tmp_path: Path) -> None:
    """At 10 writes/s, a bulk write of 5 costs half a second before the next write goes."""
    slept: list[float] = []
    clock = [0.0]

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    bucket = TokenBucket(10, clock=lambda: clock[0], sleep=sleep)
    await bucket.take(1)
    bucket.debit(4)
    await bucket.take(1)
    assert sum(slept) == pytest.approx(0.5)
