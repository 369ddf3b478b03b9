"""``capture``: read everything a StateStore holds for one session or trace into a snapshot.

Only the store's public methods are used, and only those it offers (:data:`guarded.protocol.
CAPABILITIES`): a store without tasks simply yields a snapshot without tasks. What is read:

* **session** ``s``: tasks (``list_tasks``), updates and steering (``list_updates`` /
  ``list_steering`` with ``limit=0``: all of them), bindings (``list_bindings(router_session_id=s)``),
  artifacts scoped to the session, trajectories of ``list_traces(s)`` (oldest save first), and for
  every trace of the session -- listed by ``list_traces``, named by a task, update, steering event,
  binding or artifact, PenguiFlow's ``session:<s>`` pseudo-trace, and ``trace_ids`` -- its runtime
  events (``load_history``) and planner events.
* **trace** ``t``: its events, planner events, artifacts scoped to the trace, and its trajectory
  when ``session_id`` is also given (``get_trajectory`` needs it).
* **memory states**: the keys read are ``memory_keys`` plus, for a session, every key the store
  lists (``list_memory_keys``, :class:`~guarded.protocol.SupportsMemoryKeys`). A store that cannot
  list them gets PenguiFlow's ``tenant:user:session`` for every tenant and user the session's
  bindings and artifacts name instead, and the capture says it could not enumerate ``memory``.
* **pauses**: only the ``pause_tokens`` given (no store lists its pauses: ``pauses`` is never
  enumerated). Reading a pause consumes it, so each is saved back at once; a resume racing the
  capture may find the token missing for that instant.

The snapshot's ``created_at`` is taken when the capture starts: every record was read at or after
it, which is what a restore counts the snapshot's values as of (:mod:`.restore`).

Memory stays bounded: each read's answer is written out, batch by batch, to a local spool
(:class:`~guarded.snapshots.content.SpoolWriter`) before the next read; blobs go to files one at a
time. The result is a :class:`~guarded.snapshots.content.SpooledSnapshot`: pass it to a store's
``save`` and close it; its ``not_enumerated`` names the sections the capture could only read for
the keys it was given or could derive.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..codec import (
    ARTIFACT_REF,
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    encode_trajectory,
    record_types_of,
    to_json_object,
)
from .content import SpooledSnapshot, SpoolWriter
from .record import FORMAT_VERSION, Snapshot, SubjectKind

ALL_TRACES = 1 << 30
"""The ``limit`` given to ``list_traces`` (PenguiFlow's ``[:limit]``): every trace."""


def _method(store: object, name: str) -> Any:
    """The store's method ``name``, or ``None`` when it does not offer it."""
    method = getattr(store, name, None)
    return method if callable(method) else None


async def capture(
    store: object,
    *,
    session_id: str | None = None,
    trace_id: str | None = None,
    parent: Snapshot | str | None = None,
    tags: Iterable[str] = (),
    description: str = "",
    memory_keys: Iterable[str] = (),
    trace_ids: Iterable[str] = (),
    pause_tokens: Iterable[str] = (),
    snapshot_id: str | None = None,
    spool_dir: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> SpooledSnapshot:
    """Capture the state of one session (``session_id``) or one trace (``trace_id``, with
    ``session_id`` to include its trajectory) from ``store``.

    ``parent`` (a snapshot or its id) records lineage. The snapshot's id is ``snapshot_id`` or a
    new UUID. ``progress(section, count)`` is told of the records as they are read. Raises
    ``ValueError`` when neither subject is given, and whatever the store raises.
    """
    if trace_id is None and session_id is None:
        raise ValueError("capture needs session_id= or trace_id=")
    kind: SubjectKind = "trace" if trace_id is not None else "session"
    subject = trace_id if trace_id is not None else session_id
    assert subject is not None
    created_at = datetime.now(UTC)
    writer = SpoolWriter(spool_dir, on_lines=progress)
    try:
        reader = _Reader(store, writer)
        if kind == "session":
            assert session_id is not None
            await reader.session(session_id, list(trace_ids), list(memory_keys))
        else:
            assert trace_id is not None
            await reader.trace(trace_id, session_id, list(memory_keys))
        await reader.pauses(list(pause_tokens))
        parent_id = parent.id if isinstance(parent, Snapshot) else parent
        captured = await writer.finish(
            id=snapshot_id or uuid.uuid4().hex,
            subject_kind=kind,
            subject_id=subject,
            created_at=created_at,
            format_version=FORMAT_VERSION,
            tags=tuple(tags),
            description=description,
            parent_id=parent_id,
        )
    except BaseException:
        writer.abandon()
        raise
    captured.not_enumerated = (*reader.not_enumerated, "pauses")
    return captured


class _Reader:
    def __init__(self, store: object, writer: SpoolWriter) -> None:
        self.store = store
        self.writer = writer
        self.traces: dict[str, None] = {}
        self.people: set[tuple[str, str]] = set()
        self.not_enumerated: tuple[str, ...] = ()
        """The sections read only for the keys given or derived (the store lists none)."""

    def _note_trace(self, trace_id: object) -> None:
        if isinstance(trace_id, str) and trace_id:
            self.traces.setdefault(trace_id, None)

    def _note_person(self, tenant: object, user: object) -> None:
        if isinstance(tenant, str) and isinstance(user, str):
            self.people.add((tenant, user))

    async def session(self, session_id: str, trace_ids: Sequence[str], memory_keys: Sequence[str]) -> None:
        await self._tasks(session_id)
        for method, codec, section in (
            ("list_updates", STATE_UPDATE, "updates"),
            ("list_steering", STEERING_EVENT, "steering"),
        ):
            if read := _method(self.store, method):
                for record in await read(session_id, limit=0):
                    data = codec.encode(record)
                    self._note_trace(data.get("trace_id"))
                    await self.writer.add(section, data)
        if read := _method(self.store, "list_bindings"):
            for binding in await read(router_session_id=session_id):
                data = REMOTE_BINDING.encode(binding)
                self._note_trace(data["trace_id"])
                self._note_person(data.get("tenant_id"), data.get("user_id"))
                await self.writer.add("bindings", data)
        await self._artifacts(session_id=session_id)
        listed: list[str] = []
        if read := _method(self.store, "list_traces"):
            listed = list(await read(session_id, ALL_TRACES))
        for trace in reversed(listed):  # oldest save first: a restore re-creates the same order
            await self._trajectory(trace, session_id)
        for trace in [*listed, *trace_ids, f"session:{session_id}"]:
            self._note_trace(trace)
        for trace in list(self.traces):
            await self._trace_logs(trace)
        keys = dict.fromkeys(memory_keys)
        if list_keys := _method(self.store, "list_memory_keys"):
            keys.update(dict.fromkeys(await list_keys(session_id)))
        else:
            self.not_enumerated = ("memory",)
            for tenant, user in sorted(self.people):
                keys.setdefault(f"{tenant}:{user}:{session_id}", None)
        await self._memory(list(keys))

    async def trace(self, trace_id: str, session_id: str | None, memory_keys: Sequence[str]) -> None:
        await self._trace_logs(trace_id)
        if session_id is not None:
            await self._trajectory(trace_id, session_id)
        await self._artifacts(trace_id=trace_id)
        self.not_enumerated = ("memory",)  # memory belongs to a session: only the keys given
        await self._memory(memory_keys)

    async def _tasks(self, session_id: str) -> None:
        if not (read := _method(self.store, "list_tasks")):
            return
        for task in await read(session_id):
            data = TASK_STATE.encode(task)
            self._note_trace(data.get("trace_id"))
            context = data.get("context_snapshot")
            if isinstance(context, dict):
                self._note_trace(context.get("trace_id"))
            await self.writer.add("tasks", data)

    async def _trace_logs(self, trace_id: str) -> None:
        history = await self.store.load_history(trace_id)  # type: ignore[attr-defined]
        for event in history:
            await self.writer.add("events", STORED_EVENT.encode(event))
        del history
        if read := _method(self.store, "list_planner_events"):
            for event in await read(trace_id):
                await self.writer.add(
                    "planner_events", {"trace_id": trace_id, "event": PLANNER_EVENT.encode(event)}
                )

    async def _trajectory(self, trace_id: str, session_id: str) -> None:
        if not (read := _method(self.store, "get_trajectory")):
            return
        trajectory = await read(trace_id, session_id)
        if trajectory is not None:
            await self.writer.add(
                "trajectories",
                {"trace_id": trace_id, "session_id": session_id, "trajectory": encode_trajectory(trajectory)},
            )

    async def _artifacts(self, **scope: str) -> None:
        artifacts = getattr(self.store, "artifact_store", None)
        if artifacts is None or not callable(getattr(artifacts, "list", None)):
            return
        # the store's own scope class: PenguiFlow's stores validate it as theirs
        for ref in await artifacts.list(scope=record_types_of(self.store).ArtifactScope(**scope)):
            data = await artifacts.get(ref.id)
            if data is None:  # expired between list and get
                continue
            encoded = ARTIFACT_REF.encode(ref)
            found = encoded.get("scope")
            if isinstance(found, dict):
                self._note_trace(found.get("trace_id"))
                self._note_person(found.get("tenant_id"), found.get("user_id"))
            digest = await self.writer.add_blob(bytes(data))
            await self.writer.add("artifacts", {"ref": encoded, "blob": digest, "size": len(data)})
            del data

    async def _memory(self, keys: Sequence[str]) -> None:
        if not keys or not (read := _method(self.store, "load_memory_state")):
            return
        for key in sorted(keys):
            state = await read(key)
            if state is not None:
                await self.writer.add("memory", {"key": key, "state": to_json_object(state, "state")})

    async def pauses(self, tokens: Sequence[str]) -> None:
        load = _method(self.store, "load_planner_state")
        save = _method(self.store, "save_planner_state")
        if not tokens or load is None or save is None:
            return
        for token in tokens:
            payload = await load(token)
            if payload is None:
                continue
            await save(token, payload)  # a read consumes: put it back at once
            await self.writer.add("pauses", {"token": token, "payload": to_json_object(payload, "payload")})


__all__ = ["ALL_TRACES", "capture"]
