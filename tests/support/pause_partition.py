"""Fault injection for the cross-worker pause tests: a real store whose pause calls fail with a
connection error while ``down`` (the worker cannot reach its server)."""

from __future__ import annotations

from typing import Any


class PausePartition:
    """Mix in before a real store class: ``class PartitionedStore(PausePartition, PostgresStateStore)``."""

    down = False

    def _reach(self) -> None:
        if self.down:
            raise ConnectionResetError("injected partition")

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        self._reach()
        await super().save_planner_state(token, payload)

    async def save_planner_states(self, items: Any) -> None:
        self._reach()
        await super().save_planner_states(items)

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        self._reach()
        return await super().load_planner_state(token)
