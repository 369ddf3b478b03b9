"""The tables of one :class:`~.store.PostgresStateStore`, each with the object that reads and
writes it (events, remote bindings, pauses, memory states, tasks, the two update streams,
trajectories, planner events and artifacts)."""

from __future__ import annotations

from dataclasses import dataclass

from guarded.codec import STATE_UPDATE, STEERING_EVENT, RecordTypes
from guarded.models import ArtifactRetentionConfig

from .artifact_store import PostgresArtifactStore
from .bindings import Bindings
from .connection import Database
from .event_log import Events
from .memory_state import MemoryStates
from .pauses import Pauses
from .planner_events import PlannerEvents
from .planner_trajectories import Trajectories
from .streams import Stream
from .task_states import Tasks


@dataclass(frozen=True, slots=True)
class Tables:
    """The table objects of one store, in one schema."""

    events: Events
    bindings: Bindings
    pauses: Pauses
    memory: MemoryStates
    tasks: Tasks
    updates: Stream
    steering: Stream
    trajectories: Trajectories
    planner_events: PlannerEvents
    artifacts: PostgresArtifactStore

    @classmethod
    def of(
        cls,
        db: Database,
        schema: str,
        types: RecordTypes,
        *,
        pause_ttl: float,
        consume_grace: float,
        artifact_retention: ArtifactRetentionConfig | None,
    ) -> Tables:
        return cls(
            events=Events(db, schema, types),
            bindings=Bindings(db, schema, types),
            pauses=Pauses(db, schema, ttl=pause_ttl, grace=consume_grace),
            memory=MemoryStates(db, schema),
            tasks=Tasks(db, schema, types),
            updates=Stream(
                db,
                schema,
                types,
                table="state_updates",
                id_field="update_id",
                type_field="update_type",
                codec=STATE_UPDATE,
            ),
            steering=Stream(
                db,
                schema,
                types,
                table="steering_events",
                id_field="event_id",
                type_field="event_type",
                codec=STEERING_EVENT,
            ),
            trajectories=Trajectories(db, schema),
            planner_events=PlannerEvents(db, schema, types),
            artifacts=PostgresArtifactStore(db, schema, artifact_retention, types),
        )


__all__ = ["Tables"]
