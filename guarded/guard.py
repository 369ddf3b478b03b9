"""``guard(store)``: wrap any StateStore in the layer chain and return a capability-preserving proxy."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.trace import TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry

from .artifact_side import (
    ARTIFACT_STORE_METHODS,
    artifact_durability,
    artifact_spill_path,
    guarded_artifact_property,
)
from .config import GuardConfig, build_config
from .controller import GuardController, controller
from .guard_core import GuardCore, GuardedArtifactStore, GuardedStore, make_proxy
from .pipeline.call import Layer
from .pipeline.proxy import CallShape, call_shape
from .policy import MethodPolicy
from .policy_table import PolicyTable
from .protocol import CAPABILITIES, LEGACY_ALIASES
from .snapshots.guarded import guard_snapshots, is_snapshot_store

S = TypeVar("S")

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
    special: dict[str, property] = {}
    if inspect.getattr_static(store, "artifact_store", None) is not None:
        special["artifact_store"] = guarded_artifact_property(core, _guard_artifact_store)
        core.serve_artifacts(artifact_durability)
    proxy = make_proxy(core, GuardedStore, special)
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


__all__ = [
    "ARTIFACT_STORE_METHODS",
    "STATE_STORE_METHODS",
    "GuardController",
    "GuardCore",
    "GuardedArtifactStore",
    "GuardedStore",
    "artifact_spill_path",
    "controller",
    "guard",
]
