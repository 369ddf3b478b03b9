"""Last-write-wins that never goes backwards, on every durable store: a late write or replay cannot
undo a newer task state (by ``updated_at``, naive times read as UTC), nor move it to another
session."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guarded.errors import WriteSupersededError
from guarded.logical_time import replaying
from guarded.models import TaskContextSnapshot, TaskState, TaskStatus, TaskType

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def task(status: TaskStatus, updated_at: datetime, session: str = "s", **changes: Any) -> TaskState:
    fields: dict[str, Any] = {
        "task_id": "task",
        "session_id": session,
        "status": status,
        "task_type": TaskType.BACKGROUND,
        "priority": 1,
        "context_snapshot": TaskContextSnapshot(session_id=session, task_id="task"),
        "updated_at": updated_at,
    }
    fields.update(changes)
    return TaskState(**fields)


async def status_of(store: Any, session: str = "s") -> str:
    [only] = await store.list_tasks(session)
    return str(only.status.value)


@pytest.mark.asyncio
async def test_an_older_write_never_replaces_a_newer_one(store: Any) -> None:
    await store.save_task(task(TaskStatus.COMPLETE, T0 + timedelta(seconds=10)))
    await store.save_task(task(TaskStatus.RUNNING, T0))  # a late write
    assert await status_of(store) == "COMPLETE"
    with replaying(), pytest.raises(WriteSupersededError):
        await store.save_task(task(TaskStatus.RUNNING, T0))  # a late replay is reported
    assert await status_of(store) == "COMPLETE"


@pytest.mark.asyncio
async def test_newer_and_equal_timestamps_win(store: Any) -> None:
    await store.save_task(task(TaskStatus.PENDING, T0))
    await store.save_task(task(TaskStatus.RUNNING, T0 + timedelta(microseconds=1)))
    assert await status_of(store) == "RUNNING"
    await store.save_task(task(TaskStatus.PAUSED, T0 + timedelta(microseconds=1)))
    assert await status_of(store) == "PAUSED"


@pytest.mark.asyncio
async def test_naive_timestamps_compare_as_utc(store: Any) -> None:
    await store.save_task(task(TaskStatus.COMPLETE, T0 + timedelta(hours=1)))
    await store.save_task(task(TaskStatus.RUNNING, (T0 + timedelta(minutes=30)).replace(tzinfo=None)))
    assert await status_of(store) == "COMPLETE"
    await store.save_task(task(TaskStatus.FAILED, (T0 + timedelta(hours=2)).replace(tzinfo=None)))
    assert await status_of(store) == "FAILED"


@pytest.mark.asyncio
async def test_a_stale_write_does_not_move_the_task_to_another_session(store: Any) -> None:
    await store.save_task(task(TaskStatus.RUNNING, T0 + timedelta(seconds=5), session="a"))
    await store.save_task(task(TaskStatus.RUNNING, T0, session="b"))
    assert [item.session_id for item in await store.list_tasks("a")] == ["a"]
    assert await store.list_tasks("b") == []
    await store.save_task(task(TaskStatus.RUNNING, T0 + timedelta(seconds=6), session="b"))
    assert await store.list_tasks("a") == []
    assert [item.session_id for item in await store.list_tasks("b")] == ["b"]


@pytest.mark.asyncio
async def test_concurrent_replays_converge_on_the_newest(store: Any) -> None:
    writes = [
        task(TaskStatus.RUNNING, T0 + timedelta(seconds=second), priority=second) for second in range(30)
    ]
    newest = writes[-1]
    shuffled = writes[1::2] + writes[::2]
    await asyncio.gather(*(store.save_task(item) for item in shuffled))
    [stored] = await store.list_tasks("s")
    assert stored.priority == newest.priority
    assert stored.updated_at == newest.updated_at
