"""What ``guard(PostgresStateStore)`` returns is PenguiFlow's own types.

With ``types=guarded.codec.penguiflow_types()`` every load of the store, through the guard,
returns PenguiFlow's classes (dataclasses, pydantic models and enums of ``penguiflow.state``,
``penguiflow.planner`` and ``penguiflow.artifacts``), equal to what PenguiFlow saved, and
PenguiFlow's own code that consumes them (the ``penguiflow.state.adapters`` helpers,
``TaskStateModel.from_state``, ``StreamingSession.hydrate``, ``penguiflow-admin``'s rendering)
accepts them. Spec 000 "Data Types"; spec README: PenguiFlow 3.11 wins where the two differ.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from penguiflow.admin import render_events
from penguiflow.artifacts import ArtifactRef, ArtifactScope
from penguiflow.planner import PlannerEvent, Trajectory
from penguiflow.sessions.session import StreamingSession
from penguiflow.state import adapters
from penguiflow.state.models import (
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStateModel,
    TaskStatus,
    TaskType,
    UpdateType,
)
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.codec import penguiflow_types
from guarded.extension import Kind
from guarded.testing.faulty import Fault, FaultPlan, FaultyStore
from tests.postgres.conftest import StoreFactory

from .support import guarded_postgres

pytestmark = pytest.mark.asyncio

TRACE, SESSION, TASK = "trace-1", "session-1", "task-1"
CREATED = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


def event() -> StoredEvent:
    payload = {
        "event": "node_success",
        "latency_ms": 12.5,
        "attempt": 0,
        "nested": {"rows": [1, "two", None]},
    }
    return StoredEvent(TRACE, 1_740_000_000.125, "node_success", "search", "search-1", payload)


def binding() -> RemoteBinding:
    return RemoteBinding(
        trace_id=TRACE,
        context_id="ctx-1",
        task_id="remote-1",
        agent_url="https://agents.example/search",
        router_session_id="router-1",
        remote_skill="search",
        tenant_id="acme",
        user_id="alice",
        last_remote_task_id="remote-0",
        metadata={"region": "eu"},
    )


def task(status: TaskStatus = TaskStatus.RUNNING) -> TaskState:
    snapshot = TaskContextSnapshot(
        session_id=SESSION,
        task_id=TASK,
        trace_id=TRACE,
        spawned_at=CREATED,
        spawn_reason="research in the background",
        query="quarterly revenue",
        context_version=3,
        llm_context={"tone": "brief"},
        tool_context={"tenant_id": "acme"},
        artifacts=[{"id": "art_1"}],
    )
    return TaskState(
        task_id=TASK,
        session_id=SESSION,
        status=status,
        task_type=TaskType.BACKGROUND,
        priority=2,
        context_snapshot=snapshot,
        trace_id=TRACE,
        progress={"pct": 40},
        created_at=CREATED,
        updated_at=CREATED,
    )


def update() -> StateUpdate:
    return StateUpdate(
        session_id=SESSION,
        task_id=TASK,
        trace_id=TRACE,
        update_id="update-1",
        update_type=UpdateType.PROGRESS,
        content={"pct": 40, "note": "half way"},
        step_index=1,
        total_steps=3,
        created_at=CREATED,
    )


def steering() -> SteeringEvent:
    return SteeringEvent(
        session_id=SESSION,
        task_id=TASK,
        event_id="steering-1",
        event_type=SteeringEventType.USER_MESSAGE,
        payload={"text": "focus on Europe"},
        trace_id=TRACE,
        created_at=CREATED,
    )


def planner_event() -> PlannerEvent:
    return PlannerEvent(
        event_type="step_complete",
        ts=1_740_000_001.5,
        trajectory_step=1,
        thought="searching",
        node_name="search",
        latency_ms=120.25,
        token_estimate=42,
        extra={"tool": "search"},
    )


def trajectory() -> Trajectory:
    return Trajectory(
        query="quarterly revenue",
        llm_context={"tone": "brief"},
        tool_context={"tenant_id": "acme"},
        metadata={"run": 7},
        hint_state={"seen": ["search"]},
    )


class Loads:
    """Calls the store's read methods, remembering which were exercised."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.called: set[str] = set()

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.called.add(method)
        return await getattr(self._store, method)(*args, **kwargs)


def read_methods(proxy: Any) -> set[str]:
    control = controller(proxy)
    return {
        name for name in control.guarded_methods() if control.policy(name).kind in (Kind.READ, Kind.CONSUME)
    }


async def test_every_load_returns_penguiflows_own_classes(make_store: StoreFactory) -> None:
    async with guarded_postgres(make_store) as store:
        memory = {"health": "healthy", "turns": [{"user": "hi", "assistant": "hello"}], "summary": ""}
        pause = {"trajectory": trajectory().serialise(), "reason": "await_input", "payload": {"q": 1}}
        await store.save_event(event())
        await store.save_remote_binding(binding())
        await store.save_task(task())
        await store.save_update(update())
        await store.save_steering(steering())
        await store.save_planner_event(TRACE, planner_event())
        await store.save_trajectory(TRACE, SESSION, trajectory())
        await store.save_memory_state("acme:alice:session-1", memory)
        await store.save_planner_state("pause-token", pause)

        load = Loads(store)
        history = await load("load_history", TRACE)
        assert history == [event()]
        assert type(history[0]) is StoredEvent

        found = await load(
            "find_binding",
            router_session_id="router-1",
            agent_url="https://agents.example/search",
            remote_skill="search",
            tenant_id="acme",
            user_id="alice",
        )
        assert type(found) is RemoteBinding
        assert found == binding()
        assert await load("list_bindings", router_session_id="router-1") == [binding()]

        (loaded_task,) = await load("list_tasks", SESSION)
        assert type(loaded_task) is TaskState
        assert loaded_task == task()
        assert type(loaded_task.status) is TaskStatus
        assert type(loaded_task.task_type) is TaskType
        assert type(loaded_task.context_snapshot) is TaskContextSnapshot
        assert loaded_task.created_at == CREATED
        assert loaded_task.created_at.tzinfo is not None

        for method in ("list_updates", "list_task_updates"):
            (loaded_update,) = await load(method, SESSION, task_id=TASK)
            assert type(loaded_update) is StateUpdate
            assert type(loaded_update.update_type) is UpdateType
            assert loaded_update == update()

        (loaded_steering,) = await load("list_steering", SESSION)
        assert type(loaded_steering) is SteeringEvent
        assert type(loaded_steering.event_type) is SteeringEventType
        assert loaded_steering == steering()

        for method in ("list_planner_events", "get_events"):
            loaded_events = await load(method, TRACE)
            assert [type(item) for item in loaded_events] == [PlannerEvent]
            assert loaded_events == [planner_event()]

        loaded_trajectory = await load("get_trajectory", TRACE, SESSION)
        assert type(loaded_trajectory) is Trajectory
        assert loaded_trajectory.serialise() == trajectory().serialise()
        assert await load("list_traces", SESSION) == [TRACE]

        assert await load("load_memory_state", "acme:alice:session-1") == memory
        assert await load("list_memory_keys", "session-1") == ["acme:alice:session-1"]
        assert await load("load_planner_state", "pause-token") == pause
        assert await load("load_planner_state", "pause-token") is None  # consumed once

        assert load.called == read_methods(store)

        artifacts = store.artifact_store
        scope = ArtifactScope(tenant_id="acme", session_id=SESSION)
        ref = await artifacts.put_bytes(b"\x00chart", mime_type="image/png", namespace="plot", scope=scope)
        assert type(ref) is ArtifactRef
        assert type(ref.scope) is ArtifactScope
        text_ref = await artifacts.put_text("notes", scope=scope)
        assert type(text_ref) is ArtifactRef

        artifact_load = Loads(artifacts)
        loaded_ref = await artifact_load("get_ref", ref.id)
        assert type(loaded_ref) is ArtifactRef
        assert type(loaded_ref.scope) is ArtifactScope
        assert loaded_ref == ref
        listed = await artifact_load("list", scope=ArtifactScope(session_id=SESSION))
        assert {type(item) for item in listed} == {ArtifactRef}
        assert sorted(item.id for item in listed) == sorted([ref.id, text_ref.id])
        assert await artifact_load("get", ref.id) == b"\x00chart"
        assert await artifact_load("exists", ref.id) is True
        assert artifact_load.called == read_methods(artifacts)


async def test_penguiflows_own_code_accepts_what_the_store_returns(make_store: StoreFactory) -> None:
    async with guarded_postgres(make_store) as store:
        await adapters.save_task_compat(store, task(TaskStatus.PENDING))
        await adapters.save_task_compat(store, task())  # newer state of the same task
        await adapters.save_update_compat(store, update())
        await adapters.save_steering_compat(store, steering())
        await adapters.save_planner_event_compat(store, TRACE, planner_event())
        await store.save_event(event())

        tasks = await adapters.list_tasks_compat(store, SESSION)
        assert [TaskStateModel.from_state(item) for item in tasks] == [TaskStateModel.from_state(task())]
        assert await adapters.list_updates_compat(store, SESSION, task_id=TASK) == [update()]
        (loaded_steering,) = await adapters.list_steering_compat(store, SESSION)
        assert loaded_steering.to_injection() == steering().to_injection()
        assert await adapters.list_planner_events_compat(store, TRACE) == [planner_event()]
        assert render_events(await store.load_history(TRACE)) == render_events([event()])

        session = StreamingSession(SESSION, state_store=store)
        await session.hydrate()
        (hydrated,) = await session.list_tasks()
        assert TaskStateModel.from_state(hydrated).status is TaskStatus.RUNNING


async def test_writes_held_in_the_dead_letter_buffer_read_back_as_penguiflows_classes(
    make_store: StoreFactory,
) -> None:
    """While PostgreSQL refuses writes, reads add the writes the guard holds (read-your-writes);
    those must be PenguiFlow's classes too, or ``TaskStateModel.from_state`` rejects them."""
    backend = await make_store(types=penguiflow_types())
    writes_down = FaultPlan.always(
        Fault.error_before(ConnectionRefusedError), methods={"save_task", "save_update", "save_updates"}
    )
    async with guard(
        FaultyStore(backend, writes_down),
        registry=CollectorRegistry(),
        dead_letter={"drain_timeout": 0},  # closed without trying the refusing store again
    ) as store:
        await store.save_task(task())
        await store.save_update(update())
        await controller(store).flush()
        assert controller(store).stats()[("save_task", "dead_lettered")] == 1

        (held_task,) = await store.list_tasks(SESSION)
        (held_update,) = await store.list_updates(SESSION)
        assert type(held_update) is StateUpdate
        assert type(held_task) is TaskState
        assert TaskStateModel.from_state(held_task) == TaskStateModel.from_state(task())
