"""Every store shape a user may hand ``guard()`` is guarded, or refused.

A StateStore method is guarded however ``getattr(store, name)`` reaches it: an ``async def`` of
the class, an instance attribute, a callable object, a ``functools.partial``, a sync function or
``functools.wraps`` decorator returning a coroutine, or a name only ``__getattr__`` answers (a
delegating wrapper, ``wrapt.ObjectProxy``, ``AsyncMock(spec=...)``); one first reached after
``guard()`` is guarded on first access. Each test below puts such a store over a backend whose
every call hangs: the guarded call must end at its deadline with the method's fallback.

Timing: the guard promises the deadline (plus its watchdog tick, ``support.MARGIN``); what is
asserted is ``deadline + SLACK`` so that a loaded 2-core CI machine running the other suites
does not turn scheduling delay into a failure. A call handed out raw would hang for ever; each
is bounded by ``asyncio.wait_for`` so a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
from collections.abc import Callable, Iterator
from typing import Any
from unittest.mock import AsyncMock

import pytest
import wrapt
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard
from guarded.protocol import CAPABILITIES, StateStore
from tests.broken_stores import MinimalStore

from .support import DEADLINE, fast_config
from .test_capabilities import PROBE_NAMES
from .test_fallback import CALLS

SLACK = 0.25
"""Seconds past the deadline a call may take before the test fails (see the module docs)."""


@pytest.fixture(autouse=True)
def no_collector_pauses() -> Iterator[None]:
    """The deadlines are timed on the event loop's clock; a full garbage collection of the test
    process's heap (late in the suite) once stalled the loop 0.37 s, so every call of a test was
    late by the same amount. Collected before each test and paused during it."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


NEVER = 5.0
"""What a raw (unguarded) hanging call is given before the test calls it hung."""

STORE_CALLS = [(name, args, kwargs, fallback) for name, args, kwargs, fallback in CALLS if "." not in name]
"""Every StateStore method (aliases included) with arguments and its fallback."""

METHODS = sorted({name for name, *_ in STORE_CALLS})


async def _hang(*args: Any, **kwargs: Any) -> Any:
    await asyncio.Event().wait()


def _hanging_method(name: str) -> Callable[..., Any]:
    async def method(self: object, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    method.__name__ = method.__qualname__ = name
    return method


HangingStore: type = type("HangingStore", (), {name: _hanging_method(name) for name in METHODS})
"""A store with every StateStore method, each of which never answers."""


class Delegating:
    """A tenant-scoping or logging wrapper: every method comes through ``__getattr__``."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _sync_decorator(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)  # a coroutine, returned by a sync function

    return wrapper


class _AsyncCallable:
    def __init__(self, inner: Callable[..., Any]) -> None:
        self._inner = inner

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self._inner(*args, **kwargs)


class _Shell:
    """A store whose methods are set per instance by the factories below."""


def _per_method(inner: object, make: Callable[[Callable[..., Any]], Any]) -> object:
    shell = _Shell()
    for name in METHODS:
        setattr(shell, name, make(getattr(inner, name)))
    return shell


def _class_of_decorated(inner: object) -> object:
    namespace = {name: _sync_decorator(_hanging_method(name)) for name in METHODS}
    return type("DecoratedStore", (), namespace)()


def _class_of_lambdas(inner: object) -> object:
    def forward(name: str) -> Callable[..., Any]:
        return lambda self, *args, **kwargs: getattr(self._inner, name)(*args, **kwargs)

    namespace: dict[str, Any] = {name: forward(name) for name in METHODS}
    namespace["__init__"] = lambda self: setattr(self, "_inner", inner)
    return type("LambdaStore", (), namespace)()


def _async_mock(inner: object) -> object:
    mock = AsyncMock(spec=HangingStore)
    for name in METHODS:
        getattr(mock, name).side_effect = _hang
    return mock


SHAPES: dict[str, Callable[[object], object]] = {
    "class": lambda inner: inner,
    "delegating __getattr__": Delegating,
    "wrapt.ObjectProxy": wrapt.ObjectProxy,
    "AsyncMock(spec=...)": _async_mock,
    "instance attribute": lambda inner: _per_method(inner, lambda method: method),
    "callable object": lambda inner: _per_method(inner, _AsyncCallable),
    "functools.partial": lambda inner: _per_method(inner, lambda method: functools.partial(method)),
    "sync lambda returning a coroutine": lambda inner: _per_method(
        inner, lambda method: lambda *args, **kwargs: method(*args, **kwargs)
    ),
    "functools.wraps sync decorator": _class_of_decorated,
    "sync method returning a coroutine": _class_of_lambdas,
}


async def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await asyncio.wait_for(call(), NEVER)
    return result, loop.time() - started


async def _assert_every_call_ends_at_its_deadline(store: Any) -> None:
    outcomes = await asyncio.gather(
        *(
            _timed(functools.partial(getattr(store, name), *args, **kwargs))
            for name, args, kwargs, _ in STORE_CALLS
        )
    )
    late = {
        name: round(elapsed, 3)
        for (name, *_), (_, elapsed) in zip(STORE_CALLS, outcomes, strict=True)
        if elapsed > DEADLINE + SLACK
    }
    wrong = {
        name: result
        for (name, _, _, fallback), (result, _) in zip(STORE_CALLS, outcomes, strict=True)
        if result != fallback
    }
    assert late == {}
    assert wrong == {}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.asyncio
async def test_every_method_of_every_shape_is_guarded(shape: str) -> None:
    store = SHAPES[shape](HangingStore())
    proxy = guard(store, registry=CollectorRegistry(), config=fast_config())
    assert controller(proxy).guarded_methods() == METHODS
    for name in METHODS:
        assert inspect.iscoroutinefunction(getattr(proxy, name)), name
    await _assert_every_call_ends_at_its_deadline(proxy)
    stats = controller(proxy).stats()
    assert {method for method, _ in stats} == set(METHODS)
    assert {outcome for _, outcome in stats} == {"timeout"}


@pytest.mark.asyncio
async def test_a_delegating_wrapper_over_a_failing_store_degrades() -> None:
    class Failing(MinimalStore):
        async def load_history(self, trace_id: str) -> list[Any]:
            raise ConnectionError("backend down")

    proxy = guard(Delegating(Failing()), registry=CollectorRegistry(), config=fast_config())
    assert await proxy.load_history("t1") == []
    assert controller(proxy).stats() == {("load_history", "fallback"): 1}


@pytest.mark.asyncio
async def test_methods_added_after_guard_are_guarded_on_first_access() -> None:
    store = MinimalStore()
    proxy = guard(store, registry=CollectorRegistry(), config=fast_config())
    assert controller(proxy).guarded_methods() == ["load_history", "save_event", "save_remote_binding"]

    store.load_memory_state = _hang  # type: ignore[attr-defined]  # on the instance, after guard()
    proxy.list_tasks = _hang  # set through the proxy
    type(store).list_steering = _hanging_method("list_steering")  # type: ignore[attr-defined]
    try:
        for name, call, fallback in [
            ("load_memory_state", lambda: proxy.load_memory_state("k"), None),
            ("list_tasks", lambda: proxy.list_tasks("s1"), []),
            ("list_steering", lambda: proxy.list_steering("s1"), []),
        ]:
            result, elapsed = await _timed(call)
            assert (result, elapsed < DEADLINE + SLACK) == (fallback, True), (name, elapsed)
            assert (name, "timeout") in controller(proxy).stats()
        guarded_methods = set(controller(proxy).guarded_methods())
        assert {"load_memory_state", "list_tasks", "list_steering"} <= guarded_methods
        assert controller(proxy).policy("list_tasks").fallback.value == "empty_list"
    finally:
        del type(store).list_steering  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_a_name_only_getattr_knows_is_guarded_with_its_inferred_policy() -> None:
    class Dynamic(MinimalStore):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("fetch_"):
                return _hang
            raise AttributeError(name)

    proxy = guard(Dynamic(), registry=CollectorRegistry(), config=fast_config())
    result, elapsed = await _timed(lambda: proxy.fetch_all_things("x"))
    assert result == []  # fetch_all* is inferred a list read
    assert elapsed < DEADLINE + SLACK
    assert controller(proxy).policy("fetch_all_things").inferred
    assert "fetch_all_things" in controller(proxy).guarded_methods()
    assert not hasattr(proxy, "other")


@pytest.mark.asyncio
async def test_an_async_method_behind_a_property_is_guarded_when_read() -> None:
    class Behind(MinimalStore):
        @property
        def load_memory_state(self) -> Callable[..., Any]:
            return _hang

    proxy = guard(Behind(), registry=CollectorRegistry(), config=fast_config())
    result, elapsed = await _timed(lambda: proxy.load_memory_state("k"))
    assert (result, elapsed < DEADLINE + SLACK) == (None, True)


def test_sync_helpers_and_plain_attributes_pass_through() -> None:
    class Helpers(MinimalStore):
        limit = 3

        def describe(self) -> str:
            return "helper"

    store = Helpers()
    proxy = guard(Delegating(store), registry=CollectorRegistry())
    assert proxy.describe() == "helper"
    assert proxy.limit == 3
    assert "describe" not in controller(proxy).guarded_methods()


@pytest.mark.asyncio
async def test_a_protocol_method_whose_shape_is_unknown_returns_what_it_returns() -> None:
    # A lambda returning a plain value: accepted (only a call could tell) and guarded; the
    # guarded call awaits a result only when it is awaitable.
    store = MinimalStore()
    store.load_memory_state = lambda key: {"key": key}  # type: ignore[attr-defined]
    proxy = guard(store, registry=CollectorRegistry())
    assert await proxy.load_memory_state("k") == {"key": "k"}
    assert "load_memory_state" in controller(proxy).guarded_methods()


def _capabilities_of(target: object) -> dict[str, bool]:
    return {cap.name: isinstance(target, cap.protocol) for cap in CAPABILITIES}


@pytest.mark.parametrize("shape", ["delegating __getattr__", "wrapt.ObjectProxy", "AsyncMock(spec=...)"])
def test_capabilities_are_mirrored_exactly(shape: str) -> None:
    store = SHAPES[shape](InMemoryStateStore())
    proxy = guard(store, registry=CollectorRegistry())
    mismatched = [name for name in PROBE_NAMES if hasattr(proxy, name) != hasattr(store, name)]
    assert mismatched == []
    assert _capabilities_of(proxy) == _capabilities_of(store)
    assert isinstance(proxy, StateStore)


class _SyncStore:
    def save_event(self, event: Any) -> None:
        pass

    def load_history(self, trace_id: str) -> list[Any]:
        return []

    async def save_remote_binding(self, binding: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (InMemoryStateStore, "not the class InMemoryStateStore"),
        (42, "int has no save_event, load_history, save_remote_binding"),
        (object(), "object has no save_event"),
        (Delegating(object()), "Delegating has no save_event"),
        (type("Partial", (MinimalStore,), {"load_history": None})(), "has no load_history method"),
        (_SyncStore(), r"_SyncStore.save_event, load_history not async"),
    ],
)
def test_what_cannot_be_a_store_is_refused(bad: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        guard(bad, registry=CollectorRegistry())


def test_a_sync_decorated_required_method_is_refused_only_when_it_says_so() -> None:
    class Declared(MinimalStore):
        @_sync_decorator
        def save_event(self, event: Any) -> None:  # sync all the way: refused
            pass

    with pytest.raises(TypeError, match=r"Declared.save_event not async"):
        guard(Declared(), registry=CollectorRegistry())

    class Unsaid(MinimalStore):
        def save_event(self, event):  # type: ignore[no-untyped-def]  # no annotation: accepted
            return asyncio.sleep(0)

    proxy = guard(Unsaid(), registry=CollectorRegistry())
    assert "save_event" in controller(proxy).guarded_methods()
