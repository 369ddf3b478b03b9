"""The PostgreSQL backend's ordering rules, statement by statement (:mod:`guarded.backend`).

A direct upsert is applied whatever logical time it carries, and leaves the row a time past the
stored one, which the process clock moves past; a replay older than the stored row is left alone
and reported (:class:`~guarded.errors.WriteSupersededError`, after the rest of the call is
applied); a replay kept without a time lands only where the key has no row.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guarded import backend as logical_clock
from guarded.backend import next_logical_time
from guarded.backends.postgres import PostgresStateStore
from guarded.errors import WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.models import RemoteBinding, TaskContextSnapshot, TaskState, TaskStatus, TaskType

AHEAD = 4_000_000_000_000_000  # microseconds: a clock far ahead of this one


def binding(index: int, agent: str) -> RemoteBinding:
    return RemoteBinding(
        trace_id=f"t{index}",
        context_id=f"c{index}",
        task_id="task",
        agent_url=agent,
        router_session_id="router",
        remote_skill="skill",
    )


Write = Callable[[PostgresStateStore, str], Awaitable[Any]]
Read = Callable[[PostgresStateStore], Awaitable[Any]]

SINGLE: dict[str, tuple[Write, Read]] = {
    "memory": (
        lambda store, by: store.save_memory_state("k", {"by": by}),
        lambda store: store.load_memory_state("k"),
    ),
    "trajectory": (
        lambda store, by: store.save_trajectory("trace", "s", {"by": by}),
        lambda store: store.get_trajectory("trace", "s"),
    ),
    "binding": (
        lambda store, by: store.save_remote_binding(binding(0, by)),
        lambda store: store.list_bindings(router_session_id="router"),
    ),
}
BULK: dict[str, tuple[Write, Read]] = {
    "memory": (
        lambda store, by: store.save_memory_states([("k", {"by": by}), ("j", {"by": by})]),
        lambda store: store.load_memory_state("k"),
    ),
    "trajectory": (
        lambda store, by: store.save_trajectories([("trace", "s", {"by": by}), ("other", "s", {"by": by})]),
        lambda store: store.get_trajectory("trace", "s"),
    ),
    "binding": (
        lambda store, by: store.save_remote_bindings([binding(0, by), binding(1, by)]),
        lambda store: store.list_bindings(router_session_id="router"),
    ),
}


def shown(found: Any) -> Any:
    if isinstance(found, list):
        return sorted(item.agent_url for item in found)
    return found


@pytest.mark.asyncio
@pytest.mark.parametrize("form", ["single", "bulk"])
@pytest.mark.parametrize("kind", ["memory", "trajectory", "binding"])
async def test_direct_writes_apply_and_only_older_replays_are_refused(
    kind: str, form: str, store: PostgresStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write, read = (SINGLE if form == "single" else BULK)[kind]
    items = 1 if form == "single" else 2
    seen = logical_clock._last
    # The process clock comes back to this after the test, not to the time ahead it merges below.
    monkeypatch.setattr(logical_clock, "_last", seen)
    with logical_times((AHEAD,) * items):  # another worker, its clock far ahead
        await write(store, "ahead")
    monkeypatch.setattr(logical_clock, "_last", seen)  # a time this process has not seen
    before = await read(store)

    with logical_times((next_logical_time(),) * items):  # a direct write of this worker, later
        await write(store, "direct")
    after_direct = await read(store)
    assert shown(after_direct) != shown(before), "a direct write with an older time must be applied"
    assert next_logical_time() > AHEAD, "the process clock moves past the stored time"

    with logical_times((AHEAD,) * items), replaying(), pytest.raises(WriteSupersededError) as refused:
        await write(store, "an older replay")
    assert refused.value.refused == items
    assert shown(await read(store)) == shown(after_direct)


@pytest.mark.asyncio
async def test_replays_are_compared_row_by_row_and_untimed_ones_only_fill_empty_keys(
    store: PostgresStateStore,
) -> None:
    await store.save_memory_state("k", {"by": "direct"})
    with replaying(), pytest.raises(WriteSupersededError) as refused:  # kept without a time
        await store.save_memory_states([("k", {"by": "untimed"}), ("free", {"by": "untimed"})])
    assert refused.value.refused == 1
    assert await store.load_memory_state("k") == {"by": "direct"}
    assert await store.load_memory_state("free") == {"by": "untimed"}
    with logical_times((next_logical_time(),)), replaying():  # a newer replay is applied
        await store.save_memory_state("k", {"by": "newer replay"})
    assert await store.load_memory_state("k") == {"by": "newer replay"}


@pytest.mark.asyncio
async def test_an_untimed_replayed_pause_lives_its_whole_ttl_where_the_token_has_none(
    store: PostgresStateStore,
) -> None:
    """A pause held by a version that kept no logical time: its call time is unknown, so its TTL
    counts from the replay (counted from time 0, it had expired 56 years ago and was dropped as
    delivered), and it still lands only where the token has no row."""
    await store.save_planner_state("taken", {"by": "direct"})
    with replaying():
        await store.save_planner_state("free", {"by": "untimed"})
        with pytest.raises(WriteSupersededError):
            await store.save_planner_state("taken", {"by": "untimed"})
    assert await store.load_planner_state("free") == {"by": "untimed"}
    assert await store.load_planner_state("taken") == {"by": "direct"}


@pytest.mark.asyncio
async def test_terminal_marks_and_pause_saves_follow_the_same_rules(
    store: PostgresStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = logical_clock._last
    # The process clock comes back to this after the test, not to the time ahead it merges below.
    monkeypatch.setattr(logical_clock, "_last", seen)
    with logical_times((AHEAD,)):
        await store.save_remote_binding(binding(0, "ahead"))
        await store.save_planner_state("p", {"by": "ahead"})
    monkeypatch.setattr(logical_clock, "_last", seen)
    with logical_times((1,)), replaying():
        with pytest.raises(WriteSupersededError):
            await store.mark_binding_terminal(trace_id="t0", context_id="c0", task_id="task")
        with logical_times((seen,)), pytest.raises(WriteSupersededError):  # older, not expired
            await store.save_planner_state("p", {"by": "an older replay"})
        await store.mark_binding_terminal(
            trace_id="unknown", context_id=None, task_id="task"
        )  # nothing to mark
        with pytest.raises(WriteSupersededError) as refused:
            await store.mark_bindings_terminal([("t0", "c0", "task"), ("unknown", None, "task")])
        assert refused.value.refused == 1
    [found] = await store.list_bindings(router_session_id="router")
    assert not found.is_terminal
    with logical_times((1,)):  # direct: applied
        await store.mark_binding_terminal(trace_id="t0", context_id="c0", task_id="task")
        await store.save_planner_state("p", {"by": "a direct save"})
    [found] = await store.list_bindings(router_session_id="router")
    assert found.is_terminal
    assert await store.load_planner_state("p") == {"by": "a direct save"}


def task(step: int) -> TaskState:
    return TaskState(
        task_id="task",
        session_id="session",
        status=TaskStatus.RUNNING,
        task_type=TaskType.BACKGROUND,
        priority=step,
        context_snapshot=TaskContextSnapshot(session_id="session", task_id="task"),
        updated_at=datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=step),
    )


@pytest.mark.asyncio
async def test_a_replayed_task_state_older_than_the_stored_one_is_reported(store: PostgresStateStore) -> None:
    """Tasks are ordered by their own ``updated_at``: an older one is refused, a direct write
    quietly as before, a replay reported so the guard counts it as superseded."""
    await store.save_task(task(2))
    await store.save_task(task(1))  # a direct write of older data: refused, as PenguiFlow callers expect
    with replaying():
        with pytest.raises(WriteSupersededError):
            await store.save_task(task(0))
        with pytest.raises(WriteSupersededError) as refused:
            await store.save_tasks([task(1)])
        assert refused.value.refused == 1
        await store.save_task(task(3))
    [found] = await store.list_tasks("session")
    assert found.priority == 3
