"""What the batcher (:mod:`guarded.durability.batching`) is made of: a pending write and what
:meth:`~guarded.durability.batching.Batcher.offer` answers, the writer an owner supplies, the
per-method queue with its read-your-writes bookkeeping, and the instruments every batcher of a
registry shares."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from prometheus_client import CollectorRegistry, Counter

from ..observability import telemetry_names as names
from ..observability.batch_stats import BatchStats, FlushSeries, batch_stats
from ..observability.per_registry import PerRegistry
from ..observability.store_gauge import StoreTotalGauge, store_total_gauge
from ..outcome import Outcome

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


__all__ = [
    "ALONE",
    "NO_ROOM",
    "QUEUED",
    "Instruments",
    "LoneWriter",
    "MethodQueue",
    "PendingWrite",
    "ScopeEntry",
    "Writer",
    "instruments_for",
]
