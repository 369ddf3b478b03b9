"""Every data type of the StateStore protocol (spec 000, "Data Types"; PenguiFlow 3.11 models).

Field names, types and defaults follow the specification and ``penguiflow`` 3.11, so objects of
either are interchangeable; :mod:`guarded.codec` turns any of them into JSON and back.
"""

from .artifacts import ArtifactRef, ArtifactRetentionConfig, ArtifactScope, ArtifactStore
from .events import GLOBAL_TRACE_ID, FlowEventLike, RemoteBinding, StoredEvent
from .memory_health_states import MemoryHealth
from .planner import PlannerEvent, SerialisableTrajectory, Trajectory
from .steering_events import SteeringEvent, SteeringEventType
from .task_telemetry import (
    TaskMode,
    TaskOutcome,
    TaskTelemetryEvent,
    TaskTelemetryEventType,
    TaskTelemetrySink,
)
from .tasks import (
    MergeStrategy,
    StateUpdate,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)

__all__ = [
    "GLOBAL_TRACE_ID",
    "ArtifactRef",
    "ArtifactRetentionConfig",
    "ArtifactScope",
    "ArtifactStore",
    "FlowEventLike",
    "MemoryHealth",
    "MergeStrategy",
    "PlannerEvent",
    "RemoteBinding",
    "SerialisableTrajectory",
    "StateUpdate",
    "SteeringEvent",
    "SteeringEventType",
    "StoredEvent",
    "TaskContextSnapshot",
    "TaskMode",
    "TaskOutcome",
    "TaskState",
    "TaskStatus",
    "TaskTelemetryEvent",
    "TaskTelemetryEventType",
    "TaskTelemetrySink",
    "TaskType",
    "Trajectory",
    "UpdateType",
]
