"""``guard(store)``: wrap any StateStore in the layer chain and return a capability-preserving proxy."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from opentelemetry import trace
from opentelemetry.trace import TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry

from .backend import ERROR_CLASSIFIER, HONOURS_IDEMPOTENCY_KEY, RECOVERS_UNANSWERED_CONSUMES
from .builtin_policies import LIFECYCLE_METHODS
from .config import GuardConfig, build_config
from .controller import GuardController, controller
from .durability.artifact_side import (
    ARTIFACT_STORE_METHODS,
    artifact_durability,
    artifact_spill_path,
    guarded_artifact_property,
)
from .durability.owner import Durability
from .layers import (
    BulkheadLayer,
    CircuitBreakerLayer,
    FallbackLayer,
    MetricsLayer,
    RetryLayer,
    TimeoutLayer,
    TracingLayer,
)
from .layers.batching import BatchingLayer
from .layers.call_check import CallCheckLayer
from .layers.dead_letter import DeadLetterLayer
from .layers.memory_health import MemoryHealthLayer
from .layers.metrics import GuardInstruments, guard_instruments, publish_breaker_state
from .layers.stale_reads import StaleReadLayer
from .observability import telemetry_names as names
from .observability.failure_log import FailureLog
from .pipeline.breaker import BreakerState, CircuitBreaker
from .pipeline.bulkhead import Bulkhead, bulkhead_for
from .pipeline.call import Call, Layer, MethodSetup, Service
from .pipeline.classify import register_classifier
from .pipeline.compiled import compile_method, preloadable, raising
from .pipeline.cores import core_of, register
from .pipeline.entry import entry_point
from .pipeline.loops import LoopHome
from .pipeline.proxy import CallShape, build_proxy_class, call_shape, public_names
from .pipeline.unanswered import DEFAULT_GRACE, UnansweredConsumes
from .policy import MethodPolicy
from .policy_table import PolicyTable
from .protocol import CAPABILITIES, LEGACY_ALIASES
from .snapshots.guarded import guard_snapshots, is_snapshot_store

S = TypeVar("S")

_MISSING = object()

STATE_STORE_METHODS = frozenset(
    {
        method
        for capability in CAPABILITIES
        for method in capability.methods
        if method != "artifact_store"  # a property, guarded by its own proxy
    }
    | set(LEGACY_ALIASES)
)
"""The StateStore protocol's methods and their legacy aliases: PenguiFlow awaits each, so one the
store offers is guarded even when only a call could tell it is async (a lambda, a sync function
returning a coroutine): the guarded call awaits what it returns when that is awaitable."""


REQUIRED_METHODS: tuple[str, ...] = next(cap.methods for cap in CAPABILITIES if cap.required)

logger = logging.getLogger("guarded")


class GuardedStore:
    """Base class of every guard proxy (see :func:`guard`). Holds nothing of its own."""

    async def __aenter__(self) -> Any:
        core = _core(self)
        await core.home.run(core.open_durability, core.config.dead_letter.drain_timeout)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await controller(self).aclose()

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
            stale_reads = StaleReadLayer(ports, policies, answer_held_pauses=config.stale.answer_held_pauses)
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
        self._unanswered_services: dict[str, Service] = {}
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

    async def open_durability(self) -> None:
        """Open the spill files (what earlier processes held starts replaying), artifacts' too."""
        if self.durability is not None:
            await self.durability.open()
        artifacts = artifact_durability(self, create=True)
        if artifacts is not None:
            await artifacts.open()  # artifacts a previous process held start replaying

    def settle_unanswered(self, call: Call, failure: BaseException) -> Awaitable[Any]:
        """End ``call``, which the guard's event loop (another thread's) did not answer in time,
        as a call that failed with ``failure`` ends: counted and logged by the metrics and fallback
        layers, its fallback returned, or ``failure`` raised in strict mode when it is a refusal
        (:meth:`guarded.pipeline.loops.LoopHome.on_unanswered`)."""
        setup = call.method
        service = self._unanswered_services.get(setup.label)
        if service is None:
            service = _failing
            for layer in reversed(self._answering):
                service = layer.wrap(service, setup)
            self._unanswered_services[setup.label] = service
        call.preloaded = failure
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

    def _compose(self, method: str, setup: MethodSetup, layers: Sequence[Layer]) -> Service:
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
        backend = service
        service = preloadable(backend)
        for layer in reversed(layers):
            service = layer.wrap(service, setup)
        return compile_method(layers, setup, backend, service, self.home) or service

    def build_method(self, method: str) -> Callable[..., Any]:
        """The guarded coroutine function for ``target.method``."""
        setup = self._setup(method)
        self.setups[method] = setup
        service = self._compose(method, setup, self.layers)
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


def _failing(call: Call) -> Awaitable[Any]:
    """The innermost service of a call that failed before it reached the backend: its failure."""
    failure = call.preloaded
    assert failure is not None
    call.preloaded = None
    return raising(failure)


def guard(
    store: S,
    *,
    name: str = "default",
    config: GuardConfig | Mapping[str, Any] | None = None,
    policies: Mapping[str, Mapping[str, Any] | MethodPolicy] | None = None,
    registry: CollectorRegistry = REGISTRY,
    tracer_provider: TracerProvider | None = None,
    extra_layers: Sequence[Layer] = (),
    **overrides: Any,
) -> S:
    """Wrap ``store`` so every async method is must-not-throw, bounded in time, retried when safe,
    circuit-broken, measured and traced.

    The result has exactly the capabilities of ``store`` (same ``hasattr`` answers, same
    ``isinstance`` against the protocols), so PenguiFlow sees the same store it saw before.

    Args:
        store: any object with async StateStore methods.
        name: the ``store`` label of metrics and ``guarded.store`` span attribute.
        config: every tunable (a :class:`~guarded.config.GuardConfig`, or a mapping of its
            settings, validated into one); production defaults when omitted.
        policies: per-method policy overrides (a :class:`~guarded.policy.MethodPolicy`, or a mapping
            of fields to patch such as ``{"my_method": {"kind": "read", "fallback": "empty_list"}}``).
        registry: prometheus registry for the metrics (the global one by default).
        tracer_provider: OpenTelemetry tracer provider (the global one by default).
        extra_layers: your own layers, run innermost (between the timeout layer and the store).
        **overrides: settings of :class:`~guarded.config.GuardConfig` (sections, or the flat
            shorthands ``timeout``, ``retries``, ``spill_path``, ``batching``, ``breaker``) merged
            section by section over those ``config`` was given (docs/configuration.md).

    A :class:`~guarded.snapshots.SnapshotStore` is guarded by
    :func:`~guarded.snapshots.guarded.guard_snapshots` (same arguments; docs/snapshots.md).
    """
    if is_snapshot_store(store):
        return guard_snapshots(  # type: ignore[return-value]
            store,
            name=name,
            config=config,
            policies=policies,
            registry=registry,
            tracer_provider=tracer_provider,
            extra_layers=extra_layers,
            **overrides,
        )
    _check_store(store)
    base = build_config(config, overrides)
    table = PolicyTable.for_state_store()
    if policies:
        table = table.with_overrides(policies)
    core = GuardCore(
        store,
        name=name,
        config=base,
        policies=table,
        registry=registry,
        tracer_provider=tracer_provider,
        extra_layers=extra_layers,
        durable=True,
        protocol_methods=STATE_STORE_METHODS | frozenset(policies or ()),
    )
    proxy = make_proxy(core, GuardedStore)
    if core.durability is not None:
        # A guard never closed says so, with what it had not delivered, when it is collected or
        # the interpreter exits (its event loop's shutdown is watched by the durability itself).
        weakref.finalize(proxy, core.durability.report_unclosed, "was garbage-collected")
    return proxy  # type: ignore[return-value]


def _check_store(store: object) -> None:
    """Refuse what cannot be a store: a class, an object without the required methods, or one
    whose required methods are declared not async (an unknown shape is accepted, its calls
    guarded as "result awaitable")."""
    if isinstance(store, type):
        raise TypeError(
            f"guard() takes a store instance, not the class {store.__qualname__}: "
            f"guard({store.__qualname__}(...))"
        )
    kind = type(store).__qualname__
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(store, name, None))]
    if missing:
        raise TypeError(
            f"guard() takes a StateStore: {kind} has no {', '.join(missing)} method "
            f"(required: {', '.join(REQUIRED_METHODS)})"
        )
    sync = [name for name in REQUIRED_METHODS if call_shape(getattr(store, name)) is CallShape.SYNC]
    if sync:
        raise TypeError(
            f"guard() takes a StateStore: {kind}.{', '.join(sync)} not async "
            "(PenguiFlow awaits them; define them with async def)"
        )


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


def _guard_artifact_store(core: GuardCore, inner: object, layers: list[Layer]) -> tuple[GuardCore, object]:
    """The guard of ``core``'s backend's artifact store: its core (sharing the store's breaker,
    bulkhead and failure log: the same backend) and its proxy."""
    artifact_core = GuardCore(
        inner,
        name=core.name,
        config=core.config,
        policies=PolicyTable.for_artifact_store(),
        registry=core.registry,
        tracer_provider=core.tracer_provider,
        extra_layers=core.extra_layers,
        label_prefix="artifact_store.",
        protocol_methods=ARTIFACT_STORE_METHODS,
        breaker=core.breaker,
        bulkhead=core.bulkhead,
        failure_log=core.failure_log,
        degraded_layers=layers,
        home=core.home,
    )
    return artifact_core, make_proxy(artifact_core, GuardedArtifactStore)


def make_proxy(core: GuardCore, base: type[GuardedStore]) -> GuardedStore:
    target = core.target
    listed = set(public_names(target))
    methods = {}
    for name in _guarded_names(core):
        method = core.method(name)
        if name in listed:
            # On the class, as for the store; a name only __getattr__ knows stays off it (the
            # proxy's __getattr__ hands out the guarded method), so static lookups answer alike.
            methods[name] = method
    special: dict[str, property] = {}
    if base is GuardedStore and inspect.getattr_static(target, "artifact_store", None) is not None:
        special["artifact_store"] = guarded_artifact_property(core, _guard_artifact_store)
    cls = build_proxy_class(
        target,
        methods=methods,
        special=special,
        base=base,
        class_name=f"Guarded{type(target).__name__}",
        resolve=core.resolve,
    )
    proxy: GuardedStore = cls()
    register(proxy, core)
    return proxy


__all__ = [
    "ARTIFACT_STORE_METHODS",
    "ERROR_CLASSIFIER",
    "HONOURS_IDEMPOTENCY_KEY",
    "RECOVERS_UNANSWERED_CONSUMES",
    "STATE_STORE_METHODS",
    "GuardController",
    "GuardCore",
    "GuardedArtifactStore",
    "GuardedStore",
    "artifact_spill_path",
    "controller",
    "core_of",
    "guard",
    "make_proxy",
]
