"""Compatibility adapters for stores that use legacy method names (spec 000, "Compatibility Adapters").

Each adapter calls the current method name when the store has it and falls back to the legacy
name otherwise:

============================  ==================================
current method                legacy alternative
============================  ==================================
``save_update(update)``       ``save_task_update(update)``
``list_updates(...)``         ``list_task_updates(...)``
``save_planner_event(t, e)``  Playground ``save_event(t, e)``
``list_planner_events(t)``    ``get_events(t)``
============================  ==================================

A store with neither raises :class:`~guarded.errors.CapabilityError` (a ``TypeError``, as in
PenguiFlow) naming both. The adapters work with any objects of the protocol, ours or PenguiFlow's,
and return lists even when a store returns another sequence.

The legacy Playground ``save_event(trace_id, event)`` shares its name with the core audit-log
method ``save_event(event)``. :func:`save_planner_event_compat` tells them apart by signature
*before* calling: it never calls a one-argument ``save_event`` with two arguments and mistakes
the resulting ``TypeError`` (or a ``TypeError`` raised inside the store) for a missing method.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .errors import CapabilityError
from .models import (
    ArtifactStore,
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    TaskState,
)

_AsyncMethod = Callable[..., Awaitable[Any]]


def _method(store: object, name: str) -> _AsyncMethod | None:
    """``store.name`` when it is callable, else ``None``."""
    method = getattr(store, name, None)
    return cast(_AsyncMethod, method) if callable(method) else None


def _resolve(store: object, name: str, legacy: str | None = None) -> _AsyncMethod:
    """The method called ``name``, else the one called ``legacy``; raise when neither exists."""
    method = _method(store, name)
    if method is None and legacy is not None:
        method = _method(store, legacy)
    if method is None:
        names = f"{name}/{legacy}" if legacy else name
        raise CapabilityError(f"StateStore {type(store).__qualname__} missing {names}")
    return method


def is_legacy_save_event(method: Callable[..., Any]) -> bool:
    """Whether ``method`` is the Playground's ``save_event(trace_id, event)``, not the core one.

    True only when the signature *requires* two positional arguments: it accepts
    ``(trace_id, event)`` and refuses a lone ``(event)``. A signature that cannot be inspected, or
    one as permissive as ``(*args)``, is not taken for the legacy form: guessing wrong would hand a
    trace id to the core audit log. Wrappers made with ``functools.wraps`` are inspected through
    to the function they wrap.
    """
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return False
    try:
        signature.bind("trace_id", "event")
    except TypeError:
        return False
    try:
        signature.bind("event")
    except TypeError:
        return True
    return False


def get_artifact_store(store: object) -> ArtifactStore | None:
    """The store's artifact store: its ``artifact_store`` property, or the store itself, else ``None``.

    Mirrors ``penguiflow.artifacts.discover_artifact_store``.
    """
    candidate = getattr(store, "artifact_store", None)
    if isinstance(candidate, ArtifactStore):
        return candidate
    if isinstance(store, ArtifactStore):
        return store
    return None


async def save_update_compat(store: object, update: StateUpdate) -> None:
    """Persist a task update through ``save_update``, else the legacy ``save_task_update``."""
    await _resolve(store, "save_update", "save_task_update")(update)


async def list_updates_compat(
    store: object,
    session_id: str,
    *,
    task_id: str | None = None,
    since_id: str | None = None,
    limit: int = 500,
) -> list[StateUpdate]:
    """List task updates through ``list_updates``, else the legacy ``list_task_updates``."""
    method = _resolve(store, "list_updates", "list_task_updates")
    return list(await method(session_id, task_id=task_id, since_id=since_id, limit=limit))


async def save_task_compat(store: object, state: TaskState) -> None:
    """Upsert a task through ``save_task`` (there is no legacy name)."""
    await _resolve(store, "save_task")(state)


async def list_tasks_compat(store: object, session_id: str) -> list[TaskState]:
    """List the tasks of a session through ``list_tasks`` (there is no legacy name)."""
    return list(await _resolve(store, "list_tasks")(session_id))


async def save_steering_compat(store: object, event: SteeringEvent) -> None:
    """Persist a steering event through ``save_steering`` (there is no legacy name)."""
    await _resolve(store, "save_steering")(event)


async def list_steering_compat(
    store: object,
    session_id: str,
    *,
    task_id: str | None = None,
    since_id: str | None = None,
    limit: int = 500,
) -> list[SteeringEvent]:
    """List steering events through ``list_steering`` (there is no legacy name)."""
    method = _resolve(store, "list_steering")
    return list(await method(session_id, task_id=task_id, since_id=since_id, limit=limit))


async def save_planner_event_compat(store: object, trace_id: str, event: PlannerEvent) -> None:
    """Persist a planner event via ``save_planner_event``, else Playground ``save_event(trace_id, event)``.

    The legacy form is used only when the store's ``save_event`` requires two positional
    arguments (see :func:`is_legacy_save_event`); a core ``save_event(event)`` is never called.
    """
    method = _method(store, "save_planner_event")
    if method is not None:
        await method(trace_id, event)
        return
    legacy = _method(store, "save_event")
    if legacy is not None and is_legacy_save_event(legacy):
        await legacy(trace_id, event)
        return
    note = (
        " (its save_event is the core save_event(event), not the legacy save_event(trace_id, event))"
        if legacy is not None
        else ""
    )
    raise CapabilityError(
        f"StateStore {type(store).__qualname__} missing save_planner_event/save_event(trace_id, event){note}"
    )


async def list_planner_events_compat(store: object, trace_id: str) -> list[PlannerEvent]:
    """List the planner events of a trace through ``list_planner_events``, else the legacy ``get_events``."""
    return list(await _resolve(store, "list_planner_events", "get_events")(trace_id))


async def maybe_save_remote_binding(store: object | None, binding: RemoteBinding) -> None:
    """Persist a remote binding when a store is configured; a no-op for ``None``."""
    if store is None:
        return
    await _resolve(store, "save_remote_binding")(binding)


__all__ = [
    "get_artifact_store",
    "is_legacy_save_event",
    "list_planner_events_compat",
    "list_steering_compat",
    "list_tasks_compat",
    "list_updates_compat",
    "maybe_save_remote_binding",
    "save_planner_event_compat",
    "save_steering_compat",
    "save_task_compat",
    "save_update_compat",
]
