"""Retry: what is retried, what never is, consume-once, deadlines, and a tenacity-free success path."""

from __future__ import annotations

import socket
from typing import Any

import asyncpg.exceptions as pg
import pytest
import tenacity
from prometheus_client import CollectorRegistry

import guarded.backends.postgres  # noqa: F401 - registers the PostgreSQL error classifier
import guarded.layers.retry as retry_module
from guarded.backend import current_idempotency_key
from guarded.backends.memory import InMemoryStateStore
from guarded.config import MethodConfig, RetryConfig
from guarded.error_classes import BackendNotReachedError, ErrorClass, classify, reached_backend
from guarded.errors import CallerError, InvalidPayloadError
from guarded.guard import guard
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import calls, retries

from .support import DEADLINE, MARGIN, Stopwatch, event, fast_config

RETRYABLE, REJECTED, FATAL = ErrorClass.RETRYABLE, ErrorClass.REJECTED, ErrorClass.FATAL
OPERATIONAL = ErrorClass.OPERATIONAL


class SqlError(Exception):
    """Shaped like an asyncpg error: a ``sqlstate`` attribute, a message that may quote data."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__("ERROR: something about the row (secret data)")
        self.sqlstate = sqlstate


class InterfaceError(Exception):
    """Named like asyncpg's client-side connection errors."""


CLASSIFICATION: list[tuple[BaseException, ErrorClass, bool]] = [
    # (error, class, reached the backend)
    (ConnectionResetError("reset"), RETRYABLE, True),
    (ConnectionRefusedError("refused"), RETRYABLE, False),
    (BrokenPipeError(), RETRYABLE, True),
    (TimeoutError(), RETRYABLE, True),
    (TimeoutError(), RETRYABLE, True),
    (EOFError(), RETRYABLE, True),
    (socket.gaierror("no such host"), RETRYABLE, False),
    (BackendNotReachedError("not sent"), RETRYABLE, False),
    (InterfaceError("connection is closed"), RETRYABLE, True),
    (SqlError("40001"), RETRYABLE, True),  # serialization_failure
    (SqlError("40P01"), RETRYABLE, True),  # deadlock_detected
    (SqlError("57P01"), RETRYABLE, True),  # admin_shutdown
    (SqlError("57014"), RETRYABLE, True),  # query_canceled (statement_timeout)
    (SqlError("08006"), RETRYABLE, True),  # connection_failure
    (SqlError("08001"), RETRYABLE, False),  # could not connect
    (SqlError("53300"), RETRYABLE, False),  # too_many_connections
    (SqlError("23505"), REJECTED, True),  # unique_violation
    (SqlError("22P02"), REJECTED, True),  # invalid_text_representation
    (SqlError("42P01"), OPERATIONAL, True),  # undefined_table: held and replayed
    (SqlError("54000"), REJECTED, True),  # program_limit_exceeded (index row too large)
    (SqlError("XX000"), FATAL, True),  # internal_error
    (pg.SerializationError("could not serialize"), RETRYABLE, True),
    (pg.DeadlockDetectedError("deadlock"), RETRYABLE, True),
    (pg.AdminShutdownError("terminating connection"), RETRYABLE, True),
    (pg.CannotConnectNowError("starting up"), RETRYABLE, False),
    (pg.TooManyConnectionsError("too many"), RETRYABLE, False),
    (pg.ConnectionDoesNotExistError("closed"), RETRYABLE, True),
    (pg.UniqueViolationError("duplicate"), REJECTED, True),
    (pg.InvalidTextRepresentationError("bad json"), REJECTED, True),
    (pg.InternalServerError("oops"), FATAL, True),
    (InvalidPayloadError("not JSON"), REJECTED, True),
    (ValueError("bad"), REJECTED, True),
    (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogate"), REJECTED, True),
    (TypeError("wrong argument"), ErrorClass.PROGRAMMING, True),  # a bug: rejected
    (CallerError("save_event(): missing a required argument: 'event'"), ErrorClass.PROGRAMMING, True),
    (KeyError("k"), FATAL, True),
    (AttributeError("a"), ErrorClass.PROGRAMMING, True),
    (RuntimeError("r"), FATAL, True),
    (FileNotFoundError("f"), FATAL, True),
    (PermissionError("p"), FATAL, True),
]


@pytest.mark.parametrize(
    ("error", "expected", "reached"),
    CLASSIFICATION,
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_classification(error: BaseException, expected: ErrorClass, reached: bool) -> None:
    assert classify(error) is expected
    assert reached_backend(error) is reached


def test_declared_reached_backend_wins() -> None:
    sent = ConnectionRefusedError("refused after all")
    sent.reached_backend = True  # type: ignore[attr-defined]
    assert reached_backend(sent) is True
    not_sent = ConnectionResetError("never written")
    not_sent.reached_backend = False  # type: ignore[attr-defined]
    assert reached_backend(not_sent) is False


def test_fault_errors_say_whether_they_were_sent() -> None:
    assert reached_backend(Fault.error_before(ConnectionResetError).make_error("m")) is False
    assert reached_backend(Fault.error_after(ConnectionRefusedError).make_error("m")) is True


def scripted(script: dict[str, list[Fault | None]], store: Any = None) -> Any:
    return FaultyStore(store if store is not None else InMemoryStateStore(), FaultPlan.script(script))


@pytest.mark.asyncio
async def test_retryable_error_then_success_is_retried() -> None:
    registry = CollectorRegistry()
    inner = InMemoryStateStore()
    await inner.save_event(event("t1"))
    faulty = scripted(
        {
            "load_history": [
                Fault.error_before(ConnectionResetError),
                Fault.error_after(pg.SerializationError),
            ]
        },
        inner,
    )
    store = guard(faulty, registry=registry, config=fast_config())
    history = await store.load_history("t1")
    assert [e.node_id for e in history] == ["n0"]
    assert fault_injector(faulty).calls("load_history") == 3
    assert calls(registry, "load_history", "retried") == 1
    assert calls(registry, "load_history", "ok") == 0
    assert retries(registry, "load_history") == 2


@pytest.mark.asyncio
async def test_retries_stop_at_max_attempts() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    store = guard(faulty, registry=registry, config=fast_config(max_attempts=4))
    assert await store.load_history("t1") == []
    assert fault_injector(faulty).calls("load_history") == 4
    assert calls(registry, "load_history", "fallback") == 1
    assert retries(registry, "load_history") == 3


@pytest.mark.asyncio
async def test_critical_methods_get_more_attempts() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    config = fast_config(
        deadline=2.0,
        retry=RetryConfig(
            max_attempts=2, critical_max_attempts=5, initial_backoff=0.001, max_backoff=0.002, jitter=0
        ),
    )
    store = guard(faulty, registry=registry, config=config)
    await store.save_planner_state("tok", {"a": 1})
    await store.save_memory_state("k", {"a": 1})
    assert fault_injector(faulty).calls("save_planner_state") == 5
    assert fault_injector(faulty).calls("save_memory_state") == 2


@pytest.mark.asyncio
async def test_retry_can_be_switched_off_per_method() -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    store = guard(
        faulty,
        registry=CollectorRegistry(),
        config=fast_config(methods={"load_history": MethodConfig(retry=False)}),
    )
    await store.load_history("t1")
    await store.list_tasks("s1")
    assert fault_injector(faulty).calls("load_history") == 1
    assert fault_injector(faulty).calls("list_tasks") == 3


@pytest.mark.lenient
@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (ValueError, "rejected"),
        (InvalidPayloadError, "rejected"),
        (pg.UniqueViolationError, "rejected"),
        (RuntimeError, "fallback"),
        (TypeError, "rejected"),  # a programming error
        (AttributeError, "rejected"),
    ],
)
@pytest.mark.asyncio
async def test_programming_and_data_errors_are_never_retried(
    error: type[BaseException], outcome: str
) -> None:
    registry = CollectorRegistry()
    faulty = scripted({"save_memory_state": [Fault.error_before(error)]})
    store = guard(faulty, registry=registry, config=fast_config())
    assert await store.save_memory_state("k", {"a": 1}) is None
    assert fault_injector(faulty).calls("save_memory_state") == 1
    assert calls(registry, "save_memory_state", outcome) == 1
    assert retries(registry, "save_memory_state") == 0


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_bad_payload_from_the_real_store_is_rejected_once() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore())
    store = guard(faulty, registry=registry, config=fast_config())
    assert await store.save_planner_state("tok", {"when": object()}) is None
    assert fault_injector(faulty).calls("save_planner_state") == 1
    assert calls(registry, "save_planner_state", "rejected") == 1


# --- consume once ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_consume_is_not_repeated_after_an_error_after_the_write() -> None:
    registry = CollectorRegistry()
    inner = InMemoryStateStore()
    await inner.save_planner_state("tok", {"step": 3})
    faulty = scripted({"load_planner_state": [Fault.error_after(ConnectionResetError)]}, inner)
    store = guard(faulty, registry=registry, config=fast_config(max_attempts=5))
    assert await store.load_planner_state("tok") is None
    assert fault_injector(faulty).calls("load_planner_state") == 1
    assert calls(registry, "load_planner_state", "fallback") == 1
    # Why: the consume did happen; a blind repeat would have found nothing (and said "not found").
    assert await inner.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_consume_is_not_repeated_after_a_timeout() -> None:
    registry = CollectorRegistry()
    inner = InMemoryStateStore()
    await inner.save_planner_state("tok", {"step": 3})
    faulty = scripted({"load_planner_state": [Fault.hang()]}, inner)
    store = guard(faulty, registry=registry, config=fast_config(max_attempts=5))
    assert await store.load_planner_state("tok") is None
    assert fault_injector(faulty).calls("load_planner_state") == 1
    assert calls(registry, "load_planner_state", "timeout") == 1


@pytest.mark.parametrize(
    "error", [ConnectionResetError, ConnectionRefusedError, pg.SerializationError, BackendNotReachedError]
)
@pytest.mark.asyncio
async def test_consume_is_repeated_when_the_request_was_never_sent(error: type[BaseException]) -> None:
    registry = CollectorRegistry()
    inner = InMemoryStateStore()
    await inner.save_planner_state("tok", {"step": 3})
    faulty = scripted({"load_planner_state": [Fault.error_before(error), Fault.error_before(error)]}, inner)
    store = guard(faulty, registry=registry, config=fast_config())
    assert await store.load_planner_state("tok") == {"step": 3}
    assert fault_injector(faulty).calls("load_planner_state") == 3
    assert calls(registry, "load_planner_state", "retried") == 1


class IdempotentConsumes(InMemoryStateStore):
    """Answers a repeated consume with the same idempotency key again (like the Postgres backend)."""

    honours_idempotency_key = True

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str | None] = []
        self._answers: dict[str, Any] = {}

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        key = current_idempotency_key()
        self.keys.append(key)
        if key is not None and key in self._answers:
            return self._answers[key]  # type: ignore[no-any-return]
        payload = await super().load_planner_state(token)
        if key is not None:
            self._answers[key] = payload
        return payload


@pytest.mark.asyncio
async def test_consume_is_repeated_when_the_backend_honours_the_idempotency_key() -> None:
    registry = CollectorRegistry()
    inner = IdempotentConsumes()
    await inner.save_planner_state("tok", {"step": 3})
    faulty = scripted({"load_planner_state": [Fault.error_after(ConnectionResetError)]}, inner)
    store = guard(faulty, registry=registry, config=fast_config())
    assert await store.load_planner_state("tok") == {"step": 3}
    assert calls(registry, "load_planner_state", "retried") == 1
    first, second = inner.keys
    assert first is not None
    assert first == second
    assert await store.load_planner_state("tok") is None  # a new call: new key, token gone
    assert inner.keys[2] not in (None, first)
    assert calls(registry, "load_planner_state", "not_found") == 1
    assert current_idempotency_key() is None  # the key does not leak out of the call


# --- deadlines and the success path ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_backoff_never_sleeps_past_the_deadline() -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    config = fast_config(retry=RetryConfig(max_attempts=10, initial_backoff=1.0, max_backoff=5.0, jitter=0))
    store = guard(faulty, registry=registry, config=config)
    with Stopwatch() as watch:
        assert await store.load_history("t1") == []
    assert watch.elapsed < 0.02  # a 1 s backoff cannot fit a 0.2 s deadline: give up at once
    assert fault_injector(faulty).calls("load_history") == 1


@pytest.mark.parametrize("fault", [Fault.hang(), Fault.error_before(ConnectionResetError), Fault.delay(0.07)])
@pytest.mark.asyncio
async def test_many_attempts_still_end_by_the_deadline(fault: Fault) -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(fault))
    config = fast_config(
        retry=RetryConfig(max_attempts=1000, initial_backoff=0.002, max_backoff=0.01, jitter=0.002)
    )
    store = guard(faulty, registry=registry, config=config)
    with Stopwatch() as watch:
        assert await store.list_tasks("s1") == []
    assert watch.elapsed <= DEADLINE + MARGIN
    assert fault_injector(faulty).calls("list_tasks") > 1


@pytest.mark.asyncio
async def test_success_path_never_builds_tenacity(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []

    class Spy(tenacity.AsyncRetrying):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(retry_module, "AsyncRetrying", Spy)
    registry = CollectorRegistry()
    faulty = scripted({"list_tasks": [Fault.error_before(ConnectionResetError)]})
    store = guard(faulty, registry=registry, config=fast_config())
    for index in range(20):
        await store.save_event(event("t1", index))
        await store.load_history("t1")
        await store.save_memory_state("k", {"i": index})
        await store.load_memory_state("k")
        await store.load_planner_state("missing")
    assert built == []
    await store.list_tasks("s1")  # a retryable failure does enter tenacity
    assert built == [1]
    assert calls(registry, "list_tasks", "retried") == 1
