"""Today's default (session) mode behind PgBouncer in transaction mode fails -- and says what to set.

Two failures a stock PgBouncer shows a store connected without ``pooler="transaction"``: it refuses
the ``statement_timeout`` start-up parameter, and asyncpg's named prepared statements, cached per
client connection, meet server connections that never saw them (or already have one of that name)
as soon as several clients take turns on the server connections. Each is raised as a
:class:`PoolerMismatchError` naming the setting, counted by kind, and held by the guard as the
operational condition ``pooler_mismatch``.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backend import ErrorClass
from guarded.backend import metric_names as names
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.error_classifier import POSTGRES_ERRORS
from guarded.backends.postgres.factory import ConfigurationError, config_from_env
from guarded.backends.postgres.pooler import POOLER_ERROR_KINDS, PoolerMismatchError, pooler_error_kind
from guarded.codec import DEFAULT_TYPES
from guarded.error_classes import classify, operational_condition
from guarded.testing.pgbouncer import PgBouncer

from ..conftest import StoreFactory

SETTING = 'pooler="transaction"'
ENV_SETTING = "GUARDED_PG_POOLER=transaction"


def assert_names_the_setting(error: BaseException) -> None:
    assert isinstance(error, PoolerMismatchError)
    assert SETTING in str(error)
    assert ENV_SETTING in str(error)
    assert POSTGRES_ERRORS.error_class(error) is ErrorClass.OPERATIONAL
    assert classify(error) is ErrorClass.OPERATIONAL
    assert operational_condition(error) == "pooler_mismatch"
    describe = POSTGRES_ERRORS.describe(error)
    assert describe is not None
    assert SETTING in describe


@pytest.mark.asyncio
async def test_pgbouncer_refuses_the_statement_timeout_start_up_parameter(pg_bouncer: PgBouncer) -> None:
    with pytest.raises(asyncpg.ProtocolViolationError, match="unsupported startup parameter"):
        await asyncpg.connect(pg_bouncer.dsn, server_settings={"statement_timeout": "30000"})


@pytest.mark.asyncio
async def test_the_default_mode_is_refused_at_connect_with_the_setting_named(
    make_store: StoreFactory, schema_name: str
) -> None:
    with pytest.raises(PoolerMismatchError) as caught:
        await make_store(pooler=None)
    error = caught.value
    assert error.kind == "startup_parameter_refused"
    assert "statement_timeout" in str(error)
    assert_names_the_setting(error)
    cause = error.__cause__
    assert isinstance(cause, asyncpg.ProtocolViolationError)
    assert cause.sqlstate == "08P01"
    # The SQLSTATE alone (08, connection exception) would have been retried for ever.
    assert pooler_error_kind(cause) == "startup_parameter_refused"
    assert classify(cause) is ErrorClass.OPERATIONAL


@pytest.mark.asyncio
async def test_a_lazy_store_in_the_default_mode_fails_its_first_call_with_the_setting_named(
    pg_dsn: str, schema_name: str
) -> None:
    store = PostgresStateStore.lazy(
        pg_dsn, schema=schema_name, registry=CollectorRegistry(), stats_interval=None
    )
    try:
        with pytest.raises(PoolerMismatchError) as caught:
            await store.load_history("trace")
        assert_names_the_setting(caught.value)
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_named_prepared_statements_fail_across_transactions_with_several_clients(
    make_store: StoreFactory, schema_name: str
) -> None:
    """Without the start-up parameter the default mode connects, and then breaks on the first
    statement a client runs on a server connection other than the one that prepared it."""
    await make_store(schema=schema_name)  # migrated through the pooler, in transaction mode
    registry = CollectorRegistry()
    store = await make_store(
        schema=schema_name,
        pooler=None,
        registry=registry,
        pool=PoolSettings(min_size=4, max_size=4, statement_timeout=None, command_timeout=30.0),
        types=DEFAULT_TYPES,
    )
    # Every kind is exported at zero before any error: the first one shows as an increase.
    assert [
        registry.get_sample_value(
            names.GUARDED_PG_POOLER_ERRORS_TOTAL, {"store": "postgres", "schema": schema_name, "kind": kind}
        )
        for kind in POOLER_ERROR_KINDS
    ] == [0.0] * len(POOLER_ERROR_KINDS)
    failures: list[BaseException] = []
    for _ in range(50):  # rounds of concurrent reads until the clients have swapped server connections
        results = await asyncio.gather(
            *(store.load_history(f"trace-{uuid.uuid4().hex}") for _ in range(16)), return_exceptions=True
        )
        failures = [item for item in results if isinstance(item, BaseException)]
        if failures:
            break
    assert failures, "the default mode never met another server connection's prepared statements"
    for error in failures:
        assert_names_the_setting(error)
        assert error.kind in ("prepared_statement_missing", "prepared_statement_exists")
        assert getattr(error.__cause__, "sqlstate", None) in ("26000", "42P05")
    counted = sum(
        registry.get_sample_value(
            names.GUARDED_PG_POOLER_ERRORS_TOTAL, {"store": "postgres", "schema": schema_name, "kind": kind}
        )
        or 0
        for kind in POOLER_ERROR_KINDS
    )
    assert counted == len(failures)


def test_the_factory_reads_the_pooler_mode() -> None:
    assert config_from_env({}).pool.pooler is None
    assert not config_from_env({}).pool.transaction_pooled
    assert config_from_env({"GUARDED_PG_POOLER": "transaction"}).pool.transaction_pooled
    assert config_from_env({"GUARDED_PG_POOLER": " Session "}).pool.pooler == "session"
    with pytest.raises(ConfigurationError, match="GUARDED_PG_POOLER"):
        config_from_env({"GUARDED_PG_POOLER": "statement"})


def test_a_pooler_mode_that_does_not_exist_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"PoolSettings\.pooler"):
        PoolSettings(pooler="statement")
