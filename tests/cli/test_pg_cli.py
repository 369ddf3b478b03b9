"""``guarded pg`` on a real PostgreSQL: distinct exit codes, "not migrated", durations, progress,
Ctrl-C, and ``migrate --sql`` that prints what ``migrate`` would do without doing it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from guarded.backends.postgres import cli as pg_cli
from guarded.backends.postgres.schema_migrations import latest_version
from guarded.backends.postgres.schema_names import TABLES
from guarded.cli import progress as cli_progress
from guarded.cli.support import EXIT_INTERRUPTED, EXIT_NOT_MIGRATED, EXIT_PROBLEM, EXIT_UNREACHABLE

from .support import Ran, closed_port, in_process


def sql(dsn: str, statement: str, *args: Any) -> Any:
    async def run() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(statement, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def pg(capsys: pytest.CaptureFixture[str], dsn: str, schema: str, *argv: str) -> Ran:
    return in_process(capsys, "pg", *argv, "--dsn", dsn, "--schema", schema)


def test_status_exit_codes_tell_pending_from_unreachable_from_a_problem(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema_name: str
) -> None:
    ran = pg(capsys, pg_dsn, schema_name, "status")
    assert ran.code == EXIT_NOT_MIGRATED
    assert "  pending  0001_initial" in ran.out
    assert f"  run 'guarded pg migrate --schema {schema_name}' to apply the pending migrations" in ran.out
    assert ran.err == ""

    ran = in_process(capsys, "pg", "status", "--dsn", f"postgresql://x@127.0.0.1:{closed_port()}/x")
    assert ran.code == EXIT_UNREACHABLE

    ran = pg(capsys, pg_dsn, schema_name, "migrate")
    assert ran.code == 0, ran.err
    assert ran.out == f"schema {schema_name}: applied 0001, 0002, 0003, 0004, 0005; now at version 5\n"
    ran = pg(capsys, pg_dsn, schema_name, "status", "--json")
    assert ran.code == 0
    document = json.loads(ran.out)
    assert document["up_to_date"] is True
    assert document["target"].endswith(f"?schema={schema_name}")
    ran = pg(capsys, pg_dsn, schema_name, "status")
    assert ran.code == 0
    header = next(line for line in ran.out.splitlines() if line.startswith("TABLE"))
    assert header.split() == ["TABLE", "ROWS", "SIZE"]

    sql(pg_dsn, f'UPDATE "{schema_name}".guarded_migrations SET checksum = $1 WHERE version = 1', "edited")
    ran = pg(capsys, pg_dsn, schema_name, "status")
    assert ran.code == EXIT_PROBLEM
    assert "CHECKSUM MISMATCH" in ran.out


def test_cleanup_of_a_schema_that_is_not_migrated_says_so(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema_name: str
) -> None:
    ran = pg(capsys, pg_dsn, "nosuchschema", "cleanup")
    assert ran.code == EXIT_NOT_MIGRATED
    assert ran.error == (
        "error: schema 'nosuchschema' does not exist, so it is not migrated; hint: check --schema "
        "(or GUARDED_PG_SCHEMA); 'guarded pg migrate --schema nosuchschema' creates it"
    )
    sql(pg_dsn, f'CREATE SCHEMA "{schema_name}"')
    ran = pg(capsys, pg_dsn, schema_name, "cleanup", "--max-age-events", "30d")
    assert ran.code == EXIT_NOT_MIGRATED
    assert ran.error == (
        f"error: schema '{schema_name}' is not migrated: it is at version 0, this code needs "
        f"{latest_version()}; hint: run 'guarded pg migrate --schema {schema_name}'"
    )


def old_updates(dsn: str, schema: str, count: int, *, days: int) -> None:
    sql(
        dsn,
        f'INSERT INTO "{schema}".state_updates '
        "(session_id, task_id, update_id, update_type, doc, created_at) "
        "SELECT 's', 't', 'u' || n, 'PROGRESS', '{}', now() - make_interval(days => $2) "
        "FROM generate_series(1, $1) AS n",
        count,
        days,
    )


def test_cleanup_takes_30d_and_shows_progress(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_dsn: str, schema_name: str
) -> None:
    assert pg(capsys, pg_dsn, schema_name, "migrate").code == 0
    old_updates(pg_dsn, schema_name, 12_000, days=40)
    sql(
        pg_dsn,
        f'INSERT INTO "{schema_name}".state_updates (session_id, task_id, update_id, update_type, doc) '
        "VALUES ('s', 't', 'fresh', 'PROGRESS', '{}')",
    )
    monkeypatch.setattr(cli_progress, "LINE_INTERVAL", 0.0)
    ran = pg(capsys, pg_dsn, schema_name, "cleanup", "--max-age-updates", "30d", "--grace", "0")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[:2] == [
        f"schema {schema_name}: state_updates: 12000",
        "  state_updates: rows older than 30d deleted",
    ]
    progress = [line for line in ran.err_lines if line.startswith(f"cleanup {schema_name}: ")]
    assert any(f"cleanup {schema_name}: 5,000 rows deleted, " in line for line in progress), progress
    assert progress[-1].startswith(f"cleanup {schema_name}: done: 12,000 rows deleted, ")
    assert "/s, " in progress[-1]
    assert sql(pg_dsn, f'SELECT count(*) AS n FROM "{schema_name}".state_updates')[0]["n"] == 1

    ran = pg(capsys, pg_dsn, schema_name, "cleanup", "--max-age-events", "12h", "--json")
    assert json.loads(ran.out)["max_age_seconds"]["flow_events"] == 43_200


def test_ctrl_c_during_cleanup_says_what_was_deleted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_dsn: str, schema_name: str
) -> None:
    assert pg(capsys, pg_dsn, schema_name, "migrate").code == 0
    old_updates(pg_dsn, schema_name, 7_000, days=40)
    real = pg_cli.cleanup

    async def interrupted_after_one_batch(db: Any, schema: str, **options: Any) -> Any:
        await db.execute(
            f'DELETE FROM "{schema}"."state_updates" WHERE ctid = ANY(ARRAY(SELECT ctid FROM '
            f'"{schema}"."state_updates" LIMIT $1))',
            5_000,
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(pg_cli, "cleanup", interrupted_after_one_batch)
    ran = pg(capsys, pg_dsn, schema_name, "cleanup", "--max-age-updates", "30d")
    assert ran.code == EXIT_INTERRUPTED
    assert ran.err_lines[-1] == (
        "interrupted: deleted 5,000 row(s) before Ctrl-C (state_updates: 5000); each batch commits on its "
        "own, so what was deleted stays deleted; run 'guarded pg cleanup' again to finish"
    )
    assert sql(pg_dsn, f'SELECT count(*) AS n FROM "{schema_name}".state_updates')[0]["n"] == 2_000
    monkeypatch.setattr(pg_cli, "cleanup", real)


def test_migrate_shows_progress(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_dsn: str, schema_name: str
) -> None:
    monkeypatch.setattr(cli_progress, "LINE_INTERVAL", 0.0)
    ran = pg(capsys, pg_dsn, schema_name, "migrate")
    assert ran.code == 0
    lines = [line for line in ran.err_lines if line.startswith(f"migrate {schema_name}: ")]
    assert lines[0].startswith(f"migrate {schema_name}: 1 of 5 migrations (20%), ")
    assert lines[-1].startswith(f"migrate {schema_name}: done: 5 of 5 migrations (100%), ")
    assert lines[-1].endswith("; applied 0005_pause_tombstones")


def tables(dsn: str, schema: str) -> dict[str, list[tuple[str, str]]]:
    rows = sql(
        dsn,
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
        schema,
    )
    found: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        found.setdefault(row["table_name"], []).append((row["column_name"], row["data_type"]))
    return found


def test_migrate_sql_prints_the_migration_without_running_it(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema_name: str
) -> None:
    ran = pg(capsys, pg_dsn, schema_name, "migrate", "--sql")
    assert ran.code == 0, ran.err
    script = ran.out
    assert "-- pending: 0001_initial, 0002_logical_time, 0003_session_traces, 0004_snapshots" in script
    assert script.count("BEGIN;") == script.count("COMMIT;") == latest_version()
    exists = sql(pg_dsn, "SELECT count(*) AS n FROM pg_namespace WHERE nspname = $1", schema_name)
    assert exists[0]["n"] == 0, "--sql ran something"

    # What the script does is what migrate does: status reads it as up to date, same tables.
    async def apply() -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(script)
        finally:
            await conn.close()

    asyncio.run(apply())
    ran = pg(capsys, pg_dsn, schema_name, "status", "--json")
    assert ran.code == 0, ran.out
    status = json.loads(ran.out)
    assert (status["version"], status["pending"], status["checksum_mismatches"]) == (latest_version(), [], [])
    reference = schema_name + "_ref"
    assert pg(capsys, pg_dsn, reference, "migrate").code == 0
    assert tables(pg_dsn, schema_name) == tables(pg_dsn, reference)
    assert set(TABLES) <= set(tables(pg_dsn, schema_name))

    ran = pg(capsys, pg_dsn, schema_name, "migrate", "--sql")
    assert ran.code == 0
    assert "-- the schema is up to date: nothing to apply" in ran.out
    assert "BEGIN;" not in ran.out
