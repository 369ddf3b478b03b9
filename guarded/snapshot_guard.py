"""``guard(snapshot_store)``: a :class:`~guarded.snapshots.SnapshotStore` behind the guard's chain.

``guard()`` recognises a SnapshotStore (the protocol's methods, none of a StateStore's) and calls
:func:`guard_snapshots`, which you may call directly. Every call runs through the same chain as a
StateStore call -- tracing, metrics, fallback, stale reads, circuit breaker, retry, bulkhead,
timeout -- under :meth:`PolicyTable.for_snapshot_store <guarded.policy.PolicyTable.for_snapshot_store>`,
so it is measured (``guarded_store_*{store, method, outcome}``) and traced like any store call.

What differs from a StateStore, because a snapshot store's callers are operators and tools rather
than an agent that must never see an exception:

* **the store's answers stay answers**: ``SnapshotNotFoundError``, ``SnapshotConflictError``,
  ``SnapshotCorruptError``, the format-version errors and ``InvalidCursorError`` are raised to the
  caller as the backend raised them (outcome ``ok``: the backend answered), never retried, never
  counted against the backend;
* **reads are stale-if-error**: ``get``, ``list``, ``lineage`` and ``diff`` answer what this
  process last read for the same arguments when the backend fails (outcome ``stale``);
  ``load`` is not (a content streams from the backend after ``load`` returns);
* **failures are loud**: a call with no stale answer raises
  :class:`~guarded.snapshots.SnapshotStoreUnavailableError` (the backend's error chained, outcome
  ``fallback``/``timeout``/``circuit_open`` in the metrics) instead of returning a default;
  the caller's own bugs (a ``ValueError``, a ``TypeError``) are raised as they are;
* **saves are not held**: a save that fails after its retries raises; it is not kept in the
  dead-letter buffer, which holds JSON arguments (a content is streams and blobs, up to gigabytes).
  Saves are idempotent: save again once the backend is back.
* ``delete`` and ``gc`` are never retried (a repeat answers differently); ``save``, ``tag`` and
  ``untag`` are.

Snapshot calls are slow next to a StateStore's: unless given a ``config`` or a ``timeout``,
``save``, ``load``, ``diff`` and ``gc`` get a 15-minute deadline (:data:`LONG_CALLS`), the other
calls the guard's own; a call counts as slow for the breaker after 60 seconds at least.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from opentelemetry.trace import TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry

from .call import Layer
from .classify import CircuitOpenError, no_wait_fixes, safe_message
from .config import GuardConfig, MethodConfig, build_config
from .cores import register
from .policy import MethodPolicy, PolicyTable
from .snapshots.content import SnapshotContent
from .snapshots.errors import SnapshotError, SnapshotStoreUnavailableError
from .snapshots.protocol import SnapshotStore
from .snapshots.record import GcReport, RetentionPolicy, Snapshot, SnapshotDiff, SnapshotPage, SubjectKind

T = TypeVar("T")

SNAPSHOT_METHODS = ("save", "load", "get", "list", "delete", "tag", "untag", "lineage", "diff", "gc")
"""The methods of :class:`~guarded.snapshots.SnapshotStore`, every one guarded."""

LONG_CALLS: Mapping[str, MethodConfig] = {
    name: MethodConfig(deadline=900.0, attempt_timeout=900.0) for name in ("save", "load", "diff", "gc")
}
"""Default per-method settings of a guarded snapshot store (a ``methods`` entry you give wins)."""
SLOW_CALL_SECONDS = 60.0
"""A snapshot call slower than this counts as slow for the breaker (unless configured higher)."""

_failures: contextvars.ContextVar[builtins.list[BaseException] | None] = contextvars.ContextVar(
    "guarded_snapshot_failures", default=None
)


class _Answer:
    """A snapshot error the backend answered with, carried through the chain as a result."""

    __slots__ = ("error",)

    def __init__(self, error: SnapshotError) -> None:
        self.error = error


class SnapshotCalls:
    """What the guard's chain calls: the store's methods, whose snapshot errors come back as
    values (the backend answered) and whose failures are noted for the caller's error."""

    def __init__(self, store: object) -> None:
        self._store = store
        for name in ("error_classifier", "max_concurrency", "db_system_name", "target_identity"):
            value = getattr(store, name, None)
            if value is not None:
                setattr(self, name, value)

    async def _call(self, call: Awaitable[T]) -> T | _Answer:
        try:
            return await call
        except SnapshotError as exc:
            return _Answer(exc)
        except Exception as exc:
            noted = _failures.get()
            if noted is not None:
                noted.append(exc)
            raise
        except asyncio.CancelledError:
            # The guard's deadline (a caller's own cancellation never reaches its error).
            noted = _failures.get()
            if noted is not None:
                noted.append(TimeoutError("no answer within the call's deadline"))
            raise

    async def save(self, content: SnapshotContent) -> Snapshot | _Answer:
        return await self._call(self._store.save(content))  # type: ignore[attr-defined]

    async def load(self, snapshot_id: str) -> SnapshotContent | _Answer:
        return await self._call(self._store.load(snapshot_id))  # type: ignore[attr-defined]

    async def get(self, snapshot_id: str) -> Snapshot | _Answer:
        return await self._call(self._store.get(snapshot_id))  # type: ignore[attr-defined]

    async def list(
        self,
        *,
        subject_kind: SubjectKind | None = None,
        subject_id: str | None = None,
        tag: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> SnapshotPage | _Answer:
        return await self._call(
            self._store.list(  # type: ignore[attr-defined]
                subject_kind=subject_kind,
                subject_id=subject_id,
                tag=tag,
                since=since,
                until=until,
                limit=limit,
                cursor=cursor,
            )
        )

    async def delete(self, snapshot_id: str) -> bool | _Answer:
        return await self._call(self._store.delete(snapshot_id))  # type: ignore[attr-defined]

    async def tag(self, snapshot_id: str, tags: tuple[str, ...]) -> Snapshot | _Answer:
        return await self._call(self._store.tag(snapshot_id, tags))  # type: ignore[attr-defined]

    async def untag(self, snapshot_id: str, tags: tuple[str, ...]) -> Snapshot | _Answer:
        return await self._call(self._store.untag(snapshot_id, tags))  # type: ignore[attr-defined]

    async def lineage(self, snapshot_id: str) -> builtins.list[Snapshot] | _Answer:
        return await self._call(self._store.lineage(snapshot_id))  # type: ignore[attr-defined]

    async def diff(self, a: str, b: str) -> SnapshotDiff | _Answer:
        return await self._call(self._store.diff(a, b))  # type: ignore[attr-defined]

    async def gc(self, policy: RetentionPolicy | None = None) -> GcReport | _Answer:
        return await self._call(self._store.gc(policy))  # type: ignore[attr-defined]


class GuardedSnapshotStore:
    """A guarded :class:`~guarded.snapshots.SnapshotStore` (see the module docs); itself one.

    ``async with`` it, or ``await guarded.controller(it).aclose()`` at shutdown, as any guard.
    """

    def __init__(self, proxy: Any, store: object) -> None:
        self._proxy = proxy
        self.store = store
        """The store behind the guard."""

    async def _run(self, method: str, call: Any) -> Any:
        noted: builtins.list[BaseException] = []
        token = _failures.set(noted)
        try:
            result = await call
        finally:
            _failures.reset(token)
        if isinstance(result, _Answer):
            raise result.error
        if result is None:  # the chain's fallback: the call failed and nothing stale answered
            cause = noted[-1] if noted else None
            if cause is not None and no_wait_fixes(cause):
                raise cause  # the caller's bug or bad value, as it is
            if cause is None:  # the backend was not asked
                error = SnapshotStoreUnavailableError(
                    method,
                    "not sent: the circuit breaker is open (the backend is failing) or the call "
                    "waited for admission past its deadline",
                )
                raise error from CircuitOpenError(method)
            reason = f"{type(cause).__name__}: {safe_message(cause)}"
            raise SnapshotStoreUnavailableError(method, reason) from cause
        return result

    async def save(self, content: SnapshotContent) -> Snapshot:
        saved: Snapshot = await self._run("save", self._proxy.save(content))
        return saved

    async def load(self, snapshot_id: str) -> SnapshotContent:
        content: SnapshotContent = await self._run("load", self._proxy.load(snapshot_id))
        return content

    async def get(self, snapshot_id: str) -> Snapshot:
        found: Snapshot = await self._run("get", self._proxy.get(snapshot_id))
        return found

    async def list(
        self,
        *,
        subject_kind: SubjectKind | None = None,
        subject_id: str | None = None,
        tag: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> SnapshotPage:
        page: SnapshotPage = await self._run(
            "list",
            self._proxy.list(
                subject_kind=subject_kind,
                subject_id=subject_id,
                tag=tag,
                since=since,
                until=until,
                limit=limit,
                cursor=cursor,
            ),
        )
        return page

    async def delete(self, snapshot_id: str) -> bool:
        deleted: bool = await self._run("delete", self._proxy.delete(snapshot_id))
        return deleted

    async def tag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        tagged: Snapshot = await self._run("tag", self._proxy.tag(snapshot_id, tuple(tags)))
        return tagged

    async def untag(self, snapshot_id: str, tags: Iterable[str]) -> Snapshot:
        untagged: Snapshot = await self._run("untag", self._proxy.untag(snapshot_id, tuple(tags)))
        return untagged

    async def lineage(self, snapshot_id: str) -> builtins.list[Snapshot]:
        chain: builtins.list[Snapshot] = await self._run("lineage", self._proxy.lineage(snapshot_id))
        return chain

    async def diff(self, a: str, b: str) -> SnapshotDiff:
        found: SnapshotDiff = await self._run("diff", self._proxy.diff(a, b))
        return found

    async def gc(self, policy: RetentionPolicy | None = None) -> GcReport:
        report: GcReport = await self._run("gc", self._proxy.gc(policy))
        return report

    async def __aenter__(self) -> GuardedSnapshotStore:
        await self._proxy.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._proxy.__aexit__(*exc_info)

    def __repr__(self) -> str:
        return f"<guarded snapshots over {self.store!r}>"


def is_snapshot_store(store: object) -> bool:
    """Whether ``store`` is a SnapshotStore (and not a StateStore, which ``guard()`` takes as one)."""
    return (
        not isinstance(store, type)
        and not callable(getattr(store, "save_event", None))
        and isinstance(store, SnapshotStore)
    )


def guard_snapshots(
    store: object,
    *,
    name: str = "snapshots",
    config: GuardConfig | None = None,
    policies: Mapping[str, Mapping[str, Any] | MethodPolicy] | None = None,
    registry: CollectorRegistry = REGISTRY,
    tracer_provider: TracerProvider | None = None,
    extra_layers: Sequence[Layer] = (),
    **overrides: Any,
) -> GuardedSnapshotStore:
    """Guard a :class:`~guarded.snapshots.SnapshotStore` (``guard(store)`` calls this for one).

    The arguments are :func:`guarded.guard`'s. Nothing is spilled to disk (no method is held).
    """
    from .guard import GuardCore, GuardedStore, make_proxy

    if not is_snapshot_store(store):
        raise TypeError(
            f"guard_snapshots() takes a SnapshotStore: {type(store).__qualname__} lacks "
            f"{', '.join(m for m in SNAPSHOT_METHODS if not callable(getattr(store, m, None))) or 'nothing'}"
        )
    base = build_config(config, overrides)
    long_calls = LONG_CALLS if config is None and "timeout" not in overrides else {}
    base = base.model_copy(
        update={
            "methods": {**long_calls, **base.methods},
            "dead_letter": base.dead_letter.model_copy(update={"enabled": False, "path": None}),
            "breaker": base.breaker.model_copy(
                update={"slow_call_duration": max(base.breaker.slow_call_duration, SLOW_CALL_SECONDS)}
            ),
        }
    )
    table = PolicyTable.for_snapshot_store()
    if policies:
        table = table.with_overrides(policies)
    core = GuardCore(
        SnapshotCalls(store),
        name=name,
        config=base,
        policies=table,
        registry=registry,
        tracer_provider=tracer_provider,
        extra_layers=extra_layers,
        durable=True,  # the stale cache; no method dead-letters
        protocol_methods=frozenset(SNAPSHOT_METHODS),
    )
    proxy = make_proxy(core, GuardedStore)
    guarded = GuardedSnapshotStore(proxy, store)
    register(guarded, core)  # guarded.controller(guarded) works as for any guard
    return guarded


__all__ = [
    "LONG_CALLS",
    "SNAPSHOT_METHODS",
    "GuardedSnapshotStore",
    "SnapshotCalls",
    "guard_snapshots",
    "is_snapshot_store",
]
