"""A separate process that opens a store and writes, for the multi-process tests.

``python -m tests.postgres._worker MODE DSN SCHEMA START_AT WORKER_ID``: waits until the Unix
time ``START_AT`` (so the processes start together), then runs ``MODE``:

* ``migrate``: connect (applying migrations) and save one event.
* ``write``: write the same keys as every other worker: events (single and bulk), updates,
  tasks with interleaved timestamps, memory state and bindings.
* ``consume``: load (consume) every one of the :data:`PAUSES` pauses the test saved, as every other
  worker does at the same time (even workers in order, odd ones in reverse), and print the tokens
  it was given as one JSON line. It connects before waiting for ``START_AT``, so the workers'
  consumes overlap from the first.

The store connects with ``pooler=$GUARDED_PG_POOLER`` (unset: the default mode).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.models import (
    RemoteBinding,
    StateUpdate,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)
from tests.support import records

EVENTS = 300
UPDATES = 200
TASK_WRITES = 40
PAUSES = 600
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def event(index: int) -> StoredEvent:
    return records.event(
        "shared-trace", index, ts=float(index % 50), kind="k", node_name=f"n{index}", node_id=None
    )


async def migrate(store: PostgresStateStore, worker: int) -> None:
    await store.save_event(StoredEvent("migrated", 1.0, "k", None, None, {"worker": worker}))


async def write(store: PostgresStateStore, worker: int) -> None:
    order = range(EVENTS) if worker % 2 == 0 else reversed(range(EVENTS))
    singles = [event(index) for index in order]
    for start in range(0, EVENTS, 50):
        await store.save_events(singles[start : start + 50])
        await asyncio.gather(*(store.save_event(item) for item in singles[start : start + 10]))
    for index in range(UPDATES):
        await store.save_update(
            StateUpdate(
                session_id="shared-session",
                task_id=f"task-{index % 3}",
                update_id=f"update-{index}",
                update_type=UpdateType.PROGRESS,
                content={"i": index},
            )
        )
    # Worker w writes the even or odd timestamps of one task: the newest (TASK_WRITES - 1) must win.
    for step in range(worker % 2, TASK_WRITES, 2):
        await store.save_task(
            TaskState(
                task_id="shared-task",
                session_id="shared-session",
                status=TaskStatus.RUNNING,
                task_type=TaskType.BACKGROUND,
                priority=step,
                context_snapshot=TaskContextSnapshot(session_id="shared-session", task_id="shared-task"),
                updated_at=T0 + timedelta(seconds=step),
            )
        )
        await store.save_memory_state("shared:memory", {"worker": worker, "step": step})
        await store.save_remote_binding(
            RemoteBinding(
                "shared-trace", None, "shared-task", f"http://worker-{worker}", router_session_id="r"
            )
        )


def pause_token(index: int) -> str:
    return f"pause-{index}"


async def consume(store: PostgresStateStore, worker: int) -> None:
    order = range(PAUSES) if worker % 2 == 0 else reversed(range(PAUSES))
    tokens = [pause_token(index) for index in order]
    given: list[str] = []
    for start in range(0, PAUSES, 10):  # ten consumes in flight at a time
        loaded = await asyncio.gather(
            *(store.load_planner_state(token) for token in tokens[start : start + 10])
        )
        given += [state["token"] for state in loaded if state is not None]
    print(json.dumps(given), flush=True)


async def main(mode: str, dsn: str, schema: str, start_at: float, worker: int) -> None:
    async def wait() -> None:
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    if mode != "consume":
        await wait()  # the connection (and its migration) is part of the race
    store = await PostgresStateStore.connect(
        dsn,
        schema=schema,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(min_size=1, max_size=4, pooler=os.environ.get("GUARDED_PG_POOLER")),
    )
    if mode == "consume":
        await wait()
    try:
        await {"migrate": migrate, "write": write, "consume": consume}[mode](store, worker)
    finally:
        await store.close()


if __name__ == "__main__":
    mode, dsn, schema, start_at, worker = sys.argv[1:6]
    asyncio.run(main(mode, dsn, schema, float(start_at), int(worker)))
