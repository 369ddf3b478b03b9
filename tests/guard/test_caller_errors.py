"""Caller bugs are the caller's: a call that does not bind to the method's
signature, or passes the wrong type of record, ends at once with outcome ``rejected`` and an ERROR
log record carrying the message; it never reaches the backend, is never held, parked, replayed or
counted ``ok``. A ``TypeError`` or ``AttributeError`` the backend raises is treated the same.

Every test runs the production configuration (batching, dead-letter buffer with its spill file,
stale reads), where a lost or replayed bad call would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BreakerConfig
from guarded.errors import CallerError, InvalidPayloadError, WriteRefusedError
from guarded.models import StoredEvent
from guarded.pipeline import strict_mode
from guarded.testing import strict
from tests.support.metrics import calls, outcome_counts

from .support import event

pytestmark = pytest.mark.asyncio

SECRET = "secret-payload-7f3a"
"""A value no log record may quote."""

BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("load_memory_state", ("k",), {"extra": 1}, "unexpected keyword argument 'extra'"),
    ("save_memory_state", ("k",), {}, "missing a required argument: 'state'"),
    ("save_event", (SECRET,), {}, "'event' must be a StoredEvent"),
    ("save_event", (None,), {}, "got NoneType"),
    ("save_events", ([event("t"), SECRET],), {}, "'events[1]' must be a StoredEvent"),
    ("save_events", (SECRET,), {}, "'events' must be a sequence (list or tuple) of StoredEvent"),
    ("load_history", ("t", "surplus"), {}, "too many positional arguments"),
    ("save_task", ({"task_id": SECRET},), {}, "'state' must be a TaskState"),
    ("save_update", (42,), {}, "'update' must be a StateUpdate"),
    ("save_task_update", (42,), {}, "'update' must be a StateUpdate"),
    ("save_steering", (SECRET,), {}, "'event' must be a SteeringEvent"),
    ("save_planner_event", ("t", SECRET), {}, "'event' must be a PlannerEvent"),
    ("save_planner_state", ("tok", SECRET), {}, "'payload' must be a mapping"),
    ("save_memory_state", ("k", [SECRET]), {}, "'state' must be a mapping"),
    ("save_trajectory", ("t", "s", SECRET), {}, "'trajectory' must be a mapping or"),
    ("save_remote_binding", (SECRET,), {}, "'binding' must be a RemoteBinding"),
    ("list_updates", ("s",), {"sinceid": "x"}, "unexpected keyword argument 'sinceid'"),
    ("mark_binding_terminal", ("t", None, "task"), {}, "too many positional arguments"),
]


class RecordingStore(InMemoryStateStore):
    """The reference in-memory store, remembering every call that reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.reached: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if not name.startswith("_") and name != "reached" and callable(value):
            self_reached = super().__getattribute__("reached")

            def recorded(*args: Any, **kwargs: Any) -> Any:
                self_reached.append(name)
                return value(*args, **kwargs)

            return recorded
        return value


@pytest.mark.lenient
@pytest.mark.parametrize(("method", "args", "kwargs", "message"), BAD_CALLS)
async def test_a_bad_call_is_rejected_logged_and_never_held(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    store = guard(backend, registry=registry)
    caplog.set_level(logging.INFO, logger="guarded")
    async with store:
        result = await getattr(store, method)(*args, **kwargs)
        await controller(store).flush()
        buffer = controller(store).dead_letters
        assert buffer is not None
        stats = await buffer.stats()
        assert (stats.depth, stats.parked) == (0, 0), "a caller's bug is never held nor parked"
    assert result is None or result == []
    assert outcome_counts(registry) == {"rejected": 1}
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1, [record.getMessage() for record in caplog.records]
    logged = errors[0].getMessage()
    assert message in logged
    assert method in logged
    assert SECRET not in logged
    assert errors[0].__dict__["outcome"] == "rejected"
    assert not [record for record in caplog.records if SECRET in record.getMessage()]


@pytest.mark.lenient
async def test_a_bad_call_never_reaches_the_backend() -> None:
    backend = RecordingStore()
    store = guard(backend, registry=CollectorRegistry())
    async with store:
        await store.save_memory_state("k")  # type: ignore[call-arg]
        await store.save_event("not an event")  # type: ignore[arg-type]
        await store.load_memory_state("k", extra=1)  # type: ignore[call-arg]
        await controller(store).drain(1.0)
    assert not {"save_memory_state", "save_event", "save_events", "load_memory_state"} & set(backend.reached)


async def test_good_calls_pass_with_our_records_penguiflows_and_lookalikes() -> None:
    from penguiflow.state import models as pf

    class Lookalike:
        """Not a StoredEvent, but it has every field the stores read."""

        def __init__(self) -> None:
            self.trace_id, self.ts, self.kind = "t", 3.0, "node_end"
            self.node_name, self.node_id, self.payload = "n", "n3", {"i": 3}

    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry)
    async with store:
        await store.save_event(event("t", 1))
        theirs = pf.StoredEvent(trace_id="t", ts=2.0, kind="node_end", node_name="n", node_id="2", payload={})
        await store.save_event(theirs)
        await store.save_event(Lookalike())  # type: ignore[arg-type]
        await store.save_events([event("t", 4)])
        await store.save_memory_state(key="k", state={"a": 1})
        assert await store.load_memory_state(key="k") == {"a": 1}
        history = await store.load_history("t")
    assert sorted(item.ts for item in history) == [2.0, 3.0, 1000.0 + 1, 1000.0 + 4]
    assert "rejected" not in outcome_counts(registry)


class RaisingStore(InMemoryStateStore):
    """A backend with a bug: its memory-state methods raise a programming error. It stands for a
    database (it keeps its data across processes), so its parked writes go to the spill file."""

    durable_across_processes = True

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error
        self.attempts = 0

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        self.attempts += 1
        raise self.error

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        self.attempts += 1
        raise self.error


@pytest.mark.lenient
@pytest.mark.parametrize(
    "error",
    [
        TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
        AttributeError("'NoneType' object has no attribute 'x'"),
    ],
    ids=["TypeError", "AttributeError"],
)
async def test_a_programming_error_in_the_backend_is_rejected_and_parked_not_a_store_failure(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    backend = RaisingStore(error)
    breaker = BreakerConfig(window_size=2, minimum_calls=2, failure_rate_threshold=0.5)
    store = guard(backend, registry=registry, breaker=breaker)
    caplog.set_level(logging.INFO, logger="guarded")
    async with store:
        for _ in range(5):
            assert await store.save_memory_state("k", {"v": SECRET}) is None
        await store.save_memory_state("k", {"v": 1})  # a held copy would be served below
        assert await store.load_memory_state("k") is None
        buffer = controller(store).dead_letters
        assert buffer is not None
        stats = await buffer.stats()
        # Never held for replay (no wait fixes a bug); parked with its reason, so the writes can
        # be replayed once the backend is fixed (guarded dlq replay --parked).
        assert (stats.depth, stats.parked) == (0, 6)
        assert controller(store).breaker.state.value == "closed", "a bug is not the backend being down"
    assert backend.attempts == 7, "never retried"
    assert calls(registry, "save_memory_state", "rejected") == 6
    assert calls(registry, "load_memory_state", "rejected") == 1
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors
    assert all(str(error) in message for message in errors)
    assert not [record for record in caplog.records if SECRET in record.getMessage()]


@pytest.mark.lenient
async def test_a_delegating_store_is_checked_against_the_protocol_signature() -> None:
    class Delegating:
        """Forwards everything: its own signatures say nothing."""

        def __init__(self, inner: object) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    class Forwarding:
        def __init__(self, inner: object) -> None:
            self._inner = inner

        async def save_event(self, *args: Any, **kwargs: Any) -> Any:
            return await self._inner.save_event(*args, **kwargs)  # type: ignore[attr-defined]

        async def load_history(self, *args: Any, **kwargs: Any) -> Any:
            return await self._inner.load_history(*args, **kwargs)  # type: ignore[attr-defined]

        async def save_remote_binding(self, *args: Any, **kwargs: Any) -> Any:
            return await self._inner.save_remote_binding(*args, **kwargs)  # type: ignore[attr-defined]

    for wrapper in (Delegating(InMemoryStateStore()), Forwarding(InMemoryStateStore())):
        registry = CollectorRegistry()
        store = guard(wrapper, registry=registry)
        async with store:
            await store.save_event(event("t"), "surplus")
            await store.load_history(trace_id="t", limit=3)
            await store.save_event(event("t"))
            assert len(await store.load_history("t")) == 1
        assert calls(registry, "save_event", "rejected") == 1
        assert calls(registry, "load_history", "rejected") == 1


# --- strict mode -------------------------------------------------------------


def _strict_by_config() -> contextlib.AbstractContextManager[dict[str, Any]]:
    return contextlib.nullcontext({"strict": True})


@contextlib.contextmanager
def _strict_by_context_manager() -> Iterator[dict[str, Any]]:
    with strict():
        yield {}


@contextlib.contextmanager
def _strict_by_environment() -> Iterator[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GUARDED_STRICT", "1")
        yield {}


STRICT_SWITCHES = {
    "GuardConfig(strict=True)": _strict_by_config,
    "guarded.testing.strict()": _strict_by_context_manager,
    "GUARDED_STRICT=1": _strict_by_environment,
}


@pytest.mark.lenient
@pytest.mark.parametrize("switch", list(STRICT_SWITCHES))
@pytest.mark.parametrize(("method", "args", "kwargs", "message"), BAD_CALLS[:3])
async def test_strict_mode_raises_the_callers_bug(
    switch: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    registry = CollectorRegistry()
    backend = RecordingStore()
    with STRICT_SWITCHES[switch]() as settings:
        store = guard(backend, registry=registry, **settings)
        async with store:
            with pytest.raises(TypeError, match=re.escape(message)) as raised:
                await getattr(store, method)(*args, **kwargs)
            assert isinstance(raised.value, CallerError)
            buffer = controller(store).dead_letters
            assert buffer is not None
            assert (await buffer.stats()).depth == 0
    assert outcome_counts(registry) == {"rejected": 1}
    assert method not in backend.reached


@pytest.mark.lenient
@pytest.mark.parametrize("switch", list(STRICT_SWITCHES))
async def test_strict_mode_raises_a_programming_error_of_the_backend(switch: str) -> None:
    with STRICT_SWITCHES[switch]() as settings:
        backend = RaisingStore(AttributeError("no attribute 'x'"))
        store = guard(backend, registry=CollectorRegistry(), **settings)
        async with store:
            with pytest.raises(AttributeError, match="no attribute 'x'"):
                await store.load_memory_state("k")


@pytest.mark.lenient
async def test_strict_mode_raises_bad_data_after_parking_it() -> None:
    """Bad data is the caller's too: parked with its reason as in production, and raised."""
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), strict=True, batching=False)
    async with store:
        with pytest.raises(InvalidPayloadError, match="nan is not a valid JSON number"):
            await store.save_memory_state("k", {"v": float("nan")})
        buffer = controller(store).dead_letters
        assert buffer is not None
        assert (await buffer.stats()).parked == 1


class HangingStore(InMemoryStateStore):
    """A store whose reads never answer and whose writes lose their connection."""

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        await asyncio.Event().wait()
        return None

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        raise ConnectionResetError("connection lost")


async def test_strict_mode_still_degrades_on_store_failures() -> None:
    """The suite runs strict (tests/conftest.py): outages must look as in production."""
    registry = CollectorRegistry()
    store = guard(
        HangingStore(),
        registry=registry,
        strict=True,
        timeout=0.2,
        retries=1,
        dead_letter={"drain_timeout": 0},  # closed without waiting for the hanging store again
    )
    async with store:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await store.load_memory_state("k") is None
        assert loop.time() - started < 0.2 + 0.5
        assert await store.save_memory_state("k", {"v": 1}) is None
        buffer = controller(store).dead_letters
        assert buffer is not None
        assert (await buffer.stats()).depth == 1
    assert outcome_counts(registry) == {"timeout": 1, "dead_lettered": 1}


async def test_the_suite_runs_strict() -> None:
    """Unmarked tests run in strict mode (tests/conftest.py)."""
    assert strict_mode.forced()
    store = guard(InMemoryStateStore(), registry=CollectorRegistry())
    async with store:
        with pytest.raises(CallerError):
            await store.save_event("not an event")  # type: ignore[arg-type]


# --- found by an adversarial review --------------------------------------------------------------


def _with_connection(method: Any) -> Any:
    """A decorator that supplies the method's first argument itself (a connection)."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await method(self, "connection", *args, **kwargs)

    return wrapper


class DecoratedStore(InMemoryStateStore):
    @_with_connection
    async def save_memory_state(self, connection: str, key: str, state: dict[str, Any]) -> None:  # type: ignore[override]
        assert connection == "connection"
        await super().save_memory_state(key, state)


async def test_a_decorator_that_supplies_an_argument_does_not_make_good_calls_wrong() -> None:
    """The signature checked is the wrapper's (it takes anything: the protocol's stands in), not
    the wrapped function's, whose first parameter the decorator supplies."""
    backend = DecoratedStore()
    registry = CollectorRegistry()
    async with guard(backend, registry=registry) as store:
        await store.save_memory_state("k", {"v": 1})
    assert await backend.load_memory_state("k") == {"v": 1}
    assert outcome_counts(registry) == {"ok": 1}


class BuggyBatchStore(InMemoryStateStore):
    """Its bulk and single event writes raise a TypeError for one event (a bug on that input)."""

    async def save_events(self, events: Any) -> None:
        if any(event.node_id == "bad" for event in events):
            raise TypeError("backend bug on this event")
        await super().save_events(events)

    async def save_event(self, event: Any) -> None:
        if event.node_id == "bad":
            raise TypeError("backend bug on this event")
        await super().save_event(event)


@pytest.mark.lenient
async def test_a_batched_write_the_backend_fails_with_a_bug_is_parked_and_rejected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = BuggyBatchStore()
    registry = CollectorRegistry()
    caplog.set_level(logging.INFO, logger="guarded")
    bad = StoredEvent("t", 9.0, "node_end", "n", "bad", {})
    async with guard(backend, registry=registry) as store:
        await asyncio.gather(
            *(store.save_event(event("t", index)) for index in range(5)), store.save_event(bad)
        )
        buffer = controller(store).dead_letters
        assert buffer is not None
        assert ((await buffer.stats()).depth, len(await buffer.parked())) == (0, 1)
    assert len(await backend.load_history("t")) == 5, "the good writes of the batch are written"
    assert calls(registry, "save_event", "rejected") == 1
    assert any(
        "backend bug on this event" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
    )
    with strict():
        async with guard(BuggyBatchStore(), registry=CollectorRegistry()) as store:
            with pytest.raises(WriteRefusedError, match="parked"):
                await store.save_event(bad)


class AliasOnlyStore:
    """A store of the older protocol: only the legacy names of the task-update methods."""

    def __init__(self) -> None:
        self._inner = InMemoryStateStore()

    async def save_event(self, event: Any) -> None:
        await self._inner.save_event(event)

    async def load_history(self, trace_id: str) -> Any:
        return await self._inner.load_history(trace_id)

    async def save_remote_binding(self, binding: Any) -> None:
        await self._inner.save_remote_binding(binding)

    async def save_task_update(self, update: Any) -> None:
        await self._inner.save_update(update)

    async def list_task_updates(self, session_id: str, **kwargs: Any) -> Any:
        return await self._inner.list_updates(session_id, **kwargs)


async def test_a_store_with_only_the_legacy_names_gets_its_updates() -> None:
    from guarded.models import StateUpdate

    backend = AliasOnlyStore()
    registry = CollectorRegistry()
    update = StateUpdate(session_id="s", task_id="t", update_type="PROGRESS", content={"n": 1})
    async with guard(backend, registry=registry) as store:
        await store.save_task_update(update)
        assert [item.update_id for item in await store.list_task_updates("s")] == [update.update_id]
        buffer = controller(store).dead_letters
        assert buffer is not None
        assert ((await buffer.stats()).depth, await buffer.parked()) == (0, [])
    assert len(await backend.list_task_updates("s")) == 1
    assert outcome_counts(registry) == {"ok": 2}


@pytest.mark.lenient
async def test_names_that_came_from_data_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A payload splatted into a call names its keys in Python's message: not identifiers, redacted."""
    caplog.set_level(logging.INFO, logger="guarded")
    async with guard(InMemoryStateStore(), registry=CollectorRegistry()) as store:
        await store.save_memory_state("k", {}, **{"ssn_078-05-1120": 1})  # type: ignore[call-arg]
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "unexpected keyword argument '…'" in logged
    assert "078-05-1120" not in logged


class Hostile:
    """An argument whose attributes raise something else than AttributeError."""

    def __getattr__(self, name: str) -> Any:
        raise KeyError(name)


@pytest.mark.lenient
async def test_an_argument_whose_attributes_raise_is_a_wrong_type() -> None:
    registry = CollectorRegistry()
    async with guard(InMemoryStateStore(), registry=registry) as store:
        await store.save_event(Hostile())  # type: ignore[arg-type]
        await store.save_trajectory("t", "s", Hostile())  # type: ignore[arg-type]
    assert outcome_counts(registry) == {"rejected": 2}
