"""Tenancy: ``schema=`` isolates stores completely; schema names are validated, never interpolated."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from guarded.backends.postgres import InvalidSchemaNameError, PostgresStateStore, validate_schema_name
from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)
from guarded.pipeline.idempotency import idempotency_key

from .conftest import StoreFactory, new_schema_name


async def write_everything(store: PostgresStateStore) -> None:
    await store.save_event(StoredEvent("trace", 1.0, "k", "n", "i", {"tenant": store.schema}))
    await store.save_remote_binding(
        RemoteBinding("trace", None, "task", "http://a", router_session_id="r", remote_skill="s")
    )
    await store.save_planner_state("token", {"tenant": store.schema})
    await store.save_memory_state("t:u:s", {"tenant": store.schema})
    await store.save_task(
        TaskState(
            task_id="task",
            session_id="session",
            status=TaskStatus.RUNNING,
            task_type=TaskType.FOREGROUND,
            priority=1,
            context_snapshot=TaskContextSnapshot(session_id="session", task_id="task"),
            updated_at=datetime(2030, 1, 1, tzinfo=UTC),
        )
    )
    await store.save_update(
        StateUpdate(
            session_id="session", task_id="task", update_id="u1", update_type=UpdateType.PROGRESS, content=1
        )
    )
    await store.save_steering(
        SteeringEvent(
            session_id="session", task_id="task", event_id="e1", event_type=SteeringEventType.CANCEL
        )
    )
    await store.save_trajectory("trace", "session", {"steps": []})
    await store.save_planner_event("trace", PlannerEvent("x", 1.0, 1))
    await store.artifact_store.put_bytes(b"artifact", namespace="ns")


async def everything_visible(store: PostgresStateStore) -> dict[str, Any]:
    return {
        "history": await store.load_history("trace"),
        "bindings": await store.list_bindings(router_session_id="r"),
        "memory": await store.load_memory_state("t:u:s"),
        "tasks": await store.list_tasks("session"),
        "updates": await store.list_updates("session"),
        "steering": await store.list_steering("session"),
        "trajectory": await store.get_trajectory("trace", "session"),
        "traces": await store.list_traces("session"),
        "planner_events": await store.list_planner_events("trace"),
        "artifacts": await store.artifact_store.list(),
    }


@pytest.mark.asyncio
async def test_a_store_never_sees_another_schemas_rows(make_store: StoreFactory) -> None:
    tenant_a = await make_store(schema=new_schema_name())
    tenant_b = await make_store(schema=new_schema_name())
    await write_everything(tenant_a)
    seen_by_b = await everything_visible(tenant_b)
    assert all(not value for value in seen_by_b.values()), seen_by_b
    assert await tenant_b.load_planner_state("token") is None
    # ... and A still has everything, including the pause B tried to consume.
    seen_by_a = await everything_visible(tenant_a)
    assert all(seen_by_a.values()), seen_by_a
    assert await tenant_a.load_planner_state("token") == {"tenant": tenant_a.schema}
    # The same keys in B are B's own.
    await write_everything(tenant_b)
    [event_b] = await tenant_b.load_history("trace")
    [event_a] = await tenant_a.load_history("trace")
    assert event_a.payload == {"tenant": tenant_a.schema}
    assert event_b.payload == {"tenant": tenant_b.schema}


@pytest.mark.asyncio
async def test_consume_with_the_same_key_in_another_schema_gets_nothing(make_store: StoreFactory) -> None:
    tenant_a = await make_store(schema=new_schema_name())
    tenant_b = await make_store(schema=new_schema_name())
    await tenant_a.save_planner_state("token", {"a": 1})
    with idempotency_key("call-1"):
        assert await tenant_a.load_planner_state("token") == {"a": 1}
        assert await tenant_b.load_planner_state("token") is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Tenant",
        "tenant-a",
        "tenant a",
        'a"; DROP SCHEMA public CASCADE; --',
        "a.b",
        "pg_catalog",
        "pg_temp",
        "information_schema",
        "1tenant",
        "x" * 64,
        "tenant\x00",
        "ténant",
    ],
)
def test_invalid_schema_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidSchemaNameError):
        validate_schema_name(name)


@pytest.mark.asyncio
async def test_connect_refuses_an_injection_attempt_before_connecting(make_store: StoreFactory) -> None:
    with pytest.raises(InvalidSchemaNameError):
        await make_store(schema='x"; DROP TABLE t; --', dsn="postgresql://nobody@127.0.0.1:1/none")


@pytest.mark.parametrize("name", ["public", "tenant_a", "_private", "t" * 63, "a1_b2"])
def test_valid_schema_names(name: str) -> None:
    assert validate_schema_name(name) == name
