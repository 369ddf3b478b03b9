"""``guard(store)``: wrap any StateStore in the layer chain and return a capability-preserving proxy."""

from __future__ import annotations

import inspect
import re
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
from .backend import store_parts_of
from .config import GuardConfig, build_config
from .controller import GuardController, controller
from .deadletter.slots import sibling_spill_path
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
    :func:`~guarded.snapshots.guarded.guard_snapshots` (same arguments; docs/snapshots.md). A
    composed store (:class:`~guarded.backend.ComposedStore`, such as ``HybridStateStore``) comes
    back rebuilt over its parts, each guarded on its own as ``"<name>.<part>"``
    (docs/architecture.md, "Composed stores").
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
    parts = store_parts_of(store)
    if parts is not None:
        return _guard_parts(  # type: ignore[no-any-return]
            store,
            parts,
            name=name,
            config=base,
            policies=policies,
            registry=registry,
            tracer_provider=tracer_provider,
            extra_layers=extra_layers,
        )
    return _guard_state_store(
        store,
        name=name,
        config=base,
        policies=policies,
        registry=registry,
        tracer_provider=tracer_provider,
        extra_layers=extra_layers,
    )


def _guard_state_store(
    store: S,
    *,
    name: str,
    config: GuardConfig,
    policies: Mapping[str, Mapping[str, Any] | MethodPolicy] | None,
    registry: CollectorRegistry,
    tracer_provider: TracerProvider | None,
    extra_layers: Sequence[Layer],
) -> S:
    """The guard of one backend (its own core, breaker, bulkhead and durability) and its proxy."""
    table = PolicyTable.for_state_store()
    if policies:
        table = table.with_overrides(policies)
    core = GuardCore(
        store,
        name=name,
        config=config,
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


_PART_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _guard_parts(
    store: Any,
    parts: Mapping[str, object],
    *,
    name: str,
    config: GuardConfig,
    policies: Mapping[str, Mapping[str, Any] | MethodPolicy] | None,
    registry: CollectorRegistry,
    tracer_provider: TracerProvider | None,
    extra_layers: Sequence[Layer],
) -> Any:
    """A composed store (:class:`~guarded.backend.ComposedStore`) over its parts, each guarded on
    its own as the store ``"<name>.<part>"``: a breaker, bulkhead, error classifier, dead-letter
    buffer, metrics and spans of its own, so one part failing never stops another. Each part's
    spill file is its own: a configured path without ``{name}`` gets ``-<part>`` before its
    extension (a path with ``{name}`` already differs by the part's name). The composed store
    was checked whole; a part need only have the methods routed to it."""
    for part in parts:
        if not (isinstance(part, str) and _PART_NAME.fullmatch(part)):
            raise ValueError(
                f"{type(store).__qualname__} names a part {part!r}: a part's name is a lowercase "
                "identifier of at most 32 characters (it names the part's metrics and spill file)"
            )
    guarded = {
        part: _guard_state_store(
            inner,
            name=f"{name}.{part}",
            config=_part_config(config, part),
            policies=policies,
            registry=registry,
            tracer_provider=tracer_provider,
            extra_layers=extra_layers,
        )
        for part, inner in parts.items()
    }
    return store.with_parts(guarded)


def _part_config(config: GuardConfig, part: str) -> GuardConfig:
    """``config`` for the guard of the part ``part``: its own spill file beside the configured one."""
    path = config.dead_letter.path
    if path is None or "{name}" in path:
        return config
    own = config.dead_letter.model_copy(update={"path": sibling_spill_path(path, f"-{part}")})
    return config.model_copy(update={"dead_letter": own})


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
