"""The guarded ``artifact_store`` of a guarded store: the in-process copies of artifacts the
backend could not take, their durability (a spill file of their own) and the guarded proxy of the
backend's artifact store (spec 000 "Artifact Store")."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..codec import RecordTypes, record_types_of
from ..config import GuardConfig
from ..deadletter.slots import sibling_spill_path
from ..layers.artifact_fallback import LocalArtifactFallbackLayer
from ..models import ArtifactRetentionConfig
from ..policy_table import PolicyTable
from ..store_identity import durable_across_processes, store_identity
from .local_artifacts import InMemoryArtifactStore
from .owner import Durability

if TYPE_CHECKING:
    from ..guard import GuardCore
    from ..pipeline.call import Layer

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


_ARTIFACT_SPILL_SLACK = 1024 * 1024
"""Room above ``artifacts.spill_max_bytes`` in the artifact buffer's own caps, so the estimate
the admission check uses can never make the buffer drop an artifact it admitted."""


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
        self._fallback: LocalArtifactFallbackLayer | None = None
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
            spill_max_bytes=config.artifacts.spill_max_bytes,
        )
        self._fallback = fallback
        artifact_core, proxy = self._build(core, inner, [fallback])
        self._inner, self._proxy, self._artifact_core = inner, proxy, artifact_core
        return proxy

    def _moved(self) -> None:
        """The guard moved to a new event loop: the in-process copies' locks serve the new one."""
        self.local.moved()
        if self._fallback is not None:
            self._fallback.moved()

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
    keeps nothing across processes), the artifact caps, no batching and no stale cache (the
    in-process copies answer reads)."""
    cap = config.artifacts.spill_max_bytes + _ARTIFACT_SPILL_SLACK
    dead_letter = config.dead_letter
    path = artifact_spill_path(dead_letter.path) if target.durable_across_processes else None
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
