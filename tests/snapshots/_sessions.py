"""Random PenguiFlow-shaped sessions written into a store, and everything a store answers about one."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from penguiflow.artifacts import ArtifactScope
from penguiflow.planner import PlannerEvent, Trajectory
from penguiflow.state.models import (
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)

from guarded.codec import encode, encode_trajectory

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
TENANT, USER = "acme", "u1"


def memory_key(session_id: str) -> str:
    return f"{TENANT}:{USER}:{session_id}"


def _payload(rng: random.Random) -> dict[str, Any]:
    return {
        "n": rng.randint(-5, 10**12),
        "text": rng.choice(["héllo", "a\x00b", "🐧", ""]),
        "f": rng.random(),
    }


async def populate(store: Any, rng: random.Random, session_id: str, *, events: int = 40) -> list[str]:
    """Write a random session; returns its trace ids (the pseudo-trace included)."""
    traces = [f"{session_id}-t{index}" for index in range(rng.randint(1, 3))]
    all_traces = [*traces, f"session:{session_id}"]
    for _ in range(events):
        trace = rng.choice(all_traces)
        event = StoredEvent(
            trace, float(rng.randint(0, events)), rng.choice(["a", "b"]), "node", None, _payload(rng)
        )
        await store.save_event(event)
        if rng.random() < 0.1:
            await store.save_event(event)  # a retried event
    for trace in traces:
        for step in range(rng.randint(0, 4)):
            chunk = PlannerEvent(event_type="stream_chunk", ts=1.0, trajectory_step=step, extra={"c": "x"})
            await store.save_planner_event(trace, chunk)
            if rng.random() < 0.3:
                await store.save_planner_event(trace, chunk)  # identical chunks are legitimate
        if rng.random() < 0.8:
            await store.save_trajectory(
                trace, session_id, Trajectory(query="q", metadata={"n": rng.randint(0, 9)})
            )
    tasks = [f"{session_id}-k{index}" for index in range(rng.randint(1, 3))]
    for index, task_id in enumerate(tasks):
        context = TaskContextSnapshot(session_id=session_id, task_id=task_id, trace_id=rng.choice(traces))
        state = TaskState(
            task_id=task_id,
            session_id=session_id,
            status=rng.choice(list(TaskStatus)),
            task_type=rng.choice(list(TaskType)),
            priority=index,
            context_snapshot=context,
            trace_id=rng.choice(traces),
            result={"r": index},
            progress={"p": index} if index else None,
            created_at=EPOCH,
            updated_at=EPOCH + dt.timedelta(seconds=index),
        )
        await store.save_task(state)
    for index in range(rng.randint(0, 15)):
        update = StateUpdate(
            session_id=session_id,
            task_id=rng.choice(tasks),
            trace_id=rng.choice(traces),
            update_id=f"{session_id}-u{index}",
            update_type=rng.choice(list(UpdateType)),
            content={"i": index},
            created_at=EPOCH,
        )
        await store.save_update(update)
    for index in range(rng.randint(0, 5)):
        steering = SteeringEvent(
            session_id=session_id,
            task_id=rng.choice(tasks),
            event_id=f"{session_id}-e{index}",
            event_type=rng.choice(list(SteeringEventType)),
            payload={"text": "go"},
            created_at=EPOCH,
        )
        await store.save_steering(steering)
    for index, trace in enumerate(traces):
        binding = RemoteBinding(
            trace, f"ctx{index}", f"remote{index}", "http://agent", session_id, "skill", TENANT, USER
        )
        await store.save_remote_binding(binding)
    await store.save_memory_state(memory_key(session_id), {"turns": [rng.randint(0, 9)], "health": "healthy"})
    await store.save_memory_state(f"custom:{session_id}", {"x": 1})
    scope = ArtifactScope(tenant_id=TENANT, user_id=USER, session_id=session_id, trace_id=traces[0])
    for index in range(rng.randint(1, 3)):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 3000)))
        await store.artifact_store.put_bytes(
            data, mime_type="application/x", filename=f"f{index}", scope=scope
        )
    await store.save_planner_state(f"{session_id}-pause", {"resume": "here"})
    return all_traces


async def observe(store: Any, session_id: str, traces: list[str]) -> dict[str, Any]:
    """Every read method's answer about the session, as JSON (pauses are not read: that consumes)."""
    seen: dict[str, Any] = {
        "tasks": [encode(t) for t in await store.list_tasks(session_id)],
        "updates": [encode(u) for u in await store.list_updates(session_id, limit=0)],
        "updates_default": [encode(u) for u in await store.list_updates(session_id)],
        "steering": [encode(e) for e in await store.list_steering(session_id, limit=0)],
        "traces": await store.list_traces(session_id),
        "bindings": [encode(b) for b in await store.list_bindings(router_session_id=session_id)],
        "found": encode(b)
        if (
            b := await store.find_binding(
                router_session_id=session_id,
                agent_url="http://agent",
                remote_skill="skill",
                tenant_id=TENANT,
                user_id=USER,
            )
        )
        else None,
        "memory": [
            await store.load_memory_state(k) for k in (memory_key(session_id), f"custom:{session_id}")
        ],
    }
    for trace in traces:
        trajectory = await store.get_trajectory(trace, session_id)
        seen[f"trace {trace}"] = {
            "history": [encode(e) for e in await store.load_history(trace)],
            "planner": [encode(e) for e in await store.list_planner_events(trace)],
            "trajectory": encode_trajectory(trajectory) if trajectory is not None else None,
        }
    refs = await store.artifact_store.list(scope=ArtifactScope(session_id=session_id))
    seen["artifacts"] = [(encode(ref), await store.artifact_store.get(ref.id)) for ref in refs]
    return seen
