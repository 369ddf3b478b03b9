"""A backend that routes reads (read replicas) is told which reads must be current: those made
while writes are held in the dead-letter buffer, whose replay commits on its primary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backend import read_must_be_current
from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig, StaleConfig
from guarded.models import StoredEvent

from .support import fast_config


class RoutingStore(InMemoryStateStore):
    """Records, for each read, whether the guard marked it as one that must be current."""

    def __init__(self, *, routes_reads: bool) -> None:
        super().__init__()
        self.routes_reads = routes_reads
        self.down = False
        self.marks: list[bool] = []

    async def save_event(self, event: Any) -> None:
        if self.down:
            raise ConnectionError("primary down")
        await super().save_event(event)

    async def load_history(self, trace_id: str) -> list[Any]:
        self.marks.append(read_must_be_current())
        return await super().load_history(trace_id)

    async def list_updates(self, session_id: str, **kwargs: Any) -> list[Any]:
        self.marks.append(read_must_be_current())
        return await super().list_updates(session_id, **kwargs)


def event(trace: str) -> StoredEvent:
    return StoredEvent(trace, 1.0, "node_end", "node", "n", {})


@pytest.mark.asyncio
@pytest.mark.parametrize("routes_reads", [True, False])
async def test_reads_are_marked_while_writes_are_held(routes_reads: bool, tmp_path: Path) -> None:
    backend = RoutingStore(routes_reads=routes_reads)
    config = fast_config(
        dead_letter=DeadLetterConfig(path=str(tmp_path / "spill.db"), replay_rate=0.001),
        stale=StaleConfig(enabled=True),
    )
    store = guard(backend, config=config, registry=CollectorRegistry())
    await store.load_history("t")
    backend.down = True
    await store.save_event(event("t"))  # held
    assert (await controller(store).dead_letters.stats()).depth == 1  # type: ignore[union-attr]
    backend.down = False
    assert [item.trace_id for item in await store.load_history("t")] == ["t"]  # merged from the buffer
    await store.list_updates("s")
    assert backend.marks == [False, routes_reads, routes_reads]
    assert read_must_be_current() is False  # the mark does not outlive the read
    await controller(store).aclose()
