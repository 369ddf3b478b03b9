"""Batching of writes: a queue per method, written in bulk by a writer its owner supplies.

The batcher knows nothing of stores or methods: the owner (the guard's durability, reading the
policy table) says which methods it submits, which of them are ``ordered``, and how a batch of
them is written.

A :class:`Batcher` writes queued writes in bulk through a *writer* its owner supplies; the owner
decides what a failed flush means (retry, dead-letter) and reports each write's outcome. Two ways
of acknowledging a write, per write:

- **group commit** (the guard's default): the write carries a future (:attr:`PendingWrite.done`)
  that the batcher settles with the write's outcome once its batch is written. When no flush of
  its method runs, a write goes out at once, written by its caller in the caller's own task
  (:meth:`Batcher.offer` answers :data:`ALONE`; no flush task, no loop iteration). Writes arriving
  while a flush runs form the next batch, started when that flush ends; a further flush runs
  beside the running ones once ``parallel_flush_at`` writes wait, up to the method's flush limit,
  and a queue of twice that many or more is split evenly over the free flushes. The callers a
  batch answered resume on the next loop iteration and usually write again at once, so they stay
  together: the split makes cohorts whose flushes overlap (one is prepared and encoded while the
  backend commits another) instead of one batch that the process and the backend take in turns.
  No timer: a lone writer pays no batching delay.
- **write-behind** (``done`` is ``None``): the caller is acknowledged once the write is queued. A
  queue flushes as soon as it holds ``max_batch`` writes, or once its oldest write has waited
  ``max_delay`` seconds (one timer per queue; ``max_delay=0`` flushes on the next iteration).

Either way a flush takes up to ``max_batch`` writes in queue order, and at most
``max_concurrent_flushes`` flushes of one method run at once (one for the methods the owner
declares ``ordered``, whose reads follow insertion order). Writes of one method are handed to the
writer in submission order.

The batcher promises that every queued write is either handed to the writer or, when
:meth:`Batcher.aclose` runs out of time, returned by :meth:`Batcher.drain_unwritten` (the owner keeps
those and settles their futures).

Backpressure: writes queued plus writes being flushed (all methods together) never exceed
``queue_size``. A submitter that finds no space waits, FIFO, up to its deadline.

Read-your-writes: :meth:`Batcher.flush_scope` writes out what is pending for one trace or session
before a read of it; :meth:`Batcher.pending_for_scope` lists those writes (for a fallback that
must show them while the backend is down). Both see write-behind writes only: a group-commit write
is acknowledged once written, so no read has to see it before then.

Metrics (prometheus-client, shared by every batcher of one registry): ``guarded_batch_size`` and
``guarded_batch_flush_duration_seconds`` histograms by store and method, counted once per flush
in plain integers and exported at scrape time (:mod:`guarded.observability.batch_stats`),
the ``guarded_batch_pending`` and ``guarded_batch_capacity`` gauges by store, read from the
batchers at scrape time so that :meth:`Batcher.submit` never touches a metric, and the
``guarded_batch_failed_writes_total`` counter by store and method (writes a raising writer lost).

Not thread-safe: a batcher works on the event loop running when it is used (it binds to none at
construction, so it may be built outside a loop); use it from one loop at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from ..config import BatchConfig
from ..observability import telemetry_names as names
from ..observability.batch_stats import BatchStats, FlushSeries, batch_stats
from ..observability.per_registry import PerRegistry
from ..observability.scrape_time_gauges import StoreTotalGauge, store_total_gauge
from ..outcome import Outcome
from ..pipeline.loops import abandon

QUEUED = 0
""":meth:`Batcher.offer`: the write is queued."""
ALONE = 1
""":meth:`Batcher.offer`: the write is queued and no flush of its method runs: the caller writes
it at once (:meth:`Batcher.write_alone`), with no task and no loop iteration."""
NO_ROOM = 2
""":meth:`Batcher.offer`: the write is not queued (the batcher is full or closed)."""


@dataclass(slots=True)
class PendingWrite:
    """One write waiting to be flushed. Treat it as immutable: it is not frozen only because a
    frozen dataclass's ``__init__`` costs three times as much, and one is built per call."""

    method: str
    """The store method, e.g. ``"save_event"``."""
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    scope: str | None
    """The trace or session id the write belongs to, for read-your-writes; ``None`` for none."""
    stamp: int
    """Call-order number assigned by the caller."""
    queued_at: float
    """Loop time at which the caller submitted the write."""
    done: asyncio.Future[Outcome] | None = None
    """Group commit: settled with the write's outcome once its batch is written (``OK``: in the
    backend; ``DEAD_LETTERED``: held for replay; ``REJECTED``: parked as bad data). ``None`` for a
    write-behind write, acknowledged when queued."""
    deadline: float = math.inf
    """Loop time of the caller's deadline (group commit), which bounds keeping the write when its
    batch fails (:func:`guarded.deadletter.buffer.commit_deadline`)."""

    def settle(self, outcome: Outcome) -> None:
        """Tell the caller waiting for this write (if any, and if it still waits) its outcome."""
        done = self.done
        if done is not None and not done.done():
            done.set_result(outcome)


Writer: TypeAlias = Callable[[str, Sequence[PendingWrite]], Awaitable[Sequence[Outcome] | None]]
"""Writes one flush of one method and returns each write's outcome (``None``: all ``OK``). It must
not raise: it handles failures itself (retry, dead-letter). If it raises anyway, the batcher logs
the error type (never payloads), counts the writes in :attr:`Batcher.failed`, settles them
``FALLBACK`` (not kept) and frees their space; they are not returned to the owner."""


class LoneWriter(Protocol):
    """What a writer may offer for a batch of one written in its caller's task (a lone writer
    under group commit), so that the write's own call is awaited with no frame of the writer's."""

    def start_one(self, write: PendingWrite) -> Awaitable[Any] | None:
        """The write's call, started (``None``: write it through the writer itself); never raises."""

    def runs_as_called(self, method: str) -> bool:
        """Whether a lone write of ``method`` may go out as the call its caller made (the store
        takes it by that name), so the caller's own call may carry it."""

    def as_called(self, write: PendingWrite, started: Awaitable[Any]) -> Awaitable[Any]:
        """``started``, the caller's own call of the lone ``write``, with what the writer puts
        around a write (a keyed append's item key)."""

    def one_failed(self, write: PendingWrite, exc: BaseException) -> Awaitable[Sequence[Outcome] | None]:
        """The writer's outcomes for the write whose started call failed with ``exc``; raises a
        cancellation of the flush."""


# --- metrics ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instruments:
    flushes: BatchStats
    pending: StoreTotalGauge
    capacity: StoreTotalGauge
    failed: Counter


def _build_instruments(registry: CollectorRegistry) -> Instruments:
    labels = [names.LABEL_STORE, names.LABEL_METHOD]
    return Instruments(
        flushes=batch_stats(registry),
        pending=store_total_gauge(
            registry,
            names.BATCH_PENDING,
            "Acknowledged writes queued or being flushed (lost if the process dies now).",
            lambda batcher: batcher.pending,
        ),
        capacity=store_total_gauge(
            registry,
            names.BATCH_CAPACITY,
            "Writes the batcher holds at most (queue_size); pending at this value: the queue is full.",
            lambda batcher: batcher.config.queue_size,
        ),
        failed=Counter(
            names.BATCH_FAILED_WRITES,
            "Writes a batch writer raised on: answered fallback and not kept (lost).",
            labels,
            registry=registry,
        ),
    )


instruments_for: PerRegistry[Instruments] = PerRegistry(_build_instruments)


# --- the queue of one method ------------------------------------------------------------------------


class ScopeEntry:
    """Writes of one (method, scope) queued or in flight, and the sequence number of the last one."""

    __slots__ = ("count", "last")

    def __init__(self, last: int) -> None:
        self.count = 1
        self.last = last


class MethodQueue:
    """The queue, flushes in flight and read-your-writes bookkeeping of one method.

    Every write gets a sequence number (its position in the method's submission order) without
    storing it: the head of ``queue`` is number ``taken``. Batches are contiguous ranges, kept in
    ``in_flight`` by their first number, in start order.
    """

    __slots__ = (
        "active",
        "due",
        "eager",
        "flush_waiters",
        "flushes",
        "in_flight",
        "method",
        "queue",
        "scopes",
        "taken",
        "timer",
        "urgent_through",
    )

    def __init__(self, method: str, flushes: FlushSeries) -> None:
        self.method = method
        self.queue: deque[PendingWrite] = deque()
        self.taken = 0
        self.in_flight: dict[int, list[PendingWrite]] = {}
        self.active = 0
        self.timer: asyncio.Handle | None = None
        self.due = False
        self.urgent_through = 0
        """Writes numbered below this are flushed without waiting for size or delay."""
        self.scopes: dict[str, ScopeEntry] = {}
        self.flush_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        """Heap of (sequence number to reach, tie-breaker, future) of pending flush calls."""
        self.flushes = flushes
        self.eager = False
        """Group commit: start a flush whenever fewer than the limit run (no size or delay)."""

    @property
    def submitted(self) -> int:
        return self.taken + len(self.queue)

    @property
    def written_through(self) -> int:
        """Every write numbered below this has left the batcher (written, failed or handed back)."""
        for start in self.in_flight:
            return start
        return self.taken


# --- backpressure -----------------------------------------------------------------------------------


class BatchSpace:
    """The batcher's backpressure: slots for ``capacity`` writes (queued or being flushed, all
    methods together) and the FIFO of submitters waiting for one.

    A slot is taken at once when one is free and nobody waits (:meth:`take_now`, the hot path: no
    future, no lock), or waited for up to a deadline (:meth:`wait`). Freed slots go to the oldest
    waiter first (:meth:`release`). Closing refuses every waiter and every later request.
    """

    __slots__ = ("capacity", "closed", "pending", "waiters")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pending = 0
        """Slots taken: writes queued or being flushed, plus slots granted to waiters about to queue."""
        self.waiters: deque[asyncio.Future[bool]] = deque()
        self.closed = False

    def take_now(self) -> bool:
        """Take a slot when one is free and nobody waits for one (``False`` otherwise, or closed)."""
        if self.pending < self.capacity and not self.waiters and not self.closed:
            self.pending += 1
            return True
        return False

    async def wait(self, deadline: float) -> bool:
        """Wait for a slot, behind the earlier waiters, until loop time ``deadline``; ``True`` once
        granted, ``False`` when the deadline passed or the space closed first. A cancelled waiter
        gives back a slot it was granted, or its place in the line."""
        if self.closed:
            return False
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            return False
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiters.append(waiter)
        expiry = loop.call_at(deadline, self._expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release(1)
            else:
                self._forget(waiter)
            raise
        finally:
            expiry.cancel()

    def release(self, count: int) -> None:
        """Free ``count`` slots and hand them to waiting submitters, oldest first."""
        self.pending -= count
        waiters = self.waiters
        while waiters and self.pending < self.capacity:
            waiter = waiters.popleft()
            if not waiter.done():
                self.pending += 1
                waiter.set_result(True)

    def close(self) -> None:
        """Refuse every waiting submitter and every later request."""
        self.closed = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            waiter.set_result(False)
            self._forget(waiter)

    def _forget(self, waiter: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)


# --- the batcher ------------------------------------------------------------------------------------

logger = logging.getLogger("guarded.batching")

_OK = Outcome.OK
_CANCEL_GRACE = 1.0
"""Seconds :meth:`Batcher.aclose` waits for cancelled flushes to unwind after its timeout."""


class Batcher:
    """Write-behind queue of append-only writes with bulk flushes, backpressure and read-your-writes.

    ``submit`` is the hot path: while there is space it appends to a deque and bumps counters — no
    lock, task, timer or metric per write. Flush tasks are one per batch.
    """

    def __init__(
        self,
        config: BatchConfig,
        writer: Writer,
        *,
        store_name: str,
        registry: CollectorRegistry = REGISTRY,
        ordered: Collection[str] = (),
        lone: LoneWriter | None = None,
    ) -> None:
        self.config = config
        self._lone = lone
        """How ``writer`` writes a batch of one in its caller's task, when it says."""
        self._ordered = frozenset(ordered)
        self.store_name = store_name
        self._writer = writer
        self._max_batch = config.max_batch
        self._max_delay = config.max_delay
        self._max_flushes = config.max_concurrent_flushes
        self._parallel_at = min(config.parallel_flush_at, config.max_batch)
        self._queues: dict[str, MethodQueue] = {}
        self._space = BatchSpace(config.queue_size)
        self._tasks: dict[asyncio.Task[None], list[PendingWrite]] = {}
        """The flush tasks running and the batch each writes."""
        self._unwritten: list[PendingWrite] = []
        self._abandoned: set[int] = set()
        self._tiebreak = itertools.count()
        self.failed = 0
        """Writes whose writer raised (a bug in the writer): logged, counted, not retried."""
        instruments = instruments_for(registry)
        self._flushes = instruments.flushes
        self._failed = instruments.failed
        instruments.pending.add(self)
        instruments.capacity.add(self)

    # --- state --------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Writes queued or being flushed, plus slots granted to submitters about to queue."""
        return self._space.pending

    @property
    def acknowledged_pending(self) -> int:
        """Write-behind writes acknowledged but not yet written (lost if the process dies now);
        group-commit writes are not acknowledged before they are written, so they do not count."""
        return sum(
            1
            for mq in self._queues.values()
            for batch in (mq.queue, *mq.in_flight.values())
            for write in batch
            if write.done is None
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has started: no write is accepted any more."""
        return self._space.closed

    def pending_for_scope(self, method: str, scope: str) -> list[PendingWrite]:
        """Write-behind writes of ``method`` for ``scope`` queued or in flight, in submission order."""
        mq = self._queues.get(method)
        if mq is None or scope not in mq.scopes:
            return []
        found = [
            write
            for batch in mq.in_flight.values()
            for write in batch
            if write.scope == scope and write.done is None
        ]
        found.extend(write for write in mq.queue if write.scope == scope and write.done is None)
        return found

    # --- submitting ---------------------------------------------------------------------------------

    def offer(self, write: PendingWrite) -> int:
        """The part of :meth:`submit` that never waits: :data:`QUEUED` when ``write`` is queued,
        :data:`ALONE` when it is queued and is to be written at once in the caller's own task
        (``await`` :meth:`write_alone` before anything else runs), :data:`NO_ROOM` when it was not
        queued (the batcher is full, or closed: :meth:`submit` it instead)."""
        space = self._space
        if space.pending < space.capacity and not space.waiters and not space.closed:
            space.pending += 1  # space.take_now(), inline: this runs once per write
            mq = self._queues.get(write.method)
            if mq is not None and mq.eager and write.done is not None:
                # _enqueue's group-commit cases, inline (once per write).
                queue = mq.queue
                if mq.active:  # a flush runs: the write joins the next batch
                    queue.append(write)
                    if (
                        mq.timer is None
                        and not mq.due
                        and len(queue) >= self._parallel_at
                        and mq.active < self._limit(mq)
                    ):
                        mq.timer = asyncio.get_running_loop().call_soon(self._on_timer, mq)
                    return QUEUED
                if not queue and mq.timer is None:  # nothing runs or waits: the caller writes it
                    queue.append(write)
                    return ALONE
            return QUEUED if self._enqueue(write) is None else ALONE
        return NO_ROOM

    def write_alone(self, method: str, started: Awaitable[Any] | None = None) -> Awaitable[Outcome | None]:
        """Write the one queued write of ``method`` that :meth:`offer` answered :data:`ALONE`;
        the awaitable answers its outcome (``None`` for a write-behind write). ``started``: the
        write's call as its caller already made it (when :meth:`runs_as_called`), else the
        writer makes it."""
        mq = self._queues[method]
        batch = [mq.queue.popleft()]  # _take(mq, 1), inline: the queue holds only this write
        start = mq.taken
        mq.taken = start + 1
        mq.in_flight[start] = batch
        mq.active += 1
        return self._run_lone(mq, start, batch, started)

    def runs_as_called(self, method: str) -> bool:
        """Whether the writer writes a lone write of ``method`` as the call its caller made, so
        the caller may hand that call to :meth:`write_alone`."""
        return self._lone is not None and self._lone.runs_as_called(method)

    async def submit(self, write: PendingWrite, *, deadline: float) -> bool:
        """Queue ``write``; ``True`` once it is queued (the caller may be acknowledged).

        When the batcher is full (``queue_size`` writes queued or in flight, all methods together),
        wait for space, FIFO with other waiting submitters, until loop time ``deadline``; ``False``
        when there was still none (the caller dead-letters the write). ``False`` at once after
        :meth:`aclose` started. Cancelling a waiting submitter gives its place back.
        """
        if not self._space.take_now() and not await self._space.wait(deadline):
            return False
        alone = self._enqueue(write)
        if alone is not None:
            await self.write_alone(alone.method)
        return True

    def _enqueue(self, write: PendingWrite) -> MethodQueue | None:
        """Queue a write whose slot is already counted in ``_pending``; its queue when the write
        is to go out at once in the caller's own task (group commit, no flush of its method running
        and nothing else waiting: a lone writer pays for no task and no extra loop iteration)."""
        method = write.method
        mq = self._queues.get(method)
        if mq is None:
            mq = self._queues[method] = MethodQueue(method, self._flushes.of(self.store_name, method))
            mq.eager = write.done is not None
        queue = mq.queue
        queue.append(write)
        scope = write.scope
        # Read-your-writes needs the scopes of acknowledged writes only: a group-commit write is
        # acknowledged once written, so a read concurrent with it need not wait for it. Per write:
        # a legacy alias may acknowledge at enqueue in its target's group-commit queue.
        if scope is not None and write.done is None:
            entry = mq.scopes.get(scope)
            if entry is None:
                mq.scopes[scope] = ScopeEntry(mq.taken + len(queue) - 1)
            else:
                entry.count += 1
                entry.last = mq.taken + len(queue) - 1
        if mq.eager:
            if not mq.active and len(queue) == 1 and mq.timer is None:
                return mq
            # Writes submitted in this loop iteration join one batch, started on the next
            # iteration when no flush runs (or ``parallel_flush_at`` wait and the limit allows another);
            # otherwise the end of the running flush starts it.
            if (
                mq.timer is None
                and not mq.due
                and (not mq.active or (len(queue) >= self._parallel_at and mq.active < self._limit(mq)))
            ):
                mq.timer = asyncio.get_running_loop().call_soon(self._on_timer, mq)
        elif len(queue) >= self._max_batch:
            self._pump(mq)
        elif write.done is not None and not mq.due:
            # A group-commit write in a queue a write-behind write made (a legacy alias acknowledged
            # at enqueue shares its target's queue): its caller waits for the commit, so the batch
            # goes out on the next loop iteration, not after ``max_delay``.
            if mq.timer is not None:
                mq.timer.cancel()
            mq.due = True
            mq.timer = asyncio.get_running_loop().call_soon(self._on_timer, mq)
        elif len(queue) == 1 and mq.timer is None and not mq.due:
            mq.timer = asyncio.get_running_loop().call_later(self._max_delay, self._on_timer, mq)
        return None

    def _after_cancelled_lone_flush(self, mq: MethodQueue) -> None:
        """The caller of a lone flush gave up: its write is handed back, but the writes that
        queued behind it must still go out (a cancelled flush does not start the next one)."""
        if mq.queue and mq.timer is None and not self._space.closed:
            mq.timer = asyncio.get_running_loop().call_soon(self._on_timer, mq)

    @staticmethod
    def _take(mq: MethodQueue, size: int) -> tuple[int, list[PendingWrite]]:
        """Move the next ``size`` queued writes of ``mq`` in flight as one batch; returns the
        batch's first sequence number and its writes."""
        queue = mq.queue
        if size == len(queue):
            batch = list(queue)
            queue.clear()
        else:
            popleft = queue.popleft
            batch = [popleft() for _ in range(size)]
        start = mq.taken
        mq.taken += size
        mq.in_flight[start] = batch
        mq.active += 1
        return start, batch

    # --- flushing -----------------------------------------------------------------------------------

    def _limit(self, mq: MethodQueue) -> int:
        return 1 if mq.method in self._ordered else self._max_flushes

    def _on_timer(self, mq: MethodQueue) -> None:
        mq.timer = None
        mq.due = True
        self._pump(mq)

    def _pump(self, mq: MethodQueue) -> None:
        """Start the flushes ``mq`` is ready for, then keep its timer armed while writes wait."""
        queue = mq.queue
        max_batch = self._max_batch
        parallel_at = self._parallel_at
        started = False
        limit = self._limit(mq)
        eager = mq.eager
        while queue and mq.active < limit:
            if eager:
                # Group commit: the writes that arrive while a flush runs form the next batch; a
                # further flush runs beside it once ``parallel_flush_at`` writes wait (or a read or
                # close waits), and a long queue is split over the free flushes.
                waiting = len(queue)
                if (
                    mq.active
                    and waiting < parallel_at
                    and mq.taken >= mq.urgent_through
                    and not self._space.closed
                ):
                    break
                if waiting >= 2 * parallel_at:
                    parts = min(limit - mq.active, waiting // parallel_at)
                    size = min(-(-waiting // parts), max_batch)
                else:
                    size = min(waiting, max_batch)
            else:
                size = min(len(queue), max_batch)
                if not (
                    len(queue) >= max_batch or mq.due or mq.taken < mq.urgent_through or self._space.closed
                ):
                    break
            start, batch = self._take(mq, size)
            mq.due = False
            started = True
            task = asyncio.get_running_loop().create_task(self._run_flush(mq, start, batch))
            self._tasks[task] = batch
            task.add_done_callback(self._flush_ended)
        if not queue or eager:
            # A group-commit queue left non-empty is pumped when one of its flushes ends.
            mq.due = False
            if mq.timer is not None:
                mq.timer.cancel()
                mq.timer = None
        elif started and not mq.due:
            if mq.timer is not None:
                mq.timer.cancel()
            loop = asyncio.get_running_loop()
            now = loop.time()
            when = min(queue[0].queued_at, now) + self._max_delay
            mq.timer = loop.call_at(when, self._on_timer, mq)

    def _flush_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    async def _run_flush(self, mq: MethodQueue, start: int, batch: list[PendingWrite]) -> None:
        """Write ``batch`` (a flush task's) and settle its writes."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            outcomes = await self._writer(mq.method, batch)
        except asyncio.CancelledError:
            self._flush_cancelled(mq, start, batch)
            raise
        except Exception as exc:
            self._writer_raised(mq, batch, exc)
        except BaseException as exc:
            self._flush_ended_raising(mq, start, batch, exc, lone=False)
            raise
        else:
            if outcomes is None or all(outcome is _OK for outcome in outcomes):
                for write in batch:
                    done = write.done
                    if done is not None and not done.done():
                        done.set_result(_OK)
            else:
                for write, outcome in zip(batch, outcomes, strict=True):
                    write.settle(outcome)
        if id(batch) in self._abandoned:
            self._abandoned.discard(id(batch))
        else:
            mq.flushes.observe(len(batch), loop.time() - began)
            self._finish(mq, start, batch)

    async def _run_lone(
        self, mq: MethodQueue, start: int, batch: list[PendingWrite], started: Awaitable[Any] | None
    ) -> Outcome | None:
        """Write the one write of ``batch`` in its caller's task (:meth:`write_alone`) and answer
        its outcome (``None`` for a write-behind write): :meth:`_run_flush` for a batch of one,
        without its loops."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        write = batch[0]
        done = write.done
        lone = self._lone
        try:
            if lone is not None:
                started = lone.start_one(write) if started is None else lone.as_called(write, started)
            if lone is not None and started is not None:
                try:
                    await started
                    outcomes = None
                except BaseException as exc:
                    outcomes = await lone.one_failed(write, exc)
            else:
                outcomes = await self._writer(mq.method, batch)
        except asyncio.CancelledError:
            self._flush_cancelled(mq, start, batch)
            self._after_cancelled_lone_flush(mq)
            raise
        except Exception as exc:
            self._writer_raised(mq, batch, exc)  # settles the write FALLBACK
        except BaseException as exc:
            self._flush_ended_raising(mq, start, batch, exc, lone=True)
            raise
        else:
            if done is not None and not done.done():
                done.set_result(outcomes[0] if outcomes else _OK)
        if id(batch) in self._abandoned:
            # aclose() handed the write to the owner meanwhile: the owner's verdict stands.
            self._abandoned.discard(id(batch))
            return None if done is None else await done
        mq.flushes.observe_one(loop.time() - began)
        if mq.scopes or mq.flush_waiters or mq.queue or self._space.waiters:
            self._finish(mq, start, batch)
        else:  # _finish(mq, start, batch) when nothing waits for the write or behind it, inline
            del mq.in_flight[start]
            mq.active -= 1
            self._space.pending -= 1
        return None if done is None else done.result()

    def _flush_cancelled(self, mq: MethodQueue, start: int, batch: list[PendingWrite]) -> None:
        """A flush was cancelled: its writes go back to the owner (unless :meth:`aclose` already
        handed them over) and leave the batcher; the next flush is not started."""
        if id(batch) in self._abandoned:
            self._abandoned.discard(id(batch))
            return
        self._unwritten.extend(batch)
        self._finish(mq, start, batch, pump=False)

    def _flush_ended_raising(
        self, mq: MethodQueue, start: int, batch: list[PendingWrite], exc: BaseException, *, lone: bool
    ) -> None:
        """A flush ended with neither a failure the writer answers nor a cancellation (a
        ``BaseException`` such as ``SystemExit``, or its coroutine closed): whether its writes were
        written is unknown, so they go back to the owner (kept at close: delivered at least once),
        the callers waiting for a flush task's batch meet ``exc`` as a lone writer does, and the
        method is free for the next flush (unless :meth:`aclose` already handed the writes over)."""
        if id(batch) in self._abandoned:
            self._abandoned.discard(id(batch))
            return
        self._unwritten.extend(batch)
        if not lone:
            for write in batch:
                done = write.done
                if done is not None and not done.done():
                    done.set_exception(exc)
        self._finish(mq, start, batch)

    def _writer_raised(self, mq: MethodQueue, batch: list[PendingWrite], exc: Exception) -> None:
        """The writer raised (a bug in it): log the error type (never payloads), count the writes
        as failed and answer them ``FALLBACK``."""
        self.failed += len(batch)
        self._failed.labels(self.store_name, mq.method).inc(len(batch))
        logger.error(
            "batch writer for %s on store %r raised %s; %d writes counted as failed",
            mq.method,
            self.store_name,
            type(exc).__qualname__,
            len(batch),
            extra={
                "event": "batch_writer_failed",
                "store": self.store_name,
                "method": mq.method,
                "error_type": type(exc).__qualname__,
                "writes": len(batch),
            },
        )
        for write in batch:
            write.settle(Outcome.FALLBACK)

    def _finish(self, mq: MethodQueue, start: int, batch: list[PendingWrite], *, pump: bool = True) -> None:
        """A batch left the batcher: free its slots, settle its scopes, wake flush waiters, go on."""
        del mq.in_flight[start]
        mq.active -= 1
        _leave_scopes(mq, batch)
        self._wake_flushers(mq)
        self._space.release(len(batch))
        if not pump:
            return
        if mq.eager and len(batch) > 1 and mq.timer is None and not self._space.closed:
            # The callers just answered resume on the next loop iteration and most write again at
            # once: start the next batch after them, so that they join it instead of the first of
            # them going out alone and the rest waiting a round trip for it.
            mq.timer = asyncio.get_running_loop().call_soon(self._on_timer, mq)
        elif mq.queue:
            self._pump(mq)

    def _wake_flushers(self, mq: MethodQueue) -> None:
        waiters = mq.flush_waiters
        if not waiters:
            return
        through = mq.written_through
        while waiters and waiters[0][0] <= through:
            future = heapq.heappop(waiters)[2]
            if not future.done():
                future.set_result(None)

    def _request(self, mq: MethodQueue, target: int) -> asyncio.Future[None] | None:
        """Flush ``mq`` up to sequence number ``target`` (exclusive) now; a future that resolves
        once all of those are written, or ``None`` when they already are."""
        if mq.written_through >= target:
            return None
        mq.urgent_through = max(mq.urgent_through, target)
        self._pump(mq)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(mq.flush_waiters, (target, next(self._tiebreak), future))
        return future

    async def flush_scope(self, method: str, scope: str) -> None:
        """Return once every write of (``method``, ``scope``) queued before the call has been
        handed to the writer and the writer finished with it (read-your-writes).

        Costs one dictionary lookup when nothing is pending for the scope.
        """
        mq = self._queues.get(method)
        if mq is None:
            return
        entry = mq.scopes.get(scope)
        if entry is None:
            return
        future = self._request(mq, entry.last + 1)
        if future is not None:
            await future

    async def flush(self) -> None:
        """Return once everything queued before the call has been written (or handed back)."""
        futures = [self._request(mq, mq.submitted) for mq in list(self._queues.values())]
        for future in futures:
            if future is not None:
                await future

    # --- closing ------------------------------------------------------------------------------------

    async def aclose(self, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """Stop accepting writes, flush everything and wait for the flushes in flight.

        Returns 0 when all of it was written within ``timeout`` seconds (``None``: no limit).
        Otherwise the flushes still running are cancelled and the number of writes still queued
        or in flight is returned; those writes are available from :meth:`drain_unwritten`, for
        the owner to dead-letter. A cancelled flush may have reached the backend already, so
        they are delivered at least once, not exactly once.
        """
        self._space.close()
        try:
            async with asyncio.timeout(timeout):
                while self._space.pending:
                    await self.flush()
                    if self._space.pending:
                        await asyncio.sleep(0)
        except TimeoutError:
            pass
        if not self._space.pending:
            return 0
        return await self._abandon()

    async def _abandon(self) -> int:
        """Hand every write still queued or in flight back to the owner and cancel the flushes."""
        unwritten = 0
        for mq in self._queues.values():
            if mq.timer is not None:
                mq.timer.cancel()
                mq.timer = None
            mq.due = False
            queued = list(mq.queue)
            mq.queue.clear()
            if queued:
                mq.in_flight[mq.taken] = queued
                mq.taken += len(queued)
                mq.active += 1
            for start, batch in list(mq.in_flight.items()):
                if batch is not queued:
                    self._abandoned.add(id(batch))
                self._unwritten.extend(batch)
                unwritten += len(batch)
                self._finish(mq, start, batch)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_GRACE)
        return unwritten

    def moved(self) -> list[PendingWrite]:
        """The guard moved to a new event loop (the old one closed or stopped; this runs on the
        new one): the old loop's flush tasks, timers and waiters never resume (a stopped loop that
        runs again cancels its flush tasks). Queued writes are flushed from this loop; the writes
        of the flushes that were in flight, which may or may not have reached the backend, are
        returned for the owner to keep (delivered at least once). A lone write a caller of a
        stopped loop is writing in its own task stays that caller's: it goes on when that loop
        runs again (handed back as well, it would be written twice). The futures of callers of
        the old loop are replaced by ones of this loop, so settling them cannot fail; what they
        are settled with is passed on to those callers should their loop run again."""
        loop = asyncio.get_running_loop()
        flushing = {id(batch) for batch in self._tasks.values()}
        for task in self._tasks:
            abandon(task)
        self._tasks.clear()
        self._space.waiters.clear()
        unwritten: list[PendingWrite] = []
        for mq in self._queues.values():
            if mq.timer is not None:
                mq.timer.cancel()
                mq.timer = None
            mq.flush_waiters.clear()
            for start in sorted(mq.in_flight):
                batch = mq.in_flight[start]
                self._abandoned.add(id(batch))
                _leave_scopes(mq, batch)
                if id(batch) in flushing or not _written_by_a_waiting_caller(batch):
                    unwritten.extend(batch)
            mq.in_flight.clear()
            mq.active = 0
            mq.due = True
        for write in [*unwritten, *(write for mq in self._queues.values() for write in mq.queue)]:
            waiting = write.done
            if waiting is not None and waiting.get_loop() is not loop:
                write.done = loop.create_future()
                write.done.add_done_callback(functools.partial(_pass_on, waiting))
        self._space.pending = sum(len(mq.queue) for mq in self._queues.values())
        for mq in self._queues.values():
            if mq.queue:
                self._pump(mq)
        return unwritten

    def drain_unwritten(self) -> list[PendingWrite]:
        """Writes that were acknowledged but never written (``aclose`` timed out, or a flush was
        cancelled), in submission order per method; each is returned once."""
        unwritten, self._unwritten = self._unwritten, []
        return unwritten


def _written_by_a_waiting_caller(batch: list[PendingWrite]) -> bool:
    """Whether ``batch``, in flight but written by no flush task, is a lone write its caller writes
    in its own task on an event loop that may run again (stopped, not closed)."""
    done = batch[0].done if len(batch) == 1 else None
    return done is not None and not done.get_loop().is_closed()


def _pass_on(waiting: asyncio.Future[Outcome], settled: asyncio.Future[Outcome]) -> None:
    """Settle ``waiting``, the future of a caller on an event loop the guard moved away from, as
    ``settled`` was, should that loop run again."""
    loop = waiting.get_loop()
    if settled.cancelled() or loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # closed meanwhile
        loop.call_soon_threadsafe(_settle_like, waiting, settled)


def _settle_like(waiting: asyncio.Future[Outcome], settled: asyncio.Future[Outcome]) -> None:
    if waiting.done():
        return
    failure = settled.exception()
    if failure is None:
        waiting.set_result(settled.result())
    else:
        waiting.set_exception(failure)
        waiting.exception()  # retrieved: raised to the caller, who may have gone


def _leave_scopes(mq: MethodQueue, batch: list[PendingWrite]) -> None:
    """The write-behind writes of ``batch`` no longer count as pending for their scopes."""
    scopes = mq.scopes
    if scopes:
        for write in batch:
            scope = write.scope
            if scope is not None and write.done is None:
                entry = scopes[scope]
                entry.count -= 1
                if not entry.count:
                    del scopes[scope]


__all__ = [
    "ALONE",
    "NO_ROOM",
    "QUEUED",
    "BatchSpace",
    "Batcher",
    "LoneWriter",
    "PendingWrite",
    "Writer",
]
