"""Must-not-throw: fallbacks per policy, not_found vs failure, {} -> None, rate-limited safe logs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import guard
from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    TaskContextSnapshot,
    TaskState,
)
from guarded.observability.failure_log import FailureLog
from guarded.testing import Fault, FaultPlan, FaultyStore
from tests.broken_stores import BrokenStore
from tests.support.metrics import calls, outcome_counts

from .support import event, fast_config

SECRET = "s3cr3t-PAYLOAD-7f2c"


def task_state(session: str = "s1", task: str = "task1") -> TaskState:
    return TaskState(
        task_id=task,
        session_id=session,
        status="RUNNING",
        task_type="FOREGROUND",
        priority=0,
        context_snapshot=TaskContextSnapshot(session_id=session, task_id=task),
    )


def binding() -> RemoteBinding:
    return RemoteBinding("t1", "c1", "task1", "http://agent", router_session_id="r1", remote_skill="skill")


FIND = {"router_session_id": "r1", "agent_url": "http://agent", "remote_skill": "skill"}

CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], Any]] = [
    # (method, args, kwargs, fallback)
    ("save_event", (event("t1"),), {}, None),
    ("save_events", ([event("t1")],), {}, None),
    ("load_history", ("t1",), {}, []),
    ("save_remote_binding", (binding(),), {}, None),
    ("find_binding", (), FIND, None),
    ("list_bindings", (), {"router_session_id": "r1"}, []),
    ("mark_binding_terminal", (), {"trace_id": "t1", "context_id": "c1", "task_id": "task1"}, None),
    ("save_planner_state", ("tok", {"a": 1}), {}, None),
    ("load_planner_state", ("tok",), {}, None),
    ("save_memory_state", ("k", {"a": 1}), {}, None),
    ("load_memory_state", ("k",), {}, None),
    ("save_task", (task_state(),), {}, None),
    ("list_tasks", ("s1",), {}, []),
    (
        "save_update",
        (StateUpdate(session_id="s1", task_id="task1", update_type="PROGRESS", content=1),),
        {},
        None,
    ),
    ("list_updates", ("s1",), {}, []),
    ("save_steering", (SteeringEvent(session_id="s1", task_id="task1", event_type="PAUSE"),), {}, None),
    ("list_steering", ("s1",), {}, []),
    ("save_trajectory", ("t1", "s1", {"steps": []}), {}, None),
    ("get_trajectory", ("t1", "s1"), {}, None),
    ("list_traces", ("s1",), {}, []),
    ("save_planner_event", ("t1", PlannerEvent("step", 1.0)), {}, None),
    ("list_planner_events", ("t1",), {}, []),
    ("get_events", ("t1",), {}, []),
    ("list_task_updates", ("s1",), {}, []),
    ("artifact_store.get", ("art_x",), {}, None),
    ("artifact_store.get_ref", ("art_x",), {}, None),
    ("artifact_store.exists", ("art_x",), {}, False),
    ("artifact_store.delete", ("art_x",), {}, False),
    ("artifact_store.list", (), {}, []),
]


def method_of(store: Any, name: str) -> Any:
    target = store
    for part in name.split("."):
        target = getattr(target, part)
    return target


@pytest.mark.parametrize(("method", "args", "kwargs", "fallback"), CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize(
    ("fault", "outcome"), [(Fault.error_before(RuntimeError), "fallback"), (Fault.hang(), "timeout")]
)
@pytest.mark.asyncio
async def test_failure_returns_the_policy_fallback(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], fallback: Any, fault: Fault, outcome: str
) -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(fault))
    store = guard(faulty, registry=registry, config=fast_config(max_attempts=1, attempt=0.02, deadline=0.02))
    result = await method_of(store, method)(*args, **kwargs)
    assert result == fallback
    assert type(result) is type(fallback)
    assert outcome_counts(registry) == {outcome: 1}
    assert calls(registry, method, outcome) == 1


@pytest.mark.asyncio
async def test_empty_dict_for_a_missing_token_becomes_none() -> None:
    registry = CollectorRegistry()
    store = guard(BrokenStore(), registry=registry)  # answers {} for a missing token
    assert await store.load_planner_state("missing") is None
    assert calls(registry, "load_planner_state", "not_found") == 1
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.respond({})))
    store = guard(faulty, registry=registry, name="faulty")
    assert await store.load_planner_state("missing") is None
    assert calls(registry, "load_planner_state", "not_found", store="faulty") == 1


@pytest.mark.asyncio
async def test_empty_dict_is_kept_where_it_is_a_value() -> None:
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry)
    await store.save_memory_state("k", {})
    assert await store.load_memory_state("k") == {}
    assert calls(registry, "load_memory_state", "ok") == 1


@pytest.mark.asyncio
async def test_not_found_is_distinct_from_failure() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(
        InMemoryStateStore(),
        FaultPlan.script({"load_memory_state": [None, Fault.error_before(RuntimeError)]}),
    )
    store = guard(faulty, registry=registry, config=fast_config())
    assert await store.load_memory_state("k") is None
    assert await store.load_memory_state("k") is None
    assert calls(registry, "load_memory_state", "not_found") == 1
    assert calls(registry, "load_memory_state", "fallback") == 1
    assert await store.get_trajectory("t1", "s1") is None
    assert await store.find_binding(**FIND) is None
    assert await store.load_planner_state("tok") is None
    for method in ("get_trajectory", "find_binding", "load_planner_state"):
        assert calls(registry, method, "not_found") == 1
    assert await store.load_history("nothing") == []  # an empty list is a found (empty) result
    assert calls(registry, "load_history", "ok") == 1


@pytest.mark.asyncio
async def test_found_values_are_returned_unchanged() -> None:
    store = guard(InMemoryStateStore(), registry=CollectorRegistry())
    await store.save_planner_state("tok", {"step": 1, "nested": {"a": [1, 2]}})
    assert await store.load_planner_state("tok") == {"step": 1, "nested": {"a": [1, 2]}}
    assert await store.load_planner_state("tok") is None  # consumed


@pytest.mark.lenient
@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("save_memory_state", ("k", {"x": float("nan")})),
        ("save_planner_state", ("tok", {"x": object()})),
        ("save_event", (event("t1", x="\ud800"),)),
    ],
)
@pytest.mark.asyncio
async def test_bad_payload_is_rejected(method: str, args: tuple[Any, ...]) -> None:
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry, config=fast_config())
    assert await getattr(store, method)(*args) is None
    assert outcome_counts(registry) == {"rejected": 1}


@pytest.mark.asyncio
async def test_store_raised_cancelled_error_is_a_failure_not_a_cancellation() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(asyncio.CancelledError)))
    store = guard(faulty, registry=registry, config=fast_config())
    assert await store.load_history("t1") == []  # the caller was not cancelled: nothing escapes
    assert calls(registry, "load_history", "fallback") == 1
    assert calls(registry, "load_history", "cancelled") == 0


# --- logging ---------------------------------------------------------------------------------------


def failure_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "event", None) == "statestore_call_failed"]


@pytest.mark.asyncio
async def test_one_structured_record_per_method_and_error_type(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="guarded")
    plan = FaultPlan.script(
        {
            "load_history": [Fault.error_before(ConnectionResetError)] * 5
            + [Fault.error_before(RuntimeError)] * 3,
            "list_tasks": [Fault.error_before(ConnectionResetError)] * 2,
        }
    )
    store = guard(
        FaultyStore(InMemoryStateStore(), plan),
        name="primary",
        registry=CollectorRegistry(),
        config=fast_config(max_attempts=1),
    )
    for _ in range(8):
        await store.load_history("t1")
    for _ in range(2):
        await store.list_tasks("s1")
    records = failure_records(caplog)
    assert [(r.method, r.error_type) for r in records] == [  # type: ignore[attr-defined]
        ("load_history", "ConnectionResetError"),
        ("load_history", "RuntimeError"),
        ("list_tasks", "ConnectionResetError"),
    ]
    first = records[0]
    assert first.levelno == logging.WARNING
    assert (first.store, first.outcome, first.suppressed) == ("primary", "fallback", 0)  # type: ignore[attr-defined]
    assert "load_history" in first.getMessage()
    assert "ConnectionResetError" in first.getMessage()


def test_suppressed_failures_are_counted_in_the_next_record(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="guarded")
    now = [0.0]
    log = FailureLog(10.0, clock=lambda: now[0])
    for _ in range(4):
        log.failure(store="s", method="m", error_type="E", outcome="fallback", message="")
    now[0] = 10.0
    log.failure(store="s", method="m", error_type="E", outcome="fallback", message="")
    records = failure_records(caplog)
    assert [r.suppressed for r in records] == [0, 3]  # type: ignore[attr-defined]
    assert "3 similar suppressed" in records[1].getMessage()


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_logs_never_contain_payload_contents(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    plan = FaultPlan.script(
        {
            "save_memory_state": [None, Fault.error_after(ConnectionResetError)],
            "save_event": [Fault.error_before(KeyError(SECRET))],
        }
    )
    store = guard(
        FaultyStore(InMemoryStateStore(), plan),
        registry=CollectorRegistry(),
        config=fast_config(max_attempts=1, log_interval=0),
    )
    await store.save_memory_state(
        "k", {SECRET: float("nan"), "note": SECRET}
    )  # rejected; the key is in the path
    await store.save_memory_state("k", {"note": SECRET})  # error after the write
    await store.save_planner_state("tok", {"note": SECRET, "bad": object()})
    await store.save_event(event("t1", note=SECRET))
    await store.save_steering(
        SteeringEvent(session_id="s1", task_id="t", event_type="REDIRECT", payload={"x": SECRET})
    )
    records = failure_records(caplog)
    assert len(records) >= 4
    for record in caplog.records:
        text = " ".join([record.getMessage(), repr(record.__dict__), caplog.text])
        assert SECRET not in text


class CustomStore(InMemoryStateStore):
    """A backend with methods the policy table does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.widget_calls = 0
        self.ping_calls = 0

    async def fetch_widgets(self, kind: str) -> list[str]:
        self.widget_calls += 1
        raise ConnectionResetError("down")

    async def ping(self) -> bool:
        self.ping_calls += 1
        raise ConnectionResetError("down")


@pytest.mark.asyncio
async def test_unknown_methods_get_inferred_policies_and_overrides_apply() -> None:
    registry = CollectorRegistry()
    inner = CustomStore()
    store = guard(inner, registry=registry, config=fast_config())
    assert await store.fetch_widgets("a") is None  # inferred: a single-item read
    assert inner.widget_calls == 3  # reads are repeat-safe
    assert await store.ping() is None
    assert inner.ping_calls == 1  # an unknown verb is never repeated blindly

    other = CustomStore()
    store = guard(
        other,
        name="custom",
        registry=registry,
        config=fast_config(),
        policies={
            "fetch_widgets": {"kind": "read", "fallback": "empty_list"},
            "ping": {"kind": "read", "fallback": "false", "repeat_safe": True},
        },
    )
    assert await store.fetch_widgets("a") == []
    assert await store.ping() is False
    assert other.ping_calls == 3  # now a repeat-safe read: retried
    assert calls(registry, "fetch_widgets", "fallback", store="custom") == 1
