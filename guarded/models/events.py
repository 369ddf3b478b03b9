"""Core audit-log records: ``StoredEvent`` and ``RemoteBinding`` (spec 000, "Data Types")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

GLOBAL_TRACE_ID = "__global__"
"""Sentinel trace id for events saved with ``trace_id=None`` (spec 000, ``save_event`` contract)."""


class FlowEventLike(Protocol):
    """The attributes of PenguiFlow's ``FlowEvent`` that :meth:`StoredEvent.from_flow_event` reads."""

    @property
    def event_type(self) -> str: ...
    @property
    def ts(self) -> float: ...
    @property
    def node_name(self) -> str | None: ...
    @property
    def node_id(self) -> str | None: ...
    @property
    def trace_id(self) -> str | None: ...
    def to_payload(self) -> Mapping[str, Any]: ...


@dataclass(slots=True)
class StoredEvent:
    """A runtime event persisted by a state store.

    ``kind`` is an open set: stores must accept unknown kinds as opaque strings.
    ``trace_id`` may be ``None`` for global events.
    """

    trace_id: str | None
    ts: float
    kind: str
    node_name: str | None
    node_id: str | None
    payload: Mapping[str, Any]

    @classmethod
    def from_flow_event(cls, event: FlowEventLike) -> StoredEvent:
        """Build a stored event from a PenguiFlow ``FlowEvent`` (or anything shaped like one)."""
        return cls(
            trace_id=event.trace_id,
            ts=event.ts,
            kind=event.event_type,
            node_name=event.node_name,
            node_id=event.node_id,
            payload=event.to_payload(),
        )


@dataclass(slots=True)
class RemoteBinding:
    """Association between a trace and a remote A2A worker.

    The fields after ``agent_url`` are the ones PenguiFlow 3.11 added for conversation
    bindings (``find_binding`` / ``list_bindings`` / ``mark_binding_terminal``).
    """

    trace_id: str
    context_id: str | None
    task_id: str
    agent_url: str
    router_session_id: str | None = None
    remote_skill: str | None = None
    tenant_id: str | None = None
    user_id: str | None = None
    last_remote_task_id: str | None = None
    is_terminal: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)
