"""Fault injection: make any real store fail on a script or at random.

:class:`FaultyStore` wraps a store and, before each async method call, asks a :class:`FaultPlan`
which :class:`Fault` to apply:

* ``Fault.error_before(exc)``: raise without calling the store. The request provably never
  reached the backend, so the exception carries ``reached_backend = False``
  (:func:`guarded.error_classes.reached_backend` answers ``False``).
* ``Fault.error_after(exc)``: call the store (the write happens), then raise as if the response
  had been lost; the exception carries ``reached_backend = True``.
* ``Fault.hang()``: never return (until :meth:`FaultInjector.release` or cancellation).
* ``Fault.delay(seconds)``: sleep, then call the store.
* ``Fault.stubborn(seconds)``: sleep ignoring cancellation (a store that swallows
  ``CancelledError``), then call the store.
* ``Fault.respond(value)``: return ``value`` without calling the store (``{}`` for a missing
  pause token, a stale row...).

Schedules: :meth:`FaultPlan.script` (per method and call index), :meth:`FaultPlan.sequence`
(the n-th call of any method), :meth:`FaultPlan.random` (seeded rates per fault kind),
:meth:`FaultPlan.always`, or a subclass overriding :meth:`FaultPlan.choose`.

The wrapper has exactly the capabilities of the store it wraps (same ``hasattr`` answers, same
``dir``, same ``isinstance`` against the protocols), so ``guard(FaultyStore(store))`` sees the
store it would have seen, with one exception: it stands for a backend that can fail, so it declares
``durable_across_processes = True`` (a guard gives it a spill file, as it would a database) unless
told otherwise (``FaultyStore(store, durable_across_processes=False)``, or ``None`` to mirror the
store's own declaration). Its controls therefore live elsewhere, in the :class:`FaultInjector`
returned by :func:`fault_injector`, which also keeps a log of every call and the fault applied::

    from guarded.guard import guard
    from guarded.backends.memory import InMemoryStateStore
    from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

    faulty = FaultyStore(
        InMemoryStateStore(),
        FaultPlan.script({"load_history": [Fault.error_before(ConnectionResetError), Fault.hang()]}),
    )
    store = guard(faulty)
    await store.load_history("t1")      # attempt 1 refused, attempt 2 hangs, ... -> []
    fault_injector(faulty).log          # [FaultRecord(index=0, method='load_history', ...), ...]

    fault_injector(faulty).plan = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
    # ... the database is "down" until:
    fault_injector(faulty).plan = FaultPlan()

The faults and the plans are defined in :mod:`guarded.testing.fault_plans` and re-exported here;
this module holds the store that applies them, its :class:`FaultInjector` and the call log.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from ..pipeline.proxy import async_method_names, build_proxy_class
from .fault_plans import (
    AlwaysFaults,
    ErrorSpec,
    Fault,
    FaultKind,
    FaultPlan,
    RandomFaults,
    ScriptedFaults,
    SequenceFaults,
)

S = TypeVar("S")


class Ending(str, Enum):
    """How a call through a faulty store ended."""

    RETURNED = "returned"
    RAISED = "raised"
    """An exception: the injected one, or the store's own."""
    CANCELLED = "cancelled"
    """Interrupted by a cancellation (a caller, or a timeout of the guard)."""


@dataclass(slots=True)
class FaultRecord:
    """One call that went through a faulty store: which fault it got, and how it ended."""

    index: int
    """Position among every call of the injector (0-based)."""
    method: str
    """The method name (``artifact_store.get`` for the artifact store's methods)."""
    call_index: int
    """Position among the calls of this method (0-based)."""
    fault: Fault
    task: str | None
    """Name of the asyncio task that made the call: groups the attempts of one logical call."""
    ending: Ending | None = None
    """How the call ended; ``None`` while it is in progress."""
    error: BaseException | None = None
    """The exception it raised (``ending`` is ``RAISED``)."""
    duration: float | None = None
    """Seconds from the call to its end (loop time)."""


class FaultInjector:
    """Controls and log of one or more faulty stores (see :func:`fault_injector`).

    ``plan`` may be replaced at any time (an outage starts, the database recovers).
    """

    def __init__(self, plan: FaultPlan | None = None) -> None:
        self.plan: FaultPlan = plan or FaultPlan()
        self.log: list[FaultRecord] = []
        """Every call made through the faulty stores, in order, with the fault applied."""
        self._per_method: Counter[str] = Counter()
        self._hung: set[asyncio.Future[None]] = set()

    def wrap(self, store: S) -> S:
        """A faulty store over ``store``, driven by this injector."""
        return _wrap(store, self, prefix="")  # type: ignore[return-value]

    def records(self, method: str | None = None, *, task: str | None = None) -> list[FaultRecord]:
        """The log, filtered by method and/or task name."""
        return [
            record
            for record in self.log
            if (method is None or record.method == method) and (task is None or record.task == task)
        ]

    def counts(self) -> Counter[FaultKind]:
        """How many calls got each kind of fault."""
        return Counter(record.fault.kind for record in self.log)

    def calls(self, method: str) -> int:
        """How many calls of ``method`` went through (whatever their fault)."""
        return self._per_method[method]

    @property
    def hanging(self) -> int:
        """Calls currently hung by a :meth:`Fault.hang` fault."""
        return sum(1 for future in self._hung if not future.done())

    def release(self) -> None:
        """Let every hung call proceed (it then calls the store). Call from the event loop."""
        for future in self._hung:
            if not future.done():
                future.set_result(None)
        self._hung.clear()

    def reset(self) -> None:
        """Forget the log and the per-method call counts (the plan stays)."""
        self.log.clear()
        self._per_method.clear()

    def _next(self, method: str) -> FaultRecord:
        call_index = self._per_method[method]
        self._per_method[method] = call_index + 1
        index = len(self.log)
        fault = self.plan.choose(method, call_index, index)
        task = asyncio.current_task()
        record = FaultRecord(index, method, call_index, fault, task.get_name() if task else None)
        self.log.append(record)
        return record

    async def _hang(self) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._hung.add(future)
        try:
            await future
        finally:
            self._hung.discard(future)


class FaultyStore:
    """A store that fails on a plan: ``FaultyStore(store, plan)`` (see the module docs).

    The instance is of a class generated for ``store`` (a subclass of this one) that mirrors the
    store's attributes, but for ``durable_across_processes`` (see the module docs); reach its
    controls with :func:`fault_injector`. Several stores can share one injector
    (``FaultyStore(store, injector=shared)``).
    """

    def __new__(
        cls,
        store: Any,
        plan: FaultPlan | None = None,
        *,
        injector: FaultInjector | None = None,
        durable_across_processes: bool | None = True,
    ) -> Any:
        if injector is None:
            injector = FaultInjector(plan)
        elif plan is not None:
            injector.plan = plan
        faulty = injector.wrap(store)
        if durable_across_processes is not None:
            type(faulty).durable_across_processes = durable_across_processes
        return faulty


_injectors: weakref.WeakKeyDictionary[FaultyStore, FaultInjector] = weakref.WeakKeyDictionary()


def fault_injector(store: object) -> FaultInjector:
    """The :class:`FaultInjector` of a faulty store (also reached through its ``artifact_store``)."""
    found = _injectors.get(store) if isinstance(store, FaultyStore) else None
    if found is None:
        raise TypeError(f"{type(store).__qualname__} is not a FaultyStore")
    return found


def _wrap(store: object, injector: FaultInjector, *, prefix: str) -> FaultyStore:
    methods = {
        name: _faulty_method(injector, prefix + name, getattr(store, name))
        for name in async_method_names(store)
    }
    special: dict[str, property] = {}
    if not prefix and inspect.getattr_static(store, "artifact_store", None) is not None:
        special["artifact_store"] = _faulty_artifact_property(store, injector)
    cls = build_proxy_class(
        store,
        methods=methods,
        special=special,
        base=FaultyStore,
        class_name=f"Faulty{type(store).__name__}",
    )
    faulty: FaultyStore = object.__new__(cls)
    _injectors[faulty] = injector
    return faulty


def _faulty_artifact_property(store: object, injector: FaultInjector) -> property:
    cache: list[tuple[object, FaultyStore]] = []

    def get(self: object) -> Any:
        inner = store.artifact_store  # type: ignore[attr-defined]
        if inner is None:
            return None
        if cache and cache[0][0] is inner:
            return cache[0][1]
        wrapped = _wrap(inner, injector, prefix="artifact_store.")
        cache[:] = [(inner, wrapped)]
        return wrapped

    return property(get)


def _faulty_method(injector: FaultInjector, method: str, bound: Callable[..., Any]) -> Callable[..., Any]:
    async def apply(record: FaultRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fault = record.fault
        kind = fault.kind
        if kind is FaultKind.OK:
            return await bound(*args, **kwargs)
        if kind is FaultKind.ERROR_BEFORE:
            record.error = fault.make_error(method)
            raise record.error
        if kind is FaultKind.ERROR_AFTER:
            await bound(*args, **kwargs)
            record.error = fault.make_error(method)
            raise record.error
        if kind is FaultKind.RESPOND:
            return fault.value
        if kind is FaultKind.DELAY:
            await asyncio.sleep(fault.seconds)
        elif kind is FaultKind.HANG:
            await injector._hang()
        elif kind is FaultKind.STUBBORN:
            await _sleep_ignoring_cancellation(fault.seconds)
        return await bound(*args, **kwargs)

    async def faulty_method(*args: Any, **kwargs: Any) -> Any:
        record = injector._next(method)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            result = await apply(record, args, kwargs)
        except asyncio.CancelledError as exc:
            # An injected CancelledError was raised, not a cancellation of the call.
            record.ending = Ending.RAISED if exc is record.error else Ending.CANCELLED
            raise
        except BaseException as exc:
            record.ending, record.error = Ending.RAISED, exc
            raise
        else:
            record.ending = Ending.RETURNED
            return result
        finally:
            record.duration = loop.time() - started

    faulty_method.__name__ = faulty_method.__qualname__ = method
    return faulty_method


async def _sleep_ignoring_cancellation(seconds: float) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while (left := until - loop.time()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            continue


__all__ = [
    "AlwaysFaults",
    "Ending",
    "ErrorSpec",
    "Fault",
    "FaultInjector",
    "FaultKind",
    "FaultPlan",
    "FaultRecord",
    "FaultyStore",
    "RandomFaults",
    "ScriptedFaults",
    "SequenceFaults",
    "fault_injector",
]
