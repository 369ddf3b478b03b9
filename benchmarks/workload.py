"""One call of every StateStore protocol method, and a null store that answers them at no cost.

:data:`PROTOCOL_METHODS` is every method of :data:`guarded.protocol.CAPABILITIES` that is called
(``artifact_store`` is a property), so a method added to the protocol shows up in the bench, and
:func:`calls` fails loudly until it has arguments here.

:class:`NullStore` is the in-memory backend the guard's added cost is measured on: every method
returns a prepared answer (a non-empty one for reads, so the read path does its real work), and
its bulk form ``save_events`` costs exactly its items' single writes. A store whose bulk write is
cheaper than its single write (``InMemoryStateStore``) flatters the guard's write-behind, which
turns single writes into bulk ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
)
from guarded.models.tasks import UpdateType
from guarded.protocol import CAPABILITIES

PROTOCOL_METHODS: tuple[str, ...] = tuple(
    method for capability in CAPABILITIES for method in capability.methods if method != "artifact_store"
)
"""Every called method of the protocol, in the order capability reports list them."""

TRACE, SESSION, TASK = "bench-trace", "bench-session", "bench-task"
APPEND_TRACE = "bench-trace-appends"
"""Where the benchmarked ``save_planner_event`` appends: planner events are not deduplicated, so
appending to :data:`TRACE` would grow what ``list_planner_events`` reads during the run."""
CREATED = datetime(2025, 3, 1, 12, 30, 15, tzinfo=UTC)


async def reset_schemas(dsn: str, *schemas: str) -> None:
    """Drop ``schemas`` (with everything in them) over a connection of their own, so a benchmark
    starts from an empty database and leaves nothing behind."""
    conn = await asyncpg.connect(dsn)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def event(index: int = 0, trace_id: str = TRACE) -> StoredEvent:
    return StoredEvent(
        trace_id=trace_id,
        ts=1_740_000_000.0 + index * 0.001,
        kind="node_success",
        node_name="planner",
        node_id=f"node-{index % 7}",
        payload={"step": index, "ok": True, "latency_ms": 12.5},
    )


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
        metadata={"region": "eu"},
    )


def task() -> TaskState:
    return TaskState(
        task_id=TASK,
        session_id=SESSION,
        status=TaskStatus.RUNNING,
        task_type=TaskType.BACKGROUND,
        priority=2,
        context_snapshot=TaskContextSnapshot(session_id=SESSION, task_id=TASK, trace_id=TRACE),
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
    return PlannerEvent(event_type="step_complete", ts=1_740_000_001.5, trajectory_step=1, node_name="search")


MEMORY = {"summary": "the user asked for a report", "facts": {"team": "platform"}}
PAUSE = {"trajectory": {"query": "book a flight", "steps": []}, "reason": "await_input"}
TRAJECTORY = {"query": "summarise the incident", "steps": [{"thought": "look", "action": "search"}]}


@dataclass(frozen=True, slots=True)
class MethodCall:
    """The arguments one benchmarked call of ``method`` passes."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def seeds() -> list[MethodCall]:
    """Writes to make before timing, so that every read of :func:`calls` finds its rows."""
    return [
        *(call for call in calls().values() if call.method.startswith(("save_", "mark_"))),
        MethodCall("save_planner_event", (TRACE, planner_event())),
    ]


def calls() -> dict[str, MethodCall]:
    """One call of every :data:`PROTOCOL_METHODS` method, reads addressed to the rows the writes
    make (with :func:`seeds`); writes repeat one item, each idempotent except ``save_planner_event``."""
    bound = binding()
    table = [
        MethodCall("save_event", (event(),)),
        MethodCall("load_history", (TRACE,)),
        MethodCall("save_remote_binding", (bound,)),
        MethodCall("save_planner_state", ("pause-token", PAUSE)),
        MethodCall("load_planner_state", ("pause-token",)),
        MethodCall("save_memory_state", ("memory-key", MEMORY)),
        MethodCall("load_memory_state", ("memory-key",)),
        MethodCall("list_memory_keys", (SESSION,)),
        MethodCall("save_task", (task(),)),
        MethodCall("list_tasks", (SESSION,)),
        MethodCall("save_update", (update(),)),
        MethodCall("list_updates", (SESSION,), {"task_id": TASK, "limit": 50}),
        MethodCall("save_steering", (steering(),)),
        MethodCall("list_steering", (SESSION,), {"task_id": TASK, "limit": 50}),
        MethodCall("save_trajectory", (TRACE, SESSION, TRAJECTORY)),
        MethodCall("get_trajectory", (TRACE, SESSION)),
        MethodCall("list_traces", (SESSION,)),
        MethodCall("save_planner_event", (APPEND_TRACE, planner_event())),
        MethodCall("list_planner_events", (TRACE,)),
        MethodCall(
            "find_binding",
            (),
            {
                "router_session_id": bound.router_session_id,
                "agent_url": bound.agent_url,
                "remote_skill": bound.remote_skill,
                "tenant_id": bound.tenant_id,
                "user_id": bound.user_id,
            },
        ),
        MethodCall("list_bindings", (), {"router_session_id": bound.router_session_id}),
        MethodCall(
            "mark_binding_terminal", (), {"trace_id": TRACE, "context_id": "ctx-other", "task_id": "remote-9"}
        ),
        MethodCall("save_events", ([event(index) for index in range(10)],)),
    ]
    by_name = {call.method: call for call in table}
    missing = [method for method in PROTOCOL_METHODS if method not in by_name]
    if missing:
        raise LookupError(f"benchmarks.workload has no call for protocol methods {missing}")
    return {method: by_name[method] for method in PROTOCOL_METHODS}


class NullStore:
    """Every protocol method, answering at once from prepared values; no state is kept.

    Reads return what the matching write of :func:`calls` would have left (one item for lists),
    so a guard's read path (stale cache, memory health) handles a real answer.
    """

    def __init__(self) -> None:
        self._event = event()
        self._history = [self._event]
        self._binding = binding()
        self._task = task()
        self._update = update()
        self._steering = steering()
        self._planner_event = planner_event()

    async def save_event(self, event: StoredEvent) -> None:
        return None

    async def save_events(self, events: Sequence[StoredEvent]) -> None:
        """As costly as the single writes it stands for: one ``save_event`` per item."""
        for item in events:
            await self.save_event(item)

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        return self._history

    async def save_remote_binding(self, binding: RemoteBinding) -> None:
        return None

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        return None

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        return PAUSE

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        return None

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        return MEMORY

    async def list_memory_keys(self, session_id: str) -> list[str]:
        return [f"tenant:user:{session_id}"]

    async def save_task(self, state: TaskState) -> None:
        return None

    async def list_tasks(self, session_id: str) -> Sequence[TaskState]:
        return [self._task]

    async def save_update(self, update: StateUpdate) -> None:
        return None

    async def list_updates(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> Sequence[StateUpdate]:
        return [self._update]

    async def save_steering(self, event: SteeringEvent) -> None:
        return None

    async def list_steering(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> Sequence[SteeringEvent]:
        return [self._steering]

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Any) -> None:
        return None

    async def get_trajectory(self, trace_id: str, session_id: str) -> Any:
        return TRAJECTORY

    async def list_traces(self, session_id: str, limit: int = 50) -> list[str]:
        return [TRACE]

    async def save_planner_event(self, trace_id: str, event: PlannerEvent) -> None:
        return None

    async def list_planner_events(self, trace_id: str) -> list[PlannerEvent]:
        return [self._planner_event]

    async def find_binding(
        self,
        *,
        router_session_id: str,
        agent_url: str,
        remote_skill: str,
        tenant_id: str | None = None,
        user_id: str | None = None,
    ) -> RemoteBinding | None:
        return self._binding

    async def list_bindings(self, *, router_session_id: str) -> Sequence[RemoteBinding]:
        return [self._binding]

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        return None


__all__ = ["PROTOCOL_METHODS", "MethodCall", "NullStore", "calls", "event", "seeds"]
