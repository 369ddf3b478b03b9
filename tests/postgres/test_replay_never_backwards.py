"""A replay never writes an older value over a newer one.

Worker A's last-write-wins writes are held during its outage; after recovery worker B writes newer
values directly; then A replays. A's bookkeeping cannot see B, so only the database can refuse the
older writes: every upsert carries the logical time of its call (:mod:`guarded.logical_time`).
The two workers are two guards, each with its own store, pool and spill file, as two processes
would have; A's outage is injected in A's store only.

The same within one process when the guard's map of recent writes forgets the key (more keys
written during one slow write than it remembers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded.backend import next_logical_time
from guarded.backends.postgres import PostgresStateStore
from guarded.deadletter import buffer as buffer_module
from guarded.errors import WriteSupersededError
from guarded.guard import controller, guard
from guarded.logical_time import logical_times, replaying
from guarded.models import RemoteBinding

N = 20


class FlakyStore(PostgresStateStore):
    """A PostgreSQL store whose writes fail with a connection error while ``down`` (fault
    injection; everything else is the real store), or wait for ``hold`` when set."""

    down = False
    hold: asyncio.Event | None = None
    holding: asyncio.Event | None = None
    """Set when a write starts waiting for ``hold``."""

    async def _maybe_fail(self) -> None:
        if self.hold is not None:
            if self.holding is not None:
                self.holding.set()
            await self.hold.wait()
        if self.down:
            raise ConnectionResetError("injected outage")

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        await self._maybe_fail()
        await super().save_memory_state(key, state)

    async def save_memory_states(self, items: Any) -> None:
        await self._maybe_fail()
        await super().save_memory_states(items)

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Any) -> None:
        await self._maybe_fail()
        await super().save_trajectory(trace_id, session_id, trajectory)

    async def save_trajectories(self, items: Any) -> None:
        await self._maybe_fail()
        await super().save_trajectories(items)

    async def save_remote_binding(self, binding: Any) -> None:
        await self._maybe_fail()
        await super().save_remote_binding(binding)

    async def save_remote_bindings(self, bindings: Any) -> None:
        await self._maybe_fail()
        await super().save_remote_bindings(bindings)

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        await self._maybe_fail()
        await super().save_planner_state(token, payload)

    async def save_planner_states(self, items: Any) -> None:
        await self._maybe_fail()
        await super().save_planner_states(items)


def config(path: Path, **dead_letter: Any) -> dict[str, Any]:
    return {
        "retry": {"enabled": False},
        "dead_letter": {"path": str(path), **dead_letter},
        "breaker": {"enabled": False},
    }


@pytest_asyncio.fixture
async def stores(
    pg_dsn: str, schema_name: str
) -> AsyncIterator[tuple[FlakyStore, PostgresStateStore, PostgresStateStore]]:
    """Worker A's store, worker B's, and a reader's (the guards close A's and B's)."""
    a = await FlakyStore.connect(pg_dsn, schema=schema_name)
    b = await PostgresStateStore.connect(pg_dsn, schema=schema_name)
    reader = await PostgresStateStore.connect(pg_dsn, schema=schema_name)
    try:
        yield a, b, reader
    finally:
        for store in (a, b, reader):
            await store.close()


def binding(index: int, agent: str) -> RemoteBinding:
    return RemoteBinding(
        trace_id=f"t{index}",
        context_id=f"c{index}",
        task_id=f"task{index}",
        agent_url=agent,
        router_session_id=f"router{index}",
        remote_skill="skill",
    )


@pytest.mark.asyncio
async def test_a_replay_never_undoes_another_workers_newer_write(
    stores: tuple[FlakyStore, PostgresStateStore, PostgresStateStore], tmp_path: Path
) -> None:
    raw_a, raw_b, reader = stores
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **config(tmp_path / "a.sqlite"))
    b = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **config(tmp_path / "b.sqlite"))
    async with a, b:
        raw_a.down = True
        for i in range(N):
            await a.save_memory_state(f"k{i}", {"by": "a", "version": 1})
            await a.save_trajectory(f"trace{i}", "s", {"by": "a"})
            await a.save_remote_binding(binding(i, "https://a.example"))
            await a.save_planner_state(f"pause{i}", {"by": "a"})
        assert controller(a).dead_letters.depth == 4 * N

        # B writes newer values directly; then A recovers and replays its held (older) writes.
        for i in range(N):
            await b.save_memory_state(f"k{i}", {"by": "b", "version": 2})
            await b.save_trajectory(f"trace{i}", "s", {"by": "b"})
            await b.save_remote_binding(binding(i, "https://b.example"))
            await b.save_planner_state(f"pause{i}", {"by": "b"})
        raw_a.down = False
        assert await controller(a).drain() == 0
        stats = await controller(a).dead_letters.stats()
    # Every held write lost to B's newer one: removed and counted as superseded, not as replayed.
    assert (stats.replayed_total, stats.superseded_total) == (0, 4 * N)

    memory = [await reader.load_memory_state(f"k{i}") for i in range(N)]
    trajectories = [await reader.get_trajectory(f"trace{i}", "s") for i in range(N)]
    bindings = [await reader.list_bindings(router_session_id=f"router{i}") for i in range(N)]
    pauses = [await reader.load_planner_state(f"pause{i}") for i in range(N)]
    assert [state["by"] if state else None for state in memory].count("b") == N
    assert [trajectory["by"] if trajectory else None for trajectory in trajectories].count("b") == N
    assert [[found.agent_url for found in listed] for listed in bindings] == [["https://b.example"]] * N
    assert [pause["by"] if pause else None for pause in pauses].count("b") == N


@pytest.mark.asyncio
async def test_held_writes_still_land_when_nothing_newer_was_written(
    stores: tuple[FlakyStore, PostgresStateStore, PostgresStateStore], tmp_path: Path
) -> None:
    raw_a, _, reader = stores
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **config(tmp_path / "a.sqlite"))
    async with a:
        await reader.save_memory_state("k", {"version": 0})  # older than A's held write
        raw_a.down = True
        await a.save_memory_state("k", {"version": 1})
        await a.save_memory_state("k", {"version": 2})
        raw_a.down = False
        assert await controller(a).drain() == 0
    assert await reader.load_memory_state("k") == {"version": 2}


@pytest.mark.asyncio
async def test_a_key_forgotten_by_the_guard_is_still_protected_by_the_database(
    stores: tuple[FlakyStore, PostgresStateStore, PostgresStateStore],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One process: a slow write of ``k`` fails after a newer write of ``k`` succeeded and more
    other keys than the guard remembers were written meanwhile, so its map of recent writes has
    forgotten ``k`` and the failed write is held; its replay must not undo the newer write."""
    remembered = 64
    monkeypatch.setattr(buffer_module, "RECENT_WRITES", remembered)
    raw_a, _, reader = stores
    a = guard(
        raw_a,
        name="one-process",
        registry=CollectorRegistry(),
        timeout={"attempt": 30.0, "deadline": 30.0},
        **config(tmp_path / "a.sqlite"),
    )
    async with a:
        gate, holding = asyncio.Event(), asyncio.Event()
        raw_a.hold, raw_a.holding = gate, holding
        slow = asyncio.create_task(a.save_memory_state("k", {"version": 1}))
        await holding.wait()  # the slow write has its logical time and waits in the store
        raw_a.hold = None
        await a.save_memory_state("k", {"version": 2})
        for i in range(remembered + 1):
            await a.save_memory_state(f"other{i}", {"i": i})
        raw_a.down = True
        gate.set()
        await slow  # fails: held, as the guard no longer remembers the newer write of k
        raw_a.down = False
        assert controller(a).dead_letters.depth == 1
        assert await controller(a).drain() == 0
    assert await reader.load_memory_state("k") == {"version": 2}


@pytest.mark.asyncio
async def test_the_store_alone_takes_each_calls_time_so_the_last_call_wins(
    stores: tuple[FlakyStore, PostgresStateStore, PostgresStateStore],
) -> None:
    """Without a guard nothing sets a logical time: every call gets a newer one, as PenguiFlow's
    reference store (the last call wins). A direct write is applied whatever time is set; a time
    set for a replay is compared, and a replay it refuses is reported."""
    _, _, store = stores
    for version in range(5):
        await store.save_memory_state("k", {"version": version})
    assert await store.load_memory_state("k") == {"version": 4}
    with logical_times((1,)), replaying(), pytest.raises(WriteSupersededError):
        await store.save_memory_state("k", {"version": -1})
    assert await store.load_memory_state("k") == {"version": 4}
    with logical_times((1,)):  # a direct write: applied, its time past the stored one
        await store.save_memory_state("k", {"version": 5})
    assert await store.load_memory_state("k") == {"version": 5}
    await store.save_memory_states([("k", {"version": 6}), ("k", {"version": 7})])
    assert await store.load_memory_state("k") == {"version": 7}
    with logical_times((2, 3)), replaying(), pytest.raises(WriteSupersededError) as refused:
        await store.save_memory_states([("k", {"version": -2}), ("j", {"version": 0})])
    assert refused.value.refused == 1
    assert await store.load_memory_state("k") == {"version": 7}
    assert await store.load_memory_state("j") == {"version": 0}


@pytest.mark.asyncio
async def test_the_logical_time_survives_the_spill_file_and_a_restart(
    stores: tuple[FlakyStore, PostgresStateStore, PostgresStateStore],
    tmp_path: Path,
    pg_dsn: str,
    schema_name: str,
) -> None:
    """A's held writes outlive its process in the spill file; the next process replays them after
    B wrote newer values: they carry their first call's time, so B's values stay."""
    raw_a, raw_b, reader = stores
    path = tmp_path / "a.sqlite"
    first = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **config(path, drain_timeout=0.2))
    async with first:
        raw_a.down = True
        for i in range(N):
            await first.save_memory_state(f"k{i}", {"by": "a"})
            await first.save_planner_state(f"pause{i}", {"by": "a"})
    for i in range(N):
        await raw_b.save_memory_state(f"k{i}", {"by": "b"})
        await raw_b.save_planner_state(f"pause{i}", {"by": "b"})
    again = await PostgresStateStore.connect(pg_dsn, schema=schema_name)
    second = guard(again, name="worker-a", registry=CollectorRegistry(), **config(path))
    async with second:
        assert controller(second).dead_letters.depth == 2 * N  # adopted from the spill file
        assert await controller(second).drain() == 0
        memory = [await reader.load_memory_state(f"k{i}") for i in range(N)]
        pauses = [await reader.load_planner_state(f"pause{i}") for i in range(N)]
    assert memory == [{"by": "b"}] * N
    assert pauses == [{"by": "b"}] * N


@pytest.mark.asyncio
async def test_a_held_consume_takes_only_the_save_it_was_held_for(
    stores: tuple[FlakyStore, PostgresStateStore, PostgresStateStore],
) -> None:
    """The guard's replay of a consume held for a save with logical time T (a resume answered from
    the held copy) removes the token only when the stored save is not newer than T."""
    _, _, store = stores
    held = (next_logical_time(),)
    with logical_times(held):
        await store.save_planner_state("t", {"pause": 1})
    await store.save_planner_state("t", {"pause": 2})  # a newer save of the token: now
    with logical_times(held):
        assert await store.load_planner_state("t") is None  # not the save it was held for
    assert await store.load_planner_state("t") == {"pause": 2}
    with logical_times(held):
        await store.save_planner_state("u", {"pause": 1})
        assert await store.load_planner_state("u") == {"pause": 1}
    assert await store.load_planner_state("u") is None
    with logical_times(held), replaying():  # a held consume of a token never saved leaves a tombstone
        assert await store.load_planner_state("v") is None
        with pytest.raises(WriteSupersededError):
            await store.save_planner_state("v", {"pause": 1})  # a replay of the save it was for
    assert await store.load_planner_state("v") is None
