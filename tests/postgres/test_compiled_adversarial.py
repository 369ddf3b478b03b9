"""The layers run as steps in one coroutine, against real PostgreSQL: a read that succeeded while a
write of its key was held during the backend's answer, then an outage after the replay, must
answer as the same layers nested one coroutine each do (never older over newer). Run both ways
(``guarded.guard_core.build`` patched to ``tests.support.layers.nested_build``)."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backend import LOGICAL_TIMES
from guarded.backends.postgres import PostgresStateStore
from guarded.guard import controller, guard
from guarded.observability.call_stats import call_stats
from tests.support.layers import nested_build

pytestmark = pytest.mark.asyncio

guard_module = importlib.import_module("guarded.guard_core")


class GatedStore(PostgresStateStore):
    """The real store; a memory-state read waits for ``gate`` after the database answered, saves
    fail while ``saves_fail``, and every call fails while ``down``."""

    gate: asyncio.Event | None = None
    saves_fail = False
    down = False

    async def load_memory_state(self, key: str) -> Any:
        answer = await super().load_memory_state(key)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionResetError("injected outage")
        return answer

    async def save_memory_state(self, key: str, state: Any) -> None:
        if self.saves_fail or self.down:
            raise ConnectionResetError("injected outage")
        await super().save_memory_state(key, state)


async def scenario(pg_dsn: str, schema: str, spill: Path) -> Any:
    raw = await GatedStore.connect(pg_dsn, schema=schema)
    reader = await PostgresStateStore.connect(pg_dsn, schema=schema)
    registry = CollectorRegistry()
    store = guard(
        raw,
        name="pg-race",
        registry=registry,
        retry={"max_attempts": 1, "critical_max_attempts": 1},
        dead_letter={"path": str(spill)},
        batching=False,
    )
    try:
        async with store:
            await store.save_memory_state("k", {"version": 1})
            raw.gate = asyncio.Event()
            raw.saves_fail = True
            read = asyncio.ensure_future(store.load_memory_state("k"))
            await asyncio.sleep(0.05)  # the read has the database's answer, version 1, and waits
            await store.save_memory_state("k", {"version": 2})  # held
            raw.gate.set()
            during = await read
            raw.gate = None
            raw.saves_fail = False
            left = await controller(store).drain(5.0)
            in_database = await reader.load_memory_state("k")
            raw.down = True
            outage = await store.load_memory_state("k")
            raw.down = False
            logical_time = LOGICAL_TIMES.get()
    finally:
        await reader.close()
    return (
        during,
        left,
        in_database,
        outage,
        logical_time,
        sorted(call_stats(registry).counts("pg-race").items()),
    )


async def test_a_read_racing_a_held_write_then_an_outage_answers_as_the_chain(
    pg_dsn: str, schema_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(guard_module, "build", nested_build)
        chain = await scenario(pg_dsn, schema_name + "c", tmp_path / "chain.sqlite")
    compiled = await scenario(pg_dsn, schema_name + "p", tmp_path / "compiled.sqlite")
    assert chain[2] == {"version": 2}, chain
    assert chain[3] == {"version": 2}, "the outage serves the newest acknowledged state"
    assert compiled == chain
