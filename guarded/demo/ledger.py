"""What the demo's workload was told: every acknowledged write, by kind and identity.

A write is *acknowledged* when the guarded store returned from it. The verdict later looks up
each one in the database (:mod:`guarded.demo.readback`). Appends are identified by their natural
key and keep their expected content; last-write-wins kinds keep every acknowledged value of a
key in call order, so the verdict can tell "superseded by a newer write" from "overwritten by an
older one". Pause tokens also record what their resume returned (consume once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class WriteKind(str, Enum):
    """The kinds of write the verdict checks, one per table."""

    EVENT = "event"
    UPDATE = "update"
    STEERING = "steering"
    PLANNER_EVENT = "planner_event"
    TASK = "task"
    MEMORY = "memory"
    PAUSE = "pause"
    TRAJECTORY = "trajectory"
    ARTIFACT = "artifact"


APPEND_KINDS = (WriteKind.EVENT, WriteKind.UPDATE, WriteKind.STEERING, WriteKind.PLANNER_EVENT)
"""Kinds identified by a natural key, one acknowledged write each."""
UPSERT_KINDS = (WriteKind.TASK, WriteKind.MEMORY, WriteKind.TRAJECTORY)
"""Last-write-wins kinds: the database must hold the last acknowledged value of each key."""

EventKey = tuple[str, str, str | None, float]
"""A runtime event's identity: (trace id, kind, node id, ts)."""


@dataclass(frozen=True, slots=True)
class BadWrite:
    """A write the demo sent knowing it can never be stored.

    ``expect`` is ``"parked"`` (kept in the dead-letter buffer with its reason) or ``"rejected"``
    (refused as bad data, outcome ``rejected``: an artifact put is never parked).
    """

    label: str
    method: str
    expect: str


@dataclass
class Ledger:
    """Everything the workload sent and was acknowledged, for the verdict."""

    appends: dict[WriteKind, dict[Hashable, Any]] = field(
        default_factory=lambda: {kind: {} for kind in APPEND_KINDS}
    )
    """Per append kind: identity -> expected stored content."""
    upserts: dict[WriteKind, dict[Hashable, list[Any]]] = field(
        default_factory=lambda: {kind: {} for kind in UPSERT_KINDS}
    )
    """Per upsert kind: key -> acknowledged values in call order."""
    task_sessions: dict[str, str] = field(default_factory=dict)
    """Task id -> its session (a store that lists tasks by session is read back by it)."""
    pauses: dict[str, Any] = field(default_factory=dict)
    """Pause token -> the payload acknowledged by ``save_planner_state``."""
    resumed: dict[str, Any] = field(default_factory=dict)
    """Pause token -> the payload ``load_planner_state`` returned for it."""
    resume_retries: int = 0
    """Resumes that found nothing and were tried again later."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Artifact id -> sha256 of the content, for every ``put_*`` that returned a reference."""
    bad: list[BadWrite] = field(default_factory=list)
    nul_writes: int = 0
    """Acknowledged writes whose strings contain NUL (valid; must be stored exactly)."""
    penguiflow_events: int = 0
    """Acknowledged events that PenguiFlow itself saved."""
    penguiflow_runs: int = 0
    escaped: Counter[str] = field(default_factory=Counter)
    """Exceptions that escaped the guarded store, by type (must stay empty)."""
    reads: Counter[str] = field(default_factory=Counter)
    """Read calls made, by method."""

    def event(self, key: EventKey, payload: Any) -> None:
        self.appends[WriteKind.EVENT][key] = payload

    def append(self, kind: WriteKind, key: Hashable, content: Any) -> None:
        self.appends[kind][key] = content

    def upsert(self, kind: WriteKind, key: Hashable, value: Any) -> None:
        self.upserts[kind].setdefault(key, []).append(value)

    def acknowledged(self) -> dict[WriteKind, int]:
        """Acknowledged writes by kind."""
        counts = {kind: len(found) for kind, found in self.appends.items()}
        counts.update({kind: sum(map(len, keys.values())) for kind, keys in self.upserts.items()})
        counts[WriteKind.PAUSE] = len(self.pauses)
        counts[WriteKind.ARTIFACT] = len(self.artifacts)
        return counts


__all__ = ["APPEND_KINDS", "UPSERT_KINDS", "BadWrite", "EventKey", "Ledger", "WriteKind"]
