"""Fault injection: make any real store fail on a script or at random.

:class:`FaultyStore` wraps a store and, before each async method call, asks a :class:`FaultPlan`
which :class:`Fault` to apply:

* ``Fault.error_before(exc)``: raise without calling the store. The request provably never
  reached the backend, so the exception carries ``reached_backend = False``
  (:func:`guarded.pipeline.classify.reached_backend` answers ``False``).
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
store it would have seen. Its controls therefore live elsewhere, in the :class:`FaultInjector`
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
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import random
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from ..pipeline.proxy import async_method_names, build_proxy_class

S = TypeVar("S")

ErrorSpec = type[BaseException] | BaseException | Callable[[], BaseException]
"""An exception class (instantiated with a message), an instance (copied per use), or a factory."""


class FaultKind(str, Enum):
    """What a :class:`Fault` does to a call."""

    OK = "ok"
    ERROR_BEFORE = "error_before"
    ERROR_AFTER = "error_after"
    HANG = "hang"
    DELAY = "delay"
    STUBBORN = "stubborn"
    RESPOND = "respond"


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault to apply to one call; build them with the class methods."""

    kind: FaultKind
    error: ErrorSpec | None = None
    seconds: float = 0.0
    value: Any = None

    @classmethod
    def ok(cls) -> Fault:
        """No fault: call the store."""
        return _OK

    @classmethod
    def error_before(cls, error: ErrorSpec = ConnectionRefusedError) -> Fault:
        """Raise ``error`` without calling the store (marked ``reached_backend = False``)."""
        return cls(FaultKind.ERROR_BEFORE, error=error)

    @classmethod
    def error_after(cls, error: ErrorSpec = ConnectionResetError) -> Fault:
        """Call the store, then raise ``error`` (marked ``reached_backend = True``)."""
        return cls(FaultKind.ERROR_AFTER, error=error)

    @classmethod
    def hang(cls) -> Fault:
        """Never return, until :meth:`FaultInjector.release` (then call the store) or cancellation."""
        return cls(FaultKind.HANG)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Sleep ``seconds``, then call the store."""
        return cls(FaultKind.DELAY, seconds=seconds)

    @classmethod
    def stubborn(cls, seconds: float) -> Fault:
        """Sleep ``seconds`` swallowing every cancellation, then call the store."""
        return cls(FaultKind.STUBBORN, seconds=seconds)

    @classmethod
    def respond(cls, value: Any) -> Fault:
        """Return ``value`` without calling the store."""
        return cls(FaultKind.RESPOND, value=value)

    @property
    def calls_store(self) -> bool:
        """Whether the wrapped store's method runs (or, for a hang, would run once released)."""
        return self.kind not in (FaultKind.ERROR_BEFORE, FaultKind.RESPOND)

    def make_error(self, method: str) -> BaseException:
        """A fresh exception for this fault, marked with whether the request reached the backend."""
        spec = self.error if self.error is not None else ConnectionResetError
        if isinstance(spec, BaseException):
            exc = copy.copy(spec)
        elif isinstance(spec, type):
            exc = spec(f"injected {self.kind.value} fault in {method}")
        else:
            exc = spec()
        with contextlib.suppress(AttributeError):  # an exception class with __slots__
            exc.reached_backend = self.kind is FaultKind.ERROR_AFTER  # type: ignore[attr-defined]
        return exc

    def __repr__(self) -> str:
        if self.kind in (FaultKind.ERROR_BEFORE, FaultKind.ERROR_AFTER):
            error = self.error
            name = error.__name__ if isinstance(error, type) else type(error).__name__
            return f"Fault.{self.kind.value}({name})"
        if self.kind in (FaultKind.DELAY, FaultKind.STUBBORN):
            return f"Fault.{self.kind.value}({self.seconds:g})"
        if self.kind is FaultKind.RESPOND:
            return f"Fault.respond({self.value!r})"
        return f"Fault.{self.kind.value}()"


_OK = Fault(FaultKind.OK)


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


class FaultPlan:
    """Decides the fault of each call. This base class never injects anything.

    Subclass and override :meth:`choose`, or use the constructors below.
    """

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        """The fault for the ``call_index``-th call of ``method``, the ``index``-th call overall."""
        return _OK

    @staticmethod
    def script(
        methods: Mapping[str, Sequence[Fault | None] | Mapping[int, Fault]],
        *,
        default: Fault | None = None,
    ) -> ScriptedFaults:
        """Faults by method and call index: a list (``None`` for no fault) or ``{index: fault}``.

        Calls past the end of a list, and methods not listed, get ``default`` (no fault).
        """
        return ScriptedFaults(methods, default=default)

    @staticmethod
    def sequence(faults: Iterable[Fault | None], *, default: Fault | None = None) -> SequenceFaults:
        """The n-th call of any method gets the n-th fault; calls past the end get ``default``."""
        return SequenceFaults(faults, default=default)

    @staticmethod
    def always(fault: Fault, *, methods: Iterable[str] | None = None) -> AlwaysFaults:
        """Every call (of ``methods``, when given) gets ``fault``: an outage, a slow database."""
        return AlwaysFaults(fault, methods=methods)

    @staticmethod
    def random(
        seed: int | str | None = None,
        *,
        error_before: float = 0.0,
        error_after: float = 0.0,
        hang: float = 0.0,
        delay: float = 0.0,
        stubborn: float = 0.0,
        errors: Sequence[ErrorSpec] = (ConnectionResetError,),
        delay_range: tuple[float, float] = (0.001, 0.01),
        stubborn_seconds: float = 0.05,
        methods: Iterable[str] | None = None,
    ) -> RandomFaults:
        """Each call independently gets a fault with the given probabilities (seeded, reproducible).

        Errors are drawn from ``errors``; delays uniformly from ``delay_range``. The rates must sum
        to at most 1. Only ``methods`` get faults when given.
        """
        return RandomFaults(
            seed,
            rates={
                FaultKind.ERROR_BEFORE: error_before,
                FaultKind.ERROR_AFTER: error_after,
                FaultKind.HANG: hang,
                FaultKind.DELAY: delay,
                FaultKind.STUBBORN: stubborn,
            },
            errors=errors,
            delay_range=delay_range,
            stubborn_seconds=stubborn_seconds,
            methods=methods,
        )


class ScriptedFaults(FaultPlan):
    """See :meth:`FaultPlan.script`."""

    def __init__(
        self,
        methods: Mapping[str, Sequence[Fault | None] | Mapping[int, Fault]],
        *,
        default: Fault | None = None,
    ) -> None:
        self._methods: dict[str, dict[int, Fault]] = {}
        for method, faults in methods.items():
            if isinstance(faults, Mapping):
                self._methods[method] = dict(faults)
            else:
                self._methods[method] = {i: fault for i, fault in enumerate(faults) if fault is not None}
        self._default = default or _OK

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        script = self._methods.get(method)
        if script is None:
            return self._default
        return script.get(call_index, self._default)


class SequenceFaults(FaultPlan):
    """See :meth:`FaultPlan.sequence`."""

    def __init__(self, faults: Iterable[Fault | None], *, default: Fault | None = None) -> None:
        self._faults = [fault or _OK for fault in faults]
        self._default = default or _OK

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        return self._faults[index] if index < len(self._faults) else self._default


class AlwaysFaults(FaultPlan):
    """See :meth:`FaultPlan.always`."""

    def __init__(self, fault: Fault, *, methods: Iterable[str] | None = None) -> None:
        self._fault = fault
        self._methods = None if methods is None else frozenset(methods)

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if self._methods is not None and method not in self._methods:
            return _OK
        return self._fault


class RandomFaults(FaultPlan):
    """See :meth:`FaultPlan.random`."""

    def __init__(
        self,
        seed: int | str | None,
        *,
        rates: Mapping[FaultKind, float],
        errors: Sequence[ErrorSpec],
        delay_range: tuple[float, float],
        stubborn_seconds: float,
        methods: Iterable[str] | None,
    ) -> None:
        if any(rate < 0 for rate in rates.values()) or sum(rates.values()) > 1 + 1e-9:
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1, got {dict(rates)}")
        if not errors and (rates.get(FaultKind.ERROR_BEFORE) or rates.get(FaultKind.ERROR_AFTER)):
            raise ValueError("error faults need at least one entry in errors")
        self._rng = random.Random(seed)
        self._thresholds: list[tuple[float, FaultKind]] = []
        cumulative = 0.0
        for kind, rate in rates.items():
            if rate > 0:
                cumulative += rate
                self._thresholds.append((cumulative, kind))
        self._errors = list(errors)
        self._delay_range = delay_range
        self._stubborn_seconds = stubborn_seconds
        self._methods = None if methods is None else frozenset(methods)

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if self._methods is not None and method not in self._methods:
            return _OK
        rng = self._rng
        draw = rng.random()
        kind = next((kind for threshold, kind in self._thresholds if draw < threshold), None)
        if kind is None:
            return _OK
        if kind is FaultKind.ERROR_BEFORE:
            return Fault.error_before(rng.choice(self._errors))
        if kind is FaultKind.ERROR_AFTER:
            return Fault.error_after(rng.choice(self._errors))
        if kind is FaultKind.DELAY:
            return Fault.delay(rng.uniform(*self._delay_range))
        if kind is FaultKind.STUBBORN:
            return Fault.stubborn(self._stubborn_seconds)
        return Fault.hang()


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
    store's attributes exactly; reach its controls with :func:`fault_injector`. Several stores
    can share one injector (``FaultyStore(store, injector=shared)``).
    """

    def __new__(
        cls, store: Any, plan: FaultPlan | None = None, *, injector: FaultInjector | None = None
    ) -> Any:
        if injector is None:
            injector = FaultInjector(plan)
        elif plan is not None:
            injector.plan = plan
        return injector.wrap(store)


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
