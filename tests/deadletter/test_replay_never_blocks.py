"""Replay never blocks: order is kept per key and per stream, a failing entry
backs off on its own and is parked after a bounded number of counted attempts (at once when it can
never succeed), a failed bulk write falls back to singles, and a backend that is down stops the
pass early instead of being hammered. Scripted stores and real SQLite files; time is a fake clock."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import GuardConfig, controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.backends.postgres.error_classifier import POSTGRES_ERRORS
from guarded.bulk_forms import bulk_methods_of
from guarded.config import DeadLetterConfig
from guarded.deadletter import (
    REPLAY_FAILURE_STREAK,
    DeadLetterBuffer,
    ReplayResult,
    ReplaySummary,
    store_sender,
)
from guarded.deadletter.replay import REPLAY_BACKOFF_MAX, replay_backoff
from guarded.error_classes import CircuitOpenError, ErrorClass, register_classifier
from guarded.models import StoredEvent
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.deadletter.support import Clock, buffer, event

pytestmark = pytest.mark.asyncio

MEMORY = "save_memory_state"
Rule = Callable[[str, tuple[Any, ...], dict[str, Any]], BaseException | None]


class Scripted:
    """An in-memory store with the protocol's signatures whose writes raise what ``rule`` says
    (``None``: the write goes through); ``down`` makes every call raise it. Records every call."""

    def __init__(self, rule: Rule | None = None) -> None:
        self.inner = InMemoryStateStore()
        self.rule = rule
        self.down: BaseException | None = None
        self.calls: list[tuple[str, int]] = []
        """``(method, number of writes)`` of every call that reached the store."""

    def _check(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], count: int = 1) -> None:
        self.calls.append((method, count))
        if self.down is not None:
            raise self.down
        failure = self.rule(method, args, kwargs) if self.rule is not None else None
        if failure is not None:
            raise failure

    async def save_event(self, event: StoredEvent) -> None:
        self._check("save_event", (event,), {})
        await self.inner.save_event(event)

    async def save_events(self, events: Sequence[StoredEvent]) -> None:
        self._check("save_events", (events,), {}, len(events))
        for item in events:
            failure = self.rule("save_event", (item,), {}) if self.rule is not None else None
            if failure is not None:
                raise failure
        for item in events:
            await self.inner.save_event(item)

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        return await self.inner.load_history(trace_id)

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        self._check(MEMORY, (key, state), {})
        await self.inner.save_memory_state(key, state)

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        return await self.inner.load_memory_state(key)

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        self._check("mark_binding_terminal", (), {"trace_id": trace_id})

    @property
    def sends(self) -> int:
        return len(self.calls)


def raw_sender(store: object, sent: list[str] | None = None) -> Any:
    """A sender like the guard's: it calls the store and lets every exception out (``sent``
    records the methods it was asked to send)."""

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        if sent is not None:
            sent.append(method)
        await getattr(store, method)(*args, **kwargs)
        return ReplayResult.OK

    return send


def fails_for(
    *, key: str | None = None, event_index: int | None = None, error: type[Exception] = RuntimeError
) -> Rule:
    def rule(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseException | None:
        if key is not None and method == MEMORY and args[0] == key:
            return error(f"the backend refuses {key}")
        if event_index is not None and method == "save_event" and args[0].payload["i"] == event_index:
            return error("the backend refuses this event")
        return None

    return rule


async def hold_memory(target: DeadLetterBuffer, keys: Sequence[str], *, start: int = 1) -> None:
    for stamp, key in enumerate(keys, start=start):
        await target.put(MEMORY, (key, {"v": key}), {}, key=key, stamp=stamp, error="ConnectionError")


async def hold_events(target: DeadLetterBuffer, trace: str, indexes: Sequence[int]) -> None:
    for index in indexes:
        await target.put("save_event", (event(trace, index),), {}, scope=trace, stamp=index, error="x")


async def history(store: Scripted, trace: str) -> list[int]:
    return [item.payload["i"] for item in await store.load_history(trace)]


async def replay(target: DeadLetterBuffer, store: Scripted, **options: Any) -> ReplaySummary:
    send, send_bulk = store_sender(store)
    return await target.replay(
        send, send_bulk=send_bulk, bulk_methods=bulk_methods_of(store), rate=math.inf, **options
    )


# --- calls that can never succeed are parked at once --------------------------------------------


@pytest.mark.parametrize("exact", [True, False], ids=["store-signature", "protocol-signature"])
async def test_calls_that_do_not_bind_are_parked_at_once_and_everything_else_is_delivered(
    tmp_path: Path, exact: bool
) -> None:
    """The issue's caller bugs: ``save_event()`` inside a batch of 100 good events, and
    ``mark_binding_terminal("t", "c", "x")`` (keyword-only arguments passed positionally), ahead of
    100 writes of other keys. One pass delivers every good write and parks the two with a reason.
    With the store's own signatures the bad calls are never sent; with only the protocol's (the
    guard's replay) each is sent alone once and parked on its ``TypeError``."""
    target = buffer(tmp_path / "dlq.sqlite")
    store = Scripted()
    try:
        await target.put("mark_binding_terminal", ("t", "c", "x"), {}, stamp=0, error="x")
        await hold_events(target, "t", range(50))
        await target.put("save_event", (), {}, scope="t", stamp=50, error="x")
        await hold_events(target, "t", range(50, 100))
        await hold_memory(target, [f"k{number}" for number in range(100)], start=200)
        sent: list[str] = []
        send = store_sender(store)[0] if exact else raw_sender(store, sent)
        summary = await target.replay(
            send,
            send_bulk=store_sender(store)[1],
            bulk_methods=bulk_methods_of(store),
            rate=math.inf,
            target=store if exact else None,
        )
        assert (summary.replayed, summary.parked, summary.remaining) == (200, 2, 0)
        assert not summary.stopped_early
        assert await history(store, "t") == list(range(100))
        for number in range(100):
            assert await store.load_memory_state(f"k{number}") == {"v": f"k{number}"}
        reasons = {write.method: write.reason for write in await target.parked()}
        assert reasons == {
            "mark_binding_terminal": "the call does not bind to mark_binding_terminal(): "
            "too many positional arguments",
            "save_event": "the call does not bind to save_event(): missing a required argument: 'event'",
        }
        bulks = [calls for method, calls in store.calls if method == "save_events"]
        if exact:
            # Never sent: the good events went in one bulk write.
            assert bulks == [100]
            assert sent == []
        else:
            # Each went alone, between bulk writes of the good events, and failed on its binding.
            assert bulks == [50, 50]
            assert [method for method in sent if method != MEMORY] == ["mark_binding_terminal", "save_event"]
        assert [
            method for method, _ in store.calls if method in ("save_event", "mark_binding_terminal")
        ] == []
    finally:
        await target.aclose()


@pytest.mark.parametrize("how", ["store-given", "store-sender", "attribute-error"])
async def test_an_unknown_method_in_the_file_is_parked_at_once(tmp_path: Path, how: str) -> None:
    target = buffer(tmp_path / "dlq.sqlite")
    store = Scripted()
    try:
        await target.put("save_widget", ("w", {"v": 1}), {}, stamp=1, error="x")
        await hold_memory(target, ["a", "b"], start=2)
        send = raw_sender(store) if how == "attribute-error" else store_sender(store)[0]
        summary = await target.replay(send, rate=math.inf, target=store if how == "store-given" else None)
        assert (summary.replayed, summary.parked, summary.remaining) == (2, 1, 0)
        (parked,) = await target.parked()
        assert "save_widget" in parked.reason
        assert "no method" in parked.reason
        assert [method for method, _ in store.calls] == [MEMORY, MEMORY]
    finally:
        await target.aclose()


async def test_a_method_name_that_is_no_method_is_never_called(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.sqlite")
    store = Scripted()
    try:
        await target.put("__init__", (), {}, stamp=1, error="x")
        summary = await replay(target, store)
        assert (summary.replayed, summary.parked) == (0, 1)
        assert (await target.parked())[0].reason == "not a store method name"
        assert store.calls == []
    finally:
        await target.aclose()


# --- a failing entry only holds back its own key and stream ------------------------------------


async def test_a_failing_entry_holds_back_only_its_own_key_and_stream(tmp_path: Path) -> None:
    clock = Clock()
    target = buffer(tmp_path / "dlq.sqlite", monotonic=clock)
    store = Scripted(fails_for(key="bad", event_index=3))
    try:
        await hold_memory(target, ["a", "bad", "c"])
        await hold_events(target, "t", range(6))  # 3 fails: 4 and 5 must not overtake it
        await hold_events(target, "u", range(10, 13))
        summary = await replay(target, store)
        assert summary.replayed == 2 + 3 + 3  # a, c; events 0-2 of t; every event of u
        assert (summary.failed, summary.deferred, summary.remaining) == (2, 2, 4)
        assert summary.stopped_early
        assert not summary.backend_down
        assert summary.retry_in == 0  # a first failure is tried again at the next pass
        assert await history(store, "t") == [0, 1, 2]
        assert await history(store, "u") == [10, 11, 12]
        assert await store.inner.load_memory_state("a") == {"v": "a"}
        assert await store.inner.load_memory_state("bad") is None
        store.rule = None  # the backend takes them now
        summary = await replay(target, store)
        assert (summary.replayed, summary.remaining, summary.stopped_early) == (4, 0, False)
        assert await history(store, "t") == [0, 1, 2, 3, 4, 5]
        assert await store.inner.load_memory_state("bad") == {"v": "bad"}
    finally:
        await target.aclose()


async def test_a_failed_bulk_write_falls_back_to_singles(tmp_path: Path) -> None:
    """One event the backend refuses (an error that is not about the data, so retried later) in a
    bulk run of 100: the bulk write fails, the run goes one by one, the 99 good ones are delivered
    and only the bad one (and the later events of its own trace) wait."""
    target = buffer(tmp_path / "dlq.sqlite")
    store = Scripted(fails_for(event_index=40))
    try:
        for index in range(100):
            await target.put(
                "save_event",
                (event(f"trace-{index % 10}", index),),
                {},
                scope=f"trace-{index % 10}",
                stamp=index,
                error="x",
            )
        summary = await replay(target, store)
        # 40 is in trace-0: 50, 60, 70, 80, 90 wait behind it; every other trace is delivered.
        assert (summary.replayed, summary.failed, summary.deferred) == (94, 1, 5)
        assert [calls for method, calls in store.calls if method == "save_events"] == [100]
        assert await history(store, "trace-0") == [0, 10, 20, 30]
        assert await history(store, "trace-1") == list(range(1, 100, 10))
    finally:
        await target.aclose()


# --- backoff, counted attempts, parking ---------------------------------------------------------


async def test_a_failing_entry_backs_off_on_its_own_and_is_parked_after_the_attempts(tmp_path: Path) -> None:
    clock = Clock()
    target = buffer(tmp_path / "dlq.sqlite", monotonic=clock, max_replay_attempts=4)
    store = Scripted(fails_for(key="bad"))
    try:
        await hold_memory(target, ["bad"])
        waits: list[float | None] = []
        sends: list[int] = []
        for number in range(6):
            await hold_memory(target, [f"good{number}"], start=10 + number)  # the backend takes others
            before = store.sends
            summary = await replay(target, store)
            sends.append(store.sends - before)
            waits.append(summary.retry_in)
            if summary.parked:
                break
            assert summary.retry_in is not None
            if summary.retry_in:
                before = store.sends
                early = await replay(target, store)  # not due yet: not sent
                assert (early.failed, early.deferred, store.sends - before) == (0, 1, 0)
                clock.advance(summary.retry_in)
        assert waits == [0.0, 0.5, 1.0, None]
        assert sends == [2, 2, 2, 2]  # the bad entry and the new good one, each pass
        (parked,) = await target.parked()
        assert parked.reason == "gave up after 4 failed replays; last error: RuntimeError"
        assert target.is_empty
        assert [replay_backoff(n) for n in range(1, 12)][-1] == REPLAY_BACKOFF_MAX
    finally:
        await target.aclose()


async def test_failures_while_the_backend_is_down_are_not_counted(tmp_path: Path) -> None:
    """A long outage: every send fails with a connection error, pass after pass. No held write is
    parked for it, each pass sends a handful at most, and recovery delivers everything."""
    clock = Clock()
    target = buffer(tmp_path / "dlq.sqlite", monotonic=clock, max_replay_attempts=2)
    store = Scripted()
    store.down = ConnectionRefusedError("connection refused")
    try:
        await hold_memory(target, [f"k{number}" for number in range(30)])
        await hold_events(target, "t", range(30))
        for _ in range(40):
            before = store.sends
            summary = await replay(target, store)
            assert store.sends - before <= REPLAY_FAILURE_STREAK + 2  # a bulk write and a few singles
            assert summary.parked == 0
            assert summary.stopped_early
            clock.advance(REPLAY_BACKOFF_MAX)
        assert summary.backend_down
        assert target.depth == 60
        store.down = None
        summary = await replay(target, store)
        assert (summary.replayed, summary.parked, summary.remaining) == (60, 0, 0)
        assert await history(store, "t") == list(range(30))
    finally:
        await target.aclose()


async def test_a_down_backend_stops_the_pass_after_a_few_sends(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.sqlite")
    store = Scripted()
    store.down = ConnectionResetError("connection reset")
    try:
        await hold_memory(target, [f"k{number}" for number in range(100)])
        summary = await replay(target, store)
        # One method: after REPLAY_FAILURE_STREAK failures it waits for the next pass.
        assert store.sends == REPLAY_FAILURE_STREAK
        assert (summary.failed, summary.remaining) == (REPLAY_FAILURE_STREAK, 100)
        await hold_events(target, "t", range(100))
        before = store.sends
        summary = await replay(target, store)
        # The memory states first tried are due again at once: two of them fail, then the event
        # bulk write and one event: failures of two methods in a row end the pass.
        assert store.sends - before <= REPLAY_FAILURE_STREAK + 2
        assert summary.backend_down
        assert summary.stopped_early
    finally:
        await target.aclose()


async def test_a_refusal_by_the_circuit_breaker_stops_the_pass_and_counts_nothing(tmp_path: Path) -> None:
    target = buffer(tmp_path / "dlq.sqlite", max_replay_attempts=1)
    refused: list[str] = []

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        refused.append(args[0])
        raise CircuitOpenError("circuit open for store 'primary'")

    try:
        await hold_memory(target, ["a", "b", "c"])
        for _ in range(5):
            summary = await target.replay(send, rate=math.inf)
            assert (summary.backend_down, summary.stopped_early, summary.parked) == (True, True, 0)
        assert refused == ["a"] * 5  # nothing reached the backend: the same entry goes first again
        assert target.depth == 3
    finally:
        await target.aclose()


async def test_a_success_makes_entries_whose_failures_were_not_counted_due_at_once(tmp_path: Path) -> None:
    clock = Clock()
    target = buffer(tmp_path / "dlq.sqlite", monotonic=clock)
    store = Scripted()
    store.down = ConnectionRefusedError("down")
    try:
        await hold_memory(target, ["a"])
        await replay(target, store)
        summary = await replay(target, store)  # its second failure: a backoff of 0.5 s
        assert summary.retry_in == 0.5
        store.down = None
        await hold_memory(target, ["b"], start=5)
        summary = await replay(target, store)  # b goes; a still waits out its backoff ...
        assert (summary.replayed, summary.deferred) == (1, 1)
        summary = await replay(target, store)  # ... but the success made it due at once
        assert (summary.replayed, summary.remaining) == (1, 0)
    finally:
        await target.aclose()


async def test_operational_failures_are_never_counted_toward_parking(tmp_path: Path) -> None:
    if not hasattr(ErrorClass, "OPERATIONAL"):
        pytest.skip("no operational error class")

    # SQLSTATE 42P01 is operational by the PostgreSQL backend's classifier: registered here, not
    # left to whichever test imported the backend first (alone, this test parked the write).
    register_classifier(POSTGRES_ERRORS)

    class UndefinedTable(Exception):
        sqlstate = "42P01"

    clock = Clock()
    target = buffer(tmp_path / "dlq.sqlite", monotonic=clock, max_replay_attempts=1)
    store = Scripted(fails_for(key="m", error=UndefinedTable))
    try:
        await hold_memory(target, ["m"])
        for number in range(5):
            await hold_memory(target, [f"other{number}"], start=10 + number)
            summary = await replay(target, store)
            assert summary.parked == 0
            clock.advance(REPLAY_BACKOFF_MAX)
        assert target.depth == 1
        store.rule = None
        assert (await replay(target, store)).replayed == 1
    finally:
        await target.aclose()


async def test_a_held_key_that_failed_is_still_superseded_by_a_newer_direct_write(tmp_path: Path) -> None:
    """Backoff keeps last-write-wins: a newer direct write of the key drops the waiting entry, and
    the KeyGate still orders the replay of a key against its direct writes."""
    clock = Clock()
    target = buffer(tmp_path / "dlq.sqlite", monotonic=clock)
    store = Scripted(fails_for(key="k"))
    try:
        await hold_memory(target, ["k", "j"])
        summary = await replay(target, store)
        assert (summary.replayed, summary.failed) == (1, 1)
        assert await target.supersede(MEMORY, "k", 100) == 1
        store.rule = None
        summary = await replay(target, store)
        assert (summary.replayed, summary.remaining) == (0, 0)
        assert [method for method, _ in store.calls].count(MEMORY) == 2
        assert len(target.gate) == 0
    finally:
        await target.aclose()


# --- end to end: guard(InMemoryStateStore) --------------------------------------------------------


@pytest.mark.lenient
async def test_through_the_guard_bad_calls_are_rejected_and_every_good_held_write_is_delivered(
    tmp_path: Path,
) -> None:
    """The issue's scenario through ``guard()``: during an outage, ``save_event()`` among a batch
    of 100 good events and ``mark_binding_terminal("t", "c", "x")`` are the caller's bugs: rejected
    at the call, never held, so they can neither block nor join a replay. The 200 good
    writes are held, and after recovery one drain delivers them all."""
    inner = InMemoryStateStore()
    faulty = FaultyStore(inner, FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
    registry = CollectorRegistry()
    config = GuardConfig(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite")))
    store: Any = guard(faulty, name="e2e", registry=registry, config=config)
    control = controller(store)
    try:
        results = await asyncio.gather(
            *(store.save_event(event("t", index)) for index in range(50)),
            store.save_event(),
            *(store.save_event(event("t", index)) for index in range(50, 100)),
            return_exceptions=True,
        )
        assert all(result is None for result in results)
        assert await store.mark_binding_terminal("t", "c", "x") is None
        for number in range(100):
            assert await store.save_memory_state(f"k{number}", {"v": number}) is None
        buffer = control.dead_letters
        assert buffer is not None
        assert buffer.depth == 200  # every good write held: the backend is down; the bad ones not
        assert control.stats()[("save_event", "rejected")] == 1
        assert control.stats()[("mark_binding_terminal", "rejected")] == 1
        assert len(await store.load_history("t")) == 100  # read-your-writes hides nothing now

        fault_injector(faulty).plan = FaultPlan()  # the backend is back
        left = await control.drain(30)

        assert left == 0
        assert [item.payload["i"] for item in await inner.load_history("t")] == list(range(100))
        for number in range(100):
            assert await inner.load_memory_state(f"k{number}") == {"v": number}
        assert await buffer.parked() == []
    finally:
        await control.aclose()
