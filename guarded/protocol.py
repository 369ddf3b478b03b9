"""The StateStore protocol and its optional capabilities (spec 000 "Protocol Definition", spec 001).

Only ``save_event``, ``load_history`` and ``save_remote_binding`` are required. Everything else
is a duck-typed capability that PenguiFlow detects with ``hasattr`` / ``getattr``; each has a
``runtime_checkable`` protocol here so ``isinstance(store, SupportsTasks)`` answers the question.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import CapabilityError
from .models import (
    ArtifactStore,
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    StoredEvent,
    TaskState,
    Trajectory,
)


@runtime_checkable
class StateStore(Protocol):
    """The required core: the runtime audit log and remote bindings."""

    async def save_event(self, event: StoredEvent) -> None:
        """Persist a runtime event. Must be idempotent: retries may save the same event again."""
        ...

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        """Events of a trace in ascending ``ts`` order (ties by insertion); ``[]`` for an unknown trace."""
        ...

    async def save_remote_binding(self, binding: RemoteBinding) -> None:
        """Upsert the binding of a trace to a remote worker. Must be idempotent."""
        ...


@runtime_checkable
class SupportsPlannerState(Protocol):
    """Planner pause/resume (OAuth, human-in-the-loop)."""

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        """Persist the pause payload under ``token`` (idempotent; should expire, 1 hour recommended)."""
        ...

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        """Return and consume the payload; ``None`` (never ``{}``) when missing or expired."""
        ...


@runtime_checkable
class SupportsMemoryState(Protocol):
    """Short-term memory persistence, keyed ``tenant:user:session``."""

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        """Upsert the memory state for ``key``."""
        ...

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        """The exact state saved for ``key``, or ``None``."""
        ...


@runtime_checkable
class SupportsMemoryKeys(Protocol):
    """Listing the memory keys of a session: what lets a snapshot capture every memory state of
    it without being told the keys (:func:`guarded.snapshots.capture`)."""

    async def list_memory_keys(self, session_id: str) -> Sequence[str]:
        """Every key with a memory state that ends with ``:{session_id}`` (spec 003's
        ``tenant:user:session``, and any other ``...:{session_id}`` key), sorted; ``[]`` when none."""
        ...


@runtime_checkable
class SupportsTasks(Protocol):
    """Task lifecycle and streaming updates for sessions."""

    async def save_task(self, state: TaskState) -> None:
        """Upsert a task by ``task_id``."""
        ...

    async def list_tasks(self, session_id: str) -> Sequence[TaskState]:
        """All tasks of a session (any order); ``[]`` when none."""
        ...

    async def save_update(self, update: StateUpdate) -> None:
        """Append an update; idempotent by ``update_id``."""
        ...

    async def list_updates(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> Sequence[StateUpdate]:
        """Updates oldest first; ``since_id`` is an exclusive cursor, an unknown cursor means none."""
        ...


@runtime_checkable
class SupportsSteering(Protocol):
    """Steering (user intervention) events; payloads persisted sanitized."""

    async def save_steering(self, event: SteeringEvent) -> None:
        """Append a steering event, sanitized."""
        ...

    async def list_steering(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> Sequence[SteeringEvent]:
        """Steering events oldest first with the same cursor rules as ``list_updates``."""
        ...


@runtime_checkable
class SupportsTrajectories(Protocol):
    """Planner trajectories for replay and the Playground UI."""

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Trajectory) -> None:
        """Upsert the trajectory of a trace."""
        ...

    async def get_trajectory(self, trace_id: str, session_id: str) -> Trajectory | None:
        """The trajectory, or ``None`` when missing or saved under another session."""
        ...

    async def list_traces(self, session_id: str, limit: int = 50) -> list[str]:
        """Trace ids of the session, most recently saved first."""
        ...


@runtime_checkable
class SupportsPlannerEvents(Protocol):
    """Planner/tool streaming events (a separate channel from ``save_event``)."""

    async def save_planner_event(self, trace_id: str, event: PlannerEvent) -> None:
        """Append a planner event."""
        ...

    async def list_planner_events(self, trace_id: str) -> list[PlannerEvent]:
        """Planner events of a trace in emission order."""
        ...


@runtime_checkable
class SupportsArtifacts(Protocol):
    """Exposes an artifact store for binary and large-text outputs."""

    @property
    def artifact_store(self) -> ArtifactStore | None:
        """The artifact store, or ``None`` when not configured."""
        ...


@runtime_checkable
class SupportsConversationBindings(Protocol):
    """PenguiFlow 3.11 conversation bindings: route follow-up turns to the same remote task."""

    async def find_binding(
        self,
        *,
        router_session_id: str,
        agent_url: str,
        remote_skill: str,
        tenant_id: str | None = None,
        user_id: str | None = None,
    ) -> RemoteBinding | None:
        """The latest non-terminal binding with these coordinates, or ``None``."""
        ...

    async def list_bindings(self, *, router_session_id: str) -> Sequence[RemoteBinding]:
        """All bindings of a router session."""
        ...

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        """Mark a binding terminal so it is never reused; a no-op for an unknown binding."""
        ...


@runtime_checkable
class SupportsBulkEvents(Protocol):
    """Bulk form of ``save_event``: one round trip for many events, same idempotency."""

    async def save_events(self, events: Sequence[StoredEvent]) -> None:
        """Persist every event of ``events``; duplicates are ignored as in ``save_event``."""
        ...


@dataclass(frozen=True, slots=True)
class Capability:
    """A named capability: the protocol that describes it and the methods it needs."""

    name: str
    protocol: type[Any]
    methods: tuple[str, ...]
    required: bool = False


CAPABILITIES: tuple[Capability, ...] = (
    Capability("core", StateStore, ("save_event", "load_history", "save_remote_binding"), required=True),
    Capability("planner_state", SupportsPlannerState, ("save_planner_state", "load_planner_state")),
    Capability("memory_state", SupportsMemoryState, ("save_memory_state", "load_memory_state")),
    Capability("memory_keys", SupportsMemoryKeys, ("list_memory_keys",)),
    Capability("tasks", SupportsTasks, ("save_task", "list_tasks", "save_update", "list_updates")),
    Capability("steering", SupportsSteering, ("save_steering", "list_steering")),
    Capability("trajectories", SupportsTrajectories, ("save_trajectory", "get_trajectory", "list_traces")),
    Capability("planner_events", SupportsPlannerEvents, ("save_planner_event", "list_planner_events")),
    Capability("artifacts", SupportsArtifacts, ("artifact_store",)),
    Capability(
        "conversation_bindings",
        SupportsConversationBindings,
        ("find_binding", "list_bindings", "mark_binding_terminal"),
    ),
    Capability("bulk_events", SupportsBulkEvents, ("save_events",)),
)
"""Every capability, in the order reports list them."""

LEGACY_ALIASES: dict[str, str] = {
    "save_task_update": "save_update",
    "list_task_updates": "list_updates",
    "get_events": "list_planner_events",
}
"""Legacy method names (spec 000 "Compatibility Adapters") and the method each stands for."""

LEGACY_NAMES: dict[str, tuple[str, ...]] = {
    method: tuple(alias for alias, target in LEGACY_ALIASES.items() if target == method)
    for method in set(LEGACY_ALIASES.values())
}
"""The legacy names of each method that has some: what an older store may answer it by."""


def missing_capabilities(store: object, methods: Sequence[str]) -> list[str]:
    """The names in ``methods`` that ``store`` lacks."""
    return [method for method in methods if not hasattr(store, method)]


def require_capabilities(store: object, *, feature: str, methods: Sequence[str]) -> None:
    """Fail fast with :class:`~guarded.errors.CapabilityError` (a ``TypeError``) when methods are missing."""
    missing = missing_capabilities(store, methods)
    if missing:
        raise CapabilityError(f"StateStore missing {missing} required for feature={feature}")


@dataclass(frozen=True, slots=True)
class CapabilityStatus:
    """Whether one capability is offered, and what is missing when it is only partly there."""

    capability: Capability
    missing: tuple[str, ...]

    @property
    def offered(self) -> bool:
        return not self.missing

    @property
    def partial(self) -> bool:
        return bool(self.missing) and len(self.missing) < len(self.capability.methods)


@dataclass(frozen=True, slots=True)
class CapabilityReport:
    """Which capabilities a store offers; ``str(report)`` renders a readable table."""

    store_type: str
    statuses: tuple[CapabilityStatus, ...]
    legacy_aliases: tuple[str, ...]
    artifact_store_type: str | None

    @property
    def offered(self) -> list[str]:
        """Names of the capabilities the store offers in full."""
        return [status.capability.name for status in self.statuses if status.offered]

    @property
    def is_state_store(self) -> bool:
        """Whether the required core methods are all there."""
        return all(status.offered for status in self.statuses if status.capability.required)

    def __contains__(self, name: object) -> bool:
        return name in self.offered

    def __str__(self) -> str:
        lines = [f"capabilities of {self.store_type}:"]
        width = max(len(status.capability.name) for status in self.statuses)
        for status in self.statuses:
            cap = status.capability
            if status.offered:
                mark, note = "yes", ", ".join(cap.methods)
            elif status.partial:
                mark, note = "PARTIAL", "missing " + ", ".join(status.missing)
            else:
                mark, note = "no", "not offered"
            if cap.required and not status.offered:
                mark += " (REQUIRED)"
            lines.append(f"  {cap.name:<{width}}  {mark:<8} {note}")
        if self.artifact_store_type:
            lines.append(f"  artifact store: {self.artifact_store_type}")
        if self.legacy_aliases:
            lines.append("  legacy aliases: " + ", ".join(self.legacy_aliases))
        return "\n".join(lines)


def capabilities(store: object) -> CapabilityReport:
    """Report which capabilities ``store`` offers, detected the way PenguiFlow does (``hasattr``)."""
    statuses = tuple(
        CapabilityStatus(capability, tuple(missing_capabilities(store, capability.methods)))
        for capability in CAPABILITIES
    )
    artifact_store = getattr(store, "artifact_store", None)
    return CapabilityReport(
        store_type=f"{type(store).__module__}.{type(store).__qualname__}",
        statuses=statuses,
        legacy_aliases=tuple(name for name in LEGACY_ALIASES if hasattr(store, name)),
        artifact_store_type=type(artifact_store).__qualname__ if artifact_store is not None else None,
    )


@functools.cache
def protocol_signatures() -> Mapping[str, inspect.Signature]:
    """The signatures (without ``self``) of the methods of the StateStore protocol and its
    capabilities, and of the ``ArtifactStore``; legacy aliases as their targets."""
    classes: list[type] = [ArtifactStore]
    classes.extend(
        found for found in globals().values() if isinstance(found, type) and found.__module__ == __name__
    )
    found: dict[str, inspect.Signature] = {}
    for cls in classes:
        for name, member in vars(cls).items():
            if name.startswith("_") or not inspect.iscoroutinefunction(member):
                continue
            signature = inspect.signature(member)
            parameters = list(signature.parameters.values())[1:]
            found.setdefault(name, signature.replace(parameters=parameters))
    for alias, target in LEGACY_ALIASES.items():
        if target in found:
            found.setdefault(alias, found[target])
    return found


def protocol_signature(name: str) -> inspect.Signature | None:
    """The protocol's signature of method ``name`` (see :func:`protocol_signatures`), or ``None``
    for a method the protocols do not define."""
    found: inspect.Signature | None = protocol_signatures().get(name)
    return found


def own_signature(method: object) -> inspect.Signature | None:
    """``method``'s signature, unless it has none or takes anything (``*args`` and ``**kwargs``:
    a wrapper or a proxy, whose signature says nothing of what the call needs)."""
    if method is None or not callable(method):
        return None
    try:
        # The signature of what is called: a decorator's wrapper may supply arguments itself
        # (a connection, a tenant), so the wrapped function's parameters are not the caller's.
        signature = inspect.signature(method, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    kinds = {parameter.kind for parameter in signature.parameters.values()}
    if inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.VAR_KEYWORD in kinds:
        return None
    return signature


__all__ = [
    "CAPABILITIES",
    "LEGACY_ALIASES",
    "LEGACY_NAMES",
    "Capability",
    "CapabilityReport",
    "CapabilityStatus",
    "StateStore",
    "SupportsArtifacts",
    "SupportsBulkEvents",
    "SupportsConversationBindings",
    "SupportsMemoryKeys",
    "SupportsMemoryState",
    "SupportsPlannerEvents",
    "SupportsPlannerState",
    "SupportsSteering",
    "SupportsTasks",
    "SupportsTrajectories",
    "capabilities",
    "missing_capabilities",
    "require_capabilities",
]
