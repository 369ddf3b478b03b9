"""The demo's workload: concurrent agent sessions that use a store the way PenguiFlow does.

Each session loops until the run ends. One iteration is one planner step of one trace:

* resume the pause the previous step saved (``load_planner_state``: consume once; a resume that
  finds nothing is tried again at the next steps, like a user clicking "resume" again), hydrate
  short-term memory (``load_memory_state``);
* runtime events ``node_start`` / ``node_success`` (``save_event``), a task revision
  (``save_task``; every fifth step completes or fails the task, with task telemetry), a progress
  update (``save_update``), a planner event (``save_planner_event``), the trajectory
  (``save_trajectory``), the memory state in the shape of spec 003 with its ``health``
  (healthy / retry / degraded / recovering);
* now and then a steering message (``save_steering``), a pause for human input or OAuth
  (``save_planner_state``), an artifact (``artifact_store.put_text``) and the reads a UI makes
  (``list_tasks``, ``load_history``, ``list_updates``, ``get_trajectory``).

Every acknowledged write is recorded in the :class:`~guarded.demo.ledger.Ledger`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from guarded.models import (
    ArtifactScope,
    MemoryHealth,
    PlannerEvent,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskTelemetryEvent,
    TaskTelemetrySink,
    TaskType,
    UpdateType,
)

from .calls import ESCAPED, attempt, json_form
from .ledger import Ledger, WriteKind
from .readback import task_summary

TASK_STEPS = 5
"""Steps (iterations) of one task: it is created, updated and completed (or failed) over these."""
RESUME_TRIES = 3
"""Resumes of one pause before the session gives up on it (it stays in the database)."""
FULL_ZONE_TURNS = 6
"""Turns kept verbatim in the memory state; older ones are folded into the summary."""


@dataclass
class WorkloadSettings:
    """How hard the sessions push: think time between steps and how often the optional calls come."""

    think: tuple[float, float] = (0.05, 0.15)
    """Seconds a session waits between steps (uniform range)."""
    pause_every: int = 3
    steering_every: int = 4
    artifact_every: int = 6
    failure_rate: float = 0.1
    """Share of tasks that end ``FAILED``."""


def memory_key(index: int, session_id: str) -> str:
    """The spec 003 composite memory key ``tenant:user:session``."""
    return f"demo:user-{index}:{session_id}"


@dataclass
class _Memory:
    """A session's short-term memory, evolving like ReactPlanner's (spec 003)."""

    turns: list[dict[str, str]] = field(default_factory=list)
    summary: str | None = None
    health: MemoryHealth = MemoryHealth.HEALTHY
    degraded_steps: int = 0

    def step(self, number: int, rng: random.Random) -> dict[str, Any]:
        self.turns += [
            {"role": "user", "content": f"question {number}"},
            {"role": "assistant", "content": f"answer {number}"},
        ]
        backlog = self.turns[:-FULL_ZONE_TURNS]
        self.turns = self.turns[-FULL_ZONE_TURNS:]
        self._next_health(rng)
        if backlog and self.health is MemoryHealth.HEALTHY:
            self.summary = f"summary up to step {number}"
            backlog = []
        return {
            "turns": list(self.turns),
            "summary": self.summary,
            "pending": self.turns[-2:],
            "backlog": backlog,
            "health": self.health.value,
            "config_snapshot": {"strategy": "rolling_summary", "full_zone_turns": FULL_ZONE_TURNS},
        }

    def _next_health(self, rng: random.Random) -> None:
        if self.health is MemoryHealth.HEALTHY:
            if rng.random() < 0.05:
                self.health = MemoryHealth.RETRY
        elif self.health is MemoryHealth.RETRY:
            self.health = MemoryHealth.DEGRADED if rng.random() < 0.5 else MemoryHealth.HEALTHY
        elif self.health is MemoryHealth.DEGRADED:
            self.degraded_steps += 1
            if self.degraded_steps >= 3:
                self.health, self.degraded_steps = MemoryHealth.RECOVERING, 0
        else:
            self.health = MemoryHealth.HEALTHY


class Session:
    """One agent session: a sequence of planner steps against the guarded store."""

    def __init__(
        self,
        index: int,
        store: Any,
        ledger: Ledger,
        *,
        seed: int,
        settings: WorkloadSettings,
        telemetry: TaskTelemetrySink | None = None,
    ) -> None:
        self.index = index
        self.id = f"session-{index}"
        self.store = store
        self.ledger = ledger
        self.rng = random.Random(seed * 1_000_003 + index)
        self.settings = settings
        self.telemetry = telemetry
        self.memory = _Memory()
        self.memory_key = memory_key(index, self.id)
        self.pending_pause: str | None = None
        self.resume_tries = 0
        self.started = datetime.now(UTC)
        self.task_started = 0.0
        self.steps = 0

    async def run(self, deadline: float) -> None:
        """Make steps until the event loop's clock passes ``deadline``."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            await self.step(self.steps)
            self.steps += 1
            await asyncio.sleep(self.rng.uniform(*self.settings.think))

    async def _call(self, call: Any) -> Any:
        return await attempt(self.ledger, call)

    async def _read(self, method: str, call: Any) -> Any:
        self.ledger.reads[method] += 1
        return await self._call(call)

    async def step(self, number: int) -> None:
        """One planner step (see the module docstring)."""
        store, ledger, settings = self.store, self.ledger, self.settings
        trace = f"{self.id}-t{number}"
        if self.pending_pause is not None:
            await self._resume(self.pending_pause)
        await self._read("load_memory_state", store.load_memory_state(self.memory_key))

        await self._event(trace, "node_start", {"session": self.id, "step": number})
        task_id = f"{self.id}-task-{number // TASK_STEPS}"
        await self._task(task_id, trace, number)
        update = StateUpdate(
            session_id=self.id,
            task_id=task_id,
            trace_id=trace,
            update_id=f"{self.id}-u{number}",
            update_type=UpdateType.PROGRESS,
            content={"step": number % TASK_STEPS + 1, "of": TASK_STEPS},
        )
        if await self._call(store.save_update(update)) is not ESCAPED:
            ledger.append(WriteKind.UPDATE, (self.id, update.update_id), json_form(update.content))
        planner_event = PlannerEvent(
            "step_complete",
            time.time(),
            number,
            node_name="planner",
            latency_ms=round(self.rng.uniform(20, 900), 1),
            extra={"session": self.id, "step": number},
        )
        if await self._call(store.save_planner_event(trace, planner_event)) is not ESCAPED:
            key = (trace, planner_event.event_type, planner_event.ts)
            ledger.append(WriteKind.PLANNER_EVENT, key, json_form(planner_event.extra))
        trajectory = {
            "query": f"question {number}",
            "steps": [{"thought": f"think about {number}", "action": "search", "observation": "found"}],
        }
        if await self._call(store.save_trajectory(trace, self.id, trajectory)) is not ESCAPED:
            ledger.upsert(WriteKind.TRAJECTORY, trace, (self.id, json_form(trajectory)))
        state = self.memory.step(number, self.rng)
        if await self._call(store.save_memory_state(self.memory_key, state)) is not ESCAPED:
            ledger.upsert(WriteKind.MEMORY, self.memory_key, json_form(state))
        if number % settings.steering_every == settings.steering_every - 1:
            await self._steering(task_id, trace, number)
        if number % settings.artifact_every == 0:
            await self._artifact(trace, number)
        await self._event(trace, "node_success", {"session": self.id, "step": number, "ok": True})
        if self.pending_pause is None and number % settings.pause_every == settings.pause_every - 1:
            await self._pause(trace, number)
        await self._reads(trace, number)

    async def _event(self, trace: str, kind: str, payload: dict[str, Any]) -> None:
        event = StoredEvent(trace, time.time(), kind, "planner", f"planner-{self.index}", payload)
        if await self._call(self.store.save_event(event)) is not ESCAPED:
            self.ledger.event((trace, kind, event.node_id, event.ts), json_form(payload))

    async def _task(self, task_id: str, trace: str, number: int) -> None:
        step = number % TASK_STEPS
        if step == 0:
            self.task_started = time.monotonic()
        last = step == TASK_STEPS - 1
        failed = last and self.rng.random() < self.settings.failure_rate
        status = TaskStatus.FAILED if failed else TaskStatus.COMPLETE if last else TaskStatus.RUNNING
        task_type = TaskType.BACKGROUND if self.index % 2 else TaskType.FOREGROUND
        state = TaskState(
            task_id=task_id,
            session_id=self.id,
            status=status,
            task_type=task_type,
            priority=self.index % 3,
            context_snapshot=TaskContextSnapshot(session_id=self.id, task_id=task_id, trace_id=trace),
            trace_id=trace,
            description=f"research step group {number // TASK_STEPS}",
            progress={"rev": number, "step": step + 1, "of": TASK_STEPS},
            error="tool timed out" if failed else None,
            created_at=self.started,
            updated_at=self.started + timedelta(milliseconds=number),
        )
        if await self._call(self.store.save_task(state)) is not ESCAPED:
            self.ledger.upsert(WriteKind.TASK, task_id, task_summary(status.value, state.progress))
            self.ledger.task_sessions[task_id] = self.id
        if step == 0:
            await self._telemetry(state, "task_spawned", "spawned", None)
        elif last:
            duration_ms = (time.monotonic() - self.task_started) * 1000
            if failed:
                await self._telemetry(state, "task_failed", "failed", duration_ms)
            else:
                await self._telemetry(state, "task_completed", "completed", duration_ms)

    async def _telemetry(
        self, state: TaskState, event_type: Any, outcome: Any, duration: float | None
    ) -> None:
        if self.telemetry is None:
            return
        event = TaskTelemetryEvent(
            event_type=event_type,
            outcome=outcome,
            session_id=state.session_id,
            task_id=state.task_id,
            trace_id=state.trace_id,
            task_type=state.task_type,
            status=state.status,
            mode="foreground" if state.task_type is TaskType.FOREGROUND else "job",
            duration_ms=duration,
        )
        await attempt(self.ledger, self.telemetry.emit(event))

    async def _steering(self, task_id: str, trace: str, number: int) -> None:
        event = SteeringEvent(
            session_id=self.id,
            task_id=task_id,
            event_id=f"{self.id}-e{number}",
            event_type=SteeringEventType.USER_MESSAGE,
            payload={"text": f"please also check source {number}"},
            trace_id=trace,
        )
        if await self._call(self.store.save_steering(event)) is not ESCAPED:
            self.ledger.append(WriteKind.STEERING, (self.id, event.event_id), json_form(event.payload))

    async def _artifact(self, trace: str, number: int) -> None:
        artifacts = getattr(self.store, "artifact_store", None)
        if artifacts is None:
            return
        text = f"# report {self.id} step {number}\n" + "finding. " * self.rng.randint(10, 400)
        scope = ArtifactScope(tenant_id="demo", session_id=self.id, trace_id=trace)
        ref = await self._call(
            artifacts.put_text(text, mime_type="text/markdown", namespace="demo", scope=scope)
        )
        if ref is not ESCAPED and ref is not None:
            self.ledger.artifacts[ref.id] = ref.sha256

    async def _pause(self, trace: str, number: int) -> None:
        token = f"{self.id}-pause-{number}"
        reason = "await_input" if number % 2 else "oauth"
        payload = {"trace_id": trace, "reason": reason, "step": number, "constraints": {"max_iters": 8}}
        if await self._call(self.store.save_planner_state(token, payload)) is not ESCAPED:
            self.ledger.pauses[token] = json_form(payload)
            self.pending_pause = token

    async def _resume(self, token: str) -> None:
        """Resume a pause (consume once); a resume that finds nothing is tried again at the next
        steps, as a user clicks "resume" again, up to :data:`RESUME_TRIES` times."""
        resumed = await self._read("load_planner_state", self.store.load_planner_state(token))
        self.resume_tries += 1
        if resumed is not ESCAPED and resumed is not None:
            self.ledger.resumed[token] = resumed
        elif self.resume_tries < RESUME_TRIES:
            self.ledger.resume_retries += 1
            return
        self.pending_pause, self.resume_tries = None, 0

    async def _reads(self, trace: str, number: int) -> None:
        store = self.store
        if number % 4 == 1:
            await self._read("list_tasks", store.list_tasks(self.id))
        if number % 5 == 2:
            await self._read("load_history", store.load_history(trace))
            await self._read("list_updates", store.list_updates(self.id))
        if number % 7 == 3:
            await self._read("get_trajectory", store.get_trajectory(trace, self.id))


__all__ = ["FULL_ZONE_TURNS", "RESUME_TRIES", "TASK_STEPS", "Session", "WorkloadSettings", "memory_key"]
