"""Writes made while ``aclose()`` runs, and after it returned, are never acknowledged and lost.

A write that reaches the dead-letter path of a closing or closed guard can be kept nowhere: it is
refused (outcome ``rejected``, an ERROR record; :class:`~guarded.errors.GuardClosedError` in
strict mode), never answered as if it were kept. Found by an adversarial run: writers kept writing
through a close with a healthy database and thousands of writes that returned were in neither the
database nor the spill file.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.errors import GuardClosedError
from guarded.guard import controller, guard
from guarded.models import StateUpdate, StoredEvent, UpdateType
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector, strict
from tests.postgres._outages import open_store
from tests.support.metrics import calls

WRITERS = 30


def _event(trace_id: str, index: int) -> StoredEvent:
    return StoredEvent(trace_id, float(index), "node_end", "node", f"n{index}", {"i": index})


async def write_through_close(
    store: Any, writers: int, *, before: float, after: float
) -> tuple[list[tuple[str, str]], int, int]:
    """``writers`` tasks call ``save_event`` in a loop for ``before`` seconds, through
    ``aclose()``, and for ``after`` seconds more. Returns the calls that returned (trace, node),
    how many were refused with ``GuardClosedError``, and how many returned before the close."""
    acknowledged: list[tuple[str, str]] = []
    refused = 0
    stop = asyncio.Event()

    async def writer(number: int) -> None:
        nonlocal refused
        index = 0
        while not stop.is_set():
            try:
                await store.save_event(_event(f"t{number}", index))
            except GuardClosedError:
                refused += 1
            else:
                acknowledged.append((f"t{number}", f"n{index}"))
            index += 1
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(writer(number)) for number in range(writers)]
    await asyncio.sleep(before)
    during = len(acknowledged)
    await controller(store).aclose()
    await asyncio.sleep(after)
    stop.set()
    await asyncio.gather(*tasks)
    return acknowledged, refused, during


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_a_batched_write_after_close_is_refused_not_answered_as_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    config = GuardConfig(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite")))
    store = guard(InMemoryStateStore(), name="closed", config=config, registry=registry)
    await store.save_event(_event("before", 0))
    await controller(store).aclose()
    update = StateUpdate(
        session_id="s", task_id="t", update_id="u1", update_type=UpdateType.PROGRESS, content={}
    )
    with caplog.at_level(logging.ERROR, logger="guarded"):
        assert await store.save_event(_event("after", 1)) is None
        assert await store.save_update(update) is None
    assert calls(registry, "save_event", "rejected", store="closed") == 1
    assert calls(registry, "save_update", "rejected", store="closed") == 1
    assert calls(registry, "save_event", "fallback", store="closed") == 0
    refusals = [record for record in caplog.records if "GuardClosedError" in record.getMessage()]
    assert refusals
    assert all(record.levelno == logging.ERROR for record in refusals)


@pytest.mark.asyncio
async def test_in_strict_mode_a_write_after_close_raises(tmp_path: Path) -> None:
    config = GuardConfig(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite")))
    with strict():
        store = guard(InMemoryStateStore(), name="closed-strict", config=config, registry=CollectorRegistry())
    await store.save_event(_event("before", 0))
    await controller(store).aclose()
    with pytest.raises(GuardClosedError, match="closed"):
        await store.save_event(_event("after", 1))


@pytest.mark.asyncio
async def test_writes_racing_a_close_are_kept_or_refused_never_lost(pg_dsn: str, schema_name: str) -> None:
    """30 writers keep calling ``save_event`` while ``aclose()`` runs and after it returned; a
    second guard on the same spill path then delivers what the first left. Every call that
    returned (strict mode: a refused one raises) is in the database exactly once."""
    with strict():
        store = guard(await open_store(pg_dsn, schema_name), name="racing", registry=CollectorRegistry())
    acknowledged, refused, during = await write_through_close(store, WRITERS, before=0.5, after=0.3)

    second = guard(await open_store(pg_dsn, schema_name), name="racing", registry=CollectorRegistry())
    assert await controller(second).drain(30) == 0
    await controller(second).aclose()
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            f'SELECT trace_id, node_id, count(*) AS n FROM "{schema_name}".flow_events GROUP BY 1, 2'
        )
    finally:
        await conn.close()
    found = {(row["trace_id"], row["node_id"]): row["n"] for row in rows}
    missing = [key for key in acknowledged if key not in found]
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged writes lost, e.g. {missing[:3]}"
    assert all(count == 1 for count in found.values())
    assert during > 0  # writes were made before the close ...
    assert refused > 0  # ... and refused after it


@pytest.mark.asyncio
async def test_an_artifact_put_the_backend_fails_after_close_is_refused(tmp_path: Path) -> None:
    """The artifact layer kept a put it could not dead-letter in this process only and answered
    its reference; after close that reference pointed nowhere once the process ended."""
    backend = FaultyStore(InMemoryStateStore(), FaultPlan())
    config = GuardConfig(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite")))
    registry = CollectorRegistry()
    with strict():
        store = guard(backend, name="closed-artifacts", config=config, registry=registry)
    await store.artifact_store.put_bytes(b"before")
    await controller(store).aclose()
    fault_injector(backend).plan = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
    with pytest.raises(GuardClosedError):
        await store.artifact_store.put_bytes(b"after the close")
    assert calls(registry, "artifact_store.put_bytes", "rejected", store="closed-artifacts") == 1


@pytest.mark.asyncio
async def test_with_a_memory_only_buffer_writes_racing_a_close_land_or_are_refused() -> None:
    """A memory-only buffer (``path=None``): a batched write arriving once the batcher closed was
    held in memory and dropped by the close a moment later, though it returned normally and the
    backend was healthy (40 of 60 in the adversarial run). Now it is refused."""
    backend = InMemoryStateStore()
    config = GuardConfig(dead_letter=DeadLetterConfig(path=None))
    with strict():
        store = guard(backend, name="memory-only", config=config, registry=CollectorRegistry())
    acknowledged, refused, _ = await write_through_close(store, 20, before=0.2, after=0.1)
    found = {
        (event.trace_id, event.node_id)
        for number in range(20)
        for event in await backend.load_history(f"t{number}")
    }
    missing = [key for key in acknowledged if key not in found]
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged writes lost, e.g. {missing[:3]}"
    assert refused > 0


@pytest.mark.lenient
@pytest.mark.asyncio
@pytest.mark.parametrize("resumed", ["while closing", "after close"])
async def test_a_held_pause_is_resumed_once_across_a_close(tmp_path: Path, resumed: str) -> None:
    """A pause held in the spill file, resumed through the guard while ``aclose()`` runs (the
    backend slow to answer the consume) or after it returned, then through the next guard on the
    path: exactly one resume gets it. The closed buffer kept the row the first resume was handed,
    and the next guard handed it out again (second adversarial run)."""
    backend = FaultyStore(InMemoryStateStore(), FaultPlan())
    config = GuardConfig(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite"), drain_timeout=0.5))
    first = guard(backend, name="pauses", config=config, registry=CollectorRegistry())
    await first.save_memory_state("warm", {})
    down = Fault.error_before(ConnectionRefusedError)
    fault_injector(backend).plan = FaultPlan.always(
        down, methods=["save_planner_state", "save_planner_states"]
    )
    await first.save_planner_state("tok", {"v": "pause"})
    if resumed == "while closing":
        fault_injector(backend).plan = FaultPlan.script(
            {"load_planner_state": [Fault.delay(1.0)]}, default=down
        )
        resume = asyncio.create_task(first.load_planner_state("tok"))
        await asyncio.sleep(0.1)
        await controller(first).aclose()
        answers = [await resume]
    else:
        await controller(first).aclose()
        fault_injector(backend).plan = FaultPlan()
        answers = [await first.load_planner_state("tok")]
    fault_injector(backend).plan = FaultPlan()
    second = guard(backend, name="pauses", config=config, registry=CollectorRegistry())
    try:
        assert await controller(second).drain(5) == 0
        answers.append(await second.load_planner_state("tok"))
    finally:
        await controller(second).aclose()
    assert answers.count({"v": "pause"}) == 1, answers
