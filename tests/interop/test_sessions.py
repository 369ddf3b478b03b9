"""PenguiFlow's ``StreamingSession`` / ``SessionManager`` persist through ``guard(PostgresStateStore)``.

PenguiFlow 3.11 sessions call the store directly (``hasattr(store, "save_task")``): the task registry
persists every task state change with ``save_task``, ``_publish`` fires ``save_update`` for every
update without awaiting it, ``steer`` saves the sanitized event with ``save_steering`` before acting
on it, and ``hydrate`` (run by ``SessionManager.get_or_create``) seeds the registry from
``list_tasks``. Spec 000 "Sessions" / "Steering Payload Sanitization"; spec 001 "Hydration".
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import asyncpg
import pytest
from penguiflow.sessions import SessionManager, StreamingSession, TaskStatus, TaskType
from penguiflow.steering import SteeringEvent, SteeringEventType

from guarded import controller
from tests.support.aio import eventually

from ._session_support import (
    answer,
    bare_store,
    blocked,
    describe_task,
    failing,
    guarded_store,
    run_worker,
    settle,
    shut_down,
)

SESSION = "interop-session"


async def status_of(session: StreamingSession, task_id: str) -> TaskStatus | None:
    task = await session.get_task(task_id)
    return None if task is None else task.status


async def wait_for_error(session: StreamingSession, task_id: str, error: str) -> None:
    """Wait until the task's own handler recorded ``error`` (its last state change)."""
    for _ in range(2000):
        task = await session.get_task(task_id)
        if task is not None and task.error == error:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"task {task_id} never recorded error {error!r}")


def steer(task_id: str, event_type: SteeringEventType, payload: dict[str, Any]) -> SteeringEvent:
    return SteeringEvent(
        session_id=SESSION, task_id=task_id, event_type=event_type, payload=payload, source="user"
    )


async def collect_updates(session: StreamingSession, seen: list[str]) -> None:
    """Record update ids in the order the session publishes them (its broker is synchronous)."""
    async for update in await session.subscribe():
        seen.append(update.update_id)


@pytest.mark.asyncio
async def test_a_new_process_hydrates_the_tasks_updates_and_steering_of_a_session(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    async with guarded_store(pg_dsn, schema_name) as store:
        manager = SessionManager(state_store=store)
        session = await manager.get_or_create(SESSION)
        assert await session.list_tasks() == []
        published: list[str] = []
        collector = asyncio.create_task(collect_updates(session, published))
        try:
            await run_and_check_hydration(store, session, published, pg_dsn, schema_name, raw)
        finally:
            collector.cancel()
            await shut_down(store, session)
            await manager.drop(SESSION)


async def run_and_check_hydration(
    store: Any,
    session: StreamingSession,
    published: list[str],
    pg_dsn: str,
    schema_name: str,
    raw: asyncpg.Connection,
) -> None:
    await session.run_task(
        answer({"answer": 42, "units": ["none"]}),
        task_id="fg-1",
        task_type=TaskType.FOREGROUND,
        description="foreground turn",
        query="what is six times seven?",
    )
    with pytest.raises(RuntimeError, match="tool exploded"):
        await session.run_task(failing("tool exploded"), task_id="bg-fails", task_type=TaskType.BACKGROUND)

    parent_started, child_started, paused_started = asyncio.Event(), asyncio.Event(), asyncio.Event()
    await session.spawn_task(blocked(parent_started), task_id="bg-cancelled", task_type=TaskType.BACKGROUND)
    await session.spawn_task(
        blocked(child_started),
        task_id="bg-child",
        task_type=TaskType.BACKGROUND,
        parent_task_id="bg-cancelled",
    )
    await session.spawn_task(blocked(paused_started), task_id="bg-paused", task_type=TaskType.BACKGROUND)
    await asyncio.gather(parent_started.wait(), child_started.wait(), paused_started.wait())

    assert await session.cancel_task("bg-cancelled", reason="user changed their mind")
    await wait_for_error(session, "bg-cancelled", "cancelled")
    await wait_for_error(session, "bg-child", "cancelled")
    assert await session.steer(steer("bg-paused", SteeringEventType.PRIORITIZE, {"priority": 5}))
    assert await session.steer(steer("bg-paused", SteeringEventType.PAUSE, {"reason": "wait for me"}))
    await settle(store)

    expected_tasks = [describe_task(task) for task in await session.list_tasks()]
    statuses = {task["task_id"]: task["status"] for task in expected_tasks}
    assert statuses == {
        "fg-1": "COMPLETE",
        "bg-fails": "FAILED",
        "bg-cancelled": "CANCELLED",
        "bg-child": "CANCELLED",
        "bg-paused": "PAUSED",
    }
    expected_steering = [
        {"event_id": event.event_id, "type": event.event_type.value, "payload": event.payload}
        for event in await store.list_steering(SESSION)
    ]
    assert [(event["type"], event["payload"].get("reason")) for event in expected_steering] == [
        ("CANCEL", "user changed their mind"),
        ("CANCEL", "user changed their mind"),  # propagated to the child by the session
        ("PRIORITIZE", None),
        ("PAUSE", "wait for me"),
    ]
    assert expected_steering[1]["payload"]["propagated_from"] == "bg-cancelled"
    expected_updates = [update.update_id for update in await session.list_updates(limit=10_000)]
    await eventually(lambda: len(published) == len(expected_updates), what="every update published")
    assert expected_updates == published
    assert len(published) > 20
    held = controller(store).dead_letters
    assert held is not None
    assert held.depth == 0

    # Another process: a fresh PostgresStateStore and guard on the same schema.
    hydrated = await run_worker("session", pg_dsn, schema_name, SESSION, "bg-paused")

    assert hydrated["tasks"] == expected_tasks
    assert [update["update_id"] for update in hydrated["updates"]] == published
    assert hydrated["steering"] == expected_steering
    assert hydrated["resumed"] is True

    rows = await raw.fetch(
        f"SELECT task_id, status, doc FROM {schema_name}.task_states WHERE session_id = $1", SESSION
    )
    stored = {row["task_id"]: (row["status"], json.loads(row["doc"])) for row in rows}
    assert stored["bg-paused"][0] == "RUNNING"  # resumed by the other process
    assert stored["bg-paused"][1]["priority"] == 5
    after_restart = stored["after-restart"][1]
    assert stored["after-restart"][0] == "COMPLETE"
    assert after_restart["result"] == "after restart"
    # hydrate() restored the foreground task: new tasks are spawned from it, not from "foreground".
    assert after_restart["context_snapshot"]["spawned_from_task_id"] == "fg-1"
    last = await raw.fetchrow(
        f"SELECT event_type, doc FROM {schema_name}.steering_events WHERE session_id = $1 ORDER BY id DESC",
        SESSION,
    )
    assert last is not None
    assert last["event_type"] == "RESUME"
    assert json.loads(last["doc"])["payload"] == {"reason": "resumed by the next process"}


async def stored_update_ids(session: StreamingSession, count: int) -> list[str]:
    """The session's stored update ids once ``count`` are stored (PenguiFlow does not await them)."""
    for _ in range(2000):
        stored = [update.update_id for update in await session.list_updates()]
        if len(stored) >= count:
            return stored
        await asyncio.sleep(0.005)
    raise AssertionError(f"fewer than {count} updates were stored")


@pytest.mark.asyncio
@pytest.mark.parametrize("guarded", [False, True], ids=["bare-store", "guarded-store"])
async def test_updates_are_listed_and_replayed_in_publish_order(
    pg_dsn: str, schema_name: str, guarded: bool
) -> None:
    """Spec 000: ``list_updates`` SHOULD return updates in stable order with ``since_id`` as an
    exclusive cursor, and ``subscribe(since_id=...)`` replays from it. PenguiFlow's own stores keep
    publish order; a store that does not makes a reconnecting client skip updates published after
    its cursor (they were stored before it). PenguiFlow never awaits ``save_update`` and the guard
    flushes batches concurrently, so this holds only because the backend commits a stream's appends
    in call order (backends/postgres/streams.py)."""
    opened = guarded_store(pg_dsn, schema_name) if guarded else bare_store(pg_dsn, schema_name)
    async with opened as store:
        session = StreamingSession(SESSION, state_store=store)
        published: list[str] = []
        collector = asyncio.create_task(collect_updates(session, published))
        try:
            for index in range(4):
                await session.run_task(answer(index), task_id=f"turn-{index}", task_type=TaskType.FOREGROUND)
            # created, running, progress, result, complete per task
            await eventually(lambda: len(published) == 20, what="20 published updates")
            assert await stored_update_ids(session, 20) == published
            replayed = await session.list_updates(since_id=published[9])
            assert [update.update_id for update in replayed] == published[10:]
        finally:
            collector.cancel()
            await shut_down(store, session)


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"non-standard JSON token {token} stored")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.asyncio
async def test_steering_payloads_are_stored_sanitized(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    """Spec 000 "Steering Payload Sanitization": always persist the sanitized form, never raw input."""
    deep = {"l1": {"l2": {"l3": {"l4": {"l5": {"l6": {"l7": "bottom"}}}}}}}
    untrusted = {
        "reason": "review",
        "deep": deep,
        "wide": {f"key{index:02d}": index for index in range(70)},
        "items": list(range(60)),
        "long": "y" * 5000,
        "score": math.nan,
        "limit": math.inf,
        "control": "bell\x07 nul\x00 escape\x1b[31m tab\t newline\n",
    }
    oversized = {"reason": "paste", "blob": {f"part{index}": "x" * 4000 for index in range(10)}}
    async with guarded_store(pg_dsn, schema_name) as store:
        session = StreamingSession(SESSION, state_store=store)
        started = asyncio.Event()
        await session.spawn_task(blocked(started), task_id="target", task_type=TaskType.BACKGROUND)
        await started.wait()
        assert await session.steer(steer("target", SteeringEventType.PAUSE, untrusted))
        assert await session.steer(steer("target", SteeringEventType.RESUME, oversized))
        # PenguiFlow's validation takes a boolean for an integer priority; the store keeps the event.
        assert await session.steer(steer("target", SteeringEventType.PRIORITIZE, {"priority": True}))
        # PenguiFlow validates the sanitized payload: a message without text is refused, not stored.
        assert not await session.steer(steer("target", SteeringEventType.USER_MESSAGE, {"text": "  "}))
        # The store sanitizes what PenguiFlow's own sanitizer cannot encode (a lone surrogate raises
        # UnicodeEncodeError in penguiflow.steering.sanitize_payload), on every path into it.
        lone = steer("target", SteeringEventType.USER_MESSAGE, {"text": "broken \ud800 surrogate"})
        await store.save_steering(lone)
        # An event PenguiFlow's sessions would refuse is still stored, as PenguiFlow's reference store
        # does: stores sanitize, they do not validate.
        await store.save_steering(steer("target", SteeringEventType.PRIORITIZE, {"priority": "high"}))
        await settle(store)
        stats = controller(store).stats()
        assert (stats[("save_steering", "ok")], stats.get(("save_steering", "rejected"), 0)) == (5, 0)
        assert (await status_of(session, "target")) == TaskStatus.RUNNING
        await shut_down(store, session)

    rows = await raw.fetch(
        f"SELECT event_type, doc FROM {schema_name}.steering_events WHERE session_id = $1 ORDER BY id",
        SESSION,
    )
    assert [row["event_type"] for row in rows] == [
        "PAUSE",
        "RESUME",
        "PRIORITIZE",
        "USER_MESSAGE",
        "PRIORITIZE",
    ]
    docs = [_strict_json(row["doc"]) for row in rows]

    paused = docs[0]["payload"]
    assert paused["reason"] == "review"
    assert paused["deep"] == {"l1": {"l2": {"l3": {"l4": {"l5": "<truncated>"}}}}}
    assert len(paused["wide"]) == 65
    assert paused["wide"]["__truncated_keys__"] is True
    assert [paused["wide"][f"key{index:02d}"] for index in range(64)] == list(range(64))
    assert paused["items"] == [*range(50), "<truncated>"]
    assert paused["long"] == "y" * 4096
    assert (paused["score"], paused["limit"]) == ("nan", "inf")
    assert paused["control"] == untrusted["control"]  # control characters are valid JSON: kept exactly
    assert "\\u0000" in rows[0]["doc"]

    resumed = docs[1]["payload"]
    assert set(resumed) == {"truncated", "summary"}
    assert resumed["truncated"] is True
    assert resumed["summary"].startswith('{"reason": "paste", "blob": {"part0": "xxxx')
    assert len(json.dumps(resumed, ensure_ascii=False).encode("utf-8")) <= 16_384

    assert docs[2]["payload"] == {"priority": True}
    assert docs[3]["payload"] == {"text": "broken \ufffd surrogate"}
    assert docs[4]["payload"] == {"priority": "high"}

    async with guarded_store(pg_dsn, schema_name, name="reader") as reader:
        listed = await reader.list_steering(SESSION)
    assert [event.payload for event in listed] == [doc["payload"] for doc in docs]
