"""Read what Redis holds, in the shape of the demo's ledger, for the verdict.

The guard is not on the read path: a fresh ``RedisStateStore`` of its own (own client, the demo's
key prefix, no metrics) answers for each identity the ledger names -- a trace's events and
planner events, a session's updates, steering and tasks, a memory key, a trajectory, an
artifact (its bytes hashed here). Pauses are read raw (``HGETALL`` of the pause's hash), since a
load would consume them: the payload and whether a resume consumed it (the consumed record stays
as the token's tombstone). A stream read lists every entry, so a write appended twice shows as a
duplicate.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable
from typing import Any

from .calls import json_form
from .ledger import Ledger, WriteKind
from .readback import Snapshot, StoredPause, task_summary

CONCURRENT_READS = 32
"""Reads in flight at once."""


async def _each(keys: Iterable[Hashable], read: Callable[[Any], Awaitable[None]]) -> None:
    pending = list(keys)
    for start in range(0, len(pending), CONCURRENT_READS):
        await asyncio.gather(*(read(key) for key in pending[start : start + CONCURRENT_READS]))


def _first(identity: Hashable) -> Any:
    """The trace or session of an append's identity (a tuple that starts with it)."""
    assert isinstance(identity, tuple)
    return identity[0]


def _value(field: Any) -> Any:
    """An enum's value, anything else as it is."""
    return getattr(field, "value", field)


async def read_back_redis(
    store: Any, ledger: Ledger, kinds: Collection[WriteKind] = tuple(WriteKind)
) -> Snapshot:
    """What ``store`` (an unguarded ``RedisStateStore`` on the demo's prefix) holds of the writes
    of ``kinds`` that ``ledger`` names."""
    found = Snapshot()
    traces = {_first(key) for key in ledger.appends[WriteKind.EVENT]}
    planner_traces = {_first(key) for key in ledger.appends[WriteKind.PLANNER_EVENT]}
    update_sessions = {_first(key) for key in ledger.appends[WriteKind.UPDATE]}
    steering_sessions = {_first(key) for key in ledger.appends[WriteKind.STEERING]}

    async def events(trace: str) -> None:
        for event in await store.load_history(trace):
            key = (event.trace_id, event.kind, event.node_id, event.ts)
            found.put(WriteKind.EVENT, key, json_form(event.payload))

    async def planner_events(trace: str) -> None:
        for event in await store.list_planner_events(trace):
            found.put(WriteKind.PLANNER_EVENT, (trace, event.event_type, event.ts), json_form(event.extra))

    async def updates(session: str) -> None:
        for update in await store.list_updates(session):
            found.put(WriteKind.UPDATE, (update.session_id, update.update_id), json_form(update.content))

    async def steering(session: str) -> None:
        for event in await store.list_steering(session):
            found.put(WriteKind.STEERING, (event.session_id, event.event_id), json_form(event.payload))

    async def tasks(session: str) -> None:
        for task in await store.list_tasks(session):
            summary = task_summary(_value(task.status), json_form(task.progress))
            found.upserts[WriteKind.TASK][task.task_id] = summary

    async def memory(key: str) -> None:
        state = await store.load_memory_state(key)
        if state is not None:
            found.upserts[WriteKind.MEMORY][key] = json_form(state)

    async def trajectory(trace: str) -> None:
        session = ledger.upserts[WriteKind.TRAJECTORY][trace][-1][0]
        stored = await store.get_trajectory(trace, session)
        if stored is not None:
            found.upserts[WriteKind.TRAJECTORY][trace] = (session, json_form(stored))

    async def pause(token: str) -> None:
        fields = await store.client.hgetall(store.keys.pause(token))
        payload = fields.get(b"payload")
        if payload is not None:
            found.pauses[token] = StoredPause(json.loads(payload), fields.get(b"consumed") == b"1")

    async def artifact(artifact_id: str) -> None:
        data = await store.artifact_store.get(artifact_id)
        if data is not None:
            found.artifacts[artifact_id] = hashlib.sha256(data).hexdigest()

    readers: dict[WriteKind, tuple[Iterable[Any], Callable[[Any], Awaitable[None]]]] = {
        WriteKind.EVENT: (traces, events),
        WriteKind.PLANNER_EVENT: (planner_traces, planner_events),
        WriteKind.UPDATE: (update_sessions, updates),
        WriteKind.STEERING: (steering_sessions, steering),
        WriteKind.TASK: (set(ledger.task_sessions.values()), tasks),
        WriteKind.MEMORY: (ledger.upserts[WriteKind.MEMORY], memory),
        WriteKind.TRAJECTORY: (ledger.upserts[WriteKind.TRAJECTORY], trajectory),
        WriteKind.PAUSE: (ledger.pauses, pause),
        WriteKind.ARTIFACT: (ledger.artifacts, artifact),
    }
    for kind in kinds:
        keys, read = readers[kind]
        await _each(keys, read)
    return found


__all__ = ["CONCURRENT_READS", "read_back_redis"]
