"""An operational error is held and replayed, never parked as bad data.

A table renamed away for about 3 s (a rename, a migration) makes every write to it fail with
SQLSTATE 42P01 undefined_table. Before the fix the guard parked all 50 good writes as bad data:
never replayed, the caller never told. Now they are held in the dead-letter buffer, counted in
``guarded_store_operational_errors_total{condition="undefined_object"}``, and replayed once the
table is back: after a drain all 50 are in PostgreSQL and nothing is parked.

The other operational conditions are provoked on the real server too (a read-only transaction, a
missing grant) to check that asyncpg raises what :mod:`guarded.error_classes` expects.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.config import BreakerConfig, DeadLetterConfig, GuardConfig, RetryConfig, TimeoutConfig
from guarded.error_classes import ErrorClass, classify, operational_condition
from guarded.guard import controller, guard
from guarded.models import StoredEvent
from guarded.observability import telemetry_names as names
from tests.support import records

from .conftest import StoreFactory

WRITES = 50
WINDOW = 3.0
"""Seconds the table is gone."""


def config(spill: Path) -> GuardConfig:
    return GuardConfig(
        timeout=TimeoutConfig(attempt=1.0, deadline=2.0, critical_deadline=3.0),
        retry=RetryConfig(initial_backoff=0.01, max_backoff=0.05, jitter=0.01),
        breaker=BreakerConfig(window_size=20, minimum_calls=5, open_duration=0.3),
        dead_letter=DeadLetterConfig(path=str(spill), replay_rate=1_000, drain_timeout=20),
    )


def event(index: int) -> StoredEvent:
    return records.event("renamed", index, base=0.0, kind="k", node_id="node-1")


Write = Callable[[Any, int], Awaitable[Any]]

CASES: dict[str, tuple[str, Write]] = {
    # A write of the dead-letter layer (one backend call per write) ...
    "save_memory_state": (
        "memory_states",
        lambda store, index: store.save_memory_state(f"k{index}", {"turn": index}),
    ),
    # ... and a batched write (group commit: the failed flush is held).
    "save_event": ("flow_events", lambda store, index: store.save_event(event(index))),
}


async def stored(backend: PostgresStateStore, method: str) -> int:
    if method == "save_memory_state":
        found = [await backend.load_memory_state(f"k{index}") for index in range(WRITES)]
        return sum(state == {"turn": index} for index, state in enumerate(found))
    written = [item.payload["i"] for item in await backend.load_history("renamed")]
    assert len(written) == len(set(written)), "an event was stored twice"
    return len([index for index in written if index < WRITES])  # the warm-up write aside


@pytest.mark.asyncio
@pytest.mark.parametrize("method", sorted(CASES))
async def test_writes_during_a_missing_table_window_are_held_and_replayed_not_parked(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str, tmp_path: Path, method: str
) -> None:
    table, write = CASES[method]
    registry = CollectorRegistry()
    backend = await make_store()
    store = guard(backend, name="renamed", registry=registry, config=config(tmp_path / "dlq.sqlite"))
    async with store:
        await write(store, WRITES)  # warm up: the pool's connections and statements exist
        await raw.execute(f'ALTER TABLE "{schema_name}".{table} RENAME TO {table}_moved')
        renamed_at = asyncio.get_running_loop().time()

        async def put_back() -> None:
            await asyncio.sleep(WINDOW)
            await raw.execute(f'ALTER TABLE "{schema_name}".{table}_moved RENAME TO {table}')

        restoring = asyncio.create_task(put_back())
        for index in range(WRITES):  # spread over the first 2.5 s of the window
            await write(store, index)
            await asyncio.sleep(2.5 / WRITES)
        assert asyncio.get_running_loop().time() - renamed_at < WINDOW, "writes must fall in the window"
        await restoring

        dead_letters = controller(store).dead_letters
        assert dead_letters is not None
        assert await dead_letters.parked() == [], "an operational error parked good writes"
        stats = controller(store).stats()
        assert stats.get((method, "rejected"), 0) == 0, stats
        assert await controller(store).drain() == 0
        assert await dead_letters.parked() == []
        assert await stored(backend, method) == WRITES

    counted = registry.get_sample_value(
        names.OPERATIONAL_ERRORS,
        {"store": "renamed", "method": method, "condition": "undefined_object"},
    )
    assert counted is not None, "the missing table was not counted as an operational error"
    assert counted >= 1
    assert registry.get_sample_value(
        "guarded_deadletter_parked_total", {"store": "renamed", "method": method}
    ) in (
        None,
        0.0,
    )


# --- the conditions, provoked on the real server ---------------------------------------------------


async def raised(coro: Awaitable[Any]) -> BaseException:
    try:
        await coro
    except Exception as exc:
        return exc
    raise AssertionError("expected the statement to fail")


@pytest.mark.asyncio
async def test_conditions_raised_by_the_server_are_classified_as_operational(
    raw: asyncpg.Connection, schema_name: str
) -> None:
    table = f'"{schema_name}".t'
    await raw.execute(f'CREATE SCHEMA "{schema_name}"')
    await raw.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text NOT NULL CHECK (v <> ''))")
    role = f"r_{uuid.uuid4().hex[:12]}"
    await raw.execute(f"CREATE ROLE {role}")
    hold, park = ErrorClass.OPERATIONAL, ErrorClass.REJECTED
    try:
        cases: list[tuple[str, str, ErrorClass, str | None]] = [
            ("42P01", f'INSERT INTO "{schema_name}".missing VALUES (1)', hold, "undefined_object"),
            ("42703", f"INSERT INTO {table} (nope) VALUES (1)", hold, "undefined_object"),
            ("3F000", 'CREATE TABLE "no_such_schema_x".t (i int)', hold, "undefined_object"),
            ("42601", f"INSERT INTO {table} VALUES (1,, 'v')", hold, "schema_mismatch"),
            ("22P02", f"INSERT INTO {table} VALUES ('x', 'v')", park, None),
            ("22003", f"INSERT INTO {table} VALUES (99999999999, 'v')", park, None),
            ("23502", f"INSERT INTO {table} VALUES (1, NULL)", park, None),
            ("23514", f"INSERT INTO {table} VALUES (1, '')", park, None),
        ]
        for code, statement, expected, condition in cases:
            error = await raised(raw.execute(statement))
            assert getattr(error, "sqlstate", None) == code, error
            assert (classify(error), operational_condition(error)) == (expected, condition), code

        async with raw.transaction(readonly=True):
            error = await raised(raw.execute(f"INSERT INTO {table} VALUES (2, 'v')"))
        assert getattr(error, "sqlstate", None) == "25006"
        assert isinstance(error, asyncpg.exceptions.ReadOnlySQLTransactionError)
        assert (classify(error), operational_condition(error)) == (ErrorClass.OPERATIONAL, "read_only")

        await raw.execute(f'GRANT USAGE ON SCHEMA "{schema_name}" TO {role}')
        async with raw.transaction():
            await raw.execute(f"SET LOCAL ROLE {role}")
            error = await raised(raw.execute(f"INSERT INTO {table} VALUES (3, 'v')"))
        assert isinstance(error, asyncpg.exceptions.InsufficientPrivilegeError)
        assert (classify(error), operational_condition(error)) == (
            ErrorClass.OPERATIONAL,
            "insufficient_privilege",
        )
    finally:
        await raw.execute(f'DROP SCHEMA "{schema_name}" CASCADE')
        await raw.execute(f"DROP ROLE {role}")
