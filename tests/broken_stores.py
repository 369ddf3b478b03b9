"""Stores for the contract-suite and ``guarded check`` tests, importable as ``tests.broken_stores``.

``BrokenStore`` carries three classic bugs on top of the reference store; ``MinimalStore`` has
only the three required methods, done right. The ``make_*`` factories are what
``guarded check tests.broken_stores:make_...`` calls.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from guarded.backends.memory import InMemoryStateStore
from guarded.models import RemoteBinding, StateUpdate, StoredEvent

BROKEN_CONTRACTS = frozenset(
    {
        "planner_state.missing_token_none",
        "planner_state.consume_once",
        "core.history_ascending_ts",
        "core.history_same_ts_insertion_order",
        "bulk_events.ordered",
        "tasks.updates_since_id_exclusive",
    }
)
"""The contracts :class:`BrokenStore` must fail, and no others."""


class BrokenStore(InMemoryStateStore):
    """Returns ``{}`` for a missing pause token, history newest first, and an inclusive ``since_id``."""

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        return await super().load_planner_state(token) or {}

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        return list(reversed(await super().load_history(trace_id)))

    async def list_updates(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> Sequence[StateUpdate]:
        updates = list(await super().list_updates(session_id, limit=sys.maxsize))
        starts = [index for index, update in enumerate(updates) if update.update_id == since_id]
        if starts:
            updates = updates[starts[0] :]
        if task_id is not None:
            updates = [update for update in updates if update.task_id == task_id]
        return updates[-limit:]


class MinimalStore:
    """Only ``save_event``, ``load_history`` and ``save_remote_binding``, each per the spec."""

    def __init__(self) -> None:
        self._events: dict[str, list[tuple[float, int, StoredEvent]]] = {}
        self._fingerprints: set[str] = set()
        self._bindings: dict[tuple[str, str | None, str], RemoteBinding] = {}
        self._seq = 0

    async def save_event(self, event: StoredEvent) -> None:
        trace_id = event.trace_id or "__global__"
        fingerprint = json.dumps(
            [trace_id, dataclasses.astuple(event)[1:5], dict(event.payload)], sort_keys=True
        )
        if fingerprint in self._fingerprints:
            return
        self._fingerprints.add(fingerprint)
        self._seq += 1
        self._events.setdefault(trace_id, []).append((event.ts, self._seq, event))

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        return [event for _, _, event in sorted(self._events.get(trace_id, []), key=lambda item: item[:2])]

    async def save_remote_binding(self, binding: RemoteBinding) -> None:
        self._bindings[(binding.trace_id, binding.context_id, binding.task_id)] = binding


class ClosingStore(InMemoryStateStore):
    """Says on stderr when it is closed, so a subprocess test can see ``guarded check`` close it."""

    async def aclose(self) -> None:
        print("ClosingStore: aclose() called", file=sys.stderr)


class SyncClosingStore(InMemoryStateStore):
    """Like :class:`ClosingStore` with a synchronous ``close()``."""

    def close(self) -> None:
        print("SyncClosingStore: close() called", file=sys.stderr)


def make_broken_store() -> BrokenStore:
    return BrokenStore()


def make_memory_store() -> InMemoryStateStore:
    return InMemoryStateStore()


async def make_memory_store_async() -> InMemoryStateStore:
    return InMemoryStateStore()


def make_minimal_store() -> MinimalStore:
    return MinimalStore()


async def make_closing_store() -> ClosingStore:
    return ClosingStore()


def make_sync_closing_store() -> SyncClosingStore:
    return SyncClosingStore()


def make_failing_factory() -> InMemoryStateStore:
    raise ConnectionRefusedError("database is down")


NOT_CALLABLE = 42
