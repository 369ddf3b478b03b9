"""Planner records: ``PlannerEvent`` and the opaque trajectory type (spec 000, ``planner_events`` table)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, runtime_checkable


@dataclass(frozen=True, slots=True)
class PlannerEvent:
    """A structured planner/tool event (``stream_chunk``, ``llm_call``, ``step_complete`` ...).

    Field for field the spec's ``planner_events`` table, in PenguiFlow's order, so positional
    construction matches ``penguiflow.planner.PlannerEvent``.
    """

    event_type: str
    ts: float
    trajectory_step: int | None = None
    thought: str | None = None
    node_name: str | None = None
    latency_ms: float | None = None
    token_estimate: int | None = None
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class SerialisableTrajectory(Protocol):
    """A trajectory object that knows its wire form, like PenguiFlow's ``Trajectory``."""

    def serialise(self) -> dict[str, Any]: ...

    @classmethod
    def from_serialised(cls, payload: Mapping[str, Any]) -> Self: ...


Trajectory = Mapping[str, Any] | SerialisableTrajectory
"""Trajectories are opaque to stores: a JSON mapping, or an object with ``serialise()`` /
``from_serialised()``. See :mod:`guarded.codec.trajectories` for how each is persisted."""
