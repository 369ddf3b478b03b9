"""What event loops leave behind: a home loop in another thread that does not answer, a consume's
turn held by a closed loop, a stopped loop whose tasks run again after the guard moved on, and
the calls of a closed loop collected as garbage. Each test bounds its waits, so a call that never
returns fails it instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import weakref
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
    assert [task for task in dropped if task() is not None] == [], "calls of the closed loop are still referenced"
