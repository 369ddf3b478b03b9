"""What stands behind a guard proxy: :class:`GuardCore` composes the layers of one guarded store
and owns its breaker, bulkhead, instruments, durability and event loop; :func:`make_proxy` builds the
proxy that mirrors the store, and :func:`core_of` finds a proxy's core (the proxy holds nothing of
its own, so that it mirrors the store exactly)."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry

from .backend import ERROR_CLASSIFIER, HONOURS_IDEMPOTENCY_KEY, RECOVERS_UNANSWERED_CONSUMES, ROUTES_READS
from .batching.batching_layer import BatchingLayer
from .builtin_policies import LIFECYCLE_METHODS
from .config import GuardConfig
from .deadletter.dead_letter_layer import DeadLetterLayer
from .durability.owner import Durability
from .error_classes import register_classifier
from .layers import (
    BulkheadLayer,
    CircuitBreakerLayer,
    FallbackLayer,
    MetricsLayer,
    RetryLayer,
    TimeoutLayer,
    TracingLayer,
)
from .layers.breaker import BreakerState, CircuitBreaker
from .layers.bulkhead import Bulkhead, bulkhead_for
from .layers.call_check import CallCheckLayer
from .layers.memory_health import MemoryHealthLayer
from .layers.metrics import GuardInstruments, guard_instruments, publish_breaker_state
from .layers.stale_reads import StaleCache, StaleReadLayer
from .observability import telemetry_names as names
from .observability.failure_log import FailureLog
from .pipeline.call import Call, Layer, MethodSetup, Service
from .pipeline.entry import entry_point
from .pipeline.loops import FORWARD_GRACE, LoopHome
from .pipeline.proxy import CallShape, build_proxy_class, call_shape, public_names
from .pipeline.steps import build, raising
from .pipeline.unanswered import DEFAULT_GRACE, UnansweredConsumes
from .policy import Kind
from .policy_table import PolicyTable

logger = logging.getLogger("guarded")

R = TypeVar("R")

_MISSING = object()


class ArtifactDurability(Protocol):
    """Finds (``create``: builds) the durability of a core's artifact puts."""

    def __call__(self, core: GuardCore, *, create: bool = False) -> Durability | None: ...


_CLOSE_AT_LEAST = 0.5
"""Seconds ``aclose()`` gives the wrapped store's own close when the drain used the budget."""

_cores: weakref.WeakKeyDictionary[object, GuardCore] = weakref.WeakKeyDictionary()


def register(proxy: object, core: GuardCore) -> None:
    """Record ``core`` as what stands behind ``proxy``."""
    _cores[proxy] = core


def core_of(proxy: object) -> GuardCore | None:
    """What stands behind a guard proxy, ``None`` for anything else."""
    try:
        return _cores.get(proxy)
    except TypeError:  # not weakly referenceable: no proxy
        return None


class GuardedStore:
    """Base class of every guard proxy (see :func:`guard`). Holds nothing of its own."""

    async def __aenter__(self) -> Any:
        core = _core(self)
        await core.home.run(core.open_durability, core.config.dead_letter.drain_timeout)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await _core(self).aclose()

    def __repr__(self) -> str:
        core = _core(self)
        return f"<guarded {core.name!r} over {core.target!r}>"


class GuardedArtifactStore(GuardedStore):
    """Base class of the proxy returned by a guarded store's ``artifact_store``."""


def _core(proxy: GuardedStore) -> GuardCore:
    found = core_of(proxy)
    assert found is not None, "every proxy is registered when it is made"
    return found


class GuardCore:
    """What stands behind one proxy: the target, its policies, breaker, instruments and layers."""

    def __init__(
        self,
        target: object,
        *,
        name: str,
        config: GuardConfig,
        policies: PolicyTable,
        registry: CollectorRegistry,
        tracer_provider: TracerProvider | None,
        extra_layers: Sequence[Layer],
        label_prefix: str = "",
        breaker: CircuitBreaker | None = None,
        bulkhead: Bulkhead | Literal["own"] | None = "own",
        failure_log: FailureLog | None = None,
        degraded_layers: Sequence[Layer] = (),
        durable: bool = False,
        protocol_methods: frozenset[str] = frozenset(),
        home: LoopHome | None = None,
    ) -> None:
        self.target = target
        self._artifact_durability: ArtifactDurability | None = None
        self.home = home or LoopHome(name)
        """The event loop that runs the guard's work (shared with its artifact store's guard)."""
        self.protocol_methods = protocol_methods
        """Method names guarded whenever the store offers them as a callable, unless it is
        declared not async (see :data:`STATE_STORE_METHODS`)."""
        self.methods: dict[str, Callable[..., Any]] = {}
        """The guarded method of each name guarded so far."""
        self.name = name
        self.config = config
        self.policies = policies
        self.registry = registry
        self.tracer_provider = tracer_provider
        self.extra_layers = tuple(extra_layers)
        self.instruments: GuardInstruments = guard_instruments(registry)
        self.breaker = breaker or self._new_breaker()
        self.bulkhead: Bulkhead | None = (
            bulkhead_for(target, config.bulkhead, store_name=name, registry=registry)
            if bulkhead == "own"
            else bulkhead
        )
        """The concurrency limit in front of the backend, shared by the public methods, the guard's
        own calls and the guarded artifact store (``None``: no limit)."""
        if self.bulkhead is not None and bulkhead == "own":
            self.home.on_move(self.bulkhead.moved)
        self.failure_log = failure_log or FailureLog(config.logging.interval)
        self.honours_idempotency_key = bool(getattr(target, HONOURS_IDEMPOTENCY_KEY, False))
        classifier = getattr(target, ERROR_CLASSIFIER, None)
        if classifier is not None:
            register_classifier(classifier)
        self.label_prefix = label_prefix
        tracer = trace.get_tracer(names.TRACER_NAME, tracer_provider=tracer_provider)
        db_system = getattr(target, "db_system_name", None)
        self._internal: dict[str, tuple[MethodSetup, Service]] = {}
        self.durability: Durability | None = None
        if durable:
            self.durability = Durability(
                target,
                config,
                store_name=name,
                registry=registry,
                breaker=self.breaker,
                run=self.run_internal,
                policies=policies,
                failure_log=self.failure_log,
            )
            self.home.on_move(self.durability.moved)
            ports = self.durability.ports()
            stale = config.stale
            cache = (
                StaleCache(stale.max_entries, max_bytes=stale.max_bytes, store_name=name, registry=registry)
                if stale.enabled
                else None
            )
            stale_reads = StaleReadLayer(
                ports,
                policies,
                cache=cache,
                answer_held_pauses=stale.answer_held_pauses,
                routes_reads=getattr(target, ROUTES_READS, False) is True,
            )
            self.home.on_move(stale_reads.moved)
            degraded_layers = [
                stale_reads,
                DeadLetterLayer(ports, self.failure_log),
                BatchingLayer(ports),
                *degraded_layers,
            ]
        self._answering: tuple[Layer, ...] = (
            MetricsLayer(self.instruments),
            FallbackLayer(self.failure_log, strict=config.strict),
        )
        """The layers that count, log and answer a call that failed (strict mode included)."""
        if home is None:
            self.home.on_unanswered(self.settle_unanswered)
        self.layers: list[Layer] = [
            TracingLayer(
                tracer,
                db_system_name=db_system if isinstance(db_system, str) else None,
                tracer_provider=tracer_provider,
            ),
            *self._answering,
            CallCheckLayer(target),
            MemoryHealthLayer(registry),
            *degraded_layers,
            *self._backend_layers(),
            *self.extra_layers,
        ]
        self.setups: dict[str, MethodSetup] = {}
        self._key_prefix = f"{os.getpid():x}-{id(self):x}-"
        self._key_counter = itertools.count()
        grace = getattr(target, "consume_grace", None)
        self.unanswered: UnansweredConsumes | None = None
        if self.honours_idempotency_key and bool(getattr(target, RECOVERS_UNANSWERED_CONSUMES, False)):
            self.unanswered = UnansweredConsumes(grace if isinstance(grace, int | float) else DEFAULT_GRACE)

    def serve_artifacts(self, durability: ArtifactDurability) -> None:
        """The guard of a store with an ``artifact_store`` hands the core how to find (``create``:
        build) the durability of its artifact puts, so that opening, draining and closing the
        guard include them. A function of the core, not a closure over it: the core keeps no
        reference to itself."""
        self._artifact_durability = durability

    def artifact_durability(self, *, create: bool = False) -> Durability | None:
        """The durability of the artifact puts of this guard's backend (set by the guard of a store
        with an ``artifact_store``); with ``create``, built when the backend has an artifact store
        and none was built yet. ``None`` for a guard without one."""
        found = self._artifact_durability
        return None if found is None else found(self, create=create)

    def _durabilities(self) -> list[Durability]:
        return [
            durability
            for durability in (self.durability, self.artifact_durability())
            if durability is not None
        ]

    async def open_durability(self) -> None:
        """Open the spill files (what earlier processes held starts replaying), artifacts' too."""
        if self.durability is not None:
            await self.durability.open()
        artifacts = self.artifact_durability(create=True)
        if artifacts is not None:
            await artifacts.open()  # artifacts a previous process held start replaying

    async def on_home_loop(self, start: Callable[[], Awaitable[R]], budget: float) -> R:
        """``start()`` on the event loop that runs the guard (:mod:`guarded.pipeline.loops`),
        waited for at most ``budget`` seconds plus the forwarding grace."""
        result: R = await self.home.run(start, budget + FORWARD_GRACE)
        return result

    async def flush(self) -> None:
        """Hand every batched write to the backend now (what fails is dead-lettered)."""
        durability = self.durability
        if durability is not None:
            await self.on_home_loop(durability.flush, self.config.dead_letter.drain_timeout)

    async def drain(self, timeout: float | None = None) -> int:  # noqa: ASYNC109 - a budget
        """Flush, then replay dead-lettered writes (artifact puts too) until none is left or
        ``timeout`` seconds (default ``dead_letter.drain_timeout``) pass; returns how many remain."""
        budget = self.config.dead_letter.drain_timeout if timeout is None else timeout

        async def drain() -> int:
            durabilities = self._durabilities()
            return sum(await asyncio.gather(*(durability.drain(budget) for durability in durabilities)))

        return await self.on_home_loop(drain, budget)

    async def aclose(self) -> None:
        """Flush batches and drain the dead-letter buffer within ``dead_letter.drain_timeout``
        (what is left stays in the spill file for the next process), then close the wrapped store
        when it has ``aclose()`` or ``close()``, within what is left of that budget (at least
        half a second; a close still running then is cancelled and logged)."""
        budget = self.config.dead_letter.drain_timeout
        await self.on_home_loop(self._aclose, budget + budget + _CLOSE_AT_LEAST)

    async def _aclose(self) -> None:
        budget = self.config.dead_letter.drain_timeout
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Artifact puts drain beside the other writes, within the same budget.
        await asyncio.gather(*(durability.aclose(budget) for durability in self._durabilities()))
        for closer_name in ("aclose", "close"):
            closer = getattr(self.target, closer_name, None)
            if callable(closer):
                result = closer()
                if inspect.isawaitable(result):
                    # The store's close gets what is left of the budget (at least
                    # _CLOSE_AT_LEAST): on a server that never answers it would wait on it.
                    left = max(started + budget - loop.time(), _CLOSE_AT_LEAST)
                    try:
                        await asyncio.wait_for(result, timeout=left)
                    except TimeoutError:
                        logger.warning("store %r did not close within %.1fs; abandoned", self.name, left)
                return

    def settle_unanswered(self, call: Call, failure: BaseException) -> Awaitable[Any]:
        """End ``call``, which the guard's event loop (another thread's) did not answer in time,
        as a call that failed with ``failure`` ends: counted and logged by the metrics and fallback
        layers, its fallback returned, or ``failure`` raised in strict mode when it is a refusal
        (:meth:`guarded.pipeline.loops.LoopHome.on_unanswered`)."""
        service: Service = build(self._answering, call.method, lambda call: raising(failure), answers=True)
        return service(call)

    def _backend_layers(self) -> list[Layer]:
        """Circuit breaker, retry, bulkhead and timeout: what stands between every call (the
        guard's own flushes and replays included) and the backend."""
        return [
            CircuitBreakerLayer(self.breaker),
            RetryLayer(self.config.retry),
            BulkheadLayer(self.bulkhead, slow_call_duration=self.config.breaker.slow_call_duration),
            TimeoutLayer(),
        ]

    def _new_breaker(self) -> CircuitBreaker:
        breaker = CircuitBreaker(self.config.breaker)
        transitions = self.instruments.circuit_transitions
        name = self.name  # not the core: the breaker outlives no guard, and keeps none alive

        def on_transition(old: BreakerState, new: BreakerState) -> None:
            transitions.labels(name, old.value, new.value).inc()

        breaker.add_listener(on_transition)
        publish_breaker_state(self.instruments, self.name, breaker)
        return breaker

    def _setup(self, method: str) -> MethodSetup:
        policy = self.policies.get(method)
        return MethodSetup(
            store_name=self.name,
            label=self.label_prefix + method,
            policy=policy,
            settings=self.config.for_method(method, critical=policy.critical),
            honours_idempotency_key=self.honours_idempotency_key and policy.alias_of is None,
        )

    def _compose(
        self, method: str, setup: MethodSetup, layers: Sequence[Layer], *, home: LoopHome | None = None
    ) -> Any:
        """The service of ``method``'s calls through ``layers``; with ``home``, the method the caller
        calls, which starts each call itself (:func:`guarded.pipeline.steps.build`)."""
        target = self.target
        service: Service
        if _defined_async_on_class(target, method):
            # The ordinary store: an ``async def`` of its class, bound once.
            bound = getattr(target, method)

            def backend(call: Call) -> Awaitable[Any]:
                return bound(*call.args, **call.kwargs)  # type: ignore[no-any-return]

            service = backend
        else:
            # Any other shape (an instance attribute, a partial, a callable object, a sync
            # function returning a coroutine, a name only ``__getattr__`` answers): looked up at
            # each call, as the caller would, and its result awaited when it is awaitable.
            async def dynamic_backend(call: Call) -> Any:
                result = getattr(target, method)(*call.args, **call.kwargs)
                if inspect.isawaitable(result):
                    return await result
                return result

            service = dynamic_backend
        return build(layers, setup, service, answers=True, home=home)

    def build_method(self, method: str) -> Callable[..., Any]:
        """The guarded coroutine function for ``target.method``."""
        setup = self._setup(method)
        self.setups[method] = setup
        policy = setup.policy
        starts_calls = policy.repeat_safe and policy.kind is not Kind.CONSUME
        service = self._compose(method, setup, self.layers, home=self.home if starts_calls else None)
        return entry_point(service, setup, self._key_prefix, self._key_counter, self.unanswered, self.home)

    def guards(self, name: str, shape: CallShape) -> bool:
        """Whether the store's attribute ``name``, callable as ``shape``, is guarded."""
        if name.startswith("_") or name in LIFECYCLE_METHODS:
            return False
        return shape is CallShape.ASYNC or (shape is CallShape.UNKNOWN and name in self.protocol_methods)

    def method(self, name: str) -> Callable[..., Any]:
        """The guarded method of ``name``, built on first use."""
        found = self.methods.get(name)
        if found is None:
            found = self.methods[name] = self.build_method(name)
        return found

    def resolve(self, name: str, value: Any) -> Any:
        """What the proxy hands out for the store's attribute ``name`` now worth ``value``: its
        guarded method when it is one the guard guards (an async method added after ``guard()``,
        or first answered by ``__getattr__``, included), else ``value`` itself."""
        if name.startswith("_") or not callable(value):
            return value
        if self.guards(name, call_shape(value)):
            return self.method(name)
        return value

    def run_internal(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Awaitable[Any]:
        """``target.method(*args, **kwargs)`` through breaker, retry, bulkhead and timeout only: the
        guard's own calls (batch flushes, replays), which raise on failure and are not counted as
        calls, and wait for admission to the backend like any other. Returns the call's awaitable
        (no frame of its own)."""
        found = self._internal.get(method)
        if found is None:
            setup = self._setup(method)
            found = self._internal[method] = (
                setup,
                self._compose(method, setup, [*self._backend_layers(), *self.extra_layers]),
            )
        setup, service = found
        loop = asyncio.get_running_loop()
        return service(Call(setup, args, kwargs, loop, loop.time()))


def _defined_async_on_class(target: object, name: str) -> bool:
    """Whether ``target.name`` is an ``async def`` of its class, not shadowed by the instance."""
    found = inspect.getattr_static(type(target), name, _MISSING)
    if not (inspect.isfunction(found) and inspect.iscoroutinefunction(found)):
        return False
    try:
        own = object.__getattribute__(target, "__dict__")
    except AttributeError:
        return True
    return not (isinstance(own, dict) and name in own)


def _guarded_names(core: GuardCore) -> list[str]:
    """The store's attributes guarded from the start: every public async method ``dir()`` lists,
    and every protocol method ``getattr`` reaches (through ``__getattr__`` too). Properties are
    not evaluated here; one that gives an async method is guarded when read."""
    target = core.target
    found = []
    for name in sorted({*public_names(target), *core.protocol_methods}):
        if name.startswith("_") or name in LIFECYCLE_METHODS:
            continue
        if isinstance(inspect.getattr_static(target, name, _MISSING), property):
            continue
        try:
            value = getattr(target, name, _MISSING)
        except Exception:  # an attribute that fails to evaluate is no method
            continue
        if value is _MISSING:
            continue
        shape = call_shape(value)
        if core.guards(name, shape):
            found.append(name)
        elif shape is CallShape.SYNC and name in core.protocol_methods:
            logger.warning(
                "%s.%s is not async; PenguiFlow awaits it: passed through unguarded",
                type(target).__qualname__,
                name,
            )
    return found


def make_proxy(
    core: GuardCore, base: type[GuardedStore], special: Mapping[str, property] | None = None
) -> GuardedStore:
    """The proxy of ``core``: the store's guarded methods on a class of its own (see
    :mod:`guarded.pipeline.proxy`), with ``special`` properties (a guarded ``artifact_store``)."""
    target = core.target
    listed = set(public_names(target))
    methods = {}
    for name in _guarded_names(core):
        method = core.method(name)
        if name in listed:
            # On the class, as for the store; a name only __getattr__ knows stays off it (the
            # proxy's __getattr__ hands out the guarded method), so static lookups answer alike.
            methods[name] = method
    cls = build_proxy_class(
        target,
        methods=methods,
        special=dict(special or {}),
        base=base,
        class_name=f"Guarded{type(target).__name__}",
        resolve=core.resolve,
    )
    proxy: GuardedStore = cls()
    register(proxy, core)
    return proxy


__all__ = [
    "GuardCore",
    "GuardedArtifactStore",
    "GuardedStore",
    "core_of",
    "make_proxy",
    "register",
]
