"""What keeps acknowledged writes of one guard: the batcher (group commit), the dead-letter buffer,
and the background replay.

The layers in :mod:`guarded.deadletter.dead_letter_layer`, :mod:`guarded.batching.batching_layer` and
:mod:`guarded.layers.stale_reads` call into one :class:`Durability` per guard. Its own backend
calls (batch flushes, replays) go through the guard's breaker, retry and timeout layers but not
through its metrics, fallback or dead-letter layers: a replay that fails stays in the buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from ..batching.batch_writer import BatchWriter, InternalCall
from ..batching.batcher import Batcher, PendingWrite
from ..batching.batching_layer import WriteQueue
from ..bulk_forms import bulk_call, bulk_method_for, bulk_methods_of
from ..codec import record_types_of
from ..config import DeadLetterConfig, GuardConfig
from ..deadletter import DeadLetterBuffer, ReplayResult
from ..deadletter.buffer_ports import DirectWriteGate, HeldWriteKeeper, HeldWriteLookups, Lifecycle
from ..error_classes import error_type, is_programming_error, safe_message
from ..errors import GuardClosedError, InvalidPayloadError, WriteSupersededError
from ..observability.failure_log import FailureLog, operational_errors
from ..pipeline.idempotency import replayed_call
from ..pipeline.loops import abandon
from ..policy_table import PolicyTable
from ..store_identity import durable_across_processes, store_identity
from .ports import BreakerWait, DurabilityPorts
from .shutdown import DRAIN_BATCH, cancelled, drain_held, log_closed, log_unclosed, undelivered_writes

logger = logging.getLogger("guarded.durability")

_REPLAY_PAUSE = 0.5
_REPLAY_MAX_PAUSE = 5.0
_ADOPT_EVERY = 30.0
"""Seconds between looks for spill files whose owner is gone (also done at start)."""


def spill_config(target: object, options: DeadLetterConfig, store_name: str) -> DeadLetterConfig:
    """The dead-letter settings of a guard over ``target``: as configured, but with no spill file
    for a store that keeps nothing across processes (a held write would be worth nothing to
    another process, and adopting one would hand it another application's writes)."""
    if options.path is None or durable_across_processes(target):
        return options
    logger.info(
        "store %r keeps nothing across processes: its held writes are kept in memory only, in no "
        "spill file, and it adopts none",
        store_name,
        extra={"event": "deadletter_not_durable_store", "store": store_name},
    )
    return options.model_copy(update={"path": None})


class Durability:
    """The batcher, dead-letter buffer and replay of one guard."""

    def __init__(
        self,
        target: object,
        config: GuardConfig,
        *,
        store_name: str,
        registry: CollectorRegistry,
        breaker: BreakerWait,
        run: InternalCall,
        policies: PolicyTable | None = None,
        failure_log: FailureLog | None = None,
    ) -> None:
        policies = policies if policies is not None else PolicyTable.for_state_store()
        self.target = target
        self.config = config
        self.store_name = store_name
        self.breaker = breaker
        self._run = run
        self._operational = operational_errors(registry)
        self._failures = failure_log or FailureLog(config.logging.interval)
        self.buffer: DeadLetterBuffer | None = (
            DeadLetterBuffer(
                spill_config(target, config.dead_letter, store_name),
                store_name=store_name,
                registry=registry,
                types=record_types_of(target),
                target=store_identity(target, store_name, application=config.dead_letter.application),
            )
            if config.dead_letter.enabled
            else None
        )
        self.writes = BatchWriter(
            target,
            run,
            self.buffer,
            store_name=store_name,
            operational=self._operational,
            keyed_appends=frozenset(policy.name for policy in policies if policy.item_keys),
            single_write_concurrency=config.batching.single_write_concurrency,
            dead_letter=self.dead_letter,
            park=self.park,
            log_bug=self._log_bug,
            kick_replay=self.kick_replay,
        )
        self.batcher: Batcher | None = (
            Batcher(
                config.batching,
                self.writes,
                store_name=store_name,
                registry=registry,
                ordered=[policy.name for policy in policies if policy.ordered],
                lone=self.writes,
            )
            if config.batching.enabled and self.buffer is not None
            else None
        )
        self.next_stamp: Callable[[], int] = itertools.count(1).__next__
        """Call-order stamps: a direct write supersedes held writes of its key with older stamps."""
        self.opened = False
        self.closed = False
        self._opening: asyncio.Future[None] | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._handing_back: asyncio.Task[None] | None = None
        """Keeps the writes of flushes a closed event loop left in flight (:meth:`moved`)."""
        self._closing = False
        self._close_begun = False
        """``aclose()`` has begun: a write held from now on in memory only would be lost."""
        self._reported = False
        if self.buffer is not None and config.dead_letter.path is None and durable_across_processes(target):
            logger.warning(
                "dead-letter buffer of store %r is in memory only (dead_letter.path=None): writes held "
                "during an outage die with the process",
                store_name,
                extra={"event": "deadletter_memory_only", "store": store_name},
            )

    def ports(self) -> DurabilityPorts:
        """The narrow interfaces the guard's layers receive (:mod:`.ports`)."""
        buffer = self.buffer
        return DurabilityPorts(
            lifecycle=Lifecycle(lambda: self.opened, self.open),
            next_stamp=self.next_stamp,
            queue=WriteQueue(self.batcher, self.writes.kept_kwargs) if self.batcher is not None else None,
            keeper=(
                HeldWriteKeeper(self.dead_letter, self.park, buffer, self._send)
                if buffer is not None
                else None
            ),
            lookups=HeldWriteLookups(buffer) if buffer is not None else None,
            gate=DirectWriteGate(buffer) if buffer is not None else None,
        )

    # --- start-up ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the spill file (once): claim a slot, adopt files whose owner is gone, and start
        replaying what waits. Never raises for the spill file (the buffer falls back to memory)."""
        if self.opened:
            return
        if self._opening is not None:
            await asyncio.shield(self._opening)
            return
        self._opening = asyncio.get_running_loop().create_future()
        try:
            waiting = await self.buffer.open() if self.buffer is not None else 0
        except Exception:
            # The buffer reports spill-file trouble itself and keeps writes in memory; anything
            # else is a bug, and writes must still reach a healthy backend.
            logger.exception("opening the dead-letter buffer failed", extra={"store": self.store_name})
            waiting = self.buffer.depth if self.buffer is not None else 0
        except BaseException as exc:
            self._opening.set_exception(exc)
            self._opening.exception()  # retrieved: waiters re-raise it, nobody else should log it
            self._opening = None
            raise
        self.opened = True
        self._opening.set_result(None)
        self._opening = None  # its waiters hold it; kept, it would keep its event loop alive
        self._watch_task = asyncio.get_running_loop().create_task(
            self._watch_loop_end(), name=f"guarded-watch-{self.store_name}"
        )
        if waiting:
            logger.info(
                "replaying %d held writes (left by a previous process or adopted)",
                waiting,
                extra={"store": self.store_name, "depth": waiting},
            )
            self.kick_replay()

    def moved(self) -> None:
        """The guard moved to a new event loop (:mod:`guarded.pipeline.loops`; this runs on it):
        the old loop's tasks (replay, watch, batch flushes, the spill file's commit) never resume
        (:func:`~guarded.pipeline.loops.abandon`: a stopped loop that runs again cancels them).
        What they held is done here: the writes of flushes that were in flight are kept (held for
        replay), queued writes are flushed, and the watch and the replay start on this loop."""
        loop = asyncio.get_running_loop()
        self._handing_back = None
        if self.buffer is not None:
            self.buffer.moved()
        if self._opening is not None and not self._opening.done():
            self._opening = None  # an open the old loop never finished: the next call opens
        abandon(self._replay_task)
        abandon(self._watch_task)
        self._replay_task = None
        if self._watch_task is not None:
            self._watch_task = loop.create_task(
                self._watch_loop_end(), name=f"guarded-watch-{self.store_name}"
            )
        unwritten = self.batcher.moved() if self.batcher is not None else []
        if unwritten:
            self._handing_back = loop.create_task(
                self._keep_unwritten(unwritten, "its event loop closed"),
                name=f"guarded-hand-back-{self.store_name}",
            )
        self.kick_replay()

    async def _keep_unwritten(self, unwritten: list[PendingWrite], why: str) -> None:
        """Hold writes the batcher handed back (``why``: what stopped their flush) for replay."""
        outcomes = await self.writes.dead_letter_writes([(write, TimeoutError(why)) for write in unwritten])
        for write, outcome in zip(unwritten, outcomes, strict=True):
            write.settle(outcome)

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
        deadline: float = math.inf,
    ) -> bool:
        """Keep a write that failed; ``False`` when it cannot be kept (it is parked as bad data).
        ``deadline`` is the event-loop time its call must end by (the buffer's ``put``).

        Raises :class:`~guarded.errors.WriteNotKeptError` when the buffer has no room for it (the
        spill file at its cap, a full disk, an unusable file; memory only, past the caps), and
        :class:`~guarded.errors.GuardClosedError` once ``aclose()`` has begun and the buffer
        holds writes in memory only: the close would drop it, so it is refused, not kept."""
        assert self.buffer is not None
        if self._close_begun and self.buffer.spill_path is None:
            raise GuardClosedError(
                f"the guard of store {self.store_name!r} is closing and keeps held writes in memory "
                "only: the write was not kept"
            )
        try:
            await self.buffer.put(
                method, args, kwargs, key=key, scope=scope, stamp=stamp, error=error, deadline=deadline
            )
        except InvalidPayloadError as exc:
            await self.buffer.park(method, args, kwargs, reason=str(exc))
            return False
        self.kick_replay()
        return True

    async def park(
        self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: BaseException
    ) -> None:
        """Park a write the backend refused (bad data, or a bug of the backend's: a ``TypeError``,
        an ``AttributeError``), with its reason; never replayed automatically."""
        if self.buffer is not None:
            await self.buffer.park(method, args, kwargs, reason=f"{error_type(exc)}: {safe_message(exc)}")

    def _log_bug(self, method: str, exc: BaseException) -> None:
        """An ERROR record for a programming error the backend raised on a write the guard made
        (a batch, a replay): the write is parked with its reason."""
        self._failures.failure(
            store=self.store_name,
            method=method,
            error_type=error_type(exc),
            outcome="parked",
            message=safe_message(exc),
            level=logging.ERROR,
            distinct=True,
        )

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
        try:
            with replayed_call(kwargs):
                await self._run(self.writes.offered(method), args, kwargs)
        except WriteSupersededError:
            return ReplayResult.SUPERSEDED
        except Exception as exc:
            self._operational.count(self.store_name, method, exc)
            if is_programming_error(exc):
                self._log_bug(method, exc)
            raise
        return ReplayResult.OK

    async def _send_bulk(
        self, method: str, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> ReplayResult:
        bulk = bulk_method_for(self.target, method)
        assert bulk is not None, "replay passes send_bulk only for methods whose bulk form the backend has"
        replay = bulk_call(method, calls)
        try:
            with replay.context():
                await self._run(bulk, replay.args, {})
        except WriteSupersededError:
            return ReplayResult.SUPERSEDED  # some items were left alone: sent one by one to tell which
        except Exception as exc:
            self._operational.count(self.store_name, method, exc, len(calls))
            raise
        return ReplayResult.OK

    async def replay_once(self, *, unlimited: bool = False) -> bool:
        """One replay pass; ``True`` when the buffer is empty afterwards. ``unlimited``: at the
        backend's pace in large bulk writes (a drain), not the background replay's rate."""
        if self.buffer is None:
            return True
        bulk_methods = bulk_methods_of(self.target)
        options = self.config.dead_letter
        summary = await self.buffer.replay(
            self._send,
            send_bulk=self._send_bulk if bulk_methods else None,
            bulk_methods=bulk_methods,
            rate=math.inf if unlimited else options.replay_rate,
            batch=max(options.replay_batch, DRAIN_BATCH) if unlimited else options.replay_batch,
            target=self.target,
        )
        return not summary.stopped_early and self.buffer.is_empty

    async def adopt_orphans(self) -> int:
        """Take over the spill files of processes that are gone (same path, same target)."""
        if self.buffer is None or self._closing:
            return 0
        try:
            adopted = await self.buffer.adopt_orphans()
        except Exception:
            logger.exception("adopting orphaned spill files failed", extra={"store": self.store_name})
            return 0
        if adopted:
            self.kick_replay()
        return adopted

    async def _replay_loop(self) -> None:
        pause = _REPLAY_PAUSE
        buffer = self.buffer
        assert buffer is not None
        while not buffer.is_empty and not self._closing:
            if self.breaker.remaining_open() > 0:
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

    async def _watch_loop_end(self) -> None:
        """Adopt orphaned spill files now and then, and report undelivered writes when the event
        loop shuts down (``asyncio.run`` cancels this task) without the guard being closed; not
        once the guard moved to another loop."""
        me = asyncio.current_task()
        try:
            while True:
                await asyncio.sleep(_ADOPT_EVERY)
                await self.adopt_orphans()
        except asyncio.CancelledError:
            if not self._closing and self._watch_task is me:
                self.report_unclosed("its event loop is shutting down")
            raise

    # --- shutdown (the drain loop and the records of what is left: .shutdown) ---------------------

    def undelivered(self) -> tuple[int, bool, str]:
        """Acknowledged writes not yet in the backend, whether some of them are in memory only
        (lost with the process), and where they are."""
        return undelivered_writes(self.batcher, self.buffer)

    def report_unclosed(self, why: str) -> None:
        """One ERROR record when the guard goes away (``why``) with acknowledged writes not yet in
        the backend; nothing when it was closed or has none."""
        if self.closed or self._closing or self._reported:
            return
        count, at_risk, where = self.undelivered()
        if not count:
            return
        self._reported = True
        log_unclosed(self.store_name, why, count, at_risk, where)

    async def flush(self) -> None:
        """Hand every queued write to the backend (or to the buffer when that fails)."""
        if self.batcher is not None:
            await self.batcher.flush()

    async def drain(self, timeout: float) -> int:  # noqa: ASYNC109 - a budget, not a cancellation
        """Flush, then deliver held writes until none is left or ``timeout`` seconds pass; returns
        how many remain (in the spill file when there is one).

        Uses the whole budget: an open breaker is waited out (probed early, with backoff, when its
        wait is longer than what is left), a failed pass is retried after a backoff, and writes go
        in large bulk writes at the backend's pace, not the background replay's rate.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self.open()
        if self.batcher is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self.batcher.flush()
        buffer = self.buffer
        if buffer is None:
            return 0
        await self.adopt_orphans()
        # A background pass paced at replay_rate would hold the buffer's replay lock for as long
        # as it runs: stop it, deliver at the backend's pace, and start it again afterwards.
        await self._stop_background_replay()
        try:
            return await drain_held(
                buffer,
                self.breaker,
                lambda: self.replay_once(unlimited=True),
                deadline,
                store_name=self.store_name,
            )
        finally:
            self.kick_replay()

    async def _stop_background_replay(self) -> None:
        await cancelled(self._replay_task)
        self._replay_task = None

    async def aclose(self, timeout: float) -> int:  # noqa: ASYNC109 - a budget, not a cancellation
        """Stop batching, drain within ``timeout``, stop the replay; returns writes left over.

        Logs one record: how many writes were not delivered and where they are (the spill file, for
        the next guard on its path; or, memory-only, lost). Never raises for the spill file.
        """
        if self.closed:
            return 0
        self._close_begun = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.batcher is not None:
            await self.batcher.aclose(timeout)
            unwritten = self.batcher.drain_unwritten()
            if unwritten and self.buffer is not None:
                await self._keep_unwritten(unwritten, "shutdown")
        if self._handing_back is not None:
            await asyncio.wait({self._handing_back}, timeout=max(0.0, deadline - loop.time()))
        remaining = await self.drain(max(0.0, deadline - loop.time()))
        self._closing = True
        await cancelled(self._replay_task)
        await cancelled(self._watch_task)
        kept = lost = parked_lost = 0
        path = None
        if self.buffer is not None:
            buffer = self.buffer
            path = buffer.claimed_path
            parked_lost = (await buffer.stats()).parked if path is None else 0
            await buffer.aclose()  # never raises; a last attempt to move memory-held writes to the file
            remaining = buffer.depth
            lost = buffer.memory_only
            kept = remaining - lost
        self.closed = True
        log_closed(self.store_name, kept=kept, path=path, lost=lost, parked_lost=parked_lost)
        return remaining
