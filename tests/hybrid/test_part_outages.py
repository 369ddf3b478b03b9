"""One part of ``guard(HybridStateStore)`` down does not stop the other: each part has its own
breaker, bulkhead and dead letters.

* Redis stopped (SIGSTOP: every call hangs until its attempt times out): the record writes keep
  being acknowledged promptly and landing in PostgreSQL, the record part's breaker stays closed while
  the hot part's opens; the memory writes made meanwhile are held and land once Redis answers again.
* PostgreSQL stopped: pauses (and memory) keep being saved and consumed in the hot store, the hot
  part's breaker stays closed while the record part's opens; the record writes made meanwhile are
  acknowledged (held in the record part's spill file) and land once PostgreSQL is back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import BreakerState, controller, guard
from guarded.backends.hybrid_store import HOT, RECORD, HybridStateStore
from guarded.models import StateUpdate, StoredEvent, UpdateType
from guarded.testing.postgres import EmbeddedPostgres
from guarded.testing.redis import RedisServer
from tests.postgres.conftest import StoreFactory

from .conftest import HotFactory, outage_config, record_store

WAIT = 60.0
"""Seconds a condition has to come true on a loaded machine."""


def event(trace_id: str, index: int) -> StoredEvent:
    return StoredEvent(
        trace_id=trace_id,
        ts=float(index),
        kind="node_start",
        node_name="n",
        node_id=str(index),
        payload={"i": index},
    )


async def until(condition: Any, what: str, *, each: Any = None) -> None:
    """Poll ``condition()`` (running ``each()`` between polls) until it holds or :data:`WAIT` passes."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {WAIT}s"
        if each is not None:
            await each()
        else:
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_postgres_down_pauses_keep_working_and_record_writes_land_later(
    record_server: EmbeddedPostgres, make_hot: HotFactory, tmp_path: Path
) -> None:
    record = await record_store(record_server.dsn)
    hybrid = HybridStateStore(hot=await make_hot(), record=record)
    store = guard(
        hybrid, name="hybrid", registry=CollectorRegistry(), config=outage_config(tmp_path / "dlq.sqlite")
    )
    control = controller(store)
    hot, rec = control.parts[HOT], control.parts[RECORD]
    saved: list[StoredEvent] = []
    async with store:
        await store.save_event(event("t1", 0))
        saved.append(event("t1", 0))
        await asyncio.to_thread(record_server.stop)

        async def record_write() -> None:
            item = event("t1", len(saved))
            await store.save_event(item)  # acknowledged: held in the record part's spill file
            saved.append(item)

        await until(
            lambda: rec.breaker.state is BreakerState.OPEN,
            "the record part's breaker opens",
            each=record_write,
        )
        for index in range(30):
            token, payload = f"pause-{index}", {"step": index, "note": "awaiting approval"}
            await store.save_planner_state(token, payload)
            await store.save_memory_state(f"acme:u1:s{index}", {"turns": index})
            await record_write()
            assert await store.load_planner_state(token) == payload
            assert await store.load_planner_state(token) is None  # consumed once
            assert await store.load_memory_state(f"acme:u1:s{index}") == {"turns": index}
        assert hot.breaker.state is BreakerState.CLOSED
        hot_outcomes = {outcome for (_, outcome) in hot.stats()}
        assert hot_outcomes <= {"ok", "not_found"}, hot.stats()
        assert hot.stats()[("save_planner_state", "ok")] == 30
        assert rec.dead_letters is not None
        assert rec.dead_letters.depth > 0
        assert hot.dead_letters is not None
        assert hot.dead_letters.depth == 0

        await asyncio.to_thread(record_server.start)
        assert await control.drain(WAIT) == 0
        assert rec.dead_letters.depth == 0
        history = await store.load_history("t1")
        assert sorted(item.node_id for item in history) == sorted(item.node_id for item in saved)
    assert len(saved) > 30


@pytest.mark.asyncio
async def test_redis_down_record_writes_keep_being_acknowledged_and_landing(
    hot_server: RedisServer, make_hot: HotFactory, make_store: StoreFactory, tmp_path: Path
) -> None:
    hybrid = HybridStateStore(hot=await make_hot(url=hot_server.url), record=await make_store())
    store = guard(
        hybrid, name="hybrid", registry=CollectorRegistry(), config=outage_config(tmp_path / "dlq.sqlite")
    )
    control = controller(store)
    hot, rec = control.parts[HOT], control.parts[RECORD]
    record = rec.store
    async with store:
        await store.save_planner_state("before", {"step": 0})
        hot_server.pause()

        async def hot_writes() -> None:
            await asyncio.gather(
                *(store.save_memory_state(f"acme:u1:s{index}", {"turns": index}) for index in range(12))
            )

        await until(
            lambda: hot.breaker.state is BreakerState.OPEN, "the hot part's breaker opens", each=hot_writes
        )
        loop = asyncio.get_running_loop()
        slowest = 0.0
        for index in range(30):
            started = loop.time()
            await store.save_event(event("t1", index))
            await store.save_update(
                StateUpdate(
                    session_id="s1",
                    task_id="k1",
                    update_id=f"u{index}",
                    update_type=UpdateType.PROGRESS,
                    content=index,
                )
            )
            slowest = max(slowest, loop.time() - started)
            # Landed in PostgreSQL, read behind the guard's back while Redis is still stopped.
            assert len(await record.load_history("t1")) == index + 1
            assert len(await record.list_updates("s1")) == index + 1
        assert slowest < 1.0, f"a record write took {slowest:.2f}s while Redis was stopped"
        assert rec.breaker.state is BreakerState.CLOSED
        assert {outcome for (_, outcome) in rec.stats()} == {"ok"}, rec.stats()
        assert rec.dead_letters is not None
        assert rec.dead_letters.depth == 0
        assert hot.dead_letters is not None
        assert hot.dead_letters.depth > 0  # the memory writes, acknowledged and held

        hot_server.resume()
        assert await control.drain(WAIT) == 0
        assert await hot.store.load_memory_state("acme:u1:s11") == {"turns": 11}
        assert await store.load_planner_state("before") == {"step": 0}
