"""``guarded check`` never touches user data: against a PostgreSQL factory it runs in a scratch
schema it creates and drops, and the user's schema keeps exactly the rows it had."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.schema_names import MIGRATIONS_TABLE, TABLES
from guarded.cli.check import SCRATCH_PREFIX
from guarded.cli.support import EXIT_UNREACHABLE, EXIT_USAGE
from guarded.codec import DEFAULT_TYPES
from guarded.models import RemoteBinding, StoredEvent

from .support import Ran, clean_environment, closed_port, guarded

FACTORY = "guarded.backends.postgres.factory:create_store"


def fill(dsn: str, schema: str) -> None:
    """A user's schema with data in it."""

    async def run() -> None:
        store = await PostgresStateStore.connect(
            dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, types=DEFAULT_TYPES
        )
        try:
            for index in range(5):
                await store.save_event(
                    StoredEvent("user-trace", float(index), "node_start", "n", "i", {"i": index})
                )
            await store.save_remote_binding(RemoteBinding("user-trace", None, "task", "agent", "http://a"))
            await store.save_planner_state("user-token", {"step": 1})
            await store.save_memory_state("tenant:user:session", {"turns": []})
        finally:
            await store.close()

    asyncio.run(run())


def snapshot(dsn: str, schema: str) -> dict[str, Any]:
    """Row counts of every table of ``schema`` and the names of the database's schemas."""

    async def run() -> dict[str, Any]:
        conn = await asyncpg.connect(dsn)
        try:
            counts = {
                table: await conn.fetchval(f'SELECT count(*) FROM "{schema}"."{table}"')
                for table in (*TABLES, MIGRATIONS_TABLE)
            }
            schemas = {row["nspname"] for row in await conn.fetch("SELECT nspname FROM pg_namespace")}
            return {"counts": counts, "schemas": schemas}
        finally:
            await conn.close()

    return asyncio.run(run())


def check(dsn: str, schema: str, *argv: str, **extra: str) -> Ran:
    env = clean_environment(
        GUARDED_PG_DSN=dsn, GUARDED_PG_SCHEMA=schema, GUARDED_PG_POOL_MIN_SIZE="1", **extra
    )
    return guarded("check", *argv, env=env)


def test_check_leaves_the_target_schemas_rows_unchanged(pg_dsn: str, schema_name: str) -> None:
    fill(pg_dsn, schema_name)
    before = snapshot(pg_dsn, schema_name)
    assert before["counts"]["flow_events"] == 5

    ran = check(pg_dsn, schema_name, FACTORY)
    assert ran.code == 0, ran.out + ran.err
    first = ran.out.splitlines()[0]
    assert first.startswith(f"scratch: PostgreSQL schema {SCRATCH_PREFIX}")
    assert first.endswith(", dropped after the check")
    scratch = first.split()[3]
    assert scratch != schema_name
    assert ran.out.rstrip().endswith("every offered contract passed")

    after = snapshot(pg_dsn, schema_name)
    assert after["counts"] == before["counts"]
    assert after["schemas"] == before["schemas"], "the scratch schema was left behind"


def test_keep_leaves_the_scratch_schema_for_inspection(pg_dsn: str, schema_name: str) -> None:
    fill(pg_dsn, schema_name)
    before = snapshot(pg_dsn, schema_name)
    ran = check(pg_dsn, schema_name, FACTORY, "--keep", "--only", "core", "--json")
    assert ran.code == 0, ran.err
    scratch = json.loads(ran.out)["scratch"]
    assert scratch["kind"] == "postgresql_schema"
    assert (scratch["kept"], scratch["dropped"]) == (True, False)
    assert scratch["name"].startswith(SCRATCH_PREFIX)
    kept = snapshot(pg_dsn, scratch["name"])
    assert kept["counts"]["flow_events"] > 0  # the contract data, where it can be looked at
    assert snapshot(pg_dsn, schema_name)["counts"] == before["counts"]

    async def drop() -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(f'DROP SCHEMA "{scratch["name"]}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())
    assert Path(scratch["spill_directory"]).is_dir()
    shutil.rmtree(scratch["spill_directory"])


def test_a_guarded_store_is_checked_in_the_scratch_schema_too(pg_dsn: str, schema_name: str) -> None:
    fill(pg_dsn, schema_name)
    before = snapshot(pg_dsn, schema_name)
    ran = check(pg_dsn, schema_name, "tests.interop.support:guarded_store_from_env", "--only", "core")
    assert ran.code == 0, ran.out + ran.err
    assert ran.out.startswith(f"scratch: PostgreSQL schema {SCRATCH_PREFIX}")
    assert snapshot(pg_dsn, schema_name) == before


def test_a_factory_that_ignores_the_scratch_schema_is_refused(pg_dsn: str, schema_name: str) -> None:
    fill(pg_dsn, schema_name)
    before = snapshot(pg_dsn, schema_name)
    ran = check(pg_dsn, schema_name, "tests.cli.factories:pinned_schema_store", CLI_TEST_SCHEMA=schema_name)
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith(
        f"error: the store from 'tests.cli.factories:pinned_schema_store' uses schema '{schema_name}', "
        f"not the scratch schema {SCRATCH_PREFIX}"
    )
    assert ran.error.endswith(
        "hint: make the factory read GUARDED_PG_SCHEMA, "
        "as guarded.backends.postgres.factory:create_store does"
    )
    assert ran.out == ""
    assert snapshot(pg_dsn, schema_name) == before


def test_check_against_an_unreachable_database_exits_3() -> None:
    port = closed_port()
    ran = check(f"postgresql://app@127.0.0.1:{port}/app", "public", FACTORY)
    assert ran.code == EXIT_UNREACHABLE
    assert ran.error.startswith(
        f"error: cannot reach the store's backend at postgresql://127.0.0.1:{port}/app?schema={SCRATCH_PREFIX}"
    )
    assert (
        "(from GUARDED_PG_DSN): calling 'guarded.backends.postgres.factory:create_store' failed: "
        in ran.error
    )
