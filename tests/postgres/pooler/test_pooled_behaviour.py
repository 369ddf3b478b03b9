"""Behind PgBouncer in transaction mode: consume-once, last-write-wins, idempotency keys, tenancy
and migrations hold as they do on a direct connection.

The backend's own tests of those promises run here again, unchanged, through this package's
fixtures (stores with ``pooler="transaction"`` through the pooler; worker processes configured by
``GUARDED_PG_POOLER``); the tests written here add many clients taking turns on few server
connections, and migrations that must leave no lock behind on a server connection.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.cli_sql import migration_script, migrations_after
from guarded.backends.postgres.schema_migrations import advisory_lock_key, latest_version
from guarded.codec import DEFAULT_TYPES
from guarded.testing.pgbouncer import PgBouncer
from guarded.testing.postgres import binaries_dir
from tests.durable.test_durable_last_write_wins import (
    test_a_stale_write_does_not_move_the_task_to_another_session,
    test_an_older_write_never_replaces_a_newer_one,
    test_concurrent_replays_converge_on_the_newest,
    test_newer_and_equal_timestamps_win,
)

from ..conftest import StoreFactory
from ..test_consume_once import (
    test_a_lost_answer_is_given_again_to_the_same_call_only,
    test_a_recovering_consume_moves_the_pause_to_its_own_key,
    test_concurrent_recovering_consumes_exactly_one_wins,
)
from ..test_processes import (
    test_migrations_raced_by_several_processes,
    test_two_processes_consuming_the_same_pauses,
    test_two_processes_writing_the_same_keys,
)
from ..test_tenancy import (
    test_a_store_never_sees_another_schemas_rows,
    test_consume_with_the_same_key_in_another_schema_gets_nothing,
)

REPO = Path(__file__).resolve().parents[3]

RERUN_HERE = (
    test_a_lost_answer_is_given_again_to_the_same_call_only,
    test_a_recovering_consume_moves_the_pause_to_its_own_key,
    test_concurrent_recovering_consumes_exactly_one_wins,
    test_a_stale_write_does_not_move_the_task_to_another_session,
    test_an_older_write_never_replaces_a_newer_one,
    test_concurrent_replays_converge_on_the_newest,
    test_newer_and_equal_timestamps_win,
    test_migrations_raced_by_several_processes,
    test_two_processes_writing_the_same_keys,
    test_two_processes_consuming_the_same_pauses,
    test_a_store_never_sees_another_schemas_rows,
    test_consume_with_the_same_key_in_another_schema_gets_nothing,
)
"""Collected in this module: the same tests, through the pooler."""

CLIENTS = 6
"""Stores (each its own asyncpg pool of 4) sharing PgBouncer's 10 server connections."""


async def advisory_locks_held(raw: asyncpg.Connection, schema: str) -> int:
    key = advisory_lock_key(schema) & 0xFFFF_FFFF_FFFF_FFFF
    count: int = await raw.fetchval(
        "SELECT count(*) FROM pg_locks "
        "WHERE locktype = 'advisory' AND classid::bigint = $1 AND objid::bigint = $2",
        key >> 32,
        key & 0xFFFF_FFFF,
    )
    return count


@pytest.mark.asyncio
async def test_each_pause_is_consumed_once_by_many_clients_through_the_pooler(
    make_store: StoreFactory,
) -> None:
    stores = [
        await make_store(pool=PoolSettings(min_size=1, max_size=4, command_timeout=30.0))
        for _ in range(CLIENTS)
    ]
    tokens = [f"token-{index}" for index in range(25)]
    for token in tokens:
        await stores[0].save_planner_state(token, {"token": token})
    results = await asyncio.gather(
        *(store.load_planner_state(token) for token in tokens for store in stores for _ in range(2))
    )
    delivered = [result["token"] for result in results if result is not None]
    assert sorted(delivered) == sorted(tokens)  # every pause once: none twice, none lost


@pytest.mark.asyncio
async def test_migrations_leave_no_lock_on_a_server_connection(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str
) -> None:
    store = await make_store()
    assert store.schema_version == latest_version()
    assert await advisory_locks_held(raw, schema_name) == 0


@pytest.mark.asyncio
async def test_a_pooled_migration_waits_for_the_schemas_lock(
    pg_dsn: str, raw: asyncpg.Connection, schema_name: str
) -> None:
    await raw.execute("SELECT pg_advisory_lock($1)", advisory_lock_key(schema_name))
    opening = asyncio.ensure_future(
        PostgresStateStore.connect(
            pg_dsn,
            schema=schema_name,
            pooler="transaction",
            registry=CollectorRegistry(),
            stats_interval=None,
        )
    )
    try:
        for _ in range(200):  # until the migration waits on the lock (it did not race past it)
            waiting = await raw.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting
        assert not opening.done()
        await raw.execute("SELECT pg_advisory_unlock($1)", advisory_lock_key(schema_name))
        store = await asyncio.wait_for(opening, 30)
        assert store.schema_version == latest_version()
        await store.close()
    finally:
        if not opening.done():
            opening.cancel()
    assert await advisory_locks_held(raw, schema_name) == 0


def test_the_migrate_command_through_the_pooler(
    pg_bouncer: PgBouncer, direct_dsn: str, schema_name: str
) -> None:
    command = [
        sys.executable,
        "-m",
        "guarded",
        "pg",
        "migrate",
        "--dsn",
        pg_bouncer.dsn,
        "--schema",
        schema_name,
    ]
    runs = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, f"{out}\n{err}"

    async def check() -> None:
        conn = await asyncpg.connect(direct_dsn)
        try:
            rows = await conn.fetch(
                f'SELECT version FROM "{schema_name}".guarded_migrations ORDER BY version'
            )
            assert [row["version"] for row in rows] == list(range(1, latest_version() + 1))
            assert await advisory_locks_held(conn, schema_name) == 0
        finally:
            await conn.close()

    asyncio.run(check())


def test_the_sql_script_applies_through_the_pooler(
    pg_bouncer: PgBouncer, direct_dsn: str, schema_name: str, tmp_path: Path
) -> None:
    script = tmp_path / "migrate.sql"
    script.write_text(
        migration_script(schema_name, migrations_after(0), from_version=0, transaction_scoped=True)
    )
    assert "pg_advisory_lock(" not in script.read_text()  # a session lock would stay on a server connection
    psql = [
        str(binaries_dir() / "psql"),
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        pg_bouncer.dsn,
        "-f",
        str(script),
    ]
    result = subprocess.run(
        psql, capture_output=True, text=True, timeout=120, env={**os.environ, "LC_ALL": "C"}
    )
    assert result.returncode == 0, result.stderr

    async def check() -> None:
        store = await PostgresStateStore.connect(
            direct_dsn,
            schema=schema_name,
            migrate=False,
            registry=CollectorRegistry(),
            stats_interval=None,
            types=DEFAULT_TYPES,
        )
        try:
            status = await store.migration_status()
            assert status.up_to_date
            assert not status.checksum_mismatches
        finally:
            await store.close()

    asyncio.run(check())
