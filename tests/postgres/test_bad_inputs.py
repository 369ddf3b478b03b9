"""Values JSON cannot carry are refused before any I/O, naming the method and the field path.

Every call here runs against a store whose pool is already *closed*: an
``InvalidPayloadError`` (rather than asyncpg's "pool is closed") proves the refusal came first.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.errors import InvalidPayloadError
from guarded.guard import controller, guard
from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    TaskContextSnapshot,
    UpdateType,
)
from tests.support.metrics import outcome_counts
from tests.support.records import plain_event as event
from tests.support.records import plain_task as task

from .conftest import StoreFactory

NAN = float("nan")
SURROGATE = "bad \udc80 text"


class Opaque:
    """An object JSON cannot serialise."""


Call = Callable[[PostgresStateStore], Awaitable[Any]]


def untyped(store: PostgresStateStore) -> Any:
    """The store without static types, to pass it arguments of the wrong type on purpose."""
    return store


CASES: list[tuple[str, Call, str, str]] = [
    (
        "nan payload",
        lambda s: s.save_event(event(payload={"x": NAN})),
        "save_event",
        "event.payload[key #0 (str)]",
    ),
    ("inf ts", lambda s: s.save_event(event(ts=float("inf"))), "save_event", "event.ts"),
    ("huge int ts", lambda s: s.save_event(event(ts=10**400)), "save_event", "event.ts"),
    ("str ts", lambda s: s.save_event(event(ts="1.0")), "save_event", "event.ts"),
    ("surrogate kind", lambda s: s.save_event(event(kind=SURROGATE)), "save_event", "event.kind"),
    (
        "object in payload",
        lambda s: s.save_event(event(payload={"a": [1, Opaque()]})),
        "save_event",
        "event.payload[key #0 (str)][1]",
    ),
    (
        "int key",
        lambda s: s.save_event(event(payload={"a": {1: "x"}})),
        "save_event",
        "event.payload[key #0 (str)][key #0 (int)]",
    ),
    ("payload not a mapping", lambda s: s.save_event(event(payload=[1])), "save_event", "event.payload"),
    ("int trace id", lambda s: s.save_event(event(trace_id=7)), "save_event", "event.trace_id"),
    (
        "bulk: second event bad",
        lambda s: s.save_events([event(), event(payload={"x": {"y": NAN}})]),
        "save_events",
        "events[1].payload[key #0 (str)][key #0 (str)]",
    ),
    (
        "binding metadata",
        lambda s: s.save_remote_binding(RemoteBinding("t", None, "k", "u", metadata={"m": Opaque()})),
        "save_remote_binding",
        "binding.metadata[key #0 (str)]",
    ),
    (
        "pause payload set",
        lambda s: s.save_planner_state("tok", {"s": {1, 2}}),
        "save_planner_state",
        "payload[key #0 (str)]",
    ),
    ("pause token not str", lambda s: untyped(s).save_planner_state(5, {}), "save_planner_state", "token"),
    ("pause token surrogate", lambda s: s.load_planner_state(SURROGATE), "load_planner_state", "token"),
    (
        "memory key surrogate",
        lambda s: s.save_memory_state("k", {SURROGATE: 1}),
        "save_memory_state",
        "state[key #0 (str)]",
    ),
    (
        "task result nan",
        lambda s: s.save_task(task(result={"r": NAN})),
        "save_task",
        "state.result[key #0 (str)]",
    ),
    (
        "task snapshot object",
        lambda s: s.save_task(
            task(
                context_snapshot=TaskContextSnapshot(
                    session_id="s", task_id="task", llm_context={"o": Opaque()}
                )
            )
        ),
        "save_task",
        "state.context_snapshot.llm_context[key #0 (str)]",
    ),
    (
        "update content nan",
        lambda s: s.save_update(
            StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=NAN)
        ),
        "save_update",
        "update.content",
    ),
    (
        "bulk updates",
        lambda s: s.save_updates(
            [
                StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=1),
                StateUpdate(session_id="s", task_id="t", update_type=UpdateType.PROGRESS, content=[Opaque()]),
            ]
        ),
        "save_updates",
        "updates[1].content[0]",
    ),
    (
        "steering id surrogate",
        lambda s: s.save_steering(
            SteeringEvent(
                session_id="s",
                task_id="t",
                event_id=SURROGATE,
                event_type=SteeringEventType.CANCEL,
            )
        ),
        "save_steering",
        "event.event_id",
    ),
    (
        "trajectory nan",
        lambda s: s.save_trajectory("t", "s", {"steps": [NAN]}),
        "save_trajectory",
        "trajectory[key #0 (str)][0]",
    ),
    (
        "trajectory object",
        lambda s: s.save_trajectory("t", "s", Opaque()),
        "save_trajectory",
        "trajectory",
    ),
    (
        "planner event extra",
        lambda s: s.save_planner_event("t", PlannerEvent("x", 1.0, 1, extra={"e": NAN})),
        "save_planner_event",
        "event.extra[key #0 (str)]",
    ),
    (
        "bulk planner events",
        lambda s: s.save_planner_events([("t", PlannerEvent("x", 1.0, 1)), ("t", PlannerEvent("x", NAN, 1))]),
        "save_planner_events",
        "items[1].event.ts",
    ),
    ("history trace not str", lambda s: untyped(s).load_history(None), "load_history", "trace_id"),
    ("updates limit not int", lambda s: untyped(s).list_updates("s", limit="5"), "list_updates", "limit"),
    (
        "steering since_id not str",
        lambda s: untyped(s).list_steering("s", since_id=3),
        "list_steering",
        "since_id",
    ),
    ("traces limit bool", lambda s: s.list_traces("s", limit=True), "list_traces", "limit"),
    (
        "find_binding tenant",
        lambda s: untyped(s).find_binding(
            router_session_id="r", agent_url="u", remote_skill="k", tenant_id=1
        ),
        "find_binding",
        "tenant_id",
    ),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "call", "method", "path"), CASES, ids=[case[0] for case in CASES])
async def test_refused_before_io_with_method_and_path(
    make_store: StoreFactory, name: str, call: Call, method: str, path: str
) -> None:
    store = await make_store()
    await store.close()  # any I/O would now fail with asyncpg's "pool is closed"
    with pytest.raises(InvalidPayloadError) as caught:
        await call(store)
    assert caught.value.method == method
    assert caught.value.path == path
    assert method in str(caught.value)
    assert path in str(caught.value)
    assert isinstance(caught.value, ValueError)  # never retryable


@pytest.mark.asyncio
async def test_bad_bulk_stores_nothing(store: PostgresStateStore) -> None:
    with pytest.raises(InvalidPayloadError):
        await store.save_events([event(trace_id="bulk"), event(trace_id="bulk", payload={"x": NAN})])
    assert await store.load_history("bulk") == []


@pytest.mark.asyncio
async def test_artifact_bad_inputs(store: PostgresStateStore) -> None:
    artifacts = store.artifact_store
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_bytes("not bytes")  # type: ignore[arg-type]
    assert caught.value.path == "data"
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_text(SURROGATE)
    assert caught.value.path == "text"
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_bytes(b"x", meta={"m": NAN})
    assert caught.value.path == "meta[key #0 (str)]"


@pytest.mark.asyncio
async def test_steering_penguiflow_keeps_is_stored_sanitized_not_validated(store: PostgresStateStore) -> None:
    # PenguiFlow's reference store sanitizes and stores; validation is its sessions' job.
    for event_type, payload in [
        (SteeringEventType.PRIORITIZE, {}),
        (SteeringEventType.PRIORITIZE, {"priority": True}),
    ]:
        await store.save_steering(
            SteeringEvent(session_id="s", task_id="t", event_type=event_type, payload=payload)
        )
    assert [event.payload for event in await store.list_steering("s")] == [{}, {"priority": True}]


@pytest.mark.asyncio
async def test_naive_and_aware_datetimes_round_trip(store: PostgresStateStore) -> None:
    naive = datetime(2025, 1, 1, 12, 0, 0, 123456)
    aware = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    await store.save_task(task(task_id="naive", created_at=naive, updated_at=naive))
    await store.save_task(task(task_id="aware", created_at=aware, updated_at=aware))
    by_id = {item.task_id: item for item in await store.list_tasks("s")}
    assert by_id["naive"].updated_at == naive
    assert by_id["naive"].updated_at.tzinfo is None
    assert by_id["aware"].updated_at == aware
    assert by_id["aware"].updated_at.tzinfo is not None


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_a_key_too_long_for_its_index_is_parked_not_retried_forever(make_store: StoreFactory) -> None:
    """PostgreSQL refuses an index row over ~2.7 kB with SQLSTATE 54000 (program limit exceeded):
    the same write can never succeed, so the guard parks it with its reason instead of holding it
    for replay."""
    registry = CollectorRegistry()
    backend = await make_store()
    config = GuardConfig(dead_letter=DeadLetterConfig(path=None))
    async with guard(backend, registry=registry, config=config) as store:
        key = base64.b64encode(random.Random(7).randbytes(15_000)).decode()  # incompressible
        await store.save_memory_state(key, {"turns": []})
        labels = {"store": "default", "method": "save_memory_state", "outcome": "rejected"}
        assert registry.get_sample_value("guarded_store_calls_total", labels) == 1
        dead_letters = controller(store).dead_letters
        assert dead_letters.depth == 0
        [parked] = await dead_letters.parked()
        assert parked.method == "save_memory_state"
        assert "54000" in parked.reason


BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("load_memory_state", ("k",), {"extra": 1}, "unexpected keyword argument 'extra'"),
    ("save_memory_state", ("k",), {}, "missing a required argument: 'state'"),
    ("save_event", ("not an event",), {}, "argument 'event' must be a StoredEvent"),
]


@pytest.mark.lenient
@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "args", "kwargs", "message"), BAD_CALLS)
async def test_a_callers_bug_is_rejected_and_logged_never_held_or_sent(
    make_store: StoreFactory,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's three bad calls, against the real store with the default guard."""
    registry = CollectorRegistry()
    backend = await make_store()
    async with guard(backend, registry=registry) as store:
        assert await getattr(store, method)(*args, **kwargs) is None
        await controller(store).flush()
        dead_letters = controller(store).dead_letters
        assert dead_letters is not None
        assert (dead_letters.depth, await dead_letters.parked()) == (0, [])
    samples = outcome_counts(registry, store=None)
    assert samples == {"rejected": 1}
    [record] = [record for record in caplog.records if record.levelname == "ERROR"]
    assert message in record.getMessage()


@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "args", "kwargs", "message"), BAD_CALLS)
async def test_in_strict_mode_a_callers_bug_raises(
    make_store: StoreFactory, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    backend = await make_store()
    async with guard(backend, registry=CollectorRegistry()) as store:  # the suite runs strict
        with pytest.raises(TypeError, match=message):
            await getattr(store, method)(*args, **kwargs)
