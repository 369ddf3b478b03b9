"""A consumed pause is never revived by a killed worker's spill file, with
real separate processes and a real PostgreSQL.

Worker B is a process of its own: partitioned from the database (fault injection over a real
:class:`PostgresStateStore`), it saves every token (held in its spill file) and is SIGKILLed.
Worker A, this process, saves each token newer, resumes each once, and runs ``cleanup()`` past
the consume grace. Then B's successor adopts the spill file and replays B's older saves: each is
refused by the tombstone of A's consume, and no token is delivered again.

Run as a script, this module is worker B::

    python -m tests.postgres.test_pauses_across_processes DSN SCHEMA SPILL TOKENS
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.guard import controller, guard
from tests.killed_process import report_then_kill
from tests.postgres.test_pauses_across_workers import PartitionedStore, resume, worker_config

TOKENS = 10


async def partitioned_worker(dsn: str, schema: str, spill: str, tokens: int) -> None:
    """Worker B: save every token while partitioned (held in the spill file), report, wait to die."""
    raw = await PartitionedStore.connect(dsn, schema=schema)
    raw.down = True
    store = guard(raw, name="worker-b", registry=CollectorRegistry(), **worker_config(Path(spill)))
    for i in range(tokens):
        await store.save_planner_state(f"tok{i}", {"by": "b", "version": 1})
    buffer = controller(store).dead_letters
    assert buffer is not None
    print(json.dumps({"held": buffer.depth}), flush=True)
    await asyncio.sleep(3600)


@pytest.mark.asyncio
async def test_a_killed_workers_older_saves_never_revive_a_consumed_pause(
    pg_dsn: str, schema_name: str, tmp_path: Path
) -> None:
    spill = tmp_path / "b.sqlite"
    await (await PostgresStateStore.connect(pg_dsn, schema=schema_name)).close()  # migrated once
    report = report_then_kill(
        "tests.postgres.test_pauses_across_processes",
        [pg_dsn, schema_name, str(spill), str(TOKENS)],
        tmp_path / "worker-b.log",
        timeout=60,
    )
    assert report == {"held": TOKENS}

    raw_a = await PostgresStateStore.connect(pg_dsn, schema=schema_name, consume_grace=0.01)
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    async with a:
        for i in range(TOKENS):
            await a.save_planner_state(f"tok{i}", {"by": "a", "version": 2})
        resumed = [await resume(a, f"tok{i}") for i in range(TOKENS)]
        await asyncio.sleep(0.05)  # past the consume grace
        await raw_a.cleanup()

        raw_b = await PostgresStateStore.connect(pg_dsn, schema=schema_name)
        successor = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **worker_config(spill))
        async with successor:
            held = controller(successor).dead_letters
            assert held is not None
            adopted = held.depth  # B's held saves, from the killed process's spill file
            assert await controller(successor).drain(10.0) == 0  # replayed: refused by the tombstones
            again = [await resume(store, f"tok{i}") for store in (a, successor) for i in range(TOKENS)]
    assert resumed == [{"by": "a", "version": 2}] * TOKENS
    assert adopted == TOKENS
    assert again == [None] * (2 * TOKENS)


def _main(argv: list[str]) -> Any:
    dsn, schema, spill, tokens = argv
    return asyncio.run(partitioned_worker(dsn, schema, spill, int(tokens)))


if __name__ == "__main__":
    _main(sys.argv[1:])
