"""Held snapshot saves: a save the backend cannot take is staged on local disk and held.

The dead-letter buffer keeps calls as JSON arguments; a snapshot's content is streams and blobs,
up to gigabytes. So a guarded ``save`` that fails for an operational reason (a timeout, a lost
connection, an open circuit breaker: never bad data, never the store's own answers such as a
conflict) is held in two parts:

1. its content is copied into a **staging directory** on local disk, next to the guard's spill
   file: one :class:`~guarded.snapshots.FileSnapshotStore` per held snapshot (atomic: a copy is
   published by one ``rename`` once every file is fsynced, and checked against its record on the
   way, so bad data is refused here too);
2. then the call ``save(snapshot_id, content_hash)`` is kept in the guard's dead-letter buffer
   (committed to its spill file), keyed by the snapshot id.

Only then does the caller get the :class:`~guarded.snapshots.Snapshot` record (outcome
``dead_lettered``). When either part fails (a full or unwritable disk, an unreadable source), the
save raises :class:`~guarded.snapshots.SnapshotStagingError` and nothing is held: a copy this call
staged is removed, and a half-written one was never published.

The replay of a held save (by this process, or by the next guard of the same store on the same
paths after a crash) loads the staged copy, saves it into the backend -- idempotent: a save that
had in fact committed returns the stored record -- and removes the staged copy. A replay that meets
another content under the same id, or a staged copy that does not match its held call, is parked
with its reason (``guarded dlq``), never retried; the staged copy is kept for the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..config import former_default_spill_path
from ..deadletter.replay import ReplayRejected
from ..deadletter.slots import named_spill_path, sibling_spill_path, split_extension
from ..durability.ports import DurabilityPorts
from ..error_classes import ErrorClass, error_type, no_wait_fixes, safe_message
from ..observability.failure_log import FailureLog
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..store_identity import store_identity
from .content import SnapshotContent
from .file_store import FileSnapshotStore, names_a_directory
from .record import Snapshot
from .snapshot_errors import (
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotStagingError,
)

logger = logging.getLogger("guarded.snapshots")

_Found = TypeVar("_Found")


class Answer:
    """A snapshot error the store (or the staging) answered with, carried through the chain as a
    result: raised to the caller, never retried, never counted against the backend."""

    __slots__ = ("error",)

    def __init__(self, error: SnapshotError) -> None:
        self.error = error


class StagedSaveRejected(ReplayRejected):
    """A held save that can never succeed as it is (another content under its id in the backend,
    its staged copy gone or not matching): parked with this message as its reason."""

    error_class = ErrorClass.REJECTED
    """Never retried, never counted against the backend, parked by the replay."""


def snapshot_spill_path(path: str | None) -> str | None:
    """The spill file of a guarded snapshot store beside the dead-letter file ``path``:
    ``-snapshots`` added to its name (``{name}.sqlite`` → ``{name}-snapshots.sqlite``), so a
    StateStore guard of the same name never adopts its held saves (nor it theirs)."""
    return sibling_spill_path(path, "-snapshots")


def staging_root(spill_path: str | None, store_name: str, target: object, base: Path | None = None) -> Path:
    """The staging directory of held saves: ``<base>/<digest of the backend's identity>/``, where
    ``base`` is by default ``<spill file without extension>.staged`` (``{name}`` replaced; for the
    default spill file, the name it had before it named the store identity, so saves staged by
    earlier versions are found), so guards of the same store on the same paths share it, and
    another backend never sees it."""
    identity = store_identity(target, store_name)
    if base is None:
        assert spill_path is not None
        path = former_default_spill_path(spill_path) or spill_path
        root, _ = split_extension(named_spill_path(path, store_name, identity))
        base = Path(f"{root}.staged")
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]
    return base / digest


def _checked(snapshot_id: str) -> str:
    if not names_a_directory(snapshot_id):
        raise ValueError(f"snapshot id {snapshot_id!r} cannot name a staging directory")
    return snapshot_id


class StagedSnapshots:
    """The staged copies of held saves: ``<root>/<snapshot id>/``, each a
    :class:`~guarded.snapshots.FileSnapshotStore` holding that one snapshot."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def directory(self, snapshot_id: str) -> Path:
        """The staging directory of ``snapshot_id``."""
        return self.root / _checked(snapshot_id)

    def _manifest(self, snapshot_id: str) -> Path:
        return self.directory(snapshot_id) / "snapshots" / snapshot_id / "manifest.json"

    def ids(self) -> list[str]:
        """The ids with a staged copy, sorted."""
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [name for name in entries if not name.startswith(".") and self._manifest(name).exists()]

    async def stage(self, content: SnapshotContent) -> tuple[Snapshot, bool]:
        """Copy ``content`` into its staging directory; its record, and whether this call staged it
        (``False``: the same content was staged already). Raises ``SnapshotConflictError`` for
        another content staged under the id, ``SnapshotCorruptError`` for a content that does not
        match its record, ``OSError`` when the disk fails."""
        snapshot_id = content.snapshot.id

        def prepare() -> tuple[FileSnapshotStore, bool]:
            existed = self._manifest(snapshot_id).exists()
            return FileSnapshotStore(self.directory(snapshot_id)), existed

        store, existed = await asyncio.to_thread(prepare)
        record = await store.save(content)
        return record, not existed

    async def _store(self, snapshot_id: str) -> FileSnapshotStore | None:
        def find() -> FileSnapshotStore | None:
            try:
                if not self._manifest(snapshot_id).exists():
                    return None
            except ValueError:
                return None
            return FileSnapshotStore(self.directory(snapshot_id))

        return await asyncio.to_thread(find)

    async def load(self, snapshot_id: str) -> SnapshotContent | None:
        """The staged content of ``snapshot_id`` (close it after use), or ``None``."""
        return await self._read(snapshot_id, lambda store: store.load(snapshot_id))

    async def get(self, snapshot_id: str) -> Snapshot | None:
        """The staged record of ``snapshot_id``, or ``None``."""
        return await self._read(snapshot_id, lambda store: store.get(snapshot_id))

    async def _read(
        self, snapshot_id: str, read: Callable[[FileSnapshotStore], Awaitable[_Found]]
    ) -> _Found | None:
        """``read`` of the staged copy of ``snapshot_id``, or ``None`` when there is none."""
        store = await self._store(snapshot_id)
        if store is None:
            return None
        try:
            return await read(store)
        except SnapshotNotFoundError:
            return None

    async def remove(self, snapshot_id: str) -> bool:
        """Remove the staged copy of ``snapshot_id`` (renamed away first, so it is gone at once);
        whether there was one."""

        def remove() -> bool:
            source = self.directory(snapshot_id)
            trash = self.root / f".removed-{snapshot_id}-{uuid.uuid4().hex}"
            try:
                os.rename(source, trash)
            except FileNotFoundError:
                return False
            shutil.rmtree(trash, ignore_errors=True)
            return True

        return await asyncio.to_thread(remove)


LiveContents = dict[str, SnapshotContent]
"""The contents of the guarded saves in progress in this process, by ticket: the chain carries a
save's JSON arguments (id, content hash, ticket), the backend call takes the content from here."""


class SnapshotStagingLayer:
    """Stages and holds a ``save`` (policy :attr:`~guarded.policy.MethodPolicy.staged`) that fails
    for an operational reason. Runs inside the dead-letter layer, outside the circuit breaker: it
    sees a save's final failure, after retries, and an open circuit's refusal."""

    def __init__(
        self, staging: StagedSnapshots, live: LiveContents, note_failure: Callable[[BaseException], None]
    ) -> None:
        self.staging = staging
        self.live = live
        self._note_failure = note_failure
        """Notes a failure for the error the caller of the guarded call in progress gets."""
        self._ports: DurabilityPorts | None = None
        self._log: FailureLog | None = None

    def bind(self, ports: DurabilityPorts, failure_log: FailureLog) -> None:
        """Give the layer its guard's durability (made with the guard, after its layers)."""
        self._ports = ports
        self._log = failure_log

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        if not method.policy.staged:
            return inner

        async def save(call: Call) -> Any:
            ports = self._ports
            if ports is None or ports.keeper is None:
                return await inner(call)
            await ports.lifecycle.ensure_open()  # held saves of a previous process start replaying
            try:
                return await inner(call)
            except Exception as exc:
                if no_wait_fixes(exc):
                    raise
                # Shielded: a caller cancelled while its content is staged leaves it staged and
                # held (as a cancelled StateStore write being committed is kept), never a staged
                # copy without its held call.
                return await asyncio.shield(self._stage_and_hold(call, exc, method, ports))

        return save

    async def _stage_and_hold(
        self, call: Call, exc: Exception, method: MethodSetup, ports: DurabilityPorts
    ) -> Any:
        snapshot_id, content_hash, ticket = _save_arguments(call.args, call.kwargs)
        content = self.live.get(ticket) if isinstance(ticket, str) else None
        if content is None or not isinstance(snapshot_id, str):
            raise exc  # not a live save of this process: nothing to stage
        backend_failure = f"{error_type(exc)}: {safe_message(exc)}"
        try:
            record, created = await self.staging.stage(content)
        except SnapshotError as answer:
            # Another content already held under this id, or a content that does not match its
            # record: the guard's answer, as the backend's would be; nothing is held.
            call.settle(Outcome.REJECTED, exc)
            return Answer(answer)
        except Exception as staging_failure:
            raise self._not_held(snapshot_id, backend_failure, staging_failure) from staging_failure
        keeper = ports.keeper
        assert keeper is not None
        try:
            kept = await keeper.hold(
                method.policy.name,
                (snapshot_id, content_hash),
                {},
                key=snapshot_id,
                scope=None,
                stamp=ports.next_stamp(),
                error=error_type(exc),
            )
            refused: BaseException | None = None if kept else RuntimeError("the buffer refused it")
        except Exception as hold_failure:
            refused = hold_failure
        if refused is not None:
            if created:
                with contextlib.suppress(OSError):
                    await self.staging.remove(snapshot_id)
            raise self._not_held(snapshot_id, backend_failure, refused) from refused
        call.settle(Outcome.DEAD_LETTERED, exc)
        if self._log is not None:
            self._log.dead_lettered(method, exc)
        return record

    def _not_held(
        self, snapshot_id: str, backend_failure: str, failure: BaseException
    ) -> SnapshotStagingError:
        error = SnapshotStagingError(
            snapshot_id, backend_failure, f"{error_type(failure)}: {safe_message(failure)}"
        )
        error.__cause__ = failure
        self._note_failure(error)
        logger.error(
            "a snapshot save the backend could not take could not be held either: %s",
            error,
            extra={"event": "snapshot_not_held", "snapshot_id": snapshot_id},
        )
        return error


def _save_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    names = ("snapshot_id", "content_hash", "live")
    found = [
        kwargs[name] if name in kwargs else (args[i] if len(args) > i else None)
        for i, name in enumerate(names)
    ]
    return found[0], found[1], found[2]


__all__ = [
    "Answer",
    "LiveContents",
    "SnapshotStagingLayer",
    "StagedSaveRejected",
    "StagedSnapshots",
    "snapshot_spill_path",
    "staging_root",
]
