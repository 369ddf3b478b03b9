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

from . import telemetry_names as names
from .breaker import BreakerState, CircuitBreaker
from .bulkhead import Bulkhead, bulkhead_for
from .call import Call, Layer, MethodSetup, Service
from .classify import register_classifier
from .codec import RecordTypes, record_types_of
from .config import GuardConfig, build_config
from .deadletter import DeadLetterBuffer
from .durability import Durability
from .entry import entry_point
from .failure_log import FailureLog
from .layers import (
    BulkheadLayer,
    CircuitBreakerLayer,
    FallbackLayer,
    MetricsLayer,
    RetryLayer,
    TimeoutLayer,
    TracingLayer,
)
from .layers.artifact_fallback import LocalArtifactFallbackLayer
from .layers.batching import BatchingLayer
from .layers.call_check import CallCheckLayer
from .layers.dead_letter import DeadLetterLayer
from .layers.memory_health import MemoryHealthLayer
from .layers.metrics import GuardInstruments, guard_instruments, publish_breaker_state
from .layers.stale_reads import StaleReadLayer
from .local_artifacts import InMemoryArtifactStore
from .models import ArtifactRetentionConfig
from .policy import LIFECYCLE_METHODS, MethodPolicy, PolicyTable
from .protocol import CAPABILITIES, LEGACY_ALIASES
from .proxy import CallShape, build_proxy_class, call_shape, public_names
from .unanswered import DEFAULT_GRACE, UnansweredConsumes

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

ARTIFACT_STORE_METHODS = frozenset(policy.name for policy in PolicyTable.for_artifact_store())
"""The ArtifactStore protocol's methods, for the guarded ``artifact_store`` as above."""

REQUIRED_METHODS: tuple[str, ...] = next(cap.methods for cap in CAPABILITIES if cap.required)

logger = logging.getLogger("guarded")

_CLOSE_AT_LEAST = 0.5
"""Seconds ``aclose()`` gives the wrapped store's own close when the drain used the budget."""

ERROR_CLASSIFIER = "error_classifier"
"""A backend names its :class:`~guarded.classify.ErrorClassifier` in this attribute; the guard
registers it, so its driver's errors are classified by what the backend knows of them."""

HONOURS_IDEMPOTENCY_KEY = "honours_idempotency_key"
"""A backend sets this class attribute to ``True`` when it honours
:data:`guarded.idempotency.IDEMPOTENCY_KEY` for consumes; the guard then retries them."""

RECOVERS_UNANSWERED_CONSUMES = "recovers_unanswered_consumes"
"""A backend that honours idempotency keys sets this class attribute to ``True`` when it also
honours :data:`guarded.idempotency.UNANSWERED_KEYS`; the guard then keeps the keys of consumes that
got no answer and has the next consume of the token recover them (:mod:`guarded.unanswered`)."""


class GuardedStore:
    """Base class of every guard proxy (see :func:`guard`). Holds nothing of its own."""

    async def __aenter__(self) -> Any:
        durability = _cores[self].durability
        if durability is not None:
            await durability.open()
        artifacts = _artifact_durability(_cores[self], create=True)
        if artifacts is not None:
            await artifacts.open()  # artifacts a previous process held start replaying
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await controller(self).aclose()

    def __repr__(self) -> str:
        core = _cores[self]
        return f"<guarded {core.name!r} over {core.target!r}>"


class GuardedArtifactStore(GuardedStore):
    """Base class of the proxy returned by a guarded store's ``artifact_store``."""


_cores: weakref.WeakKeyDictionary[GuardedStore, GuardCore] = weakref.WeakKeyDictionary()


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
    ) -> None:
        self.target = target
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
            )
            ports = self.durability.ports()
            degraded_layers = [
                StaleReadLayer(ports, policies),
                DeadLetterLayer(ports, self.failure_log),
                BatchingLayer(ports),
                *degraded_layers,
            ]
        self.layers: list[Layer] = [
            TracingLayer(
                tracer,
                db_system_name=db_system if isinstance(db_system, str) else None,
                tracer_provider=tracer_provider,
            ),
            MetricsLayer(self.instruments),
            FallbackLayer(self.failure_log, strict=config.strict),
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

        def on_transition(old: BreakerState, new: BreakerState) -> None:
            transitions.labels(self.name, old.value, new.value).inc()

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
        for layer in reversed(layers):
            service = layer.wrap(service, setup)
        return service

    def build_method(self, method: str) -> Callable[..., Any]:
        """The guarded coroutine function for ``target.method``."""
        setup = self._setup(method)
        self.setups[method] = setup
        service = self._compose(method, setup, self.layers)
        return entry_point(service, setup, self._key_prefix, self._key_counter, self.unanswered)

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

    async def run_internal(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``target.method(*args, **kwargs)`` through breaker, retry, bulkhead and timeout only: the
        guard's own calls (batch flushes, replays), which raise on failure and are not counted as
        calls, and wait for admission to the backend like any other."""
        found = self._internal.get(method)
        if found is None:
            setup = self._setup(method)
            found = self._internal[method] = (
                setup,
                self._compose(method, setup, [*self._backend_layers(), *self.extra_layers]),
            )
        setup, service = found
        loop = asyncio.get_running_loop()
        return await service(Call(setup, args, kwargs, loop, loop.time()))


def guard(
    store: S,
    *,
    name: str = "default",
    config: GuardConfig | None = None,
    policies: Mapping[str, Mapping[str, Any] | MethodPolicy] | None = None,
    registry: CollectorRegistry = REGISTRY,
    tracer_provider: TracerProvider | None = None,
    extra_layers: Sequence[Layer] = (),
    **overrides: Any,
) -> S:
    """Wrap ``store`` so every async method is must-not-throw, bounded in time, retried when safe,
    circuit-broken, measured and traced (DESIGN.md "Architecture").

    The result has exactly the capabilities of ``store`` (same ``hasattr`` answers, same
    ``isinstance`` against the protocols), so PenguiFlow sees the same store it saw before.

    Args:
        store: any object with async StateStore methods.
        name: the ``store`` label of metrics and ``guarded.store`` span attribute.
        config: every tunable; production defaults when omitted.
        policies: per-method policy overrides (a :class:`~guarded.policy.MethodPolicy`, or a mapping
            of fields to patch such as ``{"my_method": {"kind": "read", "fallback": "empty_list"}}``).
        registry: prometheus registry for the metrics (the global one by default).
        tracer_provider: OpenTelemetry tracer provider (the global one by default).
        extra_layers: your own layers, run innermost (between the timeout layer and the store).
        **overrides: settings of :class:`~guarded.config.GuardConfig` (sections, or the flat
            shorthands ``timeout``, ``retries``, ``spill_path``, ``batching``, ``breaker``) merged
            section by section over those ``config`` was given (docs/configuration.md).
    """
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
    proxy = _make_proxy(core, GuardedStore)
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


def _make_proxy(core: GuardCore, base: type[GuardedStore]) -> GuardedStore:
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
        special["artifact_store"] = _guarded_artifact_property(core)
    cls = build_proxy_class(
        target,
        methods=methods,
        special=special,
        base=base,
        class_name=f"Guarded{type(target).__name__}",
        resolve=core.resolve,
    )
    proxy: GuardedStore = cls()
    _cores[proxy] = core
    return proxy


def _guarded_artifact_property(core: GuardCore) -> property:
    side = _ArtifactSide(core)
    _artifact_sides[core] = side
    return property(lambda self: side.proxy())


def artifact_spill_path(path: str | None) -> str | None:
    """The spill file of held artifact puts beside the dead-letter file ``path``: ``-artifacts``
    added to its name (``dlq-{name}.sqlite`` → ``dlq-{name}-artifacts.sqlite``)."""
    if path is None:
        return None
    root, ext = os.path.splitext(path)
    if not ext or os.sep in ext:
        root, ext = path, ""
    return f"{root}-artifacts{ext}"


_ARTIFACT_SPILL_SLACK = 1024 * 1024
"""Room above ``artifacts.spill_max_bytes`` in the artifact buffer's own caps, so the estimate
the admission check uses can never make the buffer drop an artifact it admitted."""


class _ArtifactTarget:
    """The backend's artifact store as the artifact durability sees it: the same methods, the
    record types of the store, and a target identity of its own (its spill file is adopted only by
    a guard over the same artifact store, never mixed with the store's other writes; ``None`` when
    the store has no identity, as for its other writes)."""

    def __init__(self, inner: object, identity: str | None, types: RecordTypes) -> None:
        self._inner = inner
        self.target_identity = identity
        self.types = types

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ArtifactSide:
    """What a guard keeps for its backend's ``artifact_store``: the in-process copies, the
    durability of held puts (one per guard, created with the first guarded artifact store) and the
    guarded proxy (rebuilt when the backend hands out another artifact store object)."""

    def __init__(self, core: GuardCore) -> None:
        self._core = weakref.ref(core)  # the side is found by its core: no reference back
        config = core.config
        self.local = InMemoryArtifactStore(
            ArtifactRetentionConfig(
                max_session_bytes=config.artifacts.local_max_bytes,
                max_trace_bytes=config.artifacts.local_max_bytes,
            )
        )
        self.durability: Durability | None = None
        self._durable = config.dead_letter.enabled and config.artifacts.spill_max_bytes > 0
        self._inner: object | None = None
        self._proxy: GuardedStore | None = None
        self._artifact_core: GuardCore | None = None

    def proxy(self) -> GuardedStore | None:
        """The guarded artifact store (``None`` when the backend has none)."""
        core = self._core()
        if core is None:
            return None
        inner = core.target.artifact_store  # type: ignore[attr-defined]
        if inner is None:
            return None
        if self._proxy is not None and self._inner is inner:
            return self._proxy
        config = core.config
        if self.durability is None and self._durable:
            self.durability = Durability(
                _ArtifactTarget(inner, _artifact_identity(core.target), record_types_of(core.target)),
                _artifact_durability_config(config),
                store_name=core.name,
                registry=core.registry,
                breaker=core.breaker,
                run=self._run,
                policies=PolicyTable.for_artifact_store(),
            )
        artifact_core = GuardCore(
            inner,
            name=core.name,
            config=config,
            policies=PolicyTable.for_artifact_store(),
            registry=core.registry,
            tracer_provider=core.tracer_provider,
            extra_layers=core.extra_layers,
            label_prefix="artifact_store.",
            protocol_methods=ARTIFACT_STORE_METHODS,
            breaker=core.breaker,
            bulkhead=core.bulkhead,  # the same backend: the same limit
            failure_log=core.failure_log,
            degraded_layers=[
                LocalArtifactFallbackLayer(
                    self.local,
                    core.failure_log,
                    self.durability.ports() if self.durability is not None else None,
                    spill_max_bytes=config.artifacts.spill_max_bytes,
                )
            ],
        )
        proxy = _make_proxy(artifact_core, GuardedArtifactStore)
        self._inner, self._proxy, self._artifact_core = inner, proxy, artifact_core
        return proxy

    async def _run(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Replays of held puts go to the current artifact store through breaker, retry, timeout."""
        if self._artifact_core is None:
            raise RuntimeError("no guarded artifact store to replay into")
        return await self._artifact_core.run_internal(method, args, kwargs)


_artifact_sides: weakref.WeakKeyDictionary[GuardCore, _ArtifactSide] = weakref.WeakKeyDictionary()


def _artifact_identity(target: object) -> str | None:
    """The target identity of the artifact spill file: the store's own with `` artifact_store``
    added, or ``None`` for a store that has none (as its other spill files record none)."""
    found = getattr(target, "target_identity", None)
    return f"{found} artifact_store" if isinstance(found, str) and found else None


def _artifact_durability_config(config: GuardConfig) -> GuardConfig:
    """The configuration of the artifact durability: its own spill file, the artifact caps, no
    batching and no stale cache (the in-process copies answer reads)."""
    cap = config.artifacts.spill_max_bytes + _ARTIFACT_SPILL_SLACK
    dead_letter = config.dead_letter
    path = artifact_spill_path(dead_letter.path)
    return config.model_copy(
        update={
            "dead_letter": dead_letter.model_copy(
                update={
                    "path": path,
                    "max_disk_bytes": max(dead_letter.max_disk_bytes, cap),
                    "max_memory_bytes": cap if path is None else min(dead_letter.max_memory_bytes, cap),
                }
            ),
            "batching": config.batching.model_copy(update={"enabled": False}),
            "stale": config.stale.model_copy(update={"enabled": False}),
        }
    )


def _artifact_durability(core: GuardCore, *, create: bool = False) -> Durability | None:
    """The durability of ``core``'s artifact puts; with ``create``, built when the backend has an
    artifact store and none was built yet."""
    side = _artifact_sides.get(core)
    if side is None:
        return None
    if create and side.durability is None:
        try:
            side.proxy()
        except Exception:  # the backend's artifact_store property failed: nothing to open then
            logger.exception("guarding the artifact store failed", extra={"store": core.name})
    return side.durability


def controller(proxy: object) -> GuardController:
    """The controls of a guard proxy: flush, close, breaker, statistics, policies."""
    core = _cores.get(proxy) if isinstance(proxy, GuardedStore) else None
    if core is None:
        raise TypeError(f"{type(proxy).__qualname__} is not a guarded store (use guarded.guard(store))")
    return GuardController(core)


class GuardController:
    """Operator controls of one guard, kept off the proxy so they never collide with store methods."""

    def __init__(self, core: GuardCore) -> None:
        self._core = core

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def config(self) -> GuardConfig:
        return self._core.config

    @property
    def store(self) -> object:
        """The wrapped store."""
        return self._core.target

    @property
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker (``state``, ``force_open()``, ``disable()``, ``reset()``)."""
        return self._core.breaker

    @property
    def bulkhead(self) -> Bulkhead | None:
        """The concurrency limit in front of the backend (``limit``, ``in_use``, ``waiting``),
        ``None`` when there is none (disabled, or a backend that declares no limit)."""
        return self._core.bulkhead

    def policy(self, method: str) -> MethodPolicy:
        """The policy the guard applies to ``method``."""
        return self._core.policies.get(method)

    def stats(self) -> dict[tuple[str, str], int]:
        """Calls made through this guard so far, by (method, outcome); artifact methods are
        ``artifact_store.*``. The same numbers Prometheus scrapes as ``guarded_store_calls_total``."""
        return self._core.instruments.stats.counts(self._core.name)

    def guarded_methods(self) -> list[str]:
        """Names of the store methods the guard wraps."""
        return sorted(self._core.setups)

    @property
    def dead_letters(self) -> DeadLetterBuffer | None:
        """The dead-letter buffer (``stats()``, ``entries()``, ``parked()``), ``None`` when disabled."""
        durability = self._core.durability
        return durability.buffer if durability is not None else None

    async def flush(self) -> None:
        """Hand every batched write to the backend now (what fails is dead-lettered)."""
        if self._core.durability is not None:
            await self._core.durability.flush()

    @property
    def artifact_dead_letters(self) -> DeadLetterBuffer | None:
        """The dead-letter buffer of artifact puts (its own spill file), ``None`` until the guarded
        ``artifact_store`` was first used, or when artifacts are not dead-lettered."""
        durability = _artifact_durability(self._core)
        return durability.buffer if durability is not None else None

    async def drain(self, timeout: float | None = None) -> int:  # noqa: ASYNC109 - a budget
        """Flush, then replay dead-lettered writes (artifact puts too) until none is left or
        ``timeout`` seconds (default ``dead_letter.drain_timeout``) pass; returns how many remain."""
        budget = self._core.config.dead_letter.drain_timeout if timeout is None else timeout
        durabilities = [
            durability
            for durability in (self._core.durability, _artifact_durability(self._core))
            if durability is not None
        ]
        remaining = await asyncio.gather(*(durability.drain(budget) for durability in durabilities))
        return sum(remaining)

    async def aclose(self) -> None:
        """Flush batches and drain the dead-letter buffer within ``dead_letter.drain_timeout``
        (what is left stays in the spill file for the next process), then close the wrapped store
        when it has ``aclose()`` or ``close()``, within what is left of that budget (at least
        half a second; a close still running then is cancelled and logged)."""
        budget = self._core.config.dead_letter.drain_timeout
        loop = asyncio.get_running_loop()
        started = loop.time()
        durabilities = [
            durability
            for durability in (self._core.durability, _artifact_durability(self._core))
            if durability is not None
        ]
        # Artifact puts drain beside the other writes, within the same budget.
        await asyncio.gather(*(durability.aclose(budget) for durability in durabilities))
        for closer_name in ("aclose", "close"):
            closer = getattr(self._core.target, closer_name, None)
            if callable(closer):
                result = closer()
                if inspect.isawaitable(result):
                    # The store's close gets what is left of the budget (at least
                    # _CLOSE_AT_LEAST): on a server that never answers it would wait on it.
                    left = max(started + budget - loop.time(), _CLOSE_AT_LEAST)
                    try:
                        await asyncio.wait_for(result, timeout=left)
                    except TimeoutError:
                        logger.warning(
                            "store %r did not close within %.1fs; abandoned", self._core.name, left
                        )
                return
