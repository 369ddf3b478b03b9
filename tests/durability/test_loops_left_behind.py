"""What event loops leave behind: a home loop in another thread that does not answer, a consume's
turn held by a closed loop, the calls of a closed loop collected as garbage (and the bulkhead
permits they held), a stopped loop whose tasks run again after the guard moved on. Each test
bounds its waits, so a call that never returns fails it instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.errors import WriteNotKeptError
from guarded.guard import controller, guard
from guarded.models import PlannerEvent, StoredEvent
from guarded.pipeline.loops import FORWARD_GRACE
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import method_outcomes

TIMEOUT = 0.3
SLACK = 3.0
"""A loaded 2-core machine: seconds a call may take beyond its budget."""


class _BlockedHome:
    """A thread whose event loop becomes the guard's home (one call), then blocks in a handler
    doing blocking work until :meth:`release`: the loop runs but answers nothing."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._blocked = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),))

    async def _main(self) -> None:
        await self._store.load_memory_state("warm-up")  # this loop is now the guard's home
        self._blocked.set()
        self._release.wait(60.0)  # blocking work in a handler: the loop answers nothing meanwhile
        await asyncio.sleep(0.2)  # runs what the other thread left for it

    def __enter__(self) -> _BlockedHome:
        self._thread.start()
        assert self._blocked.wait(10.0), "the home loop never started"
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(10.0)
        assert not self._thread.is_alive()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _timed(call: Any) -> tuple[Any, float]:
    """Run ``call()`` on a new event loop in this thread: its answer (or exception) and seconds."""
    began = time.monotonic()
    try:
        answer: Any = asyncio.run(call())
    except Exception as exc:
        answer = exc
    return answer, time.monotonic() - began


def _unanswered_guard(registry: CollectorRegistry) -> tuple[InMemoryStateStore, Any]:
    backend = InMemoryStateStore()
    return backend, guard(backend, timeout=TIMEOUT, retries=0, registry=registry)


def test_a_home_loop_that_does_not_answer_times_a_read_out_and_refuses_a_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The guard's home loop runs in another thread and is blocked: a read made from this thread
    ends as any timed-out call (outcome ``timeout``, a WARNING record, its fallback even in
    strict mode) and a write as a write not kept (outcome ``refused``, ``WriteNotKeptError`` in
    strict mode), each within its deadline and the forwarding grace; the
    write never reaches the backend once the home loop answers again (before: both returned
    their fallback, uncounted, and the write was not raised in strict mode)."""
    registry = CollectorRegistry()
    backend, store = _unanswered_guard(registry)
    budget = TIMEOUT + FORWARD_GRACE
    with caplog.at_level(logging.WARNING, logger="guarded"), _BlockedHome(store) as home:
        read, read_took = _timed(lambda: store.load_memory_state("key"))
        write, write_took = _timed(lambda: store.save_memory_state("key", {"v": 1}))
        home.release()
    assert read is None
    assert isinstance(write, WriteNotKeptError), write
    assert "did not answer" in str(write)
    for took in (read_took, write_took):
        assert budget - 0.1 <= took < budget + SLACK, took
    outcomes = method_outcomes(registry)
    assert outcomes[("load_memory_state", "timeout")] == 1
    assert outcomes[("save_memory_state", "refused")] == 1
    assert ("save_memory_state", "ok") not in outcomes  # the home loop never ran it
    assert asyncio.run(backend.load_memory_state("key")) is None
    assert _failure_records(caplog) == {"load_memory_state": (logging.WARNING, "timeout")}


def _failure_records(caplog: pytest.LogCaptureFixture) -> dict[str, tuple[int, str]]:
    """The level and outcome of each call failure logged, by method."""
    return {
        record.__dict__["method"]: (record.levelno, record.__dict__["outcome"])
        for record in caplog.records
        if record.__dict__.get("event") == "statestore_call_failed"
    }


@pytest.mark.lenient
def test_outside_strict_mode_a_write_the_home_loop_does_not_answer_is_refused_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Outside strict mode the write the blocked home loop did not answer returns its fallback,
    counted ``refused`` (never ``ok``) with an ERROR record, and never reaches the backend."""
    registry = CollectorRegistry()
    backend, store = _unanswered_guard(registry)
    with caplog.at_level(logging.WARNING, logger="guarded"), _BlockedHome(store) as home:
        write, took = _timed(lambda: store.save_memory_state("key", {"v": 1}))
        home.release()
    assert write is None
    assert took < TIMEOUT + FORWARD_GRACE + SLACK
    outcomes = method_outcomes(registry)
    assert outcomes[("save_memory_state", "refused")] == 1
    assert ("save_memory_state", "ok") not in outcomes
    assert asyncio.run(backend.load_memory_state("key")) is None
    assert _failure_records(caplog) == {"save_memory_state": (logging.ERROR, "refused")}


def _run_until(loop: asyncio.AbstractEventLoop, ready: Any, within: float = 10.0) -> None:
    """Run ``loop`` until ``ready()`` holds (at most ``within`` seconds)."""

    async def waiting() -> None:
        while not ready():  # noqa: ASYNC110 - polls what another part of the guard did, no event
            await asyncio.sleep(0.005)

    loop.run_until_complete(asyncio.wait_for(waiting(), within))


def test_a_resume_on_a_new_loop_takes_the_turn_a_closed_loop_left_held(tmp_path: Path) -> None:
    """A held pause is being resumed on one loop (its save replayed to a backend that does not
    answer) while a second resume of it waits for its turn; that loop is closed without
    cancelling them. On the next loop a resume of the token answers the pause within its
    deadline, and a further resume finds it consumed (before: the turn's lock still belonged to
    the closed loop, and the resume failed with a RuntimeError)."""
    registry = CollectorRegistry()
    faulty = FaultyStore(
        InMemoryStateStore(),
        FaultPlan.script({"save_planner_state": [Fault.error_before(ConnectionRefusedError), Fault.hang()]}),
    )
    deadline = 2.0
    store = guard(
        faulty,
        timeout=deadline,
        retries=0,
        breaker={"enabled": False},
        spill_path=str(tmp_path / "spill.sqlite"),
        registry=registry,
    )
    log = fault_injector(faulty).log
    first = asyncio.new_event_loop()
    first.run_until_complete(store.save_planner_state("token", {"step": 1}))  # held
    resumes = [first.create_task(store.load_planner_state("token")) for _ in range(2)]
    # The first resume replays the held save (which hangs, holding the token's turn); the second waits.
    _run_until(first, lambda: sum(record.method == "save_planner_state" for record in log) == 2)
    first.run_until_complete(asyncio.sleep(0.05))
    assert not any(resume.done() for resume in resumes)
    first.close()

    fault_injector(faulty).plan = FaultPlan()

    async def resume() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        began = loop.time()
        answer = await asyncio.wait_for(store.load_planner_state("token"), deadline + SLACK + 5.0)
        return answer, loop.time() - began

    answer, took = asyncio.run(resume())
    assert answer == {"step": 1}
    assert took < deadline + SLACK
    again, _ = asyncio.run(resume())
    assert again is None
    outcomes = method_outcomes(registry)
    assert outcomes[("load_planner_state", "ok")] == 1
    assert outcomes[("load_planner_state", "not_found")] == 1


def _left_pending(store: Any) -> list[Any]:
    """Calls of every kind, each waiting on a backend that does not answer: keyed and unkeyed
    writes, a batched append, reads, a consume."""
    return [
        store.save_memory_state("memory", {"v": 1}),
        store.save_trajectory("trace", "session", {"steps": []}),
        store.save_event(StoredEvent("trace", 0.0, "node_end", "node", "event", {"n": 1})),
        store.save_planner_event("trace", PlannerEvent(event_type="step", ts=0.0, trajectory_step=0)),
        store.load_memory_state("memory"),
        store.load_history("trace"),
        store.load_planner_state("token"),
    ]


def test_the_calls_of_a_closed_loop_collected_as_garbage_end_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop is closed with calls of every kind pending (a sync framework's loop per request);
    the guard goes on on another loop, and the garbage collector closes the calls the closed loop
    dropped. They end without a record of a failure (before: ``ValueError; returned rejected`` for
    the context variables they reset in another context, a ``RuntimeError`` for the running loop
    they looked for) and without an outcome of a failure (counted ``cancelled``). The garbage
    collector does collect them (before: the watchdog of every loop a guard ever ran on was kept,
    with that loop and the calls armed on it, until the process ended)."""
    registry = CollectorRegistry()
    # A slow backend, not a hanging one: the injector keeps what hangs, and with it the loop.
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.delay(3600.0)))
    store = guard(faulty, timeout=30.0, spill_path=str(tmp_path / "spill.sqlite"), registry=registry)
    closing = asyncio.new_event_loop()
    dropped = [weakref.ref(closing.create_task(call)) for call in _left_pending(store)]
    closing.run_until_complete(asyncio.sleep(0.1))
    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    gc.disable()  # collected below, not whenever an allocation triggers it
    try:
        closing.close()
        del closing
        fault_injector(faulty).plan = FaultPlan()

        async def later() -> None:
            await asyncio.gather(*_left_pending(store))
            assert await controller(store).drain(10.0) == 0

        with caplog.at_level(logging.WARNING, logger="guarded"):
            asyncio.run(later())
            before = method_outcomes(registry)
            gc.collect()
    finally:
        gc.enable()
        sys.unraisablehook = hook
    assert [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("guarded") and record.levelno >= logging.WARNING
    ] == []
    assert [f"{item.exc_type.__name__}: {item.exc_value}" for item in unraisable] == []
    collected = method_outcomes(registry) - before
    assert {outcome for _, outcome in collected} == {"cancelled"}, collected
    assert [task for task in dropped if task() is not None] == [], (
        "calls of the closed loop are still referenced"
    )


class _CountingStore(InMemoryStateStore):
    """An in-memory store that counts, per memory key and per event, the writes it took."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: Counter[str] = Counter()

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        await super().save_memory_state(key, state)
        self.taken[key] += 1

    async def save_memory_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        await super().save_memory_states(items)
        self.taken.update(key for key, _ in items)

    async def save_event(self, event: StoredEvent) -> None:
        await super().save_event(event)
        self.taken[event.payload["name"]] += 1

    async def save_events(self, events: Sequence[StoredEvent]) -> None:
        await super().save_events(events)
        self.taken.update(event.payload["name"] for event in events)


def _named_event(name: str) -> StoredEvent:
    return StoredEvent("trace", 0.0, "node_end", "node", name, {"name": name})


class _SlowEvents(FaultPlan):
    """A backend slow to take events, slowest in bulk."""

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if method == "save_events":
            return Fault.delay(60.0)
        return Fault.delay(0.05) if method == "save_event" else Fault.ok()


def _waits_in(task: asyncio.Task[Any], function: str) -> bool:
    """Whether ``task`` is suspended inside a coroutine function named ``function``."""
    awaited: Any = task.get_coro()
    while awaited is not None:
        code = getattr(awaited, "cr_code", None)
        if code is not None and code.co_name == function:
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


def test_a_stopped_loop_that_runs_again_after_the_guard_moved_on_delivers_nothing_twice(
    tmp_path: Path,
) -> None:
    """A loop is stopped from inside while the guard's background work is pending on it: a replay
    pass waiting between two sends, a batch flush waiting for a slow backend, writes queued
    behind it, the watch. The guard then goes on on a new loop, which delivers every held and
    queued write; then the first loop runs again, once for a while and once for a call of the
    guard (which moves the guard back to it). Nothing is delivered twice, nothing acknowledged is
    lost, and the callers the stopped loop left waiting for their batch are answered (before:
    the stale replay pass sent a held write again, the stale flush wrote its batch again, and
    the callers waiting for a batch were never answered)."""
    backend = _CountingStore()
    faulty = FaultyStore(backend, FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
    store = guard(
        faulty,
        timeout=30.0,  # the slow flush is still waiting for the backend when the loop stops
        retries=0,
        breaker={"enabled": False},
        spill_path=str(tmp_path / "spill.sqlite"),
        registry=CollectorRegistry(),
        dead_letter={"replay_rate": 10.0, "replay_batch": 1},  # a pass waits between two sends
    )
    log = fault_injector(faulty).log
    first = asyncio.new_event_loop()
    held = [f"held-memory-{index}" for index in range(6)] + [f"held-event-{index}" for index in range(6)]
    flushed = [f"flushed-{index}" for index in range(6)]
    queued = [f"queued-{index}" for index in range(3)]

    async def during_an_outage() -> None:
        await asyncio.gather(
            *(store.save_memory_state(key, {"key": key}) for key in held if "memory" in key),
            *(store.save_event(_named_event(name)) for name in held if "event" in name),
        )

    first.run_until_complete(during_an_outage())  # every write held (acknowledged dead_lettered)
    assert not backend.taken

    # The backend is back, but slow to take events, its bulk form the slowest: a lone write waits
    # a little, a flush of the writes queued behind it much longer, while the replay pass
    # delivers a held write every 0.1 s.
    fault_injector(faulty).plan = _SlowEvents()
    answered: dict[str, asyncio.Task[Any]] = {}

    def write(loop: asyncio.AbstractEventLoop, name: str) -> None:
        task = loop.create_task(store.save_event(_named_event(name)))
        task.add_done_callback(lambda task: answered.__setitem__(name, task))

    def replaying() -> asyncio.Task[Any] | None:
        return next(
            (task for task in asyncio.all_tasks(first) if task.get_name().startswith("guarded-replay")), None
        )

    async def stop_in_the_middle() -> None:
        loop = asyncio.get_running_loop()
        for name in flushed:  # the first goes alone, the others in one flush, which waits
            write(loop, name)
        while not any(record.method == "save_events" and record.ending is None for record in log):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        for name in queued:  # behind the flush
            write(loop, name)
        # Two held writes delivered (and taken out of the buffer), the pass waiting for the next.
        while not (  # noqa: ASYNC110 - polls what the guard's tasks do, no event
            sum(backend.taken[key] for key in held) >= 2
            and (task := replaying()) is not None
            and _waits_in(task, "take")
        ):
            await asyncio.sleep(0.005)
        loop.stop()

    stopping = first.create_task(stop_in_the_middle())
    bound = first.call_later(20.0, first.stop)  # the predicates above fail the test, not hang it
    first.run_forever()
    bound.cancel()
    assert stopping.done(), "the loop was not stopped with the guard's work in the middle"
    assert 2 <= sum(backend.taken[key] for key in held) < len(held)

    async def on_a_new_loop() -> None:
        fault_injector(faulty).plan = FaultPlan()
        assert await controller(store).drain(10.0) == 0

    asyncio.run(on_a_new_loop())
    assert set(backend.taken) == {*held, *flushed, *queued}

    first.run_until_complete(asyncio.sleep(1.0))  # its timers are due: what was pending runs
    first.run_until_complete(store.load_memory_state("held-memory-0"))  # the guard moves back here
    first.run_until_complete(asyncio.sleep(1.0))
    assert first.run_until_complete(controller(store).drain(10.0)) == 0
    first.close()
    assert {name for name, task in answered.items() if task.done() and task.exception() is None} == {
        *flushed,
        *queued,
    }, "a caller left waiting for its batch was never answered"
    assert set(backend.taken) == {*held, *flushed, *queued}, "an acknowledged write was lost"
    twice = {name: count for name, count in backend.taken.items() if count > 1}
    assert twice == {}, f"delivered more than once: {twice}"


class _OneAtATimeStore(InMemoryStateStore):
    """An in-memory store that declares it runs one call at a time (as a pool of one would) and
    counts the most reads it ran at once."""

    max_concurrency = 1

    def __init__(self) -> None:
        super().__init__()
        self.running = self.most = 0

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.05)
            return await super().load_memory_state(key)
        finally:
            self.running -= 1


def test_permits_of_a_closed_loops_calls_leave_the_next_loops_line_alone(tmp_path: Path) -> None:
    """A loop is closed while one call holds the only permit in front of a slow backend and
    another waits in line for it; the guard goes on on the next loop, then the garbage collector
    closes the dropped calls. The permit count stays true: nothing in use, nobody waiting, and
    calls run one at a time (before: the permit given back by the dropped call made the count
    negative, so two calls ran at once, and the dropped waiter raised InvalidStateError as it was
    collected)."""
    registry = CollectorRegistry()
    backend = _OneAtATimeStore()
    faulty = FaultyStore(backend, FaultPlan.always(Fault.delay(3600.0), methods=["load_memory_state"]))
    store = guard(faulty, timeout=30.0, spill_path=str(tmp_path / "spill.sqlite"), registry=registry)
    bulkhead = controller(store)._core.bulkhead
    assert bulkhead is not None
    assert bulkhead.limit == 1
    closing = asyncio.new_event_loop()
    dropped = [
        weakref.ref(closing.create_task(store.load_memory_state(f"key-{index}"))) for index in range(2)
    ]
    closing.run_until_complete(asyncio.sleep(0.1))
    assert (bulkhead.in_use, bulkhead.waiting) == (1, 1)
    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    gc.disable()
    try:
        closing.close()
        del closing
        fault_injector(faulty).plan = FaultPlan()
        asyncio.run(store.save_memory_state("key-0", {"v": 0}))  # the guard moves on
        gc.collect()
    finally:
        gc.enable()
        sys.unraisablehook = hook
    assert [task for task in dropped if task() is not None] == []
    assert [f"{item.exc_type.__name__}: {item.exc_value}" for item in unraisable] == []
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)

    async def reads() -> None:
        await asyncio.gather(*(store.load_memory_state(f"key-{index}") for index in range(4)))

    asyncio.run(reads())
    assert backend.most == 1
