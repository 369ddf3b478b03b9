"""``restore``: write a snapshot's content into any StateStore, idempotently.

Only the store's public methods are used. Restoring the same snapshot twice leaves the store as
restoring it once:

* **appends** (runtime events, planner events, updates, steering) add only what the store lacks:
  events through ``save_event`` / ``save_events`` (idempotent by the protocol); updates and
  steering are skipped when the store already lists their ``update_id`` / ``event_id``; planner
  events (which have no id) when the store's list for the trace already holds as many equal ones.
* **last-write-wins upserts** (memory states, trajectories, bindings, pauses) are written once per
  key, in the snapshot's order, all with one logical time taken when the restore starts
  (:mod:`guarded.logical_time`): a backend that keeps logical times never lets a write held from
  before the restore overwrite it, and refuses the restore's write for a key written after the
  restore began -- the restore never goes backwards.
* **tasks** carry their own time: a task the store holds with a newer ``updated_at`` is kept
  (and one it holds exactly as in the snapshot is not written again).
* **artifacts** are put again from their blobs (same content, same namespace: the same id in a
  content-addressed store) unless the store already has the id.
* **pauses** are restored only with ``include_pauses=True`` (a pause can be resumed only once;
  restoring it into production resumes an old conversation).

Nothing is written before the whole content has been read once and checked against its record
(:func:`~guarded.snapshots.verify_content`: every section's hash, records and bytes, every blob's
name, size and hash): a damaged or tampered snapshot restores nothing.

A section with records that the store cannot take (it lacks the capability) raises
:class:`~guarded.errors.CapabilityError` before anything is written, unless
``skip_unsupported=True``. Memory stays bounded: records are read and written batch by batch,
blobs one at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..codec import (
    ARTIFACT_REF,
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    RecordTypes,
    decode_trajectory,
    record_types_of,
)
from ..errors import CapabilityError
from ..logical_time import logical_times, next_logical_time
from .content import SnapshotContent, canonical, parse, verify_content
from .record import SECTIONS

NEEDS: dict[str, tuple[str, ...]] = {
    "events": ("save_event",),
    "planner_events": ("save_planner_event", "list_planner_events"),
    "trajectories": ("save_trajectory",),
    "memory": ("save_memory_state",),
    "tasks": ("save_task", "list_tasks"),
    "updates": ("save_update", "list_updates"),
    "steering": ("save_steering", "list_steering"),
    "bindings": ("save_remote_binding",),
    "pauses": ("save_planner_state",),
    "artifacts": ("artifact_store",),
}
"""The store methods each section is restored through."""


@dataclass(slots=True)
class RestoreReport:
    """What a restore wrote and skipped (already there, or newer in the store), per section."""

    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0))
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0))
    unsupported: tuple[str, ...] = ()


def _lacks(store: object, section: str) -> bool:
    if section == "artifacts":
        return getattr(store, "artifact_store", None) is None
    return any(not callable(getattr(store, name, None)) for name in NEEDS[section])


async def restore(
    content: SnapshotContent,
    store: object,
    *,
    include_pauses: bool = False,
    skip_unsupported: bool = False,
    record_types: RecordTypes | None = None,
) -> RestoreReport:
    """Write ``content`` into ``store`` (see the module docstring for the rules).

    ``record_types`` are the classes handed to the store (default: the store's ``types``, else
    PenguiFlow's when installed).
    """
    counts = content.snapshot.counts
    sections = [name for name in SECTIONS if name != "pauses" or include_pauses]
    unsupported = tuple(name for name in sections if counts.get(name, 0) and _lacks(store, name))
    if unsupported and not skip_unsupported:
        raise CapabilityError(
            f"cannot restore snapshot {content.snapshot.id!r} into {type(store).__qualname__}: "
            f"it lacks what the sections {list(unsupported)} need "
            f"({', '.join(name for s in unsupported for name in NEEDS[s])}); "
            "pass skip_unsupported=True to leave them out"
        )
    await verify_content(content)  # all or nothing: no write before the whole content checked out
    report = RestoreReport(unsupported=unsupported)
    writer = _Writer(content, store, record_types or record_types_of(store), report, next_logical_time())
    for section in sections:
        if section in unsupported or not counts.get(section, 0):
            continue
        await getattr(writer, f"_{section}")()
    return report


class _Writer:
    def __init__(
        self, content: SnapshotContent, store: Any, types: RecordTypes, report: RestoreReport, time: int
    ) -> None:
        self.content = content
        self.store = store
        self.types = types
        self.report = report
        self.time = (time,)

    async def _records(self, section: str) -> AsyncIterator[dict[str, Any]]:
        async for batch in self.content.lines(section):
            for line in batch:
                yield parse(line)

    def _count(self, section: str, written: bool) -> None:
        (self.report.written if written else self.report.skipped)[section] += 1

    async def _upsert(self, section: str, method: str, *args: Any) -> None:
        with logical_times(self.time):
            await getattr(self.store, method)(*args)
        self._count(section, True)

    async def _events(self) -> None:
        bulk = getattr(self.store, "save_events", None)
        async for batch in self.content.lines("events"):
            events = [STORED_EVENT.decode(parse(line), self.types) for line in batch]
            if callable(bulk):
                await bulk(events)
            else:
                for event in events:
                    await self.store.save_event(event)
            self.report.written["events"] += len(events)

    async def _planner_events(self) -> None:
        trace: str | None = None
        present: Counter[bytes] = Counter()
        async for record in self._records("planner_events"):
            if record["trace_id"] != trace:
                trace = str(record["trace_id"])
                existing = await self.store.list_planner_events(trace)
                present = Counter(canonical(PLANNER_EVENT.encode(event)) for event in existing)
            line = canonical(record["event"])
            if present[line] > 0:
                present[line] -= 1
                self._count("planner_events", False)
                continue
            await self.store.save_planner_event(trace, PLANNER_EVENT.decode(record["event"], self.types))
            self._count("planner_events", True)

    async def _trajectories(self) -> None:
        async for record in self._records("trajectories"):
            trajectory = decode_trajectory(record["trajectory"])
            await self._upsert(
                "trajectories", "save_trajectory", record["trace_id"], record["session_id"], trajectory
            )

    async def _memory(self) -> None:
        async for record in self._records("memory"):
            await self._upsert("memory", "save_memory_state", record["key"], record["state"])

    async def _tasks(self) -> None:
        known: dict[str, dict[str, tuple[datetime, bytes]]] = {}
        async for record in self._records("tasks"):
            session = str(record["session_id"])
            if session not in known:
                known[session] = {
                    task.task_id: (task.updated_at, canonical(TASK_STATE.encode(task)))
                    for task in await self.store.list_tasks(session)
                }
            task = TASK_STATE.decode(record, self.types)
            held = known[session].get(task.task_id)
            if held is not None and (held[1] == canonical(record) or _newer(held[0], task.updated_at)):
                self._count("tasks", False)  # already there, or newer there
                continue
            await self.store.save_task(task)
            self._count("tasks", True)

    async def _updates(self) -> None:
        await self._log("updates", "list_updates", "save_update", "update_id", STATE_UPDATE.decode)

    async def _steering(self) -> None:
        await self._log("steering", "list_steering", "save_steering", "event_id", STEERING_EVENT.decode)

    async def _log(self, section: str, list_name: str, save_name: str, id_field: str, decode: Any) -> None:
        known: dict[str, set[str]] = {}
        async for record in self._records(section):
            session = str(record["session_id"])
            if session not in known:
                existing = await getattr(self.store, list_name)(session, limit=0)
                known[session] = {str(getattr(item, id_field)) for item in existing}
            if record[id_field] in known[session]:
                self._count(section, False)
                continue
            await getattr(self.store, save_name)(decode(record, self.types))
            known[session].add(str(record[id_field]))
            self._count(section, True)

    async def _bindings(self) -> None:
        async for record in self._records("bindings"):
            binding = REMOTE_BINDING.decode(record, self.types)
            await self._upsert("bindings", "save_remote_binding", binding)

    async def _pauses(self) -> None:
        async for record in self._records("pauses"):
            await self._upsert("pauses", "save_planner_state", record["token"], record["payload"])

    async def _artifacts(self) -> None:
        artifacts = self.store.artifact_store
        async for record in self._records("artifacts"):
            ref = ARTIFACT_REF.decode(record["ref"], self.types)
            if await artifacts.exists(ref.id):
                self._count("artifacts", False)
                continue
            data = await self.content.read_blob(str(record["blob"]))
            await artifacts.put_bytes(
                data,
                mime_type=ref.mime_type,
                filename=ref.filename,
                namespace=ref.namespace,
                scope=ref.scope,
                meta=dict(ref.source) or None,
            )
            del data
            self._count("artifacts", True)


def _newer(held: datetime, restored: datetime) -> bool:
    try:
        return held > restored
    except TypeError:  # naive against aware: no order to keep
        return False


__all__ = ["NEEDS", "RestoreReport", "restore"]
