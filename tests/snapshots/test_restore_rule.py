"""One restore rule, in every section and every store: a restore never moves a key backwards.

An older snapshot restored over newer data leaves every newer key as it is (memory states,
bindings, tasks, trajectories, pauses) and a consumed pause consumed; only a roll-back writes the
snapshot's values over newer ones, and its report names what it overwrote. Each case runs against
the in-memory store and a real PostgreSQL store.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from penguiflow.planner import Trajectory
from penguiflow.state.models import RemoteBinding
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from guarded.snapshots import capture, restore
from tests.postgres.conftest import StoreFactory

from ._sessions import TENANT, USER, memory_key, observe, populate

SESSION = "s1"
PAUSE = f"{SESSION}-pause"
StoreMaker = Callable[[], Awaitable[Any]]


@pytest.fixture(params=["memory", "postgres"])
def new_store(request: pytest.FixtureRequest) -> StoreMaker:
    types = penguiflow_types()
    if request.param == "memory":

        async def in_memory() -> Any:
            return InMemoryStateStore(record_types=types)

        return in_memory
    make_store: StoreFactory = request.getfixturevalue("make_store")
    return lambda: make_store(types=types)


async def write_newer(store: Any) -> None:
    """A newer write of every key the snapshot holds: memory, bindings, tasks, trajectories, pause."""
    for key in (memory_key(SESSION), f"custom:{SESSION}"):
        await store.save_memory_state(key, {"newer": True})
    for binding in await store.list_bindings(router_session_id=SESSION):
        await store.save_remote_binding(
            RemoteBinding(
                binding.trace_id,
                binding.context_id,
                binding.task_id,
                "http://newer-agent",
                SESSION,
                "skill",
                TENANT,
                USER,
            )
        )
    for task in await store.list_tasks(SESSION):
        task.result = {"newer": True}
        task.update_status(task.status)  # updated_at: now, later than the snapshot's
        await store.save_task(task)
    for trace in await store.list_traces(SESSION, 100):
        await store.save_trajectory(trace, SESSION, Trajectory(query="newer"))
    await store.save_planner_state(PAUSE, {"resume": "newer"})


def without_task_times(seen: dict[str, Any]) -> dict[str, Any]:
    """``observe``'s answer without the tasks' ``updated_at`` (a roll-back sets it to now)."""
    tasks = [{k: v for k, v in task.items() if k != "updated_at"} for task in seen["tasks"]]
    return {**seen, "tasks": tasks}


@pytest.mark.asyncio
async def test_an_older_snapshot_never_moves_a_newer_key_backwards(new_store: StoreMaker) -> None:
    store = await new_store()
    traces = await populate(store, random.Random(21), SESSION)
    async with await capture(
        store, session_id=SESSION, memory_keys=[f"custom:{SESSION}"], pause_tokens=[PAUSE]
    ) as older:
        assert older.snapshot.counts["memory"] == 2
        await write_newer(store)
        newer = await observe(store, SESSION, traces)
        report = await restore(older, store, include_pauses=True)
        assert await observe(store, SESSION, traces) == newer
        assert await store.load_planner_state(PAUSE) == {"resume": "newer"}
    for section in ("memory", "bindings", "tasks", "trajectories", "pauses"):
        assert report.written[section] == 0, section
        assert report.skipped[section] == older.snapshot.counts[section], section
    assert report.overwritten == {}


@pytest.mark.asyncio
async def test_a_consumed_pause_stays_consumed(new_store: StoreMaker) -> None:
    store = await new_store()
    await populate(store, random.Random(22), SESSION)
    async with await capture(
        store, session_id=SESSION, memory_keys=[f"custom:{SESSION}"], pause_tokens=[PAUSE]
    ) as captured:
        assert await store.load_planner_state(PAUSE) == {"resume": "here"}  # resumed: consumed
        await restore(captured, store, include_pauses=True)
        assert await store.load_planner_state(PAUSE) is None
        await restore(captured, store, include_pauses=True, rollback=True)  # asked for: back again
        assert await store.load_planner_state(PAUSE) == {"resume": "here"}


@pytest.mark.asyncio
async def test_a_roll_back_writes_the_snapshot_and_names_what_it_overwrote(new_store: StoreMaker) -> None:
    store = await new_store()
    traces = await populate(store, random.Random(23), SESSION)
    async with await capture(
        store, session_id=SESSION, memory_keys=[f"custom:{SESSION}"], pause_tokens=[PAUSE]
    ) as older:
        before = without_task_times(await observe(store, SESSION, traces))
        bindings = [
            f"{b.trace_id}/{b.context_id}/{b.task_id}"
            for b in await store.list_bindings(router_session_id=SESSION)
        ]
        tasks = [task.task_id for task in await store.list_tasks(SESSION)]
        trajectories = await store.list_traces(SESSION, 100)
        await write_newer(store)
        started = dt.datetime.now(dt.UTC)
        report = await restore(older, store, include_pauses=True, rollback=True)
        assert without_task_times(await observe(store, SESSION, traces)) == before
        for task in await store.list_tasks(SESSION):  # as of now: newer than what it replaced
            assert task.updated_at >= started - dt.timedelta(seconds=1)
        assert await store.load_planner_state(PAUSE) == {"resume": "here"}
        again = await restore(older, store, rollback=True)  # nothing left to overwrite
    assert sorted(report.overwritten["memory"]) == sorted([memory_key(SESSION), f"custom:{SESSION}"])
    assert sorted(report.overwritten["bindings"]) == sorted(bindings)
    assert sorted(report.overwritten["tasks"]) == sorted(tasks)
    assert sorted(report.overwritten["trajectories"]) == sorted(trajectories)
    assert report.overwritten["pauses"] == [PAUSE]  # written over whatever the token held
    assert again.overwritten == {}
    assert sum(again.written[s] for s in ("memory", "bindings", "tasks", "trajectories")) == 0


@pytest.mark.asyncio
async def test_a_restore_into_an_empty_store_writes_everything(new_store: StoreMaker) -> None:
    source = InMemoryStateStore(record_types=penguiflow_types())
    traces = await populate(source, random.Random(24), SESSION)
    async with await capture(source, session_id=SESSION, memory_keys=[f"custom:{SESSION}"]) as captured:
        target = await new_store()
        report = await restore(captured, target)
    assert await observe(target, SESSION, traces) == await observe(source, SESSION, traces)
    for section in ("memory", "bindings", "tasks", "trajectories"):
        assert report.written[section] == captured.snapshot.counts[section] > 0, section
    assert report.overwritten == {}


@pytest.mark.asyncio
async def test_the_rule_holds_through_the_guard(tmp_path: Path) -> None:
    backend = InMemoryStateStore(record_types=penguiflow_types())
    store = guard(backend, registry=CollectorRegistry(), spill_path=str(tmp_path / "spill.sqlite"))
    try:
        traces = await populate(store, random.Random(25), SESSION)
        async with await capture(store, session_id=SESSION, memory_keys=[f"custom:{SESSION}"]) as older:
            await write_newer(store)
            newer = await observe(backend, SESSION, traces)
            report = await restore(older, store)
            assert await observe(backend, SESSION, traces) == newer
            assert report.written["memory"] == report.written["bindings"] == 0
            report = await restore(older, store, rollback=True)
        assert sorted(report.overwritten["memory"]) == sorted([memory_key(SESSION), f"custom:{SESSION}"])
        assert await backend.load_memory_state(f"custom:{SESSION}") == {"x": 1}
    finally:
        await controller(store).aclose()
