"""``guard(snapshot_store)``: a :class:`~guarded.snapshots.SnapshotStore` behind the guard's chain.

``guard()`` recognises a SnapshotStore (the protocol's methods, none of a StateStore's) and calls
:func:`guard_snapshots`, which you may call directly. Every call runs through the same chain as a
StateStore call -- tracing, metrics, fallback, stale reads, circuit breaker, retry, bulkhead,
timeout -- under :meth:`PolicyTable.for_snapshot_store <guarded.policy_table.PolicyTable.for_snapshot_store>`,
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
* **saves are held** (:mod:`guarded.snapshots.staging`): a save the backend cannot take (a timeout,
  a lost connection, an open circuit: never bad data nor the store's answers) is staged on local
  disk -- the content copied into a :class:`~guarded.snapshots.FileSnapshotStore` of its own beside
  the spill file -- and ``save(snapshot_id, content_hash)`` held in the dead-letter buffer (a spill
  file of its own, ``{name}-snapshots.sqlite``); the caller gets the record (outcome
  ``dead_lettered``). The replay saves the staged copy into the backend (idempotent) and removes
  it; a conflict met on replay is parked with its reason. A save that can be neither saved nor
  staged raises :class:`~guarded.snapshots.SnapshotStagingError`. ``load`` and ``get`` of a held
  snapshot answer from its staged copy; ``delete`` of one takes its held save out first;
* ``delete`` and ``gc`` are never retried (a repeat answers differently) nor held; ``save``,
  ``tag`` and ``untag`` are retried.

Snapshot calls are slow next to a StateStore's: unless given a ``config`` or a ``timeout``,
``save``, ``load``, ``diff`` and ``gc`` get a 15-minute deadline (:data:`LONG_CALLS`), the other
calls the guard's own; a call counts as slow for the breaker after 60 seconds at least.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.trace import TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry

from ..config import GuardConfig, MethodConfig, build_config
from ..context_vars import reset_context_var
from ..error_classes import CircuitOpenError, no_wait_fixes, safe_message
from ..guard_core import GuardCore, GuardedStore, make_proxy, register
from ..pipeline.call import Layer
from ..policy import MethodPolicy
from ..policy_table import PolicyTable
from .content import SnapshotContent
from .record import GcReport, RetentionPolicy, Snapshot, SnapshotDiff, SnapshotPage, SubjectKind
from .snapshot_errors import (
    SnapshotConflictError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotStagingError,
    SnapshotStoreUnavailableError,
)
from .snapshot_store import SnapshotStore
from .staging import (
    Answer,
    LiveContents,
    SnapshotStagingLayer,
    StagedSaveRejected,
    StagedSnapshots,
    snapshot_spill_path,
    staging_root,
)

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


_Answer = Answer


def note_failure(exc: BaseException) -> None:
    """Note ``exc`` as a failure of the guarded call in progress (the caller's error names the last)."""
    noted = _failures.get()
    if noted is not None:
        noted.append(exc)


class SnapshotCalls:
    """What the guard's chain calls: the store's methods, whose snapshot errors come back as
    values (the backend answered) and whose failures are noted for the caller's error."""

    def __init__(
        self, store: object, live: LiveContents | None = None, staging: StagedSnapshots | None = None
    ) -> None:
        self._store = store
        self.live: LiveContents = live if live is not None else {}
        self.staging = staging
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
            note_failure(exc)
            raise
        except asyncio.CancelledError:
            # The guard's deadline (a caller's own cancellation never reaches its error).
            note_failure(TimeoutError("no answer within the call's deadline"))
            raise

    async def save(self, snapshot_id: str, content_hash: str, live: str | None = None) -> Snapshot | _Answer:
        """Save the content of the guarded save in progress ``live`` (a ticket of :attr:`live`);
        without one, replay the held save of ``snapshot_id`` from its staged copy."""
        if live is not None:
            content = self.live.get(live)
            if content is None:
                raise RuntimeError(f"no save in progress with ticket {live!r}")
            return await self._call(self._store.save(content))  # type: ignore[attr-defined]
        return await self._replay_save(snapshot_id, content_hash)

    async def _replay_save(self, snapshot_id: str, content_hash: str) -> Snapshot:
        """A held save: its staged copy into the backend, then the copy removed. What can never
        succeed raises :class:`StagedSaveRejected` (parked with the reason)."""
        staged = await self.staging.load(snapshot_id) if self.staging is not None else None
        if staged is None:
            # Replayed already (by another process sharing the staging directory, or before a crash
            # that kept the call), or deleted while held: the backend tells which.
            try:
                found: Snapshot = await self._store.get(snapshot_id)  # type: ignore[attr-defined]
            except SnapshotNotFoundError:
                raise StagedSaveRejected(
                    f"held save of snapshot {snapshot_id!r}: its staged copy is gone (deleted while "
                    "held, or removed by hand) and the backend has no such snapshot"
                ) from None
            except SnapshotError as exc:
                raise StagedSaveRejected(f"held save of snapshot {snapshot_id!r}: {exc}") from exc
            if found.content_hash != content_hash:
                raise StagedSaveRejected(_conflict(snapshot_id, "no staged copy is left"))
            return found
        try:
            if staged.snapshot.content_hash != content_hash:
                raise StagedSaveRejected(
                    f"held save of snapshot {snapshot_id!r}: the staged copy is another content "
                    f"({staged.snapshot.content_hash[:12]}, held {content_hash[:12]})"
                )
            try:
                saved: Snapshot = await self._store.save(staged)  # type: ignore[attr-defined]
            except SnapshotConflictError:
                assert self.staging is not None
                where = self.staging.directory(snapshot_id)
                raise StagedSaveRejected(
                    _conflict(snapshot_id, f"the staged copy is kept in {where}")
                ) from None
            except SnapshotError as exc:
                raise StagedSaveRejected(f"held save of snapshot {snapshot_id!r}: {exc}") from exc
        finally:
            await staged.aclose()
        assert self.staging is not None
        await self.staging.remove(snapshot_id)
        return saved

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

    def __init__(
        self, proxy: Any, store: object, calls: SnapshotCalls | None = None, ports: Any = None
    ) -> None:
        self._proxy = proxy
        self.store = store
        """The store behind the guard."""
        self._calls = calls if calls is not None else SnapshotCalls(store)
        self._ports = ports
        self.staging: StagedSnapshots | None = self._calls.staging
        """Where saves the backend could not take are staged while held (``None``: saves are
        not held, the dead-letter buffer being disabled)."""

    async def _run(self, method: str, call: Any) -> Any:
        noted: builtins.list[BaseException] = []
        token = _failures.set(noted)
        try:
            result = await call
        finally:
            reset_context_var(_failures, token)
        if isinstance(result, _Answer):
            raise result.error
        if result is None:  # the chain's fallback: the call failed and nothing stale answered
            cause = noted[-1] if noted else None
            if isinstance(cause, SnapshotStagingError):
                raise cause  # neither saved nor held: the staging failure is chained
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
        snapshot = content.snapshot
        ticket = uuid.uuid4().hex
        live = self._calls.live
        live[ticket] = content
        try:
            saved: Snapshot = await self._run(
                "save", self._proxy.save(snapshot.id, snapshot.content_hash, ticket)
            )
        finally:
            del live[ticket]
        return saved

    async def load(self, snapshot_id: str) -> SnapshotContent:
        content: SnapshotContent = await self._or_staged(
            "load", self._proxy.load(snapshot_id), snapshot_id, content=True
        )
        return content

    async def get(self, snapshot_id: str) -> Snapshot:
        found: Snapshot = await self._or_staged(
            "get", self._proxy.get(snapshot_id), snapshot_id, content=False
        )
        return found

    async def _or_staged(self, method: str, call: Awaitable[Any], snapshot_id: str, *, content: bool) -> Any:
        """The backend's answer, or, when it has not got ``snapshot_id`` (not found, or down), the
        staged copy of a held save of it."""
        try:
            return await self._run(method, call)
        except (SnapshotNotFoundError, SnapshotStoreUnavailableError):
            staged = await self._staged(snapshot_id, content=content)
            if staged is None:
                raise
            return staged

    async def _staged(self, snapshot_id: str, *, content: bool) -> Any:
        """The staged copy (content or record) of a held save of ``snapshot_id``, or ``None``: what
        the backend has not got yet answers reads of it from this process (read-your-writes)."""
        if self.staging is None or not isinstance(snapshot_id, str):
            return None
        try:
            if content:
                return await self.staging.load(snapshot_id)
            return await self.staging.get(snapshot_id)
        except (OSError, SnapshotError):
            return None

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
        unheld = await self._unhold(snapshot_id)
        deleted: bool = await self._run("delete", self._proxy.delete(snapshot_id))
        return deleted or unheld

    async def _unhold(self, snapshot_id: str) -> bool:
        """Take a held save of ``snapshot_id`` out of this guard's buffer and remove its staged
        copy, so no replay brings a deleted snapshot back: a replay of it in flight ends first."""
        ports, staging = self._ports, self.staging
        if ports is None or staging is None or ports.gate is None or ports.lookups is None:
            return False
        if not isinstance(snapshot_id, str) or snapshot_id not in staging.ids():
            return False
        await ports.lifecycle.ensure_open()
        gate = ports.gate
        slot = gate.slot("save", snapshot_id)
        stamp = ports.next_stamp()
        if slot is not None and not gate.try_enter(slot, stamp):
            await gate.enter(slot, stamp)
        try:
            while await ports.lookups.take("save", snapshot_id) is not None:
                pass
            return await staging.remove(snapshot_id)
        finally:
            if slot is not None:
                gate.leave(slot, stamp)

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


def _conflict(snapshot_id: str, where: str) -> str:
    return (
        f"held save of snapshot {snapshot_id!r}: the backend holds another content under this id "
        f"(a conflict); {where}"
    )


def guard_snapshots(
    store: object,
    *,
    name: str = "snapshots",
    config: GuardConfig | Mapping[str, Any] | None = None,
    policies: Mapping[str, Mapping[str, Any] | MethodPolicy] | None = None,
    registry: CollectorRegistry = REGISTRY,
    tracer_provider: TracerProvider | None = None,
    extra_layers: Sequence[Layer] = (),
    staging_dir: str | os.PathLike[str] | None = None,
    **overrides: Any,
) -> GuardedSnapshotStore:
    """Guard a :class:`~guarded.snapshots.SnapshotStore` (``guard(store)`` calls this for one).

    The arguments are :func:`guarded.guard`'s. Held saves are kept in a spill file of their own
    beside the dead-letter path (``{name}-snapshots.sqlite``), their contents staged in
    ``<staging_dir>/<backend digest>/`` -- ``staging_dir`` by default ``{name}-snapshots.staged``
    beside the spill file (a temporary directory when the buffer is in memory only). With the
    dead-letter buffer disabled, saves are not held: a save that fails raises.
    """
    if not is_snapshot_store(store):
        raise TypeError(
            f"guard_snapshots() takes a SnapshotStore: {type(store).__qualname__} lacks "
            f"{', '.join(m for m in SNAPSHOT_METHODS if not callable(getattr(store, m, None))) or 'nothing'}"
        )
    base = build_config(config, overrides)
    long_calls = LONG_CALLS if config is None and "timeout" not in overrides else {}
    dead_letter = base.dead_letter
    spill_path = snapshot_spill_path(dead_letter.path)
    base = base.model_copy(
        update={
            "methods": {**long_calls, **base.methods},
            "dead_letter": dead_letter.model_copy(update={"path": spill_path}),
            "batching": base.batching.model_copy(update={"enabled": False}),
            "breaker": base.breaker.model_copy(
                update={"slow_call_duration": max(base.breaker.slow_call_duration, SLOW_CALL_SECONDS)}
            ),
        }
    )
    table = PolicyTable.for_snapshot_store()
    if policies:
        table = table.with_overrides(policies)
    live: LiveContents = {}
    staging: StagedSnapshots | None = None
    temporary: str | None = None
    if dead_letter.enabled:
        if staging_dir is not None:
            root = staging_root(None, name, store, Path(staging_dir))
        elif spill_path is not None:
            root = staging_root(spill_path, name, store)
        else:  # held in memory only: the staged copies die with the process too
            temporary = tempfile.mkdtemp(prefix="guarded-staged-snapshots-")
            root = Path(temporary)
        staging = StagedSnapshots(root)
    calls = SnapshotCalls(store, live, staging)
    staging_layer = SnapshotStagingLayer(staging, live, note_failure) if staging is not None else None
    core = GuardCore(
        calls,
        name=name,
        config=base,
        policies=table,
        registry=registry,
        tracer_provider=tracer_provider,
        extra_layers=extra_layers,
        durable=True,  # the stale cache, and the buffer of held saves
        protocol_methods=frozenset(SNAPSHOT_METHODS),
        degraded_layers=[staging_layer] if staging_layer is not None else (),
    )
    ports = core.durability.ports() if core.durability is not None else None
    if staging_layer is not None and ports is not None:
        staging_layer.bind(ports, core.failure_log)
    proxy = make_proxy(core, GuardedStore)
    guarded = GuardedSnapshotStore(proxy, store, calls, ports)
    register(guarded, core)  # guarded.controller(guarded) works as for any guard
    if core.durability is not None:
        # A guard never closed says so, with the saves it still holds, when collected or at exit.
        weakref.finalize(guarded, core.durability.report_unclosed, "was garbage-collected")
    if temporary is not None:
        weakref.finalize(guarded, shutil.rmtree, temporary, True)
    return guarded


__all__ = [
    "LONG_CALLS",
    "SNAPSHOT_METHODS",
    "GuardedSnapshotStore",
    "SnapshotCalls",
    "guard_snapshots",
    "is_snapshot_store",
]
