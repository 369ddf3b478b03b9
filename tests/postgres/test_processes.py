"""Several processes at once: migrations raced on a fresh schema, the same keys written concurrently,
the same pauses consumed concurrently."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from guarded.backends.postgres.schema_migrations import latest_version

from . import _worker
from .conftest import StoreFactory

REPO = Path(__file__).resolve().parents[2]


def run_workers(mode: str, dsn: str, schema: str, count: int) -> list[str]:
    """Run ``count`` worker processes of ``mode`` together; what each printed, in order."""
    start_at = time.time() + 2.5  # every process is up and waiting before the first one goes
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.postgres._worker", mode, dsn, schema, str(start_at), str(worker)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in range(count)
    ]
    failures = []
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        outputs.append(out)
        if process.returncode != 0:
            failures.append(f"exit {process.returncode}\n{out}\n{err}")
    assert not failures, "\n---\n".join(failures)
    return outputs


@pytest.mark.asyncio
async def test_migrations_raced_by_several_processes(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    run_workers("migrate", pg_dsn, schema_name, 4)
    rows = await raw.fetch(f'SELECT version FROM "{schema_name}".guarded_migrations ORDER BY version')
    assert [row["version"] for row in rows] == list(range(1, latest_version() + 1))
    events = await raw.fetchval(f'SELECT count(*) FROM "{schema_name}".flow_events')
    assert events == 4


@pytest.mark.asyncio
async def test_two_processes_writing_the_same_keys(
    pg_dsn: str, schema_name: str, make_store: StoreFactory
) -> None:
    store = await make_store()  # migrated up front: this test is about the writes
    run_workers("write", pg_dsn, schema_name, 2)
    history = await store.load_history("shared-trace")
    assert len(history) == _worker.EVENTS
    assert sorted(item.payload["i"] for item in history) == list(range(_worker.EVENTS))
    assert [item.ts for item in history] == sorted(item.ts for item in history)
    updates = await store.list_updates("shared-session", limit=10_000)
    assert sorted(item.update_id for item in updates) == sorted(f"update-{i}" for i in range(_worker.UPDATES))
    [task] = await store.list_tasks("shared-session")
    assert task.priority == _worker.TASK_WRITES - 1
    memory = await store.load_memory_state("shared:memory")
    assert memory is not None
    assert memory["step"] in (_worker.TASK_WRITES - 1, _worker.TASK_WRITES - 2)
    bindings = await store.list_bindings(router_session_id="r")
    assert len(bindings) == 1


@pytest.mark.asyncio
async def test_two_processes_consuming_the_same_pauses(
    pg_dsn: str, schema_name: str, make_store: StoreFactory
) -> None:
    store = await make_store()
    for index in range(_worker.PAUSES):
        token = _worker.pause_token(index)
        await store.save_planner_state(token, {"token": token})
    given = [
        json.loads(output.strip().splitlines()[-1])
        for output in run_workers("consume", pg_dsn, schema_name, 2)
    ]
    everything = [token for tokens in given for token in tokens]
    assert sorted(everything) == sorted(_worker.pause_token(index) for index in range(_worker.PAUSES))
    assert all(given), "both processes must have been given some pauses (they raced)"
