"""Reading the outage workload of tests/postgres/_outages.py back through a store's own reads.

The workload (:func:`tests.postgres._outages.run_workers`) and its ledger of acknowledged writes
are the PostgreSQL suite's; :func:`read_back_through` reads what a store holds for that workload
into the same :class:`~tests.postgres._outages.Ledger` shape, through the store's public read
methods rather than its tables, so it serves any backend (a Redis server, a Redis Cluster).
Compare with :func:`tests.postgres._outages.differences`: appends as multisets (a duplicate
shows), upserts as the last value per key.

Pauses are read with ``load_planner_state``, which consumes them: read back once, at the end.
"""

from __future__ import annotations

from typing import Any

from tests.postgres._outages import KINDS, Ledger


def _plain(value: Any) -> Any:
    serialise = getattr(value, "serialise", None)
    return serialise() if callable(serialise) else value


async def read_back_through(store: Any, *, workers: int, per_worker: int) -> Ledger:
    """What ``store`` holds for the ids ``workers`` workers of ``per_worker`` writes each use."""
    found = Ledger()
    for worker in range(workers):
        trace, session = f"trace-{worker}", f"sess-{worker}"
        for event in await store.load_history(trace):
            found.events[(trace, event.node_id)] += 1
        for update in await store.list_updates(session, limit=0):
            found.updates[(session, update.update_id)] += 1
        for planner_event in await store.list_planner_events(trace):
            found.planner_events[(trace, float(planner_event.ts))] += 1
        for steering in await store.list_steering(session, limit=0):
            found.steering[(session, steering.event_id)] += 1
        for task in await store.list_tasks(session):
            found.tasks[task.task_id] = (task.session_id, task.priority)
        for slot in range(min(2, per_worker)):
            memory_key, token = f"mem-{worker}-{slot}", f"pause-{worker}-{slot}"
            traj_trace = f"traj-{worker}-{slot}"
            if (memory := await store.load_memory_state(memory_key)) is not None:
                found.memory[memory_key] = memory
            if (pause := await store.load_planner_state(token)) is not None:
                found.pauses[token] = pause
            if (trajectory := await store.get_trajectory(traj_trace, session)) is not None:
                found.trajectories[traj_trace] = (session, _plain(trajectory))
    return found


def writes_per_kind(per_worker: int) -> dict[str, int]:
    """How many writes of each method one worker makes."""
    return {kind: len(range(index, per_worker, len(KINDS))) for index, kind in enumerate(KINDS)}
