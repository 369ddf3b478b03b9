"""One guard, any event loop, any time: used from a new loop per request (``asyncio.run()`` per
request, a sync framework's loop per request, a test client without ``with``) or from two loops at
once (one per thread), every call returns within its deadline and every acknowledged write ends
up in the backend. Each scenario runs in a process of its own (:mod:`._loops_worker`) with a
bounded wait, so a call that never returns fails the test instead of hanging the suite.

Starlette is not installed in this environment: a ``TestClient`` used without ``with`` runs each
request in a new event loop of a new thread, which the ``postgres`` scenario does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.deadletter.buffer import DEAD_LETTER_GRACE
from guarded.errors import WriteNotKeptError
from guarded.guard import controller, guard
from guarded.models import StoredEvent
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import outcome_counts

from ._loops_worker import TIMEOUT
from ._support import REPO, worker_env

SLACK = 3.0
"""A loaded 2-core machine: seconds a call may take beyond its deadline and the commit's grace."""
PROCESS_LIMIT = 120.0
"""Seconds a scenario's process may take before it counts as hung (it takes a few)."""


def _scenario(state_home: Path, *arguments: str, stdin: str | None = None) -> dict[str, Any]:
    try:
        process = subprocess.run(
            [sys.executable, "-m", "tests.durability._loops_worker", *arguments],
            cwd=REPO,
            env=worker_env(state_home),
            capture_output=True,
            text=True,
            timeout=PROCESS_LIMIT,
            input=stdin,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"scenario {arguments[0]} did not finish within {PROCESS_LIMIT}s (a call never returned): {exc}"
        )
    assert process.returncode == 0, process.stderr[-3000:]
    result: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    return result


def _stick_the_spill_worker(store: Any, registry: CollectorRegistry) -> threading.Event:
    """After the first write was held (the spill file and its worker thread exist): a disk that
    does not answer, until the returned event is set."""
    assert outcome_counts(registry)["dead_lettered"] == 1
    buffer = controller(store).dead_letters
    assert buffer is not None
    assert buffer._link.executor is not None
    disk = threading.Event()
    buffer._link.executor.submit(disk.wait)
    return disk


def _failing_guard(tmp_path: Path, registry: CollectorRegistry, **options: Any) -> tuple[FaultyStore, Any]:
    """A guard whose backend (in memory) refuses every call, with a spill file: its writes are held."""
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
    store = guard(
        faulty,
        timeout=TIMEOUT,
        retries=0,
        spill_path=str(tmp_path / "spill.sqlite"),
        registry=registry,
        **options,
    )
    return faulty, store


def _check_answered_in_time(result: dict[str, Any]) -> None:
    assert result["slowest"] < TIMEOUT + DEAD_LETTER_GRACE + SLACK, result["slowest"]


def test_a_loop_per_request_with_writes_left_in_flight_as_each_loop_ends(
    tmp_path: Path, state_home: Path
) -> None:
    """``asyncio.run()`` per request, and a sync framework's loop per request closed without
    cancelling what it left (before: the second such request never returned, its writes
    waiting for the spill file's committer of a closed loop)."""
    result = _scenario(state_home, "runs", str(tmp_path / "spill.sqlite"))
    _check_answered_in_time(result)
    assert len(result["acknowledged"]) >= 20  # the awaited writes at least
    assert sorted(result["stored"]) == sorted(result["acknowledged"])


def test_two_threads_each_with_its_own_loop_at_once(tmp_path: Path, state_home: Path) -> None:
    """Two loops in two threads write through one guard at once, the backend down (before: one
    thread's 30 acknowledged writes were never delivered)."""
    result = _scenario(state_home, "threads", str(tmp_path / "spill.sqlite"))
    _check_answered_in_time(result)
    assert len(result["acknowledged"]) == 60
    assert sorted(result["stored"]) == sorted(result["acknowledged"])


def test_postgres_guard_used_from_successive_loops_in_new_threads(
    tmp_path: Path, state_home: Path, pg_dsn: str, schema_name: str
) -> None:
    """A guard over real PostgreSQL opened on one loop, then used from four later loops, each in
    a thread of its own (a test client without ``with``): the pool belongs to the closed first
    loop, so the store fails there, and every write is held, within its deadline; every other
    loop is closed with writes left in flight. A later guard on the spill path delivers every
    acknowledged write (before: the request after the first such loop never returned, as
    PenguiFlow's playground test did)."""
    spill = str(tmp_path / "spill.sqlite")
    result = _scenario(state_home, "postgres", spill, pg_dsn, schema_name)
    _check_answered_in_time(result)
    acknowledged = result["acknowledged"]
    assert len(acknowledged) >= 15  # the awaited writes at least
    drained = _scenario(
        state_home, "postgres-drain", spill, pg_dsn, schema_name, stdin=json.dumps(acknowledged)
    )
    assert sorted(drained["stored"]) == sorted(acknowledged)


def test_a_starlette_test_client_without_with(
    tmp_path: Path, state_home: Path, pg_dsn: str, schema_name: str
) -> None:
    """Starlette's ``TestClient`` used without ``with``, over an application whose first request
    opens a guard over real PostgreSQL: every request runs in an event loop of its own, the pool
    belongs to the first one, and every other request leaves writes in flight as its loop ends.
    Every request is answered, every call within its deadline, and a later guard on the spill path
    delivers every acknowledged write."""
    spill = str(tmp_path / "spill.sqlite")
    result = _scenario(state_home, "testclient", spill, pg_dsn, schema_name)
    assert result["statuses"] == [200] * 8
    _check_answered_in_time(result)
    acknowledged = result["acknowledged"]
    assert {f"request{number}" for number in range(8)} <= set(acknowledged)
    drained = _scenario(
        state_home, "postgres-drain", spill, pg_dsn, schema_name, stdin=json.dumps(acknowledged)
    )
    assert sorted(drained["stored"]) == sorted(acknowledged)


@pytest.mark.asyncio
async def test_a_commit_that_cannot_finish_in_time_is_a_write_refused_within_its_deadline(
    tmp_path: Path,
) -> None:
    """The spill file's worker thread is stuck (a disk that does not answer): the dead-letter step
    is bounded by the call's deadline too, so the write is refused (not acknowledged) in time
    instead of a call that waits for the disk (before: it returned only once the disk did)."""
    registry = CollectorRegistry()
    faulty, store = _failing_guard(tmp_path, registry)
    await store.save_memory_state("first", {"v": 1})  # held: the spill file and its worker exist
    disk = _stick_the_spill_worker(store, registry)
    loop = asyncio.get_running_loop()
    try:
        began = loop.time()
        with pytest.raises(WriteNotKeptError):  # strict mode raises a refusal
            await asyncio.wait_for(
                store.save_memory_state("second", {"v": 2}), timeout=TIMEOUT + DEAD_LETTER_GRACE + SLACK + 5.0
            )
        took = loop.time() - began
    finally:
        disk.set()
    assert took < TIMEOUT + DEAD_LETTER_GRACE + SLACK
    assert outcome_counts(registry)["refused"] == 1
    fault_injector(faulty).plan = FaultPlan()
    await controller(store).aclose()


@pytest.mark.asyncio
async def test_writes_held_against_a_stuck_disk_are_each_refused_at_their_own_deadline(
    tmp_path: Path,
) -> None:
    """One timer watches the puts waiting for the spill file: a write with a long deadline waits
    first, then two with short ones, the last begun a second later. Each is refused at its own
    commit deadline: neither earlier (the short one's alarm does not refuse the long one) nor
    later (a shorter deadline after a longer one moves the alarm earlier; after it rings, the
    next deadline is watched)."""
    long_deadline = DEAD_LETTER_GRACE + 4.0
    registry = CollectorRegistry()
    faulty, store = _failing_guard(
        tmp_path, registry, methods={"save_trajectory": {"deadline": long_deadline}}
    )
    await store.save_memory_state("first", {"v": 1})  # held: the spill file and its worker exist
    disk = _stick_the_spill_worker(store, registry)
    loop = asyncio.get_running_loop()

    async def refused_after(write: Any, delay: float = 0.0) -> float:
        await asyncio.sleep(delay)
        began = loop.time()
        with pytest.raises(WriteNotKeptError):
            await write
        return loop.time() - began

    try:
        took = await asyncio.wait_for(
            asyncio.gather(
                refused_after(store.save_trajectory("trace", "session", {"steps": []})),
                refused_after(store.save_memory_state("second", {"v": 2}), 0.2),
                refused_after(store.save_memory_state("third", {"v": 3}), 1.2),
            ),
            timeout=long_deadline + DEAD_LETTER_GRACE + SLACK + 5.0,
        )
    finally:
        disk.set()
    short_commit = max(TIMEOUT, DEAD_LETTER_GRACE)  # the backend failed at once
    assert long_deadline - 0.1 <= took[0] < long_deadline + SLACK, took
    for short in took[1:]:
        assert short_commit - 0.1 <= short < short_commit + SLACK, took
    assert outcome_counts(registry)["refused"] == 3
    fault_injector(faulty).plan = FaultPlan()
    await controller(store).aclose()


@pytest.mark.asyncio
async def test_a_batched_commit_that_cannot_finish_in_time_refuses_each_caller_within_its_deadline(
    tmp_path: Path,
) -> None:
    """A failed group commit's writes go to a spill file whose worker thread is stuck: each
    batched caller (the lone writer and those queued behind its flush alike) is refused within
    its deadline and the commit's grace, instead of waiting for the disk (before: every caller
    waited for the disk). The commit goes on: once the disk and the backend answer, every refused
    write is delivered after all, as the refusal says it may be."""
    await _batched_writes_refused_in_time(tmp_path, 6)


@pytest.mark.asyncio
async def test_a_write_the_full_queue_sends_to_a_stuck_disk_is_refused_within_its_deadline(
    tmp_path: Path,
) -> None:
    """The batcher's queue is full (one write, in a flush whose commit waits for the stuck disk):
    the next write, dead-lettered once its deadline passed without room, is refused within that
    deadline and the commit's grace (before: it waited for the disk)."""
    await _batched_writes_refused_in_time(tmp_path, 2, batching={"queue_size": 1})


async def _batched_writes_refused_in_time(tmp_path: Path, writers: int, **options: Any) -> None:
    """``writers`` concurrent ``save_event`` calls, whose backend write fails, while the spill
    file's worker thread is stuck: each is refused within its deadline and the commit's grace,
    and each is delivered once the disk and the backend answer."""
    registry = CollectorRegistry()
    faulty, store = _failing_guard(tmp_path, registry, **options)
    await store.save_event(_event("first"))  # held: the spill file and its worker exist
    disk = _stick_the_spill_worker(store, registry)
    loop = asyncio.get_running_loop()

    async def timed(name: str) -> tuple[BaseException | None, float]:
        began = loop.time()
        try:
            await store.save_event(_event(name))
        except Exception as exc:
            return exc, loop.time() - began
        return None, loop.time() - began

    names = [f"later-{index}" for index in range(writers)]
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(*(timed(name) for name in names)),
            timeout=TIMEOUT + DEAD_LETTER_GRACE + SLACK + 10.0,
        )
    finally:
        disk.set()
    for error, took in answers:
        assert isinstance(error, WriteNotKeptError), error  # strict mode raises a refusal
        assert "may still be committed" in str(error)
        assert took < TIMEOUT + DEAD_LETTER_GRACE + SLACK, took
    assert outcome_counts(registry)["refused"] == writers
    fault_injector(faulty).plan = FaultPlan()
    await controller(store).aclose()
    stored = {event.payload["name"] for event in await faulty.load_history("batched")}
    assert stored == {"first", *names}


def _event(name: str) -> StoredEvent:
    return StoredEvent("batched", 0.0, "node_end", "node", name, {"name": name})


def test_a_loop_closed_while_its_commit_is_on_the_disk_leaves_it_to_the_next_loop(
    tmp_path: Path, state_home: Path
) -> None:
    """A loop closes (without cancelling its tasks) while its group commit's transaction waits on
    the spill file's worker thread (a stuck disk): the next loop's write returns in time, what
    that transaction wrote is accounted for (the spill file stays in use), and every write
    reaches the backend (before: the next loop's write waited for the closed loop's committer
    for ever)."""
    result = _scenario(state_home, "stuck-disk", str(tmp_path / "spill.sqlite"))
    _check_answered_in_time(result)
    assert result["spill_in_use"]
    assert result["left"] == 0
    assert result["stored"] == ["first", "abandoned", "later"]
