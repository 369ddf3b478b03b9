"""Contracts of session persistence: tasks, task updates and steering events.

``list_updates`` and ``list_steering`` share their cursor rules, so one set of checks is
registered for each of the two streams. What a steering event itself must keep (round-trip,
sanitization, no validation) is checked in :mod:`._contracts_steering`.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..models import (
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)
from ._base import (
    Contract,
    contract,
    expect_same,
    expect_sequence,
    plain,
    register,
    show,
    survive,
    unique,
    violation,
)

TASKS = "spec 000 'Optional Duck-Typed Methods' §8 Task Persistence"
STEERING = "spec 000 'Optional Duck-Typed Methods' §9 Steering Persistence"
CURSOR = "spec 001 'Idempotency and stable ordering': since_id is an exclusive cursor, results oldest first"
LIMIT = "PenguiFlow's reference store: limit keeps the most recent matching items, still oldest first"
ALIASES = "spec 000 'Compatibility Adapters'; spec 001 compatibility aliases"
BASE_TIME = datetime(2025, 1, 1, tzinfo=UTC)


def task(session: str, task_id: str, status: TaskStatus = TaskStatus.PENDING, **changes: Any) -> TaskState:
    """A background task with a context snapshot worth preserving (versions, hashes, deep copies)."""
    snapshot = TaskContextSnapshot(
        session_id=session,
        task_id=task_id,
        trace_id=f"{task_id}-trace",
        spawn_reason="user asked for a report",
        query="summarise the quarter",
        context_version=7,
        context_hash="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        llm_context={"background_results": [{"digest": "ünïcode ✓"}]},
        tool_context={"tenant_id": "tenant-a", "limits": {"rows": 100}},
        memory={"turns": []},
        artifacts=[{"id": "artifact-1", "mime_type": "image/png"}],
    )
    fields: dict[str, Any] = {
        "task_id": task_id,
        "session_id": session,
        "status": status,
        "task_type": TaskType.BACKGROUND,
        "priority": 5,
        "context_snapshot": snapshot,
        "trace_id": f"{task_id}-trace",
        "description": "Test task",
    }
    fields.update(changes)
    return TaskState(**fields)


async def tasks_of(store: Any, session: str) -> list[Any]:
    result = await store.list_tasks(session)
    return list(expect_sequence(result, "list_tasks", f"it returns a sequence ({TASKS})"))


@contract(
    "tasks.roundtrip",
    "tasks",
    "A saved task comes back from list_tasks with its fields and context snapshot intact (spec 000 test 10).",
)
async def task_roundtrip(store: Any) -> None:
    session = unique("session")
    saved = task(
        session,
        f"{session}-task",
        TaskStatus.COMPLETE,
        result={"answer": "42", "score": 0.5, "rows": [1, 2.0, None]},
        progress={"step": 3, "of": 4},
        error=None,
    )
    expected = copy.deepcopy(saved)
    await store.save_task(saved)
    found = await tasks_of(store, session)
    if len(found) != 1:
        raise violation(f"list_tasks returned {len(found)} tasks after one save_task; expected 1 ({TASKS})")
    got = found[0]
    rule = f"task state must round-trip ({TASKS})"
    for name in ("task_id", "session_id", "priority", "trace_id", "description", "error"):
        expect_same(getattr(expected, name), getattr(got, name), name, rule)
    expect_same(expected.status.value, plain(got.status), "status", rule)
    expect_same(expected.task_type.value, plain(got.task_type), "task_type", rule)
    expect_same(expected.result, got.result, "result", rule)
    expect_same(expected.progress, got.progress, "progress", rule)
    snapshot_rule = (
        "TaskContextSnapshot.context_version/context_hash and the deep copies of the contexts must be "
        "preserved for divergence detection (spec 000 'Implications for StateStore')"
    )
    for name in (
        "session_id",
        "task_id",
        "trace_id",
        "spawned_from_task_id",
        "spawn_reason",
        "query",
        "propagate_on_cancel",
        "notify_on_complete",
        "context_version",
        "context_hash",
        "llm_context",
        "tool_context",
        "memory",
        "artifacts",
    ):
        expect_same(
            getattr(expected.context_snapshot, name),
            getattr(got.context_snapshot, name),
            f"context_snapshot.{name}",
            snapshot_rule,
        )


@contract(
    "tasks.upsert",
    "tasks",
    "Saving the same task_id twice leaves one task with the latest status.",
)
async def task_upsert(store: Any) -> None:
    session = unique("session")
    task_id = f"{session}-task"
    await store.save_task(task(session, task_id, TaskStatus.PENDING))
    await store.save_task(task(session, task_id, TaskStatus.RUNNING, priority=9))
    await store.save_task(task(session, f"{session}-other", TaskStatus.PENDING))
    found = {str(item.task_id): item for item in await tasks_of(store, session)}
    if sorted(found) != sorted([task_id, f"{session}-other"]):
        raise violation(
            f"list_tasks returned task ids {sorted(found)} after saving one task twice and another once; "
            f"save_task MUST be upsert-safe and list_tasks MUST return every task of the session ({TASKS})"
        )
    got = found[task_id]
    if plain(got.status) != "RUNNING" or got.priority != 9:
        raise violation(
            f"after saving a task PENDING then RUNNING (priority 9), list_tasks returned it "
            f"{plain(got.status)} (priority {got.priority}); the latest save must win ({TASKS})"
        )


@contract(
    "tasks.unknown_session_empty",
    "tasks",
    "list_tasks and list_updates of an unknown session return [], not an exception.",
)
async def tasks_unknown_session(store: Any) -> None:
    rule = f"reads MUST return an empty sequence on 'not found' (do not raise) ({TASKS})"
    for method in ("list_tasks", "list_updates"):
        result = await survive(
            f"{method} of an unknown session", getattr(store, method)(unique("session")), rule
        )
        if list(expect_sequence(result, f"{method} of an unknown session", rule)):
            raise violation(f"{method} of an unknown session returned {show(result)}; {rule}")


@dataclass(frozen=True, slots=True)
class Stream:
    """One of the two cursor-paginated streams of a session: task updates or steering events."""

    prefix: str
    capability: str
    lister: str
    id_field: str
    spec: str
    make: Callable[[str, str, str, int], Any]
    save: Callable[[Any, Any], Awaitable[None]]

    async def list(self, store: Any, session: str, **options: Any) -> list[Any]:
        result = await getattr(store, self.lister)(session, **options)
        return list(expect_sequence(result, self.lister, f"it returns a sequence ({self.spec})"))

    def ident(self, item: Any) -> str:
        return str(getattr(item, self.id_field))


def make_update(session: str, task_id: str, ident: str, index: int) -> StateUpdate:
    return StateUpdate(
        session_id=session,
        task_id=task_id,
        trace_id=f"{session}-trace",
        update_id=ident,
        update_type=UpdateType.PROGRESS,
        content={"step": index, "note": f"step {index} ✓", "ratio": index / 4},
        step_index=index,
        total_steps=5,
        created_at=BASE_TIME + timedelta(seconds=index),
    )


def make_steering(session: str, task_id: str, ident: str, index: int) -> SteeringEvent:
    return SteeringEvent(
        session_id=session,
        task_id=task_id,
        event_id=ident,
        event_type=SteeringEventType.USER_MESSAGE,
        payload={"text": f"message {index}"},
        created_at=BASE_TIME + timedelta(seconds=index),
    )


async def save_update(store: Any, item: Any) -> None:
    await store.save_update(item)


async def save_steering(store: Any, item: Any) -> None:
    await store.save_steering(item)


STREAMS = (
    Stream("tasks.updates_", "tasks", "list_updates", "update_id", TASKS, make_update, save_update),
    Stream("steering.", "steering", "list_steering", "event_id", STEERING, make_steering, save_steering),
)


async def populate(stream: Stream, store: Any, tasks: str) -> tuple[str, dict[str, str]]:
    """Save one item per letter of ``tasks`` (its task), labelled ``A0``, ``B1``...; return the labels."""
    session = unique("session")
    names: dict[str, str] = {}
    for index, letter in enumerate(tasks):
        label = f"{letter}{index}"
        ident = f"{session}-{label}"
        names[ident] = label
        await stream.save(store, stream.make(session, f"{session}-task-{letter}", ident, index))
    return session, names


async def listed(
    stream: Stream, store: Any, session: str, names: dict[str, str], **options: Any
) -> list[str]:
    return [
        names.get(stream.ident(item), stream.ident(item))
        for item in await stream.list(store, session, **options)
    ]


def call(stream: Stream, options: dict[str, Any], names: dict[str, str]) -> str:
    shown = ", ".join(f"{key}={names.get(value, value)!r}" for key, value in options.items())
    return f"{stream.lister}({shown})"


async def expect_listing(
    stream: Stream,
    store: Any,
    session: str,
    names: dict[str, str],
    expected: list[str],
    rule: str,
    **options: Any,
) -> None:
    found = await listed(stream, store, session, names, **options)
    if found != expected:
        raise violation(f"{call(stream, options, names)} returned {found}, expected {expected}; {rule}")


def ident_of(names: dict[str, str], label: str) -> str:
    return next(ident for ident, name in names.items() if name == label)


def stream_checks(stream: Stream) -> list[Contract]:
    """The cursor/ordering/idempotency contracts of one stream."""

    async def ascending(store: Any) -> None:
        session, names = await populate(stream, store, "AAAAA")
        await expect_listing(
            stream,
            store,
            session,
            names,
            ["A0", "A1", "A2", "A3", "A4"],
            f"results are oldest first ({CURSOR})",
        )
        if stream.lister == "list_updates":
            got = (await stream.list(store, session))[3]
            saved = make_update(session, "", "", 3)
            rule = f"updates must round-trip ({TASKS})"
            expect_same(saved.content, got.content, "content", rule)
            expect_same(saved.update_type.value, plain(got.update_type), "update_type", rule)
            expect_same(saved.step_index, got.step_index, "step_index", rule)

    async def idempotent(store: Any) -> None:
        session = unique("session")
        item = stream.make(session, f"{session}-task", f"{session}-once", 0)
        await stream.save(store, item)
        rule = (
            f"saving is idempotent by {stream.id_field} (spec 000 'Idempotency Requirements': retries "
            f"re-emit the same id; {stream.spec})"
        )
        await survive(
            f"saving the same {stream.id_field} again", stream.save(store, item.model_copy(deep=True)), rule
        )
        found = [stream.ident(entry) for entry in await stream.list(store, session)]
        if len(found) != 1:
            raise violation(
                f"{stream.lister} returned {len(found)} items after one {stream.id_field} was saved twice; "
                f"{rule}"
            )

    async def since_id_exclusive(store: Any) -> None:
        session, names = await populate(stream, store, "AAAAA")
        rule = f"since_id is an exclusive cursor ({CURSOR}; {stream.spec})"
        for cursor, expected in (("A2", ["A3", "A4"]), ("A0", ["A1", "A2", "A3", "A4"]), ("A4", [])):
            await expect_listing(
                stream, store, session, names, expected, rule, since_id=ident_of(names, cursor)
            )
        session, names = await populate(stream, store, "ABABA")
        await expect_listing(
            stream,
            store,
            session,
            names,
            ["A2", "A4"],
            f"the cursor is a position in the session's stream, applied before the task filter ({CURSOR})",
            since_id=ident_of(names, "B1"),
            task_id=f"{session}-task-A",
        )

    async def unknown_cursor(store: Any) -> None:
        session, names = await populate(stream, store, "AAA")
        await expect_listing(
            stream,
            store,
            session,
            names,
            ["A0", "A1", "A2"],
            f"an unknown since_id is treated as no cursor ({TASKS}, 'Notes'; spec 001)",
            since_id=unique("gone"),
        )

    async def task_filter(store: Any) -> None:
        session, names = await populate(stream, store, "ABABA")
        rule = f"task_id filters to that task's items, oldest first ({stream.spec})"
        await expect_listing(
            stream, store, session, names, ["A0", "A2", "A4"], rule, task_id=f"{session}-task-A"
        )
        await expect_listing(stream, store, session, names, ["B1", "B3"], rule, task_id=f"{session}-task-B")
        await expect_listing(stream, store, session, names, [], rule, task_id=f"{session}-task-Z")

    async def limit_most_recent(store: Any) -> None:
        session, names = await populate(stream, store, "ABABB")
        rule = f"{LIMIT}; filter before limiting ({TASKS}, 'Notes')"
        await expect_listing(stream, store, session, names, ["B3", "B4"], rule, limit=2)
        await expect_listing(stream, store, session, names, ["A0", "B1", "A2", "B3", "B4"], rule, limit=10)
        await expect_listing(
            stream, store, session, names, ["A0", "A2"], rule, task_id=f"{session}-task-A", limit=2
        )
        await expect_listing(
            stream, store, session, names, ["B3", "B4"], rule, since_id=ident_of(names, "A0"), limit=2
        )

    async def unknown_session(store: Any) -> None:
        rule = f"reads return an empty sequence for an unknown session ({stream.spec})"
        result = await survive(
            f"{stream.lister} of an unknown session", getattr(store, stream.lister)(unique("session")), rule
        )
        if list(expect_sequence(result, f"{stream.lister} of an unknown session", rule)):
            raise violation(f"{stream.lister} of an unknown session returned {show(result)}; {rule}")

    checks: list[tuple[str, str, Callable[[Any], Awaitable[None]]]] = [
        ("ascending", "returns items oldest first (insertion order)", ascending),
        ("idempotent", f"ignores a repeated {stream.id_field}", idempotent),
        (
            "since_id_exclusive",
            "treats since_id as an exclusive cursor (spec 000 test 11)",
            since_id_exclusive,
        ),
        ("unknown_cursor", "treats an unknown since_id as no cursor", unknown_cursor),
        ("task_filter", "filters by task_id", task_filter),
        (
            "limit_most_recent",
            "keeps the `limit` most recent matching items, oldest first",
            limit_most_recent,
        ),
    ]
    if stream.lister == "list_steering":
        checks.append(("unknown_session_empty", "returns [] for an unknown session", unknown_session))
    return [
        Contract(f"{stream.prefix}{suffix}", stream.capability, f"{stream.lister} {description}.", check)
        for suffix, description, check in checks
    ]


for _stream in STREAMS:
    for _contract in stream_checks(_stream):
        register(_contract)


@contract(
    "tasks.legacy_save_task_update",
    "tasks",
    "The legacy alias save_task_update stores like save_update (same idempotency key).",
    requires=("save_task_update",),
)
async def legacy_save_task_update(store: Any) -> None:
    session = unique("session")
    update = make_update(session, f"{session}-task", f"{session}-legacy", 0)
    await store.save_task_update(update)
    await store.save_update(update.model_copy(deep=True))
    found = [item.update_id for item in await store.list_updates(session)]
    if found != [update.update_id]:
        raise violation(
            f"after save_task_update and save_update of one update_id, list_updates returned "
            f"{len(found)} updates; the alias must store exactly like save_update ({ALIASES})"
        )


@contract(
    "tasks.legacy_list_task_updates",
    "tasks",
    "The legacy alias list_task_updates returns what list_updates returns, for every option.",
    requires=("list_task_updates",),
)
async def legacy_list_task_updates(store: Any) -> None:
    stream = STREAMS[0]
    session, names = await populate(stream, store, "ABABA")
    variants: list[dict[str, Any]] = [
        {},
        {"task_id": f"{session}-task-A"},
        {"since_id": ident_of(names, "A2")},
        {"limit": 2},
    ]
    for options in variants:
        current = [item.update_id for item in await store.list_updates(session, **options)]
        legacy = [item.update_id for item in await store.list_task_updates(session, **options)]
        if legacy != current:
            raise violation(
                f"list_task_updates({options}) returned {[names.get(i, i) for i in legacy]} but "
                f"list_updates returned {[names.get(i, i) for i in current]}; a legacy alias must behave "
                f"like its target ({ALIASES})"
            )
