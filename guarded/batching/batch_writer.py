"""The batcher's writer (:data:`~guarded.batching.batcher.Writer`): how a flush of queued
writes of one method reaches the backend.

One bulk call when the backend has the method's bulk form (a batch of one goes out as the single
write: the bulk form of one row costs more round trips), else bounded concurrent single writes. A
write that fails is dead-lettered; bad data (a write the backend refuses for good, or a bug of the
backend's) is parked with its reason. Every call goes through the guard's own internal call
(breaker, retry, bulkhead, timeout). Keyed appends carry an item key of their own, with the flush
and when held (:data:`guarded.backend.ITEM_KEYS`).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..backend import ITEM_KEYS as _ITEM_KEYS
from ..bulk_forms import bulk_args, bulk_method_for
from ..deadletter import DeadLetterBuffer
from ..error_classes import error_type, is_programming_error, no_wait_fixes
from ..errors import InvalidPayloadError, WriteNotKeptError
from ..observability.failure_log import OperationalErrors
from ..outcome import Outcome
from ..pipeline.idempotency import WRITE_KEY_ARGUMENT, item_keys
from ..pipeline.steps import raising
from ..policy_table import PolicyTable
from ..protocol import LEGACY_NAMES
from .batcher import PendingWrite

InternalCall = Callable[[str, tuple[Any, ...], Mapping[str, Any]], Awaitable[Any]]
"""Runs ``method(*args, **kwargs)`` on the backend through breaker, retry and timeout; raises."""

DeadLetter = Callable[..., Awaitable[bool]]
"""Keeps one write that failed (``Durability.dead_letter``); ``False`` when it was parked instead."""

_OK, _DEAD_LETTERED, _REJECTED = Outcome.OK, Outcome.DEAD_LETTERED, Outcome.REJECTED
_REFUSED = Outcome.REFUSED
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})

_ITEM_ARITY = {
    policy.name: len(policy.bulk_item) for policy in PolicyTable.for_state_store() if policy.bulk_form
}
"""Parameters per bulk item of each write with a bulk form (the table :func:`bulk_args` reads)."""


def _bulk_args(method: str, writes: Sequence[PendingWrite]) -> tuple[Any, ...]:
    """:func:`~guarded.bulk_forms.bulk_args` of a flush, without a call per write when every write
    passed its item's arguments positionally (the usual case)."""
    arity = _ITEM_ARITY.get(method)
    if arity == 1:
        try:
            return ([write.args[0] for write in writes],)
        except IndexError:
            pass
    elif arity and all(len(write.args) >= arity for write in writes):
        return ([write.args[:arity] for write in writes],)
    return bulk_args(method, writes)


class BatchWriter:
    """Writes the batcher's flushes of one guard (see the module docs); called as the batcher's
    writer, it returns each write's outcome."""

    def __init__(
        self,
        target: object,
        run: InternalCall,
        buffer: DeadLetterBuffer | None,
        *,
        store_name: str,
        operational: OperationalErrors,
        keyed_appends: frozenset[str],
        single_write_concurrency: int,
        dead_letter: DeadLetter,
        park: Callable[[str, tuple[Any, ...], Mapping[str, Any], BaseException], Awaitable[None]],
        log_bug: Callable[[str, BaseException], None],
        kick_replay: Callable[[], None],
    ) -> None:
        self._target = target
        self._run = run
        self._buffer = buffer
        self._store_name = store_name
        self._operational = operational
        self._keyed_appends = keyed_appends
        """Appends whose writes each get a key of their own, used by the flush, kept with the write
        when it is held and used again by its replay."""
        self._single_write_concurrency = single_write_concurrency
        self._dead_letter = dead_letter
        self._park = park
        self._log_bug = log_bug
        self._kick_replay = kick_replay
        self._offered_names: dict[str, str] = {}
        self._write_key_prefix = f"{uuid.uuid4().hex}:"

    def offered(self, method: str) -> str:
        """The name the store answers ``method`` by: the method itself, else a legacy alias of it
        the store has (a store with only ``save_task_update`` gets its updates, written and held
        under ``save_update`` so reads of either name see them, by that name)."""
        found = self._offered_names.get(method)
        if found is None:
            found = method
            if not callable(getattr(self._target, method, None)):
                for alias in LEGACY_NAMES.get(method, ()):
                    if callable(getattr(self._target, alias, None)):
                        found = alias
                        break
            self._offered_names[method] = found
        return found

    def _write_key(self, write: PendingWrite) -> str:
        return self._write_key_prefix + str(write.stamp)

    def _item_keys(self, writes: Sequence[PendingWrite]) -> tuple[str, ...] | None:
        """The per-item keys of a flush of ``writes`` (one method), ``None`` when it needs none."""
        if not writes or writes[0].method not in self._keyed_appends:
            return None
        return tuple(map(self._write_key, writes))

    def kept_kwargs(self, write: PendingWrite) -> Mapping[str, Any]:
        """The arguments a write is kept with: a keyed append carries the item key of its flush."""
        if write.method not in self._keyed_appends:
            return write.kwargs
        return {**write.kwargs, WRITE_KEY_ARGUMENT: self._write_key(write)}

    async def dead_letter_writes(
        self, failed: Sequence[tuple[PendingWrite, BaseException]], deadline: float = math.inf
    ) -> list[Outcome]:
        """Keep batched writes that failed; each one's outcome (``DEAD_LETTERED``, ``REFUSED`` when
        the buffer had no room for it or could not commit it by ``deadline``, the event-loop time
        their callers must be answered by, or ``REJECTED`` when its call cannot be encoded and was
        parked). A caller still waiting for a refused write is raised its refusal, which says why."""
        assert self._buffer is not None
        for write, exc in failed:
            self._operational.count(self._store_name, write.method, exc)
        items = [
            (
                write.method,
                write.args,
                self.kept_kwargs(write),
                None,
                write.scope,
                write.stamp,
                error_type(exc),
            )
            for write, exc in failed
        ]
        try:
            entries: Sequence[object] = await self._buffer.put_many(items, deadline)
        except InvalidPayloadError:
            entries = [await self._dead_letter_alone(write, exc, deadline) for write, exc in failed]
        self._kick_replay()
        outcomes = []
        for (write, exc), entry in zip(failed, entries, strict=True):
            if isinstance(entry, WriteNotKeptError):
                done = write.done
                if done is not None and not done.done():
                    entry.__cause__ = exc
                    done.set_exception(entry)
                    done.exception()  # retrieved: raised to the caller, who may have gone
                outcomes.append(_REFUSED)
            else:
                outcomes.append(_REJECTED if entry is False else _DEAD_LETTERED)
        return outcomes

    async def _dead_letter_alone(
        self, write: PendingWrite, exc: BaseException, deadline: float
    ) -> bool | WriteNotKeptError:
        """Keep one write of a failed flush by itself (another write of it could not be encoded):
        ``True`` when held, ``False`` when parked as bad data, or the refusal when not kept."""
        try:
            return await self._dead_letter(
                write.method,
                write.args,
                self.kept_kwargs(write),
                key=None,
                scope=write.scope,
                stamp=write.stamp,
                error=error_type(exc),
                deadline=deadline,
            )
        except WriteNotKeptError as refusal:
            return refusal

    async def _dead_letter_in_time(
        self, failed: Sequence[tuple[PendingWrite, BaseException]]
    ) -> list[Outcome]:
        """:meth:`dead_letter_writes` for the writes of a flush that failed, bounded by the
        deadlines of their callers (the earliest: one transaction keeps them all; write-behind
        writes have none: acknowledged, nobody waits for them)."""
        deadline = min((write.deadline for write, _ in failed if write.done is not None), default=math.inf)
        return await self.dead_letter_writes(failed, deadline)

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> list[Outcome] | None:
        """The batcher's writer: one bulk call when the backend has one, else bounded singles;
        what fails is dead-lettered, what is bad data is parked. Returns each write's outcome
        (``None`` when the bulk call wrote them all)."""
        if len(writes) == 1:
            # A batch of one (a lone writer: group commit's usual case at low concurrency) goes
            # out as the single write, in this task: the bulk form of one row costs more round
            # trips (a one-row COPY).
            write = writes[0]
            started = self.start_one(write)
            if started is not None:
                try:
                    await started
                    return None
                except BaseException as exc:
                    return await self.one_failed(write, exc)
            written = await self._write_one(write)
            if written is _OK:
                return None
            if isinstance(written, Outcome):
                return [written]
            return await self._dead_letter_in_time([(write, written)])
        bulk = bulk_method_for(self._target, method)
        if bulk is not None:
            try:
                if method in self._keyed_appends or _ITEM_KEYS.get() is not None:
                    with item_keys(self._item_keys(writes)):
                        await self._run(bulk, _bulk_args(method, writes), _NO_KWARGS)
                else:
                    await self._run(bulk, _bulk_args(method, writes), _NO_KWARGS)
                return None
            except BaseException as exc:
                if not isinstance(exc, Exception) and not _raised_by_store(exc):
                    raise  # the flush was cancelled (the batcher keeps its writes), or worse
                if not no_wait_fixes(exc):
                    return await self._dead_letter_in_time([(write, exc) for write in writes])
                # One bad write rejects the whole bulk call: write one by one to find it.
        return await self._write_singles(writes)

    def start_one(self, write: PendingWrite) -> Awaitable[Any] | None:
        """The lone write ``write`` as its single call, started: the awaitable to await, whose
        failure goes to :meth:`one_failed`; ``None`` when the write needs more around its call (an
        item key) and goes through the writer itself. Never raises."""
        method = write.method
        if method in self._keyed_appends or _ITEM_KEYS.get() is not None:
            return None
        try:
            return self._run(
                self._offered_names.get(method) or self.offered(method), write.args, write.kwargs
            )
        except BaseException as exc:
            return raising(exc)

    def runs_as_called(self, method: str) -> bool:
        """Whether a lone write of ``method`` goes out as the very call its caller made: the store
        takes it by that name (not a legacy alias)."""
        return self.offered(method) == method

    def as_called(self, write: PendingWrite, started: Awaitable[Any]) -> Awaitable[Any]:
        """The caller's own call of a lone write, under its item key when it is a keyed append
        (the key it is held and replayed with if it fails)."""
        if write.method not in self._keyed_appends:
            return started
        return _under_item_keys((self._write_key(write),), started)

    async def one_failed(self, write: PendingWrite, exc: BaseException) -> list[Outcome]:
        """The writer's answer for a lone write whose call (:meth:`start_one`) failed with ``exc``:
        parked as bad data, or dead-lettered; a cancellation of the flush is raised."""
        written = await self._write_failed(write, exc)
        if isinstance(written, Outcome):
            return [written]
        return await self._dead_letter_in_time([(write, written)])

    async def _write_singles(self, writes: Sequence[PendingWrite]) -> list[Outcome]:
        limit = asyncio.Semaphore(self._single_write_concurrency)

        async def limited(write: PendingWrite) -> Outcome | BaseException:
            async with limit:
                return await self._write_one(write)

        written_all = await asyncio.gather(*(limited(write) for write in writes))
        outcomes = [written if isinstance(written, Outcome) else _OK for written in written_all]
        failed = [
            (index, write, written)
            for index, (write, written) in enumerate(zip(writes, written_all, strict=True))
            if not isinstance(written, Outcome)
        ]
        if failed:
            kept = await self._dead_letter_in_time([(write, exc) for _, write, exc in failed])
            for (index, _, _), outcome in zip(failed, kept, strict=True):
                outcomes[index] = outcome
        return outcomes

    async def _write_one(self, write: PendingWrite) -> Outcome | BaseException:
        """Write one queued write alone: ``OK``, ``REJECTED`` when it was parked as bad data, or
        the failure for the caller to dead-letter."""
        try:
            keys = (self._write_key(write),) if write.method in self._keyed_appends else None
            if keys is None and _ITEM_KEYS.get() is None:
                await self._run(self.offered(write.method), write.args, write.kwargs)
            else:
                await _under_item_keys(keys, self._run(self.offered(write.method), write.args, write.kwargs))
            return _OK
        except BaseException as exc:
            return await self._write_failed(write, exc)

    async def _write_failed(self, write: PendingWrite, exc: BaseException) -> Outcome | BaseException:
        """A write written alone failed with ``exc``: ``REJECTED`` when it was parked as bad data,
        else the failure for the caller to dead-letter (a cancellation of the flush is raised)."""
        if not isinstance(exc, Exception) and not _raised_by_store(exc):
            raise exc
        if no_wait_fixes(exc):
            if is_programming_error(exc):
                self._log_bug(write.method, exc)
            await self._park(write.method, write.args, write.kwargs, exc)
            return _REJECTED
        return exc


async def _under_item_keys(keys: tuple[str, ...] | None, call: Awaitable[Any]) -> Any:
    """``await call`` with ``keys`` as the item keys it sees (``item_keys(keys)``, without a
    generator per write); ``call`` must not have started."""
    token = _ITEM_KEYS.set(keys)
    try:
        return await call
    finally:
        try:  # noqa: SIM105 - inline: suppress() costs a context manager per write
            _ITEM_KEYS.reset(token)
        except ValueError:  # a closed loop's call, collected as garbage (another context)
            pass


def _raised_by_store(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``CancelledError`` the store raised on its own (its driver cancelled an
    internal future; nobody cancelled the flush): a failed write like any other, held for replay."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is not None and not task.cancelling()


__all__ = ["BatchWriter", "InternalCall"]
