"""What keeps acknowledged writes of one guard: the write-behind batcher, the dead-letter buffer,
the stale-if-error cache, and the background replay (DESIGN.md "What nothing lost means").

The layers in :mod:`guarded.layers.dead_letter`, :mod:`guarded.layers.write_behind` and
:mod:`guarded.layers.stale_reads` call into one :class:`Durability` per guard. Its own backend
calls (batch flushes, replays) go through the guard's breaker, retry and timeout layers but not
through its metrics, fallback or dead-letter layers: a replay that fails stays in the buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from .batching import Batcher, PendingWrite, bulk_args, bulk_method_for
from .breaker import BreakerState, CircuitBreaker
from .classify import ErrorClass, classify, error_type, safe_message
from .codec import record_types_of
from .config import GuardConfig
from .deadletter import DeadLetterBuffer, ReplayResult
from .errors import InvalidPayloadError
from .idempotency import WRITE_KEY_ARGUMENT, item_keys, replayed_item_key
from .stale import StaleCache

logger = logging.getLogger("guarded.durability")

InternalCall = Callable[[str, tuple[Any, ...], Mapping[str, Any]], Awaitable[Any]]
"""Runs ``method(*args, **kwargs)`` on the backend through breaker, retry and timeout; raises."""

_WAITING_STATES = frozenset({BreakerState.OPEN, BreakerState.FORCED_OPEN})
_REPLAY_PAUSE = 0.5
_REPLAY_MAX_PAUSE = 5.0
KEYED_APPENDS = frozenset({"save_planner_event"})
"""Appends without a natural id: each write gets a key of its own, used by its flush, kept with it
when it is dead-lettered and used again by its replay (:data:`guarded.idempotency.ITEM_KEYS`), so a
backend that honours keys stores it once even when an acknowledgement was lost."""


class Durability:
    """The batcher, dead-letter buffer, stale cache and replay of one guard."""

    def __init__(
        self,
        target: object,
        config: GuardConfig,
        *,
        store_name: str,
        registry: CollectorRegistry,
        breaker: CircuitBreaker,
        run: InternalCall,
    ) -> None:
        self.target = target
        self.config = config
        self.store_name = store_name
        self.breaker = breaker
        self._run = run
        self.buffer: DeadLetterBuffer | None = (
            DeadLetterBuffer(
                config.dead_letter, store_name=store_name, registry=registry, types=record_types_of(target)
            )
            if config.dead_letter.enabled
            else None
        )
        self.batcher: Batcher | None = (
            Batcher(config.batching, self._write_batch, store_name=store_name, registry=registry)
            if config.batching.enabled and self.buffer is not None
            else None
        )
        self.cache: StaleCache | None = (
            StaleCache(config.stale.max_entries, store_name=store_name, registry=registry)
            if config.stale.enabled
            else None
        )
        self.next_stamp: Callable[[], int] = itertools.count(1).__next__
        """Call-order stamps: a direct write supersedes held writes of its key with older stamps."""
        self._write_key_prefix = f"{uuid.uuid4().hex}:"
        self.opened = False
        self._opening: asyncio.Future[None] | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._closing = False

    # --- start-up ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the spill file (once); writes a previous process left there start replaying."""
        if self.opened:
            return
        if self._opening is not None:
            await asyncio.shield(self._opening)
            return
        self._opening = asyncio.get_running_loop().create_future()
        try:
            waiting = await self.buffer.open() if self.buffer is not None else 0
        except BaseException as exc:
            self._opening.set_exception(exc)
            self._opening = None
            raise
        self.opened = True
        self._opening.set_result(None)
        if waiting:
            logger.info(
                "replaying %d dead-lettered writes left by a previous process",
                waiting,
                extra={"store": self.store_name, "depth": waiting},
            )
            self.kick_replay()

    # --- keeping writes -------------------------------------------------------------------------

    async def dead_letter(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        key: Hashable | None,
        scope: str | None,
        stamp: int,
        error: str,
    ) -> bool:
        """Keep a write that failed; ``False`` when it cannot be kept (it is parked as bad data)."""
        assert self.buffer is not None
        try:
            await self.buffer.put(method, args, kwargs, key=key, scope=scope, stamp=stamp, error=error)
        except InvalidPayloadError as exc:
            await self.buffer.park(method, args, kwargs, reason=str(exc))
            return False
        self.kick_replay()
        return True

    async def park(
        self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: BaseException
    ) -> None:
        """Park a write the backend rejected as bad data, with its reason; never replayed."""
        if self.buffer is not None:
            await self.buffer.park(method, args, kwargs, reason=f"{error_type(exc)}: {safe_message(exc)}")

    def _write_key(self, write: PendingWrite) -> str:
        return self._write_key_prefix + str(write.stamp)

    def _item_keys(self, writes: Sequence[PendingWrite]) -> tuple[str, ...] | None:
        """The per-item keys of a flush of ``writes`` (one method), ``None`` when it needs none."""
        if not writes or writes[0].method not in KEYED_APPENDS:
            return None
        return tuple(map(self._write_key, writes))

    def kept_kwargs(self, write: PendingWrite) -> Mapping[str, Any]:
        """The arguments a write is kept with: a keyed append carries the item key of its flush."""
        if write.method not in KEYED_APPENDS:
            return write.kwargs
        return {**write.kwargs, WRITE_KEY_ARGUMENT: self._write_key(write)}

    async def _dead_letter_writes(self, failed: Sequence[tuple[PendingWrite, BaseException]]) -> None:
        assert self.buffer is not None
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
            await self.buffer.put_many(items)
        except InvalidPayloadError:
            for write, exc in failed:
                await self.dead_letter(
                    write.method,
                    write.args,
                    self.kept_kwargs(write),
                    key=None,
                    scope=write.scope,
                    stamp=write.stamp,
                    error=error_type(exc),
                )
        self.kick_replay()

    async def _write_batch(self, method: str, writes: Sequence[PendingWrite]) -> None:
        """The batcher's writer: one bulk call when the backend has one, else bounded singles;
        what fails is dead-lettered, what is bad data is parked."""
        bulk = bulk_method_for(self.target, method)
        if bulk is not None:
            try:
                with item_keys(self._item_keys(writes)):
                    await self._run(bulk, bulk_args(method, writes), {})
                return
            except Exception as exc:
                if classify(exc) is not ErrorClass.REJECTED:
                    await self._dead_letter_writes([(write, exc) for write in writes])
                    return
                # One bad write rejects the whole bulk call: write one by one to find it.
        await self._write_singles(writes)

    async def _write_singles(self, writes: Sequence[PendingWrite]) -> None:
        limit = asyncio.Semaphore(self.config.batching.single_write_concurrency)
        failed: list[tuple[PendingWrite, BaseException]] = []

        async def write_one(write: PendingWrite) -> None:
            async with limit:
                try:
                    with item_keys(self._item_keys((write,))):
                        await self._run(write.method, write.args, write.kwargs)
                except Exception as exc:
                    if classify(exc) is ErrorClass.REJECTED:
                        await self.park(write.method, write.args, write.kwargs, exc)
                    else:
                        failed.append((write, exc))

        await asyncio.gather(*(write_one(write) for write in writes))
        if failed:
            await self._dead_letter_writes(failed)

    # --- replay -----------------------------------------------------------------------------------

    def kick_replay(self) -> None:
        """Make sure a background replay runs while the buffer holds writes."""
        if self._closing or self.buffer is None or self.buffer.is_empty:
            return
        task = self._replay_task
        if task is None or task.done():
            self._replay_task = asyncio.get_running_loop().create_task(
                self._replay_loop(), name=f"guarded-replay-{self.store_name}"
            )

    # Failures propagate: the buffer judges them (bad data parked with its reason, anything else
    # retried later) and keeps the error as the reason the pass stopped.

    async def _send(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        with replayed_item_key(kwargs):
            await self._run(method, args, kwargs)
        return ReplayResult.OK

    async def _send_bulk(
        self, method: str, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> ReplayResult:
        bulk = bulk_method_for(self.target, method)
        assert bulk is not None, "replay_once passes send_bulk only when the backend has the bulk form"
        writes = [PendingWrite(method, args, kwargs, None, 0, 0.0) for args, kwargs in calls]
        await self._run(bulk, bulk_args(method, writes), {})
        return ReplayResult.OK

    async def replay_once(self) -> bool:
        """One replay pass; ``True`` when the buffer is empty afterwards."""
        if self.buffer is None:
            return True
        has_bulk = bulk_method_for(self.target, "save_event") is not None
        summary = await self.buffer.replay(
            self._send,
            send_bulk=self._send_bulk if has_bulk else None,
            rate=self.config.dead_letter.replay_rate,
            batch=self.config.dead_letter.replay_batch,
        )
        return not summary.stopped_early and self.buffer.is_empty

    async def _replay_loop(self) -> None:
        pause = _REPLAY_PAUSE
        buffer = self.buffer
        assert buffer is not None
        while not buffer.is_empty and not self._closing:
            if self.breaker.state in _WAITING_STATES:
                await asyncio.sleep(_REPLAY_PAUSE)
                continue
            try:
                done = await self.replay_once()
            except Exception:
                logger.exception("dead-letter replay failed", extra={"store": self.store_name})
                done = False
            if done:
                pause = _REPLAY_PAUSE
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 2, _REPLAY_MAX_PAUSE)

    # --- shutdown ---------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Hand every queued write to the backend (or to the buffer when that fails)."""
        if self.batcher is not None:
            await self.batcher.flush()

    async def drain(self, timeout: float) -> int:  # noqa: ASYNC109 - a budget, not a cancellation
        """Flush, then replay the buffer until it is empty or ``timeout`` passes; returns how many
        writes remain (in the spill file when there is one)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self.open()
        if self.batcher is not None:
            await self.batcher.flush()
        buffer = self.buffer
        if buffer is None:
            return 0
        while not buffer.is_empty and loop.time() < deadline:
            if self.breaker.state in _WAITING_STATES:
                break
            try:
                done = await asyncio.wait_for(self.replay_once(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break
            if not done:
                break
        return buffer.depth

    async def aclose(self, timeout: float) -> int:  # noqa: ASYNC109 - a budget, not a cancellation
        """Stop batching, drain within ``timeout``, stop the replay; returns writes left over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.batcher is not None:
            await self.batcher.aclose(timeout)
            unwritten = self.batcher.drain_unwritten()
            if unwritten and self.buffer is not None:
                await self._dead_letter_writes([(write, TimeoutError("shutdown")) for write in unwritten])
        remaining = await self.drain(max(0.0, deadline - loop.time()))
        self._closing = True
        task = self._replay_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.buffer is not None:
            await self.buffer.aclose()
        if remaining:
            logger.warning(
                "closing with %d dead-lettered writes kept for the next process",
                remaining,
                extra={"store": self.store_name, "depth": remaining},
            )
        return remaining
