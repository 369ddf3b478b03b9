"""``HybridStateStore``: spec 000's hybrid, one StateStore made of a hot store and a record store.

Spec 000 ("Redis + PostgreSQL (Hybrid)") keeps what is short-lived and read on the hot path in
Redis -- planner pauses (a TTL, consumed once) and short-term memory -- and the durable record in
PostgreSQL: runtime events, tasks, updates, steering, trajectories, planner events, remote
bindings and artifacts. The hybrid takes the two stores built (any StateStores: a
``RedisStateStore`` and a ``PostgresStateStore``, or the in-memory store in tests)::

    hybrid = HybridStateStore(hot=redis_store, record=postgres_store)
    store = guard(hybrid)          # each part guarded on its own

Which method goes to which part is data: :data:`DEFAULT_ROUTES` (group -> part), overridden by
``routes`` (a group or a method -> part) and checked when the store is built (:func:`routing`).
The methods of one group read and write the same data, so a group is never split between the
parts (a pause saved in one store and consumed from the other would never be found); a bulk form
and a legacy alias go where their method goes.

**Memory write-through** (``memory_write_through=True``): every memory state is written to the
record store first, then to the hot store, both under the call's one logical time; reads come
from the hot store and fall back to the record store when the hot store has no entry (its TTL
expired, Redis lost it) or fails; ``list_memory_keys`` reads the record store. The record store
goes first because it is the copy that outlives the other: a failure or a crash between the two
writes leaves the hot copy older than the record, never newer, so a read that falls back never
returns an older state than one the hot store already answered, and every key the hot store holds
is listed. Both copies carry the same logical time, so a held write of either is replayed by that
time in its store (last-write-wins by the call, as every replay is). Two writers of the same key
at the same moment are ordered by each store as its writes arrive; should the two stores see them
in different orders, the record's order wins once the hot entry expires.

Under :func:`guarded.guard` the hybrid declares its parts (:class:`guarded.backend.ComposedStore`):
the guard guards each on its own, as the store ``"<name>.hot"`` and ``"<name>.record"`` (breaker,
bulkhead, error classes, dead letters and spill file, metrics), and returns the hybrid over the
guarded parts (:meth:`HybridStateStore.with_parts`). Redis down then opens only the hot part's
breaker: PostgreSQL writes go on, and the other way round. ``guarded.controller`` of it controls
both parts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Self

from guarded.backend import (
    BULK_FORMS,
    LEGACY_ALIASES,
    LOGICAL_TIMES,
    closest_hint,
    current_logical_times,
)

logger = logging.getLogger("guarded.backends.hybrid")

HOT = "hot"
"""The part for the hot paths (Redis)."""
RECORD = "record"
"""The part that keeps the durable record (PostgreSQL)."""
PARTS = (HOT, RECORD)

METHOD_GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "pauses": ("save_planner_state", "load_planner_state"),
        "memory": ("save_memory_state", "load_memory_state", "list_memory_keys"),
        "events": ("save_event", "load_history"),
        "tasks": ("save_task", "list_tasks"),
        "updates": ("save_update", "list_updates"),
        "steering": ("save_steering", "list_steering"),
        "trajectories": ("save_trajectory", "get_trajectory", "list_traces"),
        "planner_events": ("save_planner_event", "list_planner_events"),
        "bindings": ("save_remote_binding", "find_binding", "list_bindings", "mark_binding_terminal"),
        "artifacts": ("artifact_store",),
    }
)
"""The protocol's methods by the data they read and write: a group is routed whole."""

DEFAULT_ROUTES: Mapping[str, str] = MappingProxyType(
    {group: HOT if group in ("pauses", "memory") else RECORD for group in METHOD_GROUPS}
)
"""Spec 000's split: pauses and memory in the hot store, the rest in the record store."""

_FOLLOWERS: Mapping[str, str] = MappingProxyType(
    {**{bulk: single for single, bulk in BULK_FORMS.items()}, **LEGACY_ALIASES}
)
"""Bulk forms and legacy aliases, each routed with the method it stands for."""

_GROUP_OF: Mapping[str, str] = MappingProxyType(
    {method: group for group, methods in METHOD_GROUPS.items() for method in methods}
)


class RoutingError(ValueError):
    """A routing table the hybrid cannot follow: an unknown method, group or part, a bulk form or
    alias routed apart from its method, or a group split between the parts."""


def routing(routes: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every method's part: :data:`DEFAULT_ROUTES` with ``routes`` applied (a key is a group of
    :data:`METHOD_GROUPS` or one of its methods, a value a part of :data:`PARTS`), bulk forms and
    legacy aliases included. Raises :class:`RoutingError` naming what it cannot follow."""
    table = {method: DEFAULT_ROUTES[group] for method, group in _GROUP_OF.items()}
    for key, part in (routes or {}).items():
        if part not in PARTS:
            raise RoutingError(
                f"routes[{key!r}] = {part!r}: no such part{closest_hint(str(part), PARTS)}; parts: "
                + ", ".join(PARTS)
            )
        if key in METHOD_GROUPS:
            table.update(dict.fromkeys(METHOD_GROUPS[key], part))
        elif key in _GROUP_OF:
            table[key] = part
        elif key in _FOLLOWERS:
            raise RoutingError(
                f"routes[{key!r}]: {key} goes where {_FOLLOWERS[key]} goes; route {_FOLLOWERS[key]!r} "
                f"(or its group {_GROUP_OF[_FOLLOWERS[key]]!r})"
            )
        else:
            known = [*METHOD_GROUPS, *_GROUP_OF]
            raise RoutingError(
                f"routes[{key!r}]: no such method or group{closest_hint(str(key), known)}; groups: "
                + ", ".join(METHOD_GROUPS)
            )
    for group, methods in METHOD_GROUPS.items():
        parts = {method: table[method] for method in methods}
        if len(set(parts.values())) > 1:
            where = ", ".join(f"{method} -> {part}" for method, part in parts.items())
            raise RoutingError(
                f"the {group} group is split ({where}): its methods read and write the same data, "
                f"so route the group whole (routes={{{group!r}: ...}})"
            )
    table.update({follower: table[method] for follower, method in _FOLLOWERS.items()})
    return table


class HybridStateStore:
    """One StateStore over a hot store and a record store, each method routed to one of them
    (see the module's documentation). Every protocol method the routed part offers is offered,
    and only those: ``hasattr`` answers as the parts do."""

    def __init__(
        self,
        *,
        hot: object,
        record: object,
        routes: Mapping[str, str] | None = None,
        memory_write_through: bool = False,
    ) -> None:
        """``hot`` and ``record``: the two stores (each any StateStore, or one with only the methods
        routed to it). ``routes``: overrides of :data:`DEFAULT_ROUTES` (see :func:`routing`).
        ``memory_write_through``: keep a durable copy of every memory state in the record store
        (memory must then be routed to the hot store)."""
        self._routes = MappingProxyType(routing(routes))
        self._overrides = dict(routes or {})
        if memory_write_through and self._routes["save_memory_state"] != HOT:
            raise RoutingError(
                "memory_write_through copies the hot store's memory states to the record store, "
                f"but memory is routed to {self._routes['save_memory_state']!r}"
            )
        self._write_through = memory_write_through
        self._parts = MappingProxyType({HOT: hot, RECORD: record})
        self._written_through: Mapping[str, Any] = (
            MappingProxyType(
                {
                    "save_memory_state": self._save_memory_state,
                    "save_memory_states": self._save_memory_states,
                    "load_memory_state": self._load_memory_state,
                    "list_memory_keys": self._list_memory_keys,
                }
            )
            if memory_write_through
            else MappingProxyType({})
        )

    # --- what the store is made of ------------------------------------------------------------

    @property
    def store_parts(self) -> Mapping[str, object]:
        """The parts by name, ``hot`` and ``record`` (:class:`guarded.backend.ComposedStore`)."""
        return self._parts

    def with_parts(self, parts: Mapping[str, object]) -> Self:
        """This hybrid (routes and write-through) over ``parts`` (``hot`` and ``record``): what
        :func:`guarded.guard` returns over the guarded parts."""
        if set(parts) != set(PARTS):
            raise ValueError(f"with_parts takes the parts {', '.join(PARTS)}; got {', '.join(parts)}")
        return type(self)(
            hot=parts[HOT],
            record=parts[RECORD],
            routes=self._overrides,
            memory_write_through=self._write_through,
        )

    @property
    def routes(self) -> Mapping[str, str]:
        """Every method's part (read-only)."""
        return self._routes

    @property
    def memory_write_through(self) -> bool:
        """Whether memory states are written through to the record store."""
        return self._write_through

    def part_of(self, method: str) -> str:
        """The name of the part ``method`` is routed to (``KeyError`` for no protocol method)."""
        return self._routes[method]

    # --- the protocol's methods, routed -------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        part = self._routes.get(name)
        if part is None:
            raise AttributeError(f"{type(self).__qualname__} has no attribute {name!r}")
        own = self._written_through.get(name)
        store = self._parts[part]
        if own is not None and hasattr(store, name) and hasattr(self._parts[RECORD], name):
            return own
        return getattr(store, name)

    def __dir__(self) -> list[str]:
        routed = [name for name, part in self._routes.items() if hasattr(self._parts[part], name)]
        return sorted({*super().__dir__(), *routed})

    @property
    def artifact_store(self) -> Any:
        """The artifact store of the part artifacts are routed to (``None`` when it has none)."""
        return getattr(self._parts[self._routes["artifact_store"]], "artifact_store", None)

    # --- memory written through ---------------------------------------------------------------

    async def _save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        token = LOGICAL_TIMES.set(tuple(current_logical_times(1)))
        try:
            await self._parts[RECORD].save_memory_state(key, state)  # type: ignore[attr-defined]
            await self._parts[HOT].save_memory_state(key, state)  # type: ignore[attr-defined]
        finally:
            LOGICAL_TIMES.reset(token)

    async def _save_memory_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        items = list(items)
        token = LOGICAL_TIMES.set(tuple(current_logical_times(len(items))))
        try:
            await self._bulk_or_single(RECORD, items)
            await self._bulk_or_single(HOT, items)
        finally:
            LOGICAL_TIMES.reset(token)

    async def _bulk_or_single(self, part: str, items: list[tuple[str, dict[str, Any]]]) -> None:
        store: Any = self._parts[part]
        if hasattr(store, "save_memory_states"):
            await store.save_memory_states(items)
            return
        times = LOGICAL_TIMES.get() or ()
        for (key, state), time in zip(items, times, strict=True):
            token = LOGICAL_TIMES.set((time,))
            try:
                await store.save_memory_state(key, state)
            finally:
                LOGICAL_TIMES.reset(token)

    async def _load_memory_state(self, key: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None
        try:
            found = await self._parts[HOT].load_memory_state(key)  # type: ignore[attr-defined]
        except Exception as exc:  # the hot store failed: the record store has the durable copy
            logger.debug(
                "hot store failed to load a memory state (%s); reading the record", type(exc).__name__
            )
            found = None
        if found is not None:
            return found
        record: dict[str, Any] | None = await self._parts[RECORD].load_memory_state(key)  # type: ignore[attr-defined]
        return record

    async def _list_memory_keys(self, session_id: str) -> Sequence[str]:
        keys: Sequence[str] = await self._parts[RECORD].list_memory_keys(session_id)  # type: ignore[attr-defined]
        return keys

    # --- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        for part in self._parts.values():
            enter = getattr(part, "__aenter__", None)
            if enter is not None:
                await enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await _each(
            [
                part.__aexit__(exc_type, exc, traceback)
                for part in self._parts.values()
                if hasattr(part, "__aexit__")
            ]
        )

    async def aclose(self) -> None:
        """Close both parts (each that has ``aclose()`` or ``close()``), the one after the other's
        failure too. Under a guard, close with ``async with`` or ``guarded.controller(store).aclose()``,
        which first drain what each part's guard holds."""
        closing = []
        for part in self._parts.values():
            closer = getattr(part, "aclose", None) or getattr(part, "close", None)
            if callable(closer):
                result = closer()
                if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                    closing.append(result)
        await _each(closing)

    close = aclose

    def __repr__(self) -> str:
        return f"<HybridStateStore hot={self._parts[HOT]!r} record={self._parts[RECORD]!r}>"


async def _each(awaitables: Sequence[Any]) -> None:
    """Await every one of ``awaitables`` at once; the first failure is raised once all are done."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


__all__ = [
    "DEFAULT_ROUTES",
    "HOT",
    "METHOD_GROUPS",
    "PARTS",
    "RECORD",
    "HybridStateStore",
    "RoutingError",
    "routing",
]
