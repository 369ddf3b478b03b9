"""The environment-configured factories, the ``guarded pg`` commands, and PenguiFlow on the store."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.cli import register
from guarded.backends.postgres.factory import (
    ConfigurationError,
    config_from_env,
    create_store,
    create_store_lazy,
)
from guarded.codec import penguiflow_types
from guarded.models import StoredEvent

from .conftest import StoreFactory


def test_config_from_env_defaults() -> None:
    config = config_from_env({})
    assert config.dsn is None
    assert config.schema == "public"
    assert config.pool.max_size == 10
    assert config.pool.statement_timeout == 30.0
    assert config.options["migrate"] is True
    assert "pause_ttl" not in config.options


def test_config_from_env_reads_every_setting() -> None:
    config = config_from_env(
        {
            "GUARDED_PG_DSN": "postgresql://u@h/db",
            "GUARDED_PG_SCHEMA": "tenant_a",
            "GUARDED_PG_STORE_NAME": "primary",
            "GUARDED_PG_POOL_MIN_SIZE": "1",
            "GUARDED_PG_POOL_MAX_SIZE": "30",
            "GUARDED_PG_COMMAND_TIMEOUT": "none",
            "GUARDED_PG_STATEMENT_TIMEOUT": "2.5",
            "GUARDED_PG_MIGRATE": "off",
            "GUARDED_PG_PAUSE_TTL": "600",
            "GUARDED_PG_CONSUME_GRACE": "0",
            "GUARDED_PG_STATS_INTERVAL": "none",
            "GUARDED_PG_RETENTION_EVENTS": "86400",
            "GUARDED_PG_ARTIFACT_TTL_SECONDS": "60",
            "GUARDED_PG_ARTIFACT_CLEANUP_STRATEGY": "fifo",
        }
    )
    assert config.dsn == "postgresql://u@h/db"
    assert config.schema == "tenant_a"
    assert (config.pool.min_size, config.pool.max_size) == (1, 30)
    assert config.pool.command_timeout is None
    assert config.pool.statement_timeout == 2.5
    options = config.options
    assert options["name"] == "primary"
    assert options["migrate"] is False
    assert options["pause_ttl"] == 600
    assert options["consume_grace"] == 0
    assert options["stats_interval"] is None
    retention = options["retention"]
    assert retention is not None
    assert retention.events_max_age == 86400
    artifacts = options["artifact_retention"]
    assert artifacts is not None
    assert artifacts.ttl_seconds == 60
    assert artifacts.cleanup_strategy == "fifo"
    assert config_from_env({"DATABASE_URL": "postgresql://fallback"}).dsn == "postgresql://fallback"


def test_durations_accept_units_as_the_command_line_does() -> None:
    config = config_from_env(
        {
            "GUARDED_PG_RETENTION_EVENTS": "30d",
            "GUARDED_PG_RETENTION_UPDATES": "12h",
            "GUARDED_PG_PAUSE_TTL": "1h30m",
            "GUARDED_PG_STATEMENT_TIMEOUT": "500ms",
        }
    )
    retention = config.options["retention"]
    assert retention is not None
    assert (retention.events_max_age, retention.updates_max_age) == (30 * 86400, 12 * 3600)
    assert config.options["pause_ttl"] == 5400
    assert config.pool.statement_timeout == 0.5
    with pytest.raises(ConfigurationError, match=r"GUARDED_PG_PAUSE_TTL='-5m'.*30s, 15m, 12h or 30d"):
        config_from_env({"GUARDED_PG_PAUSE_TTL": "-5m"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GUARDED_PG_SCHEMA", "Bad-Name"),
        ("GUARDED_PG_POOL_MAX_SIZE", "ten"),
        ("GUARDED_PG_COMMAND_TIMEOUT", "-1"),
        ("GUARDED_PG_MIGRATE", "maybe"),
        ("GUARDED_PG_ARTIFACT_CLEANUP_STRATEGY", "random"),
        ("GUARDED_PG_PAUSE_TTL", "soon"),
    ],
)
def test_config_errors_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name.removeprefix("GUARDED_PG_").split("_")[0]):
        config_from_env({name: value})


@pytest.mark.asyncio
async def test_async_and_sync_factories(
    pg_dsn: str, schema_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDED_PG_DSN", pg_dsn)
    monkeypatch.setenv("GUARDED_PG_SCHEMA", schema_name)
    monkeypatch.setenv("GUARDED_PG_METRICS", "0")
    monkeypatch.setenv("GUARDED_PG_POOL_MIN_SIZE", "1")
    store = await create_store()
    try:
        await store.save_event(StoredEvent("factory", 1.0, "k", None, None, {}))
    finally:
        await store.close()
    lazy = create_store_lazy()  # no I/O yet
    try:
        assert [event.kind for event in await lazy.load_history("factory")] == ["k"]
    finally:
        await lazy.close()


@pytest.mark.asyncio
async def test_penguiflow_admin_loads_the_factory(
    pg_dsn: str, schema_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from penguiflow.admin import load_state_store

    monkeypatch.setenv("GUARDED_PG_DSN", pg_dsn)
    monkeypatch.setenv("GUARDED_PG_SCHEMA", schema_name)
    monkeypatch.setenv("GUARDED_PG_METRICS", "0")
    for spec in (
        "guarded.backends.postgres.factory:create_store",
        "guarded.backends.postgres.factory:create_store_lazy",
    ):
        store: Any = await load_state_store(spec)
        try:
            assert await store.load_history("nothing") == []
        finally:
            await store.close()


def run_cli(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="guarded")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = args.handler(args)
    return code, out.getvalue()


@pytest.mark.asyncio
async def test_pg_commands(pg_dsn: str, schema_name: str, raw: asyncpg.Connection) -> None:
    def cli(*argv: str) -> tuple[int, str]:
        return run_cli("pg", *argv, "--dsn", pg_dsn, "--schema", schema_name)

    code, out = await asyncio.to_thread(cli, "status")
    assert code == 4  # migrations pending (docs/cli.md)
    assert "pending  0001_initial" in out
    assert "pending  0002_logical_time" in out
    code, out = await asyncio.to_thread(cli, "migrate")
    assert code == 0
    assert "applied 0001, 0002, 0003, 0004, 0005; now at version 5" in out
    code, out = await asyncio.to_thread(cli, "migrate", "--json")
    assert code == 0
    assert json.loads(out)["applied"] == []
    code, out = await asyncio.to_thread(cli, "status", "--json")
    status = json.loads(out)
    assert code == 0
    assert status["version"] == status["latest"] == 5
    assert "flow_events" in status["tables"]
    await raw.execute(
        f'INSERT INTO "{schema_name}".state_updates '
        "(session_id, task_id, update_id, update_type, doc, created_at) "
        "VALUES ('s', 't', 'u', 'PROGRESS', '{}', now() - interval '2 days')"
    )
    code, out = await asyncio.to_thread(cli, "cleanup", "--max-age-updates", "86400", "--json")
    assert code == 0
    assert json.loads(out)["deleted"]["state_updates"] == 1


def test_pg_command_usage_errors() -> None:
    code, _ = run_cli("pg", "status", "--schema", "Not-Valid", "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert code == 2
    code, _ = run_cli("pg", "migrate", "--schema", "ok", "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert code == 3  # cannot connect: reported, naming the target, not a traceback


@pytest.mark.asyncio
async def test_penguiflow_runs_on_the_store_and_gets_its_own_types(make_store: StoreFactory) -> None:
    from penguiflow import Headers, Message, Node, PenguiFlow
    from penguiflow.state.models import StoredEvent as PenguiFlowStoredEvent
    from penguiflow.testkit import run_one

    store: PostgresStateStore = await make_store(types=penguiflow_types())

    async def echo(message: Any, ctx: Any) -> Any:
        return message.payload

    flow = PenguiFlow((Node(echo, name="echo"), []), state_store=store)
    message = Message(payload="hello", headers=Headers(tenant="t"))
    assert await run_one(flow, message, timeout_s=10) == "hello"
    history = await store.load_history(message.trace_id)
    assert [event.kind for event in history] == ["node_start", "node_success"]
    assert all(isinstance(event, PenguiFlowStoredEvent) for event in history)


def test_store_is_recognised_by_penguiflow_protocols() -> None:
    from penguiflow.state import StateStore

    from guarded.protocol import capabilities

    store = PostgresStateStore.lazy("postgresql://nobody@127.0.0.1:1/none", registry=CollectorRegistry())
    assert isinstance(store, StateStore)
    report = capabilities(store)
    assert set(report.offered) == {item.capability.name for item in report.statuses}
    assert set(report.legacy_aliases) == {"save_task_update", "list_task_updates", "get_events"}


@pytest.mark.asyncio
async def test_from_pool_leaves_the_application_pool_open(pg_dsn: str, schema_name: str) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        async with await PostgresStateStore.from_pool(
            pool, schema=schema_name, registry=CollectorRegistry(), stats_interval=None
        ) as store:
            await store.save_memory_state("k", {"v": 1})
            assert store.pool is pool
        assert await pool.fetchval(f'SELECT count(*) FROM "{schema_name}".memory_states') == 1
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_bad_options_are_refused_without_leaking_a_pool(pg_dsn: str) -> None:
    with pytest.raises(ValueError, match="pause_ttl"):
        await PostgresStateStore.connect(pg_dsn, schema="t_bad", pause_ttl=-1, registry=CollectorRegistry())
