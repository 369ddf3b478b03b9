"""Helpers of the bulkhead tests: a slow in-memory backend, a quickly tripping breaker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from guarded.backends.memory import InMemoryStateStore
from guarded.config import BreakerConfig
from guarded.models import StoredEvent
from tests.support import records


class SlowStore(InMemoryStateStore):
    """An in-memory store whose calls take ``delay`` seconds in the backend and which declares
    ``max_concurrency``; it counts how many calls are in it at once. It stands for a database, so
    it declares itself durable across processes (its guard spills to a file)."""

    durable_across_processes = True

    def __init__(self, *, delay: float = 0.0, max_concurrency: int | None = None) -> None:
        super().__init__()
        self.delay = delay
        self.max_concurrency = max_concurrency
        self.active = 0
        self.peak = 0
        self.calls = 0
        self.down = False
        """While set, every call fails (after its delay) with ``ConnectionRefusedError``."""

    @contextlib.asynccontextmanager
    async def _in_backend(self) -> AsyncIterator[None]:
        self.calls += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
            if self.down:
                raise ConnectionRefusedError("the scripted backend is down")
            yield
        finally:
            self.active -= 1

    async def save_event(self, event: StoredEvent) -> None:
        async with self._in_backend():
            await super().save_event(event)

    async def save_events(self, events: Sequence[StoredEvent]) -> None:
        async with self._in_backend():
            await super().save_events(events)

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        async with self._in_backend():
            return await super().load_history(trace_id)

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        async with self._in_backend():
            await super().save_memory_state(key, state)

    async def save_memory_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        async with self._in_backend():
            await super().save_memory_states(items)

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        async with self._in_backend():
            return await super().load_memory_state(key)


def breaker_config(slow_call_duration: float) -> BreakerConfig:
    """A breaker that trips quickly: 5 calls are enough, half of them failing or slow."""
    return BreakerConfig(
        window_size=20,
        minimum_calls=5,
        failure_rate_threshold=0.5,
        slow_call_rate_threshold=0.5,
        slow_call_duration=slow_call_duration,
        open_duration=30.0,
    )


def event(trace: str, index: int) -> StoredEvent:
    return records.event(trace, index, base=0.0)
