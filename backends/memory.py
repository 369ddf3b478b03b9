"""The reference in-memory StateStore: every method of the protocol, compatible with PenguiFlow 3.11.

Every record is stored *encoded* with :mod:`guarded.codec` (as JSON text) and decoded on read.
So a caller's later mutation never reaches the store, every read returns fresh objects, and the
store refuses exactly what a durable backend would: a value JSON cannot carry (NaN, a lone
surrogate, an arbitrary object, a missing id) raises :class:`~guarded.errors.InvalidPayloadError`
naming the method and the path of the value, before anything is stored.

Logs are bounded per trace or session (PenguiFlow's defaults; ``<= 0`` means unbounded). When a
bound is hit the oldest records are dropped and counted in :attr:`InMemoryStateStore.dropped`,
and the first drop of each kind is logged: dropping is never silent.

Bulk forms (``save_events`` and the upserts ``save_memory_states``, ``save_tasks``,
``save_trajectories``, ``save_remote_bindings``, ``mark_bindings_terminal``,
``save_planner_states``) take one list -- each item the single method's argument, or the tuple of
its parameters in signature order -- and do exactly what the single method called once per item
in list order does, except that every item is validated first: one bad item raises the single
method's error (its path prefixed by ``items[3]``, ``states[3]``, ...) and nothing is stored.

Memory states, trajectories, remote bindings and pauses are last-write-wins by logical time
(:mod:`guarded.backend`), like the PostgreSQL backend: a direct write is always applied (the
key's time only grows), a replay older than the write that set the key leaves it alone and raises
:class:`~guarded.errors.WriteSupersededError` once the rest of the call is applied. Without a guard
every call is a direct write, so plain calls behave exactly as PenguiFlow's reference store (the
last call wins).
A consumed pause leaves a tombstone with the consume's logical time, kept until the pause TTL
after the consume: only a strictly newer replayed save makes the token consumable again, and a save
lives for the TTL after its call (a replay of one that would have expired stores nothing), as in
the PostgreSQL backend.

Safe for concurrent use on one event loop: encoding happens before the lock is taken, and no
critical section awaits. Not thread-safe.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

from guarded.backend import (
    LOGICAL_TIMES,
    InMemoryArtifactStore,
    current_logical_times,
    next_logical_time,
    sanitize_steering_event,
)
from guarded.backends.memory_logs import DROP_KINDS, BoundedLogs, Record, page
from guarded.backends.memory_records import (
    BindingKey,
    bulk_calls,
    checked,
    dumps,
    encode_event,
    event_fingerprint,
    object_text,
    text_of,
    ts_of,
)
from guarded.backends.memory_tables import (
    BindingTable,
    LatestWrites,
    Pause,
    PauseTable,
    TaskTable,
    TrajectoryTable,
)
from guarded.codec import (
    DEFAULT_TYPES,
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    JSONObject,
    RecordCodec,
    RecordTypes,
    decode_trajectory,
    encode_trajectory,
    to_json_object,
)
from guarded.errors import WriteSupersededError
from guarded.models import (
    ArtifactRetentionConfig,
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    StoredEvent,
    TaskState,
    Trajectory,
)


class InMemoryStateStore:
    """Complete in-memory StateStore for development, tests and the guard's own test suite.

    Args:
        max_events_per_trace: audit-log bound per trace.
        max_updates_per_session: task-update bound per session.
        max_steering_events_per_session: steering bound per session.
        max_planner_events_per_trace: planner-event bound per trace.
        artifact_retention: limits of :attr:`artifact_store`.
        planner_state_ttl_seconds: pause expiry (spec 000 recommends 1 hour); ``None`` never
            expires, like PenguiFlow's in-memory store.
        clock: time source for pause and artifact expiry.
        record_types: the classes reads return; :func:`guarded.codec.penguiflow_types` gives
            PenguiFlow's own.
    """

    durable_across_processes = False
    """It keeps nothing across processes: a guard gives it no spill file and adopts nothing for it
    (see :mod:`guarded.store_identity`)."""

    def __init__(
        self,
        *,
        max_events_per_trace: int = 50_000,
        max_updates_per_session: int = 10_000,
        max_steering_events_per_session: int = 10_000,
        max_planner_events_per_trace: int = 50_000,
        artifact_retention: ArtifactRetentionConfig | None = None,
        planner_state_ttl_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
        record_types: RecordTypes = DEFAULT_TYPES,
    ) -> None:
        self._clock = clock
        self._types = record_types
        self._lock = asyncio.Lock()
        self._seq = 0
        self._logs = BoundedLogs(
            {
                "events": max_events_per_trace,
                "updates": max_updates_per_session,
                "steering": max_steering_events_per_session,
                "planner_events": max_planner_events_per_trace,
            }
        )
        self._written = LatestWrites()
        self._bindings = BindingTable(self._written)
        self._pauses = PauseTable(self._written, planner_state_ttl_seconds, clock)
        self._memory_state: dict[str, str] = {}
        self._tasks = TaskTable()
        self._trajectories = TrajectoryTable(self._written)
        self._artifact_store = InMemoryArtifactStore(artifact_retention, clock=clock)

    @property
    def _planner_state(self) -> dict[str, Pause]:
        """The saved pauses by token (for tests: reading them does not consume them)."""
        return self._pauses.saved

    @property
    def dropped(self) -> Mapping[str, int]:
        """Read-only live counts of records dropped by the bounds, by kind (:data:`DROP_KINDS`)."""
        return self._logs.dropped

    @property
    def types(self) -> RecordTypes:
        """The classes reads return (``record_types``)."""
        return self._types

    @property
    def artifact_store(self) -> InMemoryArtifactStore:
        """The artifact store (spec 000 "StateStore Integration")."""
        return self._artifact_store

    # --- core audit log ---------------------------------------------------------------------------

    async def save_event(self, event: StoredEvent) -> None:
        """Append a runtime event; a repeat (same trace, ts, kind, node, payload) is ignored.

        ``trace_id=None`` (or empty) is stored under :data:`~guarded.models.GLOBAL_TRACE_ID` and
        reads back with that trace id (spec 000 ``save_event`` contract).
        """
        await self._insert_events([encode_event(event, "save_event", "event")])

    async def save_events(self, events: Sequence[StoredEvent]) -> None:
        """Bulk :meth:`save_event` with the same idempotency; nothing is stored if any event is invalid."""
        await self._insert_events(
            [encode_event(event, "save_events", f"events[{index}]") for index, event in enumerate(events)]
        )

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        """Events of the trace by ascending ``ts``, ties in insertion order; ``[]`` when unknown."""
        async with self._lock:
            log = self._logs.get("events", trace_id)
            records = sorted(log.records, key=lambda record: (record.ts, record.seq)) if log else []
        return [self._decode(STORED_EVENT, record.text) for record in records]

    # --- remote bindings ---------------------------------------------------------------------------

    async def save_remote_binding(self, binding: RemoteBinding) -> None:
        """Upsert by ``(trace_id, context_id, task_id)``."""
        data = checked("save_remote_binding", "binding", lambda: REMOTE_BINDING.encode(binding))
        [written] = current_logical_times(1)
        async with self._lock:
            applied = self._bindings.put(data, written, self._next_seq)
        _superseded(0 if applied else 1, "save_remote_binding")

    async def save_remote_bindings(self, bindings: Sequence[RemoteBinding]) -> None:
        """:meth:`save_remote_binding` for each binding in order; nothing is stored if one is invalid."""
        encoded = [
            checked("save_remote_bindings", f"bindings[{index}]", partial(REMOTE_BINDING.encode, binding))
            for index, binding in enumerate(bindings)
        ]
        times = current_logical_times(len(encoded))
        async with self._lock:
            refused = sum(
                not self._bindings.put(data, written, self._next_seq)
                for data, written in zip(encoded, times, strict=True)
            )
        _superseded(refused, "save_remote_bindings")

    async def find_binding(
        self,
        *,
        router_session_id: str,
        agent_url: str,
        remote_skill: str,
        tenant_id: str | None = None,
        user_id: str | None = None,
    ) -> RemoteBinding | None:
        """The most recently saved non-terminal binding with these coordinates, or ``None``.

        ``tenant_id`` and ``user_id`` must equal the binding's (``None`` matches only ``None``),
        as in PenguiFlow 3.11.
        """
        wanted = (router_session_id, agent_url, remote_skill, tenant_id, user_id)
        async with self._lock:
            matches = self._bindings.live_with(wanted)
        if not matches:
            return None
        latest = max(matches, key=lambda binding: binding.seq)
        found: RemoteBinding = self._decode(REMOTE_BINDING, latest.text)
        return found

    async def list_bindings(self, *, router_session_id: str) -> Sequence[RemoteBinding]:
        """Every binding of the router session, terminal ones included, in first-saved order."""
        async with self._lock:
            texts = self._bindings.texts_of_session(router_session_id)
        return [self._decode(REMOTE_BINDING, text) for text in texts]

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        """Mark the binding terminal so :meth:`find_binding` never returns it; unknown: no-op."""
        [written] = current_logical_times(1)
        async with self._lock:
            applied = self._bindings.mark_terminal((trace_id, context_id, task_id), written)
        _superseded(0 if applied else 1, "mark_binding_terminal")

    async def mark_bindings_terminal(self, items: Sequence[tuple[str, str | None, str]]) -> None:
        """:meth:`mark_binding_terminal` for each ``(trace_id, context_id, task_id)`` in order."""
        keys = [
            cast(BindingKey, key)
            for _, key in bulk_calls("mark_bindings_terminal", items, 3, "(trace_id, context_id, task_id)")
        ]
        times = current_logical_times(len(keys))
        async with self._lock:
            refused = sum(
                not self._bindings.mark_terminal(key, written)
                for key, written in zip(keys, times, strict=True)
            )
        _superseded(refused, "mark_bindings_terminal")

    # --- planner pause / resume --------------------------------------------------------------------

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        """Store the pause payload losslessly under ``token`` (upsert; restarts the TTL)."""
        text = dumps(checked("save_planner_state", "payload", lambda: to_json_object(payload)))
        times = current_logical_times(1)
        async with self._lock:
            refused = self._pauses.put([(token, text)], times)
        _superseded(refused, "save_planner_state")

    async def save_planner_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """:meth:`save_planner_state` for each ``(token, payload)`` in order (the last of a token
        wins); nothing is stored if one is invalid."""
        encoded = [
            (token, object_text("save_planner_states", f"items[{index}].payload", payload))
            for index, (token, payload) in bulk_calls("save_planner_states", items, 2, "(token, payload)")
        ]
        times = current_logical_times(len(encoded))
        async with self._lock:
            refused = self._pauses.put(encoded, times)
        _superseded(refused, "save_planner_states")

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        """Return and consume the payload; ``None`` (never ``{}``) when missing, consumed or expired."""
        saved_by = LOGICAL_TIMES.get()
        consumed_at = next_logical_time()
        async with self._lock:
            entry = self._pauses.take(token, None if saved_by is None else saved_by[0], consumed_at)
        if entry is None or (entry[0] is not None and entry[0] <= self._clock()):
            return None
        payload: dict[str, Any] = json.loads(entry[1])
        return payload

    # --- memory ------------------------------------------------------------------------------------

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        """Upsert the memory state for ``key``."""
        text = dumps(checked("save_memory_state", "state", lambda: to_json_object(state)))
        [written] = current_logical_times(1)
        async with self._lock:
            applied = self._written.newest("memory", key, written)
            if applied:
                self._memory_state[key] = text
        _superseded(0 if applied else 1, "save_memory_state")

    async def save_memory_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """:meth:`save_memory_state` for each ``(key, state)`` in order (the last of a key wins);
        nothing is stored if one is invalid."""
        encoded = [
            (key, object_text("save_memory_states", f"items[{index}].state", state))
            for index, (key, state) in bulk_calls("save_memory_states", items, 2, "(key, state)")
        ]
        times = current_logical_times(len(encoded))
        refused = 0
        async with self._lock:
            for (key, text), written in zip(encoded, times, strict=True):
                if self._written.newest("memory", key, written):
                    self._memory_state[key] = text
                else:
                    refused += 1
        _superseded(refused, "save_memory_states")

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        """A fresh copy of the state saved for ``key``, or ``None``."""
        async with self._lock:
            text = self._memory_state.get(key)
        if text is None:
            return None
        state: dict[str, Any] = json.loads(text)
        return state

    async def list_memory_keys(self, session_id: str) -> list[str]:
        """Every memory key of the session, sorted: the keys ending with ``:{session_id}`` (spec
        003's ``tenant:user:session``)."""
        suffix = f":{session_id}"
        async with self._lock:
            keys = [key for key in self._memory_state if key.endswith(suffix)]
        return sorted(keys)

    # --- tasks and updates -------------------------------------------------------------------------

    async def save_task(self, state: TaskState) -> None:
        """Upsert by ``task_id``; a task saved under another session moves there."""
        data = checked("save_task", "state", lambda: TASK_STATE.encode(state))
        async with self._lock:
            self._tasks.put(data)

    async def save_tasks(self, states: Sequence[TaskState]) -> None:
        """:meth:`save_task` for each state in order; nothing is stored if one is invalid."""
        encoded = [
            checked("save_tasks", f"states[{index}]", partial(TASK_STATE.encode, state))
            for index, state in enumerate(states)
        ]
        async with self._lock:
            for data in encoded:
                self._tasks.put(data)

    async def list_tasks(self, session_id: str) -> Sequence[TaskState]:
        """Every task of the session, in first-saved order; ``[]`` when none."""
        async with self._lock:
            texts = self._tasks.texts_of(session_id)
        return [self._decode(TASK_STATE, text) for text in texts]

    async def save_update(self, update: StateUpdate) -> None:
        """Append an update; a repeated ``update_id`` within the session is ignored."""
        data = checked("save_update", "update", lambda: STATE_UPDATE.encode(update))
        record = Record(text_of(data, "update_id"), dumps(data), task_id=text_of(data, "task_id"))
        async with self._lock:
            self._logs.append("updates", text_of(data, "session_id"), record)

    async def list_updates(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> Sequence[StateUpdate]:
        """Updates oldest first, PenguiFlow's cursor rules (spec 000 §8).

        ``since_id`` is an exclusive cursor looked up in the whole session stream (unknown or
        dropped: no cursor); then the ``task_id`` filter; then the most recent ``limit``
        (PenguiFlow's ``[-limit:]``: ``0`` keeps all, ``-n`` all but the oldest ``n``).
        """
        texts = await self._read_page("updates", session_id, task_id, since_id, limit)
        return [self._decode(STATE_UPDATE, text) for text in texts]

    async def save_task_update(self, update: StateUpdate) -> None:
        """Legacy alias of :meth:`save_update` (spec 000 "Legacy Method Mappings")."""
        await self.save_update(update)

    async def list_task_updates(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> Sequence[StateUpdate]:
        """Legacy alias of :meth:`list_updates`."""
        return await self.list_updates(session_id, task_id=task_id, since_id=since_id, limit=limit)

    # --- steering ----------------------------------------------------------------------------------

    async def save_steering(self, event: SteeringEvent) -> None:
        """Sanitize as PenguiFlow does, then append the sanitized form (spec 000 "StateStore
        Implications"); no validation, as in PenguiFlow's reference (:mod:`guarded.steering`).

        A repeated ``event_id`` within the session is ignored.
        """
        sanitized = sanitize_steering_event(event)
        data = checked("save_steering", "event", lambda: STEERING_EVENT.encode(sanitized))
        record = Record(text_of(data, "event_id"), dumps(data), task_id=text_of(data, "task_id"))
        async with self._lock:
            self._logs.append("steering", text_of(data, "session_id"), record)

    async def list_steering(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> Sequence[SteeringEvent]:
        """Steering events with the cursor rules of :meth:`list_updates` (``since_id`` is an event id)."""
        texts = await self._read_page("steering", session_id, task_id, since_id, limit)
        return [self._decode(STEERING_EVENT, text) for text in texts]

    # --- trajectories ------------------------------------------------------------------------------

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Trajectory) -> None:
        """Upsert; the trace becomes the session's most recent.

        As in PenguiFlow's reference, a trace saved under another session stays listed by the
        sessions it was saved under before (:meth:`list_traces`), while :meth:`get_trajectory`
        answers only for the session of its last save.
        """
        text = dumps(checked("save_trajectory", "", lambda: encode_trajectory(trajectory)))
        [written] = current_logical_times(1)
        async with self._lock:
            applied = self._trajectories.put(trace_id, session_id, text, written)
        _superseded(0 if applied else 1, "save_trajectory")

    async def save_trajectories(self, items: Sequence[tuple[str, str, Trajectory]]) -> None:
        """:meth:`save_trajectory` for each ``(trace_id, session_id, trajectory)`` in order;
        nothing is stored if one is invalid."""
        method = "save_trajectories"
        encoded: list[tuple[str, str, str]] = []
        for index, (trace_id, session_id, trajectory) in bulk_calls(
            method, items, 3, "(trace_id, session_id, trajectory)"
        ):
            data = checked(method, f"items[{index}]", partial(encode_trajectory, trajectory))
            encoded.append((trace_id, session_id, dumps(data)))
        times = current_logical_times(len(encoded))
        async with self._lock:
            refused = sum(
                not self._trajectories.put(trace_id, session_id, text, written)
                for (trace_id, session_id, text), written in zip(encoded, times, strict=True)
            )
        _superseded(refused, "save_trajectories")

    async def get_trajectory(self, trace_id: str, session_id: str) -> Trajectory | None:
        """The trajectory, or ``None`` when missing or saved under another session."""
        async with self._lock:
            entry = self._trajectories.get(trace_id)
        if entry is None or entry[0] != session_id:
            return None
        return decode_trajectory(json.loads(entry[1]))

    async def list_traces(self, session_id: str, limit: int = 50) -> list[str]:
        """Trace ids ever saved under the session, most recently saved there first; PenguiFlow's
        ``[:limit]`` (``0``: none, ``-n``: all but the last ``n``)."""
        async with self._lock:
            traces = self._trajectories.traces_of(session_id)
        return traces[::-1][:limit]

    # --- planner events ----------------------------------------------------------------------------

    async def save_planner_event(self, trace_id: str, event: PlannerEvent) -> None:
        """Append a planner event.

        Not de-duplicated by content: identical stream chunks with equal timestamps are
        legitimate, and a planner event has no id to recognise a retry by.
        """
        data = checked("save_planner_event", "event", lambda: PLANNER_EVENT.encode(event))
        async with self._lock:
            self._logs.append("planner_events", trace_id, Record(None, dumps(data)))

    async def list_planner_events(self, trace_id: str) -> list[PlannerEvent]:
        """Planner events of the trace in emission order."""
        async with self._lock:
            log = self._logs.get("planner_events", trace_id)
            texts = [record.text for record in log.records] if log else []
        return [self._decode(PLANNER_EVENT, text) for text in texts]

    async def get_events(self, trace_id: str) -> list[PlannerEvent]:
        """Legacy alias of :meth:`list_planner_events`."""
        return await self.list_planner_events(trace_id)

    # --- testing utilities -------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget everything, drop counters and artifacts included."""
        self._logs.clear()
        self._bindings.clear()
        self._pauses.clear()
        self._memory_state.clear()
        self._tasks.clear()
        self._trajectories.clear()
        self._written.clear()
        self._artifact_store.clear()

    def clear_session(self, session_id: str) -> None:
        """Forget a session: its tasks, updates, steering and artifacts, and for each of its traces
        the trajectory, planner events and audit log, plus the ``session:{id}`` pseudo-trace."""
        self._tasks.forget_session(session_id)
        self._logs.forget("updates", session_id)
        self._logs.forget("steering", session_id)
        self._artifact_store.clear_session(session_id)
        for trace_id in self._trajectories.forget_session(session_id):
            self._logs.forget("planner_events", trace_id)
            self._logs.forget("events", trace_id)

    # --- internals ---------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _insert_events(self, events: Sequence[JSONObject]) -> None:
        records = [
            (text_of(data, "trace_id"), Record(event_fingerprint(data), dumps(data), ts=ts_of(data)))
            for data in events
        ]
        async with self._lock:
            for trace_id, record in records:
                record.seq = self._next_seq()
                self._logs.append("events", trace_id, record)

    async def _read_page(
        self, kind: str, session_id: str, task_id: str | None, since_id: str | None, limit: int
    ) -> list[str]:
        async with self._lock:
            records = self._logs.records(kind, session_id)
        return page(records, task_id=task_id, since_id=since_id, limit=limit)

    def _decode(self, codec: RecordCodec[Any], text: str) -> Any:
        return codec.decode(json.loads(text), self._types)


def _superseded(refused: int, method: str) -> None:
    """Report replayed writes left alone because the key holds a newer one (after the rest of the
    call was applied)."""
    if refused:
        raise WriteSupersededError(refused, method=method)


__all__ = ["DROP_KINDS", "InMemoryStateStore", "event_fingerprint"]
