"""Shared pieces of the session, memory and task-telemetry interop tests, and their "next process".

The tests run the real PenguiFlow ``StreamingSession`` / ``SessionManager`` and
``DefaultShortTermMemory`` against ``guard(PostgresStateStore)`` on the embedded PostgreSQL. What one
process persists must be what the next process hydrates, so :func:`run_worker` starts a separate
Python process (``python -m tests.interop._session_support MODE DSN SCHEMA ARGS...``) that opens a
fresh store and guard on the same schema and prints one JSON document on stdout:

* ``session SESSION_ID PAUSED_TASK_ID``: hydrate the session through ``SessionManager.get_or_create``,
  report its tasks, updates and steering events, resume the paused task (steering ``RESUME`` from this
  process) and run one new background task in the hydrated session.
* ``memory KEY``: hydrate a ``DefaultShortTermMemory`` from ``KEY``, report its state and LLM context,
  then add one turn and persist it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from penguiflow.planner.memory import (
    ConversationTurn,
    DefaultShortTermMemory,
    MemoryBudget,
    ShortTermMemoryConfig,
    TrajectoryDigest,
)
from penguiflow.sessions import (
    SessionManager,
    StreamingSession,
    TaskResult,
    TaskRuntime,
    TaskState,
    TaskType,
    UpdateType,
)
from penguiflow.steering import SteeringEvent, SteeringEventType
from prometheus_client import CollectorRegistry

from guarded import GuardedStore, controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.codec import penguiflow_types

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_TIMEOUT_SECONDS = 60.0
SMALL_POOL = PoolSettings(min_size=1, max_size=4, command_timeout=30.0)


# --- the guarded store ---------------------------------------------------------------------------


async def open_backend(dsn: str, schema: str) -> PostgresStateStore:
    """A PostgresStateStore that returns PenguiFlow's own classes (what sessions and memory expect)."""
    return await PostgresStateStore.connect(
        dsn,
        schema=schema,
        types=penguiflow_types(),
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=SMALL_POOL,
    )


@asynccontextmanager
async def guarded_store(
    dsn: str,
    schema: str,
    *,
    name: str = "interop",
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[PostgresStateStore]:
    """``guard(PostgresStateStore)`` on ``schema``; leaving flushes every batched write and closes."""
    backend = await open_backend(dsn, schema)
    store = guard(backend, name=name, registry=registry or CollectorRegistry())
    try:
        yield store
    finally:
        await controller(store).aclose()


@asynccontextmanager
async def bare_store(dsn: str, schema: str) -> AsyncIterator[PostgresStateStore]:
    """The backend alone (no guard) on ``schema``, closed on the way out."""
    store = await open_backend(dsn, schema)
    try:
        yield store
    finally:
        await store.close()


async def settle(store: object) -> None:
    """Let PenguiFlow's fire-and-forget writes (``asyncio.create_task(save_update(...))``) start, then
    hand the guard's write-behind batch (if ``store`` is guarded) to PostgreSQL."""
    for _ in range(3):
        await asyncio.sleep(0)
    if isinstance(store, GuardedStore):
        await controller(store).flush()


async def shut_down(store: object, *sessions: StreamingSession) -> None:
    """Close ``sessions`` the way a process should before it closes its store.

    ``StreamingSession.close()`` cancels running tasks without awaiting them, and their cancellation
    handlers still write (``save_task``, then a fire-and-forget ``save_update``): wait for the task
    handles (PenguiFlow names them ``task:<task_id>``), then flush, so those writes are not refused
    by a store that is already closed."""
    handles = [task for task in asyncio.all_tasks() if task.get_name().startswith("task:")]
    for session in sessions:
        await session.close()
    await asyncio.gather(*handles, return_exceptions=True)
    await settle(store)


# --- task pipelines ------------------------------------------------------------------------------


def answer(payload: Any) -> Callable[[TaskRuntime], Any]:
    """A pipeline that completes with ``payload``."""

    async def pipeline(runtime: TaskRuntime) -> TaskResult:
        runtime.emit_update(UpdateType.PROGRESS, {"stage": "thinking"}, step_index=0, total_steps=1)
        return TaskResult(payload=payload, digest=[f"answered {runtime.state.task_id}"])

    return pipeline


def failing(message: str) -> Callable[[TaskRuntime], Any]:
    """A pipeline that raises ``RuntimeError(message)``."""

    async def pipeline(runtime: TaskRuntime) -> TaskResult:
        raise RuntimeError(message)

    return pipeline


def blocked(started: asyncio.Event) -> Callable[[TaskRuntime], Any]:
    """A pipeline that sets ``started`` and then waits until it is cancelled."""

    async def pipeline(runtime: TaskRuntime) -> TaskResult:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return pipeline


def describe_task(task: TaskState) -> dict[str, Any]:
    """The persisted facts of a task, as JSON (for comparing two processes' views)."""
    return {
        "task_id": task.task_id,
        "session_id": task.session_id,
        "status": task.status.value,
        "task_type": task.task_type.value,
        "description": task.description,
        "result": task.result,
        "error": task.error,
        "priority": task.priority,
        "spawned_from_task_id": task.context_snapshot.spawned_from_task_id,
        "updated_at": task.updated_at.isoformat(),
    }


# --- short-term memory ---------------------------------------------------------------------------


def memory_config(**overrides: Any) -> ShortTermMemoryConfig:
    """Rolling summary, two turns in the full zone: turn three onwards is summarized."""
    options: dict[str, Any] = {
        "strategy": "rolling_summary",
        "budget": MemoryBudget(full_zone_turns=2, summary_max_tokens=500, total_max_tokens=5000),
        "retry_attempts": 1,
        "retry_backoff_base_s": 0.0,
        "degraded_retry_interval_s": 0.0,
    }
    options.update(overrides)
    return ShortTermMemoryConfig(**options)


async def joining_summarizer(request: Mapping[str, Any]) -> Mapping[str, Any]:
    """A deterministic summarizer: the previous summary plus the summarized users' messages."""
    users = ";".join(str(turn["user"]) for turn in request["turns"])
    previous = str(request["previous_summary"])
    return {"summary": f"{previous}|{users}" if previous else users}


def turn(index: int) -> ConversationTurn:
    """A turn with a trajectory digest and shown artifacts (every field ``to_dict`` persists)."""
    return ConversationTurn(
        user_message=f"question {index}",
        assistant_response=f"answer {index}",
        trajectory_digest=TrajectoryDigest(
            tools_invoked=["search", f"tool_{index}"],
            observations_summary=f"observed {index}",
            reasoning_summary=None if index % 2 else f"reasoned {index}",
            artifacts_refs=[f"artifact-{index}"],
        ),
        artifacts_shown={"chart": {"rows": index, "title": f"chart {index}"}},
        artifacts_hidden_refs=[f"hidden-{index}"],
        ts=1_700_000_000.0 + index,
    )


# --- the next process ----------------------------------------------------------------------------


async def run_worker(mode: str, dsn: str, schema: str, *args: str) -> dict[str, Any]:
    """Run this module as a separate process and return the JSON document it printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.interop._session_support",
        mode,
        dsn,
        schema,
        *args,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), WORKER_TIMEOUT_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"worker {mode} did not finish within {WORKER_TIMEOUT_SECONDS}s") from None
    if process.returncode != 0:
        raise AssertionError(f"worker {mode} exited {process.returncode}:\n{stderr.decode()[-4000:]}")
    result: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return result


async def hydrate_session(dsn: str, schema: str, session_id: str, paused_task_id: str) -> dict[str, Any]:
    async with guarded_store(dsn, schema, name="next-process") as store:
        manager = SessionManager(state_store=store)
        session = await manager.get_or_create(session_id)
        tasks = [describe_task(task) for task in await session.list_tasks()]
        updates = [
            {"update_id": update.update_id, "task_id": update.task_id, "type": update.update_type.value}
            for update in await session.list_updates(limit=10_000)
        ]
        steering = [
            {"event_id": event.event_id, "type": event.event_type.value, "payload": event.payload}
            for event in await store.list_steering(session_id, limit=10_000)
        ]
        resumed = await session.steer(
            SteeringEvent(
                session_id=session_id,
                task_id=paused_task_id,
                event_type=SteeringEventType.RESUME,
                payload={"reason": "resumed by the next process"},
                source="user",
            )
        )
        await session.run_task(
            answer("after restart"),
            task_type=TaskType.BACKGROUND,
            task_id="after-restart",
            description="spawned in the hydrated session",
        )
        await manager.drop(session_id)
        await settle(store)
        return {"tasks": tasks, "updates": updates, "steering": steering, "resumed": resumed}


async def hydrate_memory(dsn: str, schema: str, key: str) -> dict[str, Any]:
    async with guarded_store(dsn, schema, name="next-process") as store:
        memory = DefaultShortTermMemory(config=memory_config(), summarizer=joining_summarizer)
        await memory.hydrate(store, key)
        hydrated = {"state": memory.to_dict(), "context": dict(await memory.get_llm_context())}
        await memory.add_turn(turn(100))
        await memory.flush()
        await memory.persist(store, key)
        return hydrated


async def _main(mode: str, dsn: str, schema: str, args: list[str]) -> dict[str, Any]:
    if mode == "session":
        return await hydrate_session(dsn, schema, *args)
    if mode == "memory":
        return await hydrate_memory(dsn, schema, *args)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    worker_mode, worker_dsn, worker_schema, *worker_args = sys.argv[1:]
    print(json.dumps(asyncio.run(_main(worker_mode, worker_dsn, worker_schema, worker_args))))
