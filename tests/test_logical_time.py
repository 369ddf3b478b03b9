"""Logical times of last-write-wins upserts: the clock, how they travel with a held write, and the
in-memory backend refusing an older write (PostgreSQL: tests/postgres/test_replay_never_backwards.py)."""

from __future__ import annotations

from typing import Any

import pytest

from guarded import backend as logical_clock
from guarded.backend import (
    REPLAYING,
    UNTIMED_REPLAY,
    current_item_keys,
    current_logical_time,
    current_logical_times,
    next_logical_time,
)
from guarded.backends.memory import InMemoryStateStore
from guarded.bulk_forms import bulk_call
from guarded.errors import WriteSupersededError
from guarded.logical_time import WRITE_TIME_ARGUMENT, logical_times, replaying
from guarded.models import RemoteBinding
from guarded.pipeline.idempotency import WRITE_KEY_ARGUMENT, replayed_call


def test_the_clock_is_strictly_increasing_even_when_the_wall_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wall = iter([5_000_000_000, 5_000_000_000, 4_000_000_000, 6_000_000_000])
    monkeypatch.setattr(logical_clock, "_last", 0)
    monkeypatch.setattr(logical_clock.time, "time_ns", lambda: next(wall))
    assert [next_logical_time() for _ in range(4)] == [5_000_000, 5_000_001, 5_000_002, 6_000_000]


def test_times_set_by_the_guard_are_used_one_per_item() -> None:
    assert current_logical_time() < current_logical_time()
    with logical_times((7,)):
        assert current_logical_time() == 7
        assert list(current_logical_times(1)) == [7]
        fresh = current_logical_times(2)  # not one per item: a new time for all
        assert len(set(fresh)) == 1
        assert fresh[0] > 7
    with logical_times((1, 2, 3)):
        assert list(current_logical_times(3)) == [1, 2, 3]


def test_a_replay_takes_the_kept_time_and_key_out_of_the_call() -> None:
    kwargs: dict[str, Any] = {"state": {}, WRITE_TIME_ARGUMENT: 42, WRITE_KEY_ARGUMENT: "w1"}
    with replayed_call(kwargs):
        assert current_logical_time() == 42
        assert current_item_keys() == ("w1",)
        assert REPLAYING.get()
    assert not REPLAYING.get()
    assert kwargs == {"state": {}}
    untimed: dict[str, Any] = {WRITE_TIME_ARGUMENT: "not a time"}
    with replayed_call(untimed):
        assert current_logical_time() == UNTIMED_REPLAY  # kept without a usable time: older than any
    assert untimed == {}
    assert current_logical_time() > 42  # a direct write outside: a new time


def test_a_bulk_replay_carries_each_calls_time() -> None:
    calls = [
        (("a", {"v": 1}), {WRITE_TIME_ARGUMENT: 10}),
        (("b",), {"state": {"v": 2}}),
        (("a", {"v": 3}), {WRITE_TIME_ARGUMENT: 30}),
    ]
    replay = bulk_call("save_memory_state", calls)
    assert replay.args == ([("a", {"v": 1}), ("b", {"v": 2}), ("a", {"v": 3})],)
    assert replay.logical_times is not None
    assert replay.logical_times == (10, UNTIMED_REPLAY, 30)
    with replay.context():
        assert REPLAYING.get()
    untimed = bulk_call("save_memory_state", [(("a", {}), {}), (("b", {}), {})])
    assert untimed.logical_times is None
    with untimed.context():
        assert list(current_logical_times(2)) == [UNTIMED_REPLAY] * 2


def binding(agent: str) -> RemoteBinding:
    return RemoteBinding(
        trace_id="t", context_id="c", task_id="task", agent_url=agent, router_session_id="r", remote_skill="s"
    )


@pytest.mark.asyncio
async def test_the_memory_store_refuses_an_older_replay_of_every_last_write_wins_key() -> None:
    store = InMemoryStateStore()
    with logical_times((100,)):
        await store.save_memory_state("k", {"v": "new"})
        await store.save_trajectory("trace", "s", {"v": "new"})
        await store.save_remote_binding(binding("new"))
        await store.save_planner_state("p", {"v": "new"})
    with logical_times((99,)), replaying():
        for write in (
            store.save_memory_state("k", {"v": "old"}),
            store.save_trajectory("trace", "s2", {"v": "old"}),
            store.save_remote_binding(binding("old")),
            store.mark_binding_terminal(trace_id="t", context_id="c", task_id="task"),
            store.save_planner_state("p", {"v": "old"}),
        ):
            with pytest.raises(WriteSupersededError):
                await write
    assert await store.load_memory_state("k") == {"v": "new"}
    assert await store.get_trajectory("trace", "s") == {"v": "new"}
    assert await store.list_traces("s2") == []
    [found] = await store.list_bindings(router_session_id="r")
    assert (found.agent_url, found.is_terminal) == ("new", False)
    assert await store.load_planner_state("p") == {"v": "new"}
    with logical_times((100,)), replaying():  # an equal time wins: a repeat of the same write is harmless
        await store.save_memory_state("k", {"v": "again"})
    assert await store.load_memory_state("k") == {"v": "again"}
    with logical_times((50, 200)), replaying(), pytest.raises(WriteSupersededError) as refused:
        await store.save_memory_states([("k", {"v": "older"}), ("j", {"v": "j"})])
    assert refused.value.refused == 1
    assert await store.load_memory_state("k") == {"v": "again"}
    assert await store.load_memory_state("j") == {"v": "j"}  # the rest of the call is applied


@pytest.mark.asyncio
async def test_a_direct_write_is_applied_whatever_its_time_and_the_time_only_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker whose clock is behind another's writes directly: applied, at a time past the
    stored one, which the process clock then moves past (as a hybrid logical clock merges)."""
    monkeypatch.setattr(logical_clock, "_last", 0)
    store = InMemoryStateStore()
    ahead = 10**18
    with logical_times((ahead,)):
        await store.save_memory_state("k", {"v": "ahead"})
    with logical_times((5,)):
        await store.save_memory_state("k", {"v": "behind, later"})
    assert await store.load_memory_state("k") == {"v": "behind, later"}
    assert next_logical_time() > ahead + 1  # merged: the stored time was ahead + 1
    with logical_times((ahead,)), replaying(), pytest.raises(WriteSupersededError):
        await store.save_memory_state("k", {"v": "replay of the write ahead"})
    assert await store.load_memory_state("k") == {"v": "behind, later"}


@pytest.mark.asyncio
async def test_a_replay_kept_without_a_time_lands_only_where_the_key_has_no_row() -> None:
    store = InMemoryStateStore()
    await store.save_memory_state("written", {"v": "direct"})
    with replaying():
        await store.save_memory_state("free", {"v": "held by an older version"})
        with pytest.raises(WriteSupersededError):
            await store.save_memory_state("written", {"v": "held by an older version"})
    assert await store.load_memory_state("free") == {"v": "held by an older version"}
    assert await store.load_memory_state("written") == {"v": "direct"}


@pytest.mark.asyncio
async def test_without_a_guard_the_last_call_wins_as_in_penguiflows_reference() -> None:
    store = InMemoryStateStore()
    for version in range(3):
        await store.save_memory_state("k", {"v": version})
        await store.save_remote_binding(binding(f"agent{version}"))
    await store.mark_binding_terminal(trace_id="t", context_id="c", task_id="task")
    assert await store.load_memory_state("k") == {"v": 2}
    [found] = await store.list_bindings(router_session_id="r")
    assert (found.agent_url, found.is_terminal) == ("agent2", True)
    await store.save_planner_state("p", {"v": 1})
    assert await store.load_planner_state("p") == {"v": 1}
    with (
        logical_times((1,)),
        replaying(),
        pytest.raises(WriteSupersededError),
    ):  # called before the consume (a replay): its tombstone refuses it
        await store.save_planner_state("p", {"v": 2})
    assert await store.load_planner_state("p") is None
    await store.save_planner_state("p", {"v": 3})  # a new call: the token is paused again
    assert await store.load_planner_state("p") == {"v": 3}
