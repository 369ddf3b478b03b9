"""The guarded ``artifact_store`` of a guarded store: the in-process copies of artifacts the
backend could not take, their durability (a spill file of their own) and the guarded proxy of the
backend's artifact store (spec 000 "Artifact Store")."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .codec import RecordTypes, record_types_of
from .config import GuardConfig
from .deadletter.slots import sibling_spill_path
from .deadletter.telemetry import REFUSE_DISK_CAP, BufferCounters
from .durability.owner import Durability
from .errors import WriteNotKeptError
from .layers.artifact_fallback import LocalArtifactFallbackLayer
from .local_artifacts import InMemoryArtifactStore
from .models import ArtifactRetentionConfig
from .policy_table import PolicyTable
from .store_identity import durable_across_processes, store_identity

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .guard_core import GuardCore
    from .pipeline.call import Layer

GuardArtifacts = Callable[["GuardCore", object, "list[Layer]"], "tuple[GuardCore, object]"]
"""Guards a backend's artifact store for the guard of ``core`` with the given degraded layers:
its core and proxy (supplied by :mod:`guarded.guard`)."""

logger = logging.getLogger("guarded")

ARTIFACT_STORE_METHODS = frozenset(policy.name for policy in PolicyTable.for_artifact_store())
"""The ArtifactStore protocol's methods, guarded on the ``artifact_store`` proxy."""


def guarded_artifact_property(core: GuardCore, build: GuardArtifacts) -> property:
    """The ``artifact_store`` property of ``core``'s proxy: the guarded artifact store."""
    side = _ArtifactSide(core, build)
    _artifact_sides[core] = side
    return property(lambda self: side.proxy())


def artifact_spill_path(path: str | None) -> str | None:
    """The spill file of held artifact puts beside the dead-letter file ``path``: ``-artifacts``
    added to its name (``dlq-{name}.sqlite`` → ``dlq-{name}-artifacts.sqlite``)."""
    return sibling_spill_path(path, "-artifacts")


class _ArtifactTarget:
    """The backend's artifact store as the artifact durability sees it: the same methods, the
    record types of the store, a target identity of its own (its spill file is adopted only by
    a guard over the same artifact store, never mixed with the store's other writes) and the
    store's durability across processes."""

    def __init__(self, inner: object, identity: str, durable: bool, types: RecordTypes) -> None:
        self._inner = inner
        self.target_identity = identity
        self.durable_across_processes = durable
        self.types = types

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ArtifactSide:
    """What a guard keeps for its backend's ``artifact_store``: the in-process copies, the
    durability of held puts (one per guard, created with the first guarded artifact store) and the
    guarded proxy (rebuilt when the backend hands out another artifact store object)."""

    def __init__(self, core: GuardCore, build: GuardArtifacts) -> None:
        self._build = build
        self._core = weakref.ref(core)  # the side is found by its core: no reference back
        config = core.config
        self.local = InMemoryArtifactStore(
            ArtifactRetentionConfig(
                max_session_bytes=config.artifacts.local_max_bytes,
                max_trace_bytes=config.artifacts.local_max_bytes,
            )
        )
        self._refuse_unheld = _UnheldPutRefusals(core.name, core.registry)
        core.home.on_move(self._moved)
        self.durability: Durability | None = None
        self._durable = config.dead_letter.enabled and config.artifacts.spill_max_bytes > 0
        self._inner: object | None = None
        self._proxy: object | None = None
        self._artifact_core: GuardCore | None = None

    def proxy(self) -> object | None:
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
            target = _artifact_target(core, inner)
            self.durability = Durability(
                target,
                _artifact_durability_config(config, target),
                store_name=core.name,
                registry=core.registry,
                breaker=core.breaker,
                run=_replay_into(weakref.ref(self)),
                policies=PolicyTable.for_artifact_store(),
                failure_log=core.failure_log,
            )
            core.home.on_move(self.durability.moved)
        fallback = LocalArtifactFallbackLayer(
            self.local,
            core.failure_log,
            self.durability.ports() if self.durability is not None else None,
            refuse_unheld=self._refuse_unheld,
        )
        artifact_core, proxy = self._build(core, inner, [fallback])
        self._inner, self._proxy, self._artifact_core = inner, proxy, artifact_core
        return proxy

    def _moved(self) -> None:
        """The guard moved to a new event loop: the in-process copies' locks serve the new one."""
        self.local.moved()

    async def run(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Replays of held puts go to the current artifact store through breaker, retry, timeout."""
        if self._artifact_core is None:
            raise RuntimeError("no guarded artifact store to replay into")
        return await self._artifact_core.run_internal(method, args, kwargs)


def _replay_into(side: weakref.ref[_ArtifactSide]) -> Callable[..., Any]:
    """The artifact durability's internal call, through a weak reference to its side: the side
    keeps the guarded artifact store, whose core is registered by that store (weakly), and whose
    layers keep the durability; a strong one would keep the whole guard alive for good."""

    async def run(method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        found = side()
        if found is None:
            raise RuntimeError("the guard of this artifact store is gone")
        return await found.run(method, args, kwargs)

    return run


class _UnheldPutRefusals:
    """Refuses an artifact put the backend could not take and no buffer holds (the guard has no
    artifact durability, or the method's policy holds nothing): counted and logged as at the
    artifact buffer's cap (``reason="disk_cap"``: the cap on held artifacts is 0)."""

    def __init__(self, store_name: str, registry: CollectorRegistry) -> None:
        self._store_name = store_name
        self._registry = registry
        self._counters: BufferCounters | None = None
        """Made at the first refusal: a guard that refuses none exports no dead-letter metrics."""

    def __call__(self, method: str) -> WriteNotKeptError:
        if self._counters is None:
            self._counters = BufferCounters(self._store_name, self._registry)
        self._counters.refused([method], REFUSE_DISK_CAP)
        return WriteNotKeptError(
            "this guard holds no artifact put its backend cannot take (artifacts.spill_max_bytes=0, "
            "or dead letters off): the write was not kept",
            method=method,
        )


_artifact_sides: weakref.WeakKeyDictionary[GuardCore, _ArtifactSide] = weakref.WeakKeyDictionary()


def _artifact_target(core: GuardCore, inner: object) -> _ArtifactTarget:
    """The artifact store ``inner`` of ``core``'s backend with the identity of its spill file: the
    store's own with `` artifact_store`` added."""
    target = core.target
    identity = store_identity(target, core.name, application=core.config.dead_letter.application)
    return _ArtifactTarget(
        inner, f"{identity} artifact_store", durable_across_processes(target), record_types_of(target)
    )


def _artifact_durability_config(config: GuardConfig, target: _ArtifactTarget) -> GuardConfig:
    """The configuration of the artifact durability: its own spill file (none for a store that
    keeps nothing across processes), capped at ``artifacts.spill_max_bytes`` (a put past it is
    refused by the buffer, nothing held is evicted; without a file, its memory cap), no batching
    and no stale cache (the in-process copies answer reads)."""
    cap = config.artifacts.spill_max_bytes
    dead_letter = config.dead_letter
    path = artifact_spill_path(dead_letter.path) if target.durable_across_processes else None
    return config.model_copy(
        update={
            "dead_letter": dead_letter.model_copy(
                update={
                    "path": path,
                    "max_disk_bytes": cap,
                    "max_memory_bytes": cap if path is None else min(dead_letter.max_memory_bytes, cap),
                }
            ),
            "batching": config.batching.model_copy(update={"enabled": False}),
            "stale": config.stale.model_copy(update={"enabled": False}),
        }
    )


def artifact_durability(core: GuardCore, *, create: bool = False) -> Durability | None:
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


__all__ = [
    "ARTIFACT_STORE_METHODS",
    "artifact_durability",
    "artifact_spill_path",
    "guarded_artifact_property",
]
