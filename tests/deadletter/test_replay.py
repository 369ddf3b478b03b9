"""Replay: order, pacing, RETRY_LATER stops, REJECTED parks, bulk grouping, into real stores."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.deadletter import (
    DeadLetterBuffer,
    ReplayRejected,
    ReplayResult,
    SpillFile,
    TokenBucket,
    store_sender,
)
from guarded.errors import InvalidPayloadError
from guarded.models import SteeringEvent, SteeringEventType
from guarded.steering import validate_steering_event
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.deadletter.support import Clock, buffer, put_events, sample

Sent = list[tuple[str, tuple[Any, ...], dict[str, Any]]]


def recorder(results: dict[int, ReplayResult | Exception] | None = None) -> tuple[Any, Sent]:
    """A sender that records calls and answers ``results[n]`` for the n-th call (default OK)."""
    sent: Sent = []

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        sent.append((method, args, kwargs))
        answer = (results or {}).get(len(sent) - 1, ReplayResult.OK)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return send, sent


async def fill(target: DeadLetterBuffer) -> None:
    """Events of two traces, a memory state and a planner state, interleaved."""
    await put_events(target, "t1", 2)
    await target.put("save_memory_state", ("m", {"v": 1}), {}, key="m", stamp=10, error="x")
    await put_events(target, "t2", 2, start=2)
    await target.put("save_planner_state", ("tok",), {"payload": {"p": 1}}, key="tok", stamp=11, error="x")


@pytest.mark.asyncio
@pytest.mark.parametrize("durable", [True, False], ids=["spill", "memory"])
async def test_replay_sends_every_entry_in_order_and_empties_the_buffer(
    tmp_path: Path, durable: bool
) -> None:
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.db" if durable else None, registry)
    try:
        await fill(target)
        send, sent = recorder()
        summary = await target.replay(send, rate=10_000)
        assert [method for method, _, _ in sent] == [
            "save_event",
            "save_event",
            "save_memory_state",
            "save_event",
            "save_event",
            "save_planner_state",
        ]
        assert [args[0].payload["i"] for method, args, _ in sent if method == "save_event"] == [0, 1, 2, 3]
        assert sent[-1] == ("save_planner_state", ("tok",), {"payload": {"p": 1}})
        assert (summary.replayed, summary.parked, summary.remaining, summary.stopped_early) == (
            6,
            0,
            0,
            False,
        )
        assert target.is_empty
        assert sample(registry, "guarded_deadletter_replayed_total", method="save_event") == 4
        assert (await target.stats()).replayed_total == 6
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_retry_later_stops_the_pass_and_keeps_the_rest(tmp_path: Path) -> None:
    """What RETRY_LATER stops: the entry and the later ones of its stream (here
    one trace) wait, with a backoff of the entry's own, so the third pass first waits it out."""
    clock = Clock()
    target = buffer(tmp_path / "dlq.db", monotonic=clock)
    try:
        await put_events(target, "t", 5)
        send, sent = recorder({2: ReplayResult.RETRY_LATER})
        summary = await target.replay(send, rate=10_000)
        assert (summary.replayed, summary.remaining, summary.stopped_early) == (2, 3, True)
        assert [entry.seq for entry in await target.entries()] == [3, 4, 5]
        send, sent = recorder({0: ConnectionResetError("still down")})
        summary = await target.replay(send, rate=10_000)
        assert summary.stopped_early
        assert summary.remaining == 3
        assert summary.last_error is not None
        assert "ConnectionResetError" in summary.last_error
        assert summary.retry_in is not None
        clock.advance(summary.retry_in)
        send, sent = recorder()
        summary = await target.replay(send, rate=10_000)
        assert [args[0].payload["i"] for _, args, _ in sent] == [2, 3, 4]
        assert target.is_empty
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_rejected_entries_are_parked_with_the_reason_and_the_pass_goes_on(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = buffer(tmp_path / "dlq.db", registry)
    try:
        await put_events(target, "t", 4)
        error = InvalidPayloadError("too large", path="event.payload").for_method("save_event")
        send, sent = recorder({1: error, 2: ReplayResult.REJECTED})
        summary = await target.replay(send, rate=10_000)
        assert (summary.replayed, summary.parked, summary.remaining) == (2, 2, 0)
        parked = await target.parked()
        assert [write.seq for write in parked] == [2, 3]
        assert "save_event: event.payload: too large" in parked[0].reason
        assert parked[1].reason == "rejected by the backend"
        assert parked[0].call is not None
        assert sample(registry, "guarded_deadletter_parked_total", method="save_event") == 2
        send, sent = recorder()
        assert (await target.replay(send)).replayed == 0
        assert sent == []
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_runs_of_events_become_bulk_writes_and_other_streams_wait_their_turn(tmp_path: Path) -> None:
    """Writes of another stream in between do not break a run: a page is taken stream by stream
    (each key and stream keeps its order)."""
    target = buffer(tmp_path / "dlq.db")
    faulty = FaultyStore(InMemoryStateStore())
    try:
        await put_events(target, "t", 5)
        await target.put("save_memory_state", ("m", {}), {}, key="m", stamp=99, error="x")
        await put_events(target, "t", 2, start=5)
        await put_events(target, "u", 1, start=7)
        send, send_bulk = store_sender(faulty)
        assert send_bulk is not None
        summary = await target.replay(send, send_bulk=send_bulk, batch=3, rate=10_000)
        assert summary.replayed == 9
        assert target.is_empty
        calls = [(record.method, record.call_index) for record in fault_injector(faulty).log]
        assert [method for method, _ in calls] == [
            "save_events",
            "save_events",
            "save_events",
            "save_memory_state",
        ]
        history = await faulty.load_history("t")
        assert [item.payload["i"] for item in history] == [0, 1, 2, 3, 4, 5, 6]
        assert [item.payload["i"] for item in await faulty.load_history("u")] == [7]
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_a_rejected_bulk_write_is_retried_one_by_one(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        await put_events(target, "t", 4)
        bulks: list[int] = []

        async def send_bulk(method: str, calls: list[Any]) -> ReplayResult:
            bulks.append(len(calls))
            return ReplayResult.REJECTED

        send, sent = recorder({1: ReplayRejected("event 1 is bad")})
        summary = await target.replay(send, send_bulk=send_bulk, rate=10_000)
        assert bulks == [4]
        assert len(sent) == 4
        assert (summary.replayed, summary.parked) == (3, 1)
        (parked,) = await target.parked()
        assert parked.seq == 2
        assert "event 1 is bad" in parked.reason
    finally:
        await target.aclose()


class ValidatingStore(InMemoryStateStore):
    """A store stricter than PenguiFlow's reference: it refuses steering events that fail validation."""

    async def save_steering(self, event: SteeringEvent) -> None:
        validate_steering_event(event)
        await super().save_steering(event)


@pytest.mark.asyncio
async def test_replay_into_a_failing_then_recovering_store(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    store = ValidatingStore()
    faulty = FaultyStore(store, FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
    try:
        await put_events(target, "t", 3)
        await target.put(
            "save_steering",
            (SteeringEvent(session_id="s", task_id="x", event_type=SteeringEventType.USER_MESSAGE),),
            {},
            scope="s",
            stamp=50,
            error="x",
        )
        await target.put("save_memory_state", ("m", {"v": 2}), {}, key="m", stamp=51, error="x")
        send, send_bulk = store_sender(faulty)
        summary = await target.replay(send, send_bulk=send_bulk, rate=10_000)
        assert summary.stopped_early
        assert summary.remaining == 5
        assert summary.replayed == 0
        fault_injector(faulty).plan = FaultPlan()
        summary = await target.replay(send, send_bulk=send_bulk, rate=10_000)
        assert (summary.replayed, summary.parked, summary.remaining) == (4, 1, 0)
        (parked,) = await target.parked()
        assert parked.method == "save_steering"
        assert "SteeringValidationError" in parked.reason
        assert len(await store.load_history("t")) == 3
        assert await store.load_memory_state("m") == {"v": 2}
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_superseded_and_taken_entries_are_not_replayed(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        await target.put("save_memory_state", ("a", {"v": 1}), {}, key="a", stamp=1, error="x")
        await target.put("save_planner_state", ("tok", {"v": 1}), {}, key="tok", stamp=2, error="x")
        await target.put("save_memory_state", ("b", {"v": 1}), {}, key="b", stamp=3, error="x")
        await target.supersede("save_memory_state", "a", 5)
        await target.take("save_planner_state", "tok")
        send, sent = recorder()
        await target.replay(send)
        assert sent == [("save_memory_state", ("b", {"v": 1}), {})]
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_a_damaged_stored_call_is_parked(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    target = buffer(path)
    try:
        await put_events(target, "t", 2)
        spill = target._spill
        assert spill is not None
        spill._db.execute("""UPDATE pending SET call = '{"args": 1, "kwargs": {}}' WHERE seq = 1""")
        target._memory.clear()
        send, _sent = recorder()
        summary = await target.replay(send)
        assert (summary.replayed, summary.parked) == (1, 1)
        assert "cannot be decoded" in (await target.parked())[0].reason
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_replay_is_paced_to_the_rate(tmp_path: Path) -> None:
    target = buffer(None)
    await put_events(target, "t", 11)
    send, sent = recorder()
    started = time.monotonic()
    await target.replay(send, rate=100)
    elapsed = time.monotonic() - started
    assert len(sent) == 11
    assert 0.09 <= elapsed < 1.0


@pytest.mark.asyncio
async def test_token_bucket_with_a_fake_clock() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    bucket = TokenBucket(10, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        await bucket.take()
    assert now[0] == pytest.approx(0.4)
    await bucket.take(20)
    assert now[0] == pytest.approx(0.5)
    await bucket.take()
    assert now[0] == pytest.approx(2.5)
    now[0] += 100
    await bucket.take()
    assert now[0] == pytest.approx(102.5)
    assert all(seconds > 0 for seconds in slept)


@pytest.mark.asyncio
async def test_the_pass_only_covers_entries_waiting_when_it_started(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.db")
    try:
        await put_events(target, "t", 2)

        async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
            await put_events(target, "later", 1, start=100 + args[0].payload["i"])
            return ReplayResult.OK

        summary = await target.replay(send)
        assert summary.replayed == 2
        assert summary.remaining == 2
    finally:
        await target.aclose()


def test_spill_of_a_replayed_buffer_is_empty(tmp_path: Path) -> None:
    import asyncio

    async def run() -> None:
        target = buffer(tmp_path / "dlq.db")
        await put_events(target, "t", 3)
        await target.replay(recorder()[0])
        await target.aclose()

    asyncio.run(run())
    reader = SpillFile.open_read_only(str(tmp_path / "dlq.db"))
    try:
        assert reader.totals().pending == 0
    finally:
        reader.close()
