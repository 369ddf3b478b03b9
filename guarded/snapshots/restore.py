"""``restore``: write a snapshot's content into any StateStore, idempotently, never backwards.

Only the store's public methods are used. Restoring the same snapshot twice leaves the store as
restoring it once, and **by default a restore never moves a key backwards**: the store's newer
data wins, in every section.

* **appends** (runtime events, planner events, updates, steering) add only what the store lacks:
  events through ``save_event`` / ``save_events`` (idempotent by the protocol); updates and
  steering are skipped when the store already lists their ``update_id`` / ``event_id``; planner
  events (which have no id) when the store's list for the trace already holds as many equal ones.
* **last-write-wins upserts** (memory states, trajectories, bindings) count as of the snapshot's
  ``created_at`` (when its capture began): each is written with that logical time
  as a replay (:mod:`guarded.backend`), so a store that keeps logical times leaves alone every key
  written after the capture began, and takes the snapshot's value over an older one. A key the
  store holds exactly as the snapshot is not written again; one it kept (read back after the
  write) or refused (:class:`~guarded.errors.WriteNotKeptError`) is counted as skipped.
* **tasks** carry their own time: a task the store holds with a newer ``updated_at`` is kept
  (and one it holds exactly as in the snapshot is not written again).
* **artifacts** are put again from their blobs (same content, same namespace: the same id in a
  content-addressed store) unless the store already has the id.
* **pauses** are written only by a roll-back with ``include_pauses=True``: a pause resumes once,
  and nothing in the protocol tells a pause the store consumed from one it never had (reading one
  consumes it), so a restore that is not a roll-back never re-creates one; it counts them as
  skipped.

**Roll-back** (``rollback=True``) restores the snapshot's values as of now: every upsert is
written with a logical time taken when the restore starts, and every task the store holds
otherwise with ``updated_at`` set to that moment, so the snapshot's values replace newer ones.
What it replaced is named in :attr:`RestoreReport.overwritten` (the keys whose value in the store
differed); a pause cannot be read without consuming it, so every pause a roll-back writes is
named there.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..backend import next_logical_time
from ..codec import (
    ARTIFACT_REF,
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    JSONObject,
    RecordTypes,
    decode_trajectory,
    encode_trajectory,
    record_types_of,
)
from ..errors import CapabilityError, WriteNotKeptError
from ..logical_time import logical_times, replaying
from .content import SnapshotContent, canonical, parse_line, verify_content
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
    """What a restore wrote and skipped (already there, newer in the store, or a pause outside a
    roll-back), per section; for a roll-back, what it overwrote."""

    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0))
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0))
    unsupported: tuple[str, ...] = ()
    rollback: bool = False
    overwritten: dict[str, list[str]] = field(default_factory=dict)
    """A roll-back's replaced keys by section (only sections with some): memory keys, trace ids of
    trajectories, task ids, ``trace_id/context_id/task_id`` of bindings, and every pause token
    written (a pause cannot be read without consuming it)."""


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
    rollback: bool = False,
) -> RestoreReport:
    """Write ``content`` into ``store`` (see the module docstring for the rules).

    By default the store's newer data wins everywhere; ``rollback=True`` writes the snapshot's
    values over it and names what it overwrote. ``record_types`` are the classes handed to the
    store (default: the store's ``types``, else PenguiFlow's when installed).
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
    report = RestoreReport(unsupported=unsupported, rollback=rollback)
    now = next_logical_time()
    time = now if rollback else min(_logical_time_of(content.snapshot.created_at), now)
    writer = _Writer(content, store, record_types or record_types_of(store), report, time)
    for section in sections:
        if section in unsupported or not counts.get(section, 0):
            continue
        await getattr(writer, f"_{section}")()
    return report


BindingKey = tuple[object, object, object]
"""``(trace_id, context_id, task_id)`` of a binding, as its record holds them."""

Read = Callable[[], Awaitable[bytes | None]]
"""Reads the canonical form of the value the store holds for one key (``None``: none, or the
store cannot read it back)."""


class _Writer:
    def __init__(
        self, content: SnapshotContent, store: Any, types: RecordTypes, report: RestoreReport, time: int
    ) -> None:
        self.content = content
        self.store = store
        self.types = types
        self.report = report
        self.time = (time,)
        self.rollback = report.rollback

    async def _records(self, section: str) -> AsyncIterator[dict[str, Any]]:
        async for batch in self.content.lines(section):
            for line in batch:
                yield parse_line(line)

    def _count(self, section: str, written: bool) -> None:
        (self.report.written if written else self.report.skipped)[section] += 1

    def _overwrote(self, section: str, key: str) -> None:
        self.report.overwritten.setdefault(section, []).append(key)

    async def _upsert(
        self, section: str, key: str, value: bytes, held: bytes | None, method: str, *args: Any
    ) -> bool:
        """Write one last-write-wins key (``method(*args)``) with the restore's logical time,
        unless the store holds ``value`` already (``held``); whether it was written (the caller
        then checks, outside a roll-back, that the store kept it: :meth:`_kept_newer`)."""
        if held == value:
            self._count(section, False)
            return False
        try:
            with logical_times(self.time), replaying(not self.rollback):
                await getattr(self.store, method)(*args)
        except WriteNotKeptError:
            self._count(section, False)  # the store refused it: it holds a newer write
            return False
        if self.rollback and held is not None:
            self._overwrote(section, key)
        self._count(section, True)
        return True

    def _kept_newer(self, section: str) -> None:
        """A write :meth:`_upsert` made that the store did not keep: it holds a newer value."""
        self.report.written[section] -= 1
        self.report.skipped[section] += 1

    async def _upsert_read_back(
        self, section: str, key: str, value: bytes, read: Read | None, method: str, *args: Any
    ) -> None:
        """:meth:`_upsert` of a key ``read`` reads back (``None``: the store cannot read it)."""
        held = None if read is None else await read()
        written = await self._upsert(section, key, value, held, method, *args)
        if written and not self.rollback and read is not None and await read() != value:
            self._kept_newer(section)

    def _reader(self, name: str, *args: Any, encode: Callable[[Any], Any] | None = None) -> Read | None:
        method = getattr(self.store, name, None)
        if not callable(method):
            return None

        async def read() -> bytes | None:
            found = await method(*args)
            if found is None:
                return None
            return canonical(found if encode is None else encode(found))

        return read

    async def _events(self) -> None:
        bulk = getattr(self.store, "save_events", None)
        async for batch in self.content.lines("events"):
            events = [STORED_EVENT.decode(parse_line(line), self.types) for line in batch]
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
            trace, session = record["trace_id"], record["session_id"]
            trajectory = decode_trajectory(record["trajectory"])
            await self._upsert_read_back(
                "trajectories",
                str(trace),
                canonical(record["trajectory"]),
                self._reader("get_trajectory", trace, session, encode=encode_trajectory),
                "save_trajectory",
                trace,
                session,
                trajectory,
            )

    async def _memory(self) -> None:
        async for record in self._records("memory"):
            key, state = record["key"], record["state"]
            await self._upsert_read_back(
                "memory",
                str(key),
                canonical(state),
                self._reader("load_memory_state", key),
                "save_memory_state",
                key,
                state,
            )

    async def _tasks(self) -> None:
        known: dict[str, dict[str, tuple[datetime, bytes]]] = {}
        async for record in self._records("tasks"):
            session = str(record["session_id"])
            if session not in known:
                known[session] = {
                    task.task_id: (task.updated_at, _task_value(TASK_STATE.encode(task)))
                    for task in await self.store.list_tasks(session)
                }
            task = TASK_STATE.decode(record, self.types)
            held = known[session].get(task.task_id)
            if held is not None and held[1] == _task_value(record):
                self._count("tasks", False)  # already there
                continue
            if self.rollback and held is not None:
                task.updated_at = _as_of(self.time[0], task.updated_at, held[0])
                self._overwrote("tasks", str(task.task_id))
            elif held is not None and _newer(held[0], task.updated_at):
                self._count("tasks", False)  # newer there
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
        # Each router session is listed once before the restore writes to it, and once after.
        can_list = callable(getattr(self.store, "list_bindings", None))
        before: dict[str, dict[BindingKey, bytes]] = {}
        written: dict[str, list[tuple[BindingKey, bytes]]] = {}
        async for record in self._records("bindings"):
            found = record.get("router_session_id")
            session = found if can_list and isinstance(found, str) else None  # None: cannot read back
            key: BindingKey = (record["trace_id"], record.get("context_id"), record["task_id"])
            value = canonical(record)
            if session is not None and session not in before:
                before[session] = await self._listed_bindings(session)
            held = None if session is None else before[session].get(key)
            binding = REMOTE_BINDING.decode(record, self.types)
            name = "/".join(str(part) for part in key)
            wrote = await self._upsert("bindings", name, value, held, "save_remote_binding", binding)
            if wrote and session is not None:
                written.setdefault(session, []).append((key, value))
        if self.rollback:
            return
        for session, items in written.items():
            after = await self._listed_bindings(session)
            for key, value in items:
                if after.get(key) != value:
                    self._kept_newer("bindings")

    async def _listed_bindings(self, session: str) -> dict[BindingKey, bytes]:
        """The store's bindings of a router session by ``(trace_id, context_id, task_id)``."""
        listed: dict[BindingKey, bytes] = {}
        for binding in await self.store.list_bindings(router_session_id=session):
            data = REMOTE_BINDING.encode(binding)
            listed[(data["trace_id"], data.get("context_id"), data["task_id"])] = canonical(data)
        return listed

    async def _pauses(self) -> None:
        async for record in self._records("pauses"):
            if not self.rollback:
                self._count("pauses", False)  # the store may have consumed it: never re-created
                continue
            token, payload = record["token"], record["payload"]
            try:
                with logical_times(self.time):
                    await self.store.save_planner_state(token, payload)
            except WriteNotKeptError:
                self._count("pauses", False)
                continue
            self._overwrote("pauses", str(token))
            self._count("pauses", True)

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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _logical_time_of(moment: datetime) -> int:
    """The logical time (microseconds since the Unix epoch) of ``moment``; naive is taken as UTC."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(microseconds=1)


def _as_of(time: int, like: datetime, replaced: datetime) -> datetime:
    """A roll-back's ``updated_at``: the moment of logical ``time`` (naive when ``like`` is), or
    just after ``replaced`` when that is later (a clock ahead of this one wrote it)."""
    moment = _EPOCH + timedelta(microseconds=time)
    moment = moment if like.tzinfo is not None else moment.replace(tzinfo=None)
    return replaced + timedelta(microseconds=1) if _newer(replaced, moment) else moment


def _task_value(record: JSONObject) -> bytes:
    """A task's canonical form without ``updated_at``: what a roll-back compares (it sets that)."""
    return canonical({name: value for name, value in record.items() if name != "updated_at"})


def _newer(held: datetime, restored: datetime) -> bool:
    try:
        return held > restored
    except TypeError:  # naive against aware: no order to keep
        return False


__all__ = ["NEEDS", "RestoreReport", "restore"]
