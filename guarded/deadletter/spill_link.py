"""The writes a dead-letter buffer holds, in memory and in its spill file, kept in step.

:class:`HeldIndex` is the in-memory index of what waits (in memory, in the file, or both) by
last-write-wins key and by scope (stream), with the memory caps, the writes parked in memory, the
totals read from the file, the replay history of each waiting write and the numbering (sequence
numbers, file generation, the epoch that says when sequence numbers read earlier may no longer
name the same entries). :class:`SpillLink` owns the index and the spill file together and is the
only one to change either: the worker thread every SQLite call runs on, the lock its changes take
one at a time, the file's lifecycle (claim, fail, set a damaged one aside, recover and move what
memory held into it) and every change of what is held (new writes, last-write-wins, parking,
replayed writes, unpark and purge, adoption of orphaned slot files, closing). See :mod:`.buffer`
for the rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..codec import JSONObject
from ..config import DeadLetterConfig
from ..error_classes import error_type
from .entries import DeadLetter, ParkedWrite, index_key_of_canonical, readable_text
from .gate import Slot
from .slots import SlotFiles, newest_per_key, orphan_wins
from .slots import slot_of as slot_number
from .spill import (
    EMPTY_TOTALS,
    QuarantinedRow,
    RowInfo,
    SetAside,
    SourceReadError,
    SpillCapError,
    SpillFile,
    SpillFileError,
    SpillTotals,
    WriteResult,
    is_corruption,
    is_disk_full,
)
from .telemetry import (
    DROP_MEMORY_FULL,
    DROP_SPILL_CORRUPT,
    REFUSE_DISK_CAP,
    REFUSE_DISK_FULL,
    REFUSE_MEMORY_FULL,
    REFUSE_SPILL_UNAVAILABLE,
    BufferCounters,
)

logger = logging.getLogger("guarded.deadletter")

R = TypeVar("R")

Prepared = tuple[str, JSONObject, str | None, str | None, int, int, str, Hashable | None, str]
"""An encoded put: its entry's fields but the sequence number and time (``method, call, key,
scope, stamp, size, error``), its key's index and its call's JSON text."""


def admitted(prepared: Sequence[Prepared], room: int, entries: float = math.inf) -> list[bool]:
    """Which of ``prepared`` fit, in order, in ``room`` bytes and ``entries`` entries."""
    fitting = []
    for item in prepared:
        fits = entries >= 1 and item[5] <= room
        if fits:
            room -= item[5]
            entries -= 1
        fitting.append(fits)
    return fitting


class Writing:
    """One group's transaction, its outcome recorded by the worker thread itself."""

    __slots__ = ("applied", "error", "kept", "result", "victims")

    def __init__(self, kept: list[DeadLetter], victims: dict[int, Slot]) -> None:
        self.kept = kept
        self.victims = victims
        self.result: WriteResult | None = None
        self.error: BaseException | None = None
        self.applied = False
        """Its outcome is being applied by the committer that ran it (not to be applied again)."""


def _nothing() -> None:
    """An empty job for the worker thread."""


@dataclass(slots=True)
class ScopeCount:
    """The waiting entries of one ``(method, scope)``."""

    total: int = 0
    held: dict[int, None] = field(default_factory=dict)
    """Entries of the scope whose payload is in memory (held copies and memory-only entries)."""


@dataclass(slots=True)
class Retry:
    """The replay history of one held write (kept in memory while it waits)."""

    failures: int = 0
    """Failed attempts in a row (its backoff)."""
    attempts: int = 0
    """Failures counted toward parking it (``config.max_replay_attempts``)."""
    due: float = 0.0
    """When it may be tried again (the buffer's monotonic clock)."""
    failed_at: float = -math.inf
    reason: str = ""
    uncounted: bool = False
    """Its last failure was not counted (the backend may have been down): due at once after a success."""

    def failed(self, now: float, reason: str, wait: float) -> None:
        """An attempt failed at ``now`` for ``reason``: due again ``wait`` seconds later."""
        self.failures += 1
        self.failed_at = now
        self.reason = reason
        self.due = now + wait
        self.uncounted = False

    def count(self) -> int:
        """Count the last failure toward parking; returns the failures counted so far."""
        self.attempts += 1
        return self.attempts

    def leave_uncounted(self) -> None:
        self.uncounted = True


def slot_of(entry: DeadLetter) -> Slot | None:
    """The index slot of ``entry``'s last-write-wins key (``None``: an append)."""
    return None if entry.key is None else (entry.method, index_key_of_canonical(entry.key))


class HeldIndex:
    """What a buffer holds and where (see the module docs)."""

    def __init__(self, config: DeadLetterConfig) -> None:
        self.config = config
        self.generation = 1
        """The generation of the file the writes of this process go to."""
        self.next_seq = 1
        self.epoch = 0
        """Changes whenever sequence numbers read earlier may no longer name the same entries."""

        self.memory: OrderedDict[int, DeadLetter] = OrderedDict()
        """Copies of entries the spill file holds, within the memory caps."""
        self.volatile: OrderedDict[int, DeadLetter] = OrderedDict()
        """Waiting entries the spill file does not hold (memory only, or not yet committed)."""
        self.memory_bytes = 0
        self.keys: dict[Slot, dict[int, tuple[int, int]]] = {}
        """Waiting entries of each last-write-wins key: seq -> (generation, stamp)."""
        self.keyed_scope: dict[int, str] = {}
        self.scopes: dict[tuple[str, str], ScopeCount] = {}
        self.recent: OrderedDict[Slot, int] = OrderedDict()
        """The stamp of the latest successful direct write of recently written keys."""
        self.recent_times: dict[Slot, int] = {}
        """The logical time of those direct writes, where known (the keys are among ``recent``'s):
        what an adopted orphan's write of the key is compared with."""
        self.pending_deletes: dict[int, bool] = {}
        """Waiting entries of the file to delete once it takes writes again (value: keyed; a
        keyed one is already forgotten, an unkeyed one still counts in the depth)."""
        self.depth = 0
        self.disk_bytes = 0
        self.oldest: float | None = None
        self.file_parked = 0
        self.file_parked_bytes = 0
        self.parked_memory: OrderedDict[int, ParkedWrite] = OrderedDict()
        self.parked_memory_bytes = 0
        self.file_quarantined = 0
        self.retries: dict[int, Retry] = {}
        """Replay histories of waiting writes that failed (by seq)."""
        self.healthy_at = -math.inf
        """When the backend last took a write (a replay, or a direct write of a key)."""

    @property
    def parked(self) -> int:
        return self.file_parked + len(self.parked_memory)

    def oldest_age(self, now: float) -> float:
        if self.depth == 0:
            return 0.0
        oldest = self.oldest
        try:
            first = next(iter(self.volatile.values())).enqueued_at
        except (StopIteration, RuntimeError):  # empty, or changing under a scrape thread
            first = None
        if first is not None and (oldest is None or first < oldest):
            oldest = first
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def held_entry(self, seq: int) -> DeadLetter | None:
        """The waiting entry ``seq`` when memory holds it."""
        return self.memory.get(seq) or self.volatile.get(seq)

    def still_waiting(self, entry: DeadLetter, *, has_file: bool) -> bool:
        """Whether ``entry`` still waits (``has_file``: the buffer has a spill file)."""
        if entry.seq in self.volatile:
            return True
        if entry.seq in self.pending_deletes:
            return False
        if entry.key is not None:
            seqs = self.keys.get((entry.method, index_key_of_canonical(entry.key)))
            return seqs is not None and entry.seq in seqs
        return has_file

    # --- finding slots ----------------------------------------------------------------------------

    def slot_of_row(self, seq: int, method: str | None, key: str | None) -> Slot | None:
        """The index slot holding ``seq``: the one its row names when that holds it, else found."""
        if method is not None and key is not None:
            try:
                slot: Slot = (method, index_key_of_canonical(key))
            except (ValueError, RecursionError):
                pass
            else:
                if seq in self.keys.get(slot, {}):
                    return slot
        return self.find_slot(seq)

    def find_slot(self, seq: int) -> Slot | None:
        """The index slot of a keyed waiting entry, found by its seq (slow: damaged rows only)."""
        for slot, seqs in self.keys.items():
            if seq in seqs:
                return slot
        return None

    def regenerate(self, previous: int, current: int) -> None:
        """Entries of this process carry the generation of the file they go to."""
        if previous == current:
            return
        for seqs in self.keys.values():
            for seq, (generation, stamp) in list(seqs.items()):
                if generation == previous:
                    seqs[seq] = (current, stamp)

    # --- adding -----------------------------------------------------------------------------------

    def _count_in_scope(self, method: str, scope: str, seq: int, *, held: bool) -> None:
        found = self.scopes.setdefault((method, scope), ScopeCount())
        found.total += 1
        if held:
            found.held[seq] = None

    def _key(self, slot: Slot, seq: int, position: tuple[int, int], scope: str | None) -> None:
        self.keys.setdefault(slot, {})[seq] = position
        if scope is not None:
            self.keyed_scope[seq] = scope

    def remember(self, entry: DeadLetter, slot: Slot | None) -> None:
        """A new waiting entry, held in memory until the file has it."""
        self.depth += 1
        self.volatile[entry.seq] = entry
        self.memory_bytes += entry.size
        self.make_room()
        if slot is not None:
            self._key(slot, entry.seq, (self.generation, entry.stamp), entry.scope)
        if entry.scope is not None:
            self._count_in_scope(entry.method, entry.scope, entry.seq, held=True)

    def index_row(self, row: RowInfo) -> None:
        """A waiting entry of the file."""
        self.depth += 1
        if row.key is not None:
            slot = (row.method, index_key_of_canonical(row.key))
            self._key(slot, row.seq, (row.generation, row.stamp), row.scope)
        if row.scope is not None:
            self._count_in_scope(row.method, row.scope, row.seq, held=row.seq in self.memory)

    def reindex(self, rows: Sequence[RowInfo]) -> None:
        """Rebuild the index from the file's ``rows`` and the memory-only entries."""
        positions = {seq: position for seqs in self.keys.values() for seq, position in seqs.items()}
        self.keys.clear()
        self.keyed_scope.clear()
        self.scopes.clear()
        self.depth = 0
        for row in rows:
            self.index_row(row)
        for entry in self.volatile.values():
            slot = slot_of(entry)
            self.depth += 1
            if slot is not None:
                position = positions.get(entry.seq, (self.generation, entry.stamp))
                self._key(slot, entry.seq, position, entry.scope)
            if entry.scope is not None:
                self._count_in_scope(entry.method, entry.scope, entry.seq, held=True)

    def apply_totals(self, totals: SpillTotals) -> None:
        self.file_quarantined = totals.quarantined
        self.disk_bytes = totals.pending_bytes
        self.file_parked = totals.parked
        self.file_parked_bytes = totals.parked_bytes
        self.oldest = None if totals.oldest is None else totals.oldest[1]

    # --- forgetting -------------------------------------------------------------------------------

    def forget(self, seq: int, method: str, slot: Slot | None, scope: str | None) -> None:
        self.retries.pop(seq, None)
        if slot is not None and seq not in self.keys.get(slot, {}):
            slot = self.find_slot(seq) or slot
        self.depth -= 1
        held = self.memory.pop(seq, None)
        if held is None:
            held = self.volatile.pop(seq, None)
        if held is not None:
            self.memory_bytes -= held.size
        if slot is not None:
            seqs = self.keys.get(slot)
            if seqs is not None:
                seqs.pop(seq, None)
                if not seqs:
                    del self.keys[slot]
            self.keyed_scope.pop(seq, None)
        if scope is not None:
            found = self.scopes.get((method, scope))
            if found is not None:
                found.total -= 1
                found.held.pop(seq, None)
                if found.total <= 0:
                    del self.scopes[(method, scope)]

    def forget_entry(self, entry: DeadLetter) -> None:
        self.forget(entry.seq, entry.method, slot_of(entry), entry.scope)

    def forget_row(self, row: RowInfo) -> None:
        if row.parked:
            return
        if row.damaged:
            slot = self.slot_of_row(row.seq, row.method, row.key)
            scope = self.keyed_scope.get(row.seq) if slot is not None else row.scope
            self.forget(row.seq, row.method, slot, scope)
            return
        slot = None if row.key is None else (row.method, index_key_of_canonical(row.key))
        self.forget(row.seq, row.method, slot, row.scope)

    def forget_rows(self, rows: Sequence[RowInfo]) -> None:
        for row in rows:
            self.forget_row(row)

    def forget_set_aside(self, item: SetAside) -> None:
        """A waiting entry of the file was set aside: it no longer waits."""
        seq = item.seq
        if seq is None:
            return
        if seq in self.pending_deletes:
            if not self.pending_deletes.pop(seq):  # unkeyed: still counted
                self.forget(seq, item.method or "", None, item.scope)
            return
        slot = self.slot_of_row(seq, item.method, item.key)
        if slot is not None:
            self.forget(seq, slot[0], slot, self.keyed_scope.get(seq))
        elif item.key is None:
            self.forget(seq, item.method or "", None, item.scope)

    def defer_delete(self, seq: int, slot: Slot | None) -> None:
        """The file cannot delete ``seq`` now: forget it (a keyed one) and delete it when it can."""
        if slot is not None:
            seqs = self.keys.get(slot)
            if seqs is None or seq not in seqs:
                return
            self.forget(seq, slot[0], slot, self.keyed_scope.get(seq))
        self.pending_deletes[seq] = slot is not None

    def clear_waiting(self) -> None:
        """The file and memory hold no waiting write any more (purged)."""
        self.memory.clear()
        self.volatile.clear()
        self.memory_bytes = 0
        self.keys.clear()
        self.keyed_scope.clear()
        self.scopes.clear()
        self.pending_deletes.clear()
        self.retries.clear()
        self.depth = 0
        self.oldest = None

    # --- replay history and direct writes --------------------------------------------------------

    def retry_of(self, seq: int) -> Retry:
        """The replay history of the waiting write ``seq`` (a fresh one at its first failure)."""
        state = self.retries.get(seq)
        if state is None:
            state = self.retries[seq] = Retry()
        return state

    def note_healthy(self, now: float) -> None:
        """The backend took a write at ``now``: failed replays since count toward parking."""
        self.healthy_at = now

    def uncounted_due(self, now: float) -> None:
        """The backend is up: writes whose failures were not counted are due at ``now``."""
        for state in self.retries.values():
            if state.uncounted and state.due > now:
                state.due = now

    def note_direct_write(
        self, slot: Slot, stamp: int, *, remember: int, logical_time: int | None = None
    ) -> None:
        """A direct write of ``slot`` with call stamp ``stamp`` (and ``logical_time``, when known)
        succeeded: remember it (the latest ``remember`` keys), so an older write of the key that
        fails afterwards is discarded, and an orphan's write of it adopted later is compared with it."""
        recent = self.recent
        if recent.get(slot, stamp - 1) < stamp:
            recent[slot] = stamp
            recent.move_to_end(slot)
            times = self.recent_times
            if logical_time is None:
                times.pop(slot, None)
            else:
                times[slot] = logical_time
            if len(recent) > remember:
                forgotten, _ = recent.popitem(last=False)
                times.pop(forgotten, None)

    # --- memory caps ------------------------------------------------------------------------------

    def settle(self, entries: Sequence[DeadLetter]) -> None:
        """``entries`` are in the file now: keep copies in memory while the caps allow."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        for entry in entries:
            if self.volatile.pop(entry.seq, None) is None:
                continue
            if len(self.memory) + len(self.volatile) < cap_entries and self.memory_bytes <= cap_bytes:
                self.memory[entry.seq] = entry
            else:
                self.drop_payload(entry)

    def make_room(self) -> None:
        """Keep the memory caps with the writes waiting for their commit counted: the copies of
        writes already in the file go first, oldest first."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        memory = self.memory
        while memory and (self.memory_bytes > cap_bytes or len(memory) + len(self.volatile) > cap_entries):
            _, entry = memory.popitem(last=False)
            self.drop_payload(entry)

    def drop_payload(self, entry: DeadLetter) -> None:
        self.memory_bytes -= entry.size
        if entry.scope is not None:
            found = self.scopes.get((entry.method, entry.scope))
            if found is not None:
                found.held.pop(entry.seq, None)

    def enforce_memory(self) -> list[str]:
        """Without a usable spill file: keep memory within its caps by letting go of copies of
        what the file holds and of the oldest parked writes held in memory (bad data, answered
        ``rejected``); returns the methods of the parked writes dropped (to count and log).
        Waiting writes held in memory only were acknowledged: they are never dropped (new ones
        are refused at the caps instead)."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        while self.memory and (
            len(self.memory) + len(self.volatile) > cap_entries or self.memory_bytes > cap_bytes
        ):
            _, held = self.memory.popitem(last=False)
            self.drop_payload(held)
        dropped: list[str] = []
        while self.parked_memory and (
            len(self.parked_memory) > cap_entries or self.parked_memory_bytes > cap_bytes
        ):
            _, parked = self.parked_memory.popitem(last=False)
            self.parked_memory_bytes -= parked.size
            dropped.append(parked.method)
        return dropped

    def hold_parked(self, parked: ParkedWrite) -> None:
        """A parked write the file does not hold (yet)."""
        self.parked_memory[parked.seq] = parked
        self.parked_memory_bytes += parked.size

    def clear_parked_memory(self) -> None:
        self.parked_memory.clear()
        self.parked_memory_bytes = 0

    def unpark_memory(self, limit: int | None) -> int:
        """Move parked writes held in memory that kept their call back to the waiting writes (in
        their place in the order); returns how many."""
        movable = [parked for parked in self.parked_memory.values() if parked.call is not None]
        if limit is not None:
            movable = movable[:limit]
        for parked in movable:
            assert parked.call is not None
            del self.parked_memory[parked.seq]
            self.parked_memory_bytes -= parked.size
            self.remember(
                DeadLetter(
                    seq=parked.seq,
                    method=parked.method,
                    call=parked.call,
                    key=None,
                    scope=None,
                    stamp=0,
                    enqueued_at=parked.parked_at,
                    size=parked.size,
                    error="unparked: " + parked.reason,
                ),
                None,
            )
        if movable:
            self.volatile = OrderedDict(sorted(self.volatile.items()))
            self.epoch += 1
        return len(movable)


SPILL_ERRORS = (sqlite3.Error, OSError, SpillFileError)
"""What the spill file may raise; the buffer absorbs all of it."""

_READ_WARNING_INTERVAL = 60.0


def retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a finished task's exception as seen: its caller may have been cancelled meanwhile."""
    if not task.cancelled():
        task.exception()


def describe(exc: BaseException) -> str:
    return f"{error_type(exc)}: {exc}"


class SpillLink:
    """The spill file of one buffer, the worker thread and the lock (see the module docs).

    ``files`` is ``None`` for a memory-only buffer: changes then run inline and nothing is read.
    """

    def __init__(
        self,
        files: SlotFiles | None,
        held: HeldIndex,
        counters: BufferCounters,
        config: DeadLetterConfig,
        *,
        store_name: str,
        path: str | None,
        retry_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.files = files
        self.held = held
        self.counters = counters
        self.config = config
        self.store_name = store_name
        self.path = path
        self.retry_interval = retry_interval
        self.monotonic = monotonic
        self.clock = clock
        """Wall-clock time: when a write was kept or parked."""
        self.spill: SpillFile | None = None
        self.failed = False
        """The spill file failed: held writes go to memory until it is back."""
        self.closed = False
        self._looked = False
        self._detaching = False
        self._spill_error: str | None = None
        self._disk_full = False
        self.retry_at = -math.inf
        self._read_warned_at = -math.inf
        self.executor: ThreadPoolExecutor | None = None
        self._mutex: asyncio.Lock | None = None
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def spill_error(self) -> str | None:
        return self._spill_error if self.failed else None

    def usable(self) -> bool:
        return self.spill is not None and not self.failed

    def unusable_reason(self) -> str:
        """Why the file takes no write now (the ``reason`` of the refusals): its disk is full, or
        it cannot be used."""
        return REFUSE_DISK_FULL if self._disk_full else REFUSE_SPILL_UNAVAILABLE

    def refusal(self, methods: Sequence[str], reason: str) -> str:
        """Writes of ``methods`` are refused for ``reason`` (one of
        :data:`~.telemetry.REFUSAL_REASONS`): counted and logged at ERROR; returns what a
        :class:`~guarded.errors.WriteNotKeptError` says of it (never a payload)."""
        self.counters.refused(methods, reason)
        config, store = self.config, self.store_name
        if reason == REFUSE_MEMORY_FULL:
            why = (
                f"the in-memory dead-letter buffer of store {store!r} is at its caps (max_memory_entries="
                f"{config.max_memory_entries}, max_memory_bytes={config.max_memory_bytes})"
            )
        elif reason == REFUSE_DISK_CAP:
            why = (
                f"the dead-letter spill file of store {store!r} is at its cap "
                f"(max_disk_bytes={config.max_disk_bytes})"
            )
        elif reason == REFUSE_DISK_FULL:
            why = f"the disk of the dead-letter spill file of store {store!r} is full"
        else:
            why = f"the dead-letter spill file of store {store!r} is unavailable ({self._spill_error})"
        return f"{why}: the write was not kept (nothing kept was evicted to make room)"

    # --- worker thread, tasks and locking ---------------------------------------------------------

    def moved(self) -> None:
        """The guard moved to a new event loop: a task of the old one may hold the lock for good
        (its loop closed), and its background tasks never resume; a new lock serves the new loop.
        A job the old loop left on the worker thread finishes there before the next one starts."""
        self._mutex = None
        self._background.clear()

    def lock(self) -> asyncio.Lock:
        if self._mutex is None:
            self._mutex = asyncio.Lock()
        return self._mutex

    def _worker(self) -> ThreadPoolExecutor:
        if self.closed:
            raise RuntimeError(f"dead-letter buffer of store {self.store_name!r} is closed")
        if self.executor is None:
            self.executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"guarded-dlq-{self.store_name}"
            )
        return self.executor

    async def job(self, job: Callable[[], R]) -> R:
        """Run ``job`` on the worker thread (its exceptions propagate); then account for the rows
        of the spill file it found unreadable and moved to the quarantine table."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker(), job)
        finally:
            spill = self.spill
            if spill is not None:
                self.collect_set_aside(spill)

    def collect_set_aside(self, spill: SpillFile, *, adopted_from: str | None = None) -> None:
        """Forget the unreadable rows ``spill`` set aside that were counted as waiting, count and
        log them (never their contents)."""
        found = spill.take_set_aside()
        if not found:
            return
        held = self.held
        for item in found:
            if item.counted and item.table == "pending" and adopted_from is None:
                held.forget_set_aside(item)
            elif item.table == "parked" and adopted_from is None:
                held.file_parked = max(0, held.file_parked - 1)
        if adopted_from is None:
            held.file_quarantined += len(found)
        self.counters.quarantined(len(found))
        reasons = sorted({item.reason for item in found})
        seqs = [item.seq for item in found if item.seq is not None]
        logger.error(
            "dead-letter spill file %r of store %r: %d row(s) could not be read and were moved to its "
            "quarantine table, they are not replayed (%s; seq %s); see 'guarded dlq list --quarantined'",
            adopted_from or spill.path,
            self.store_name,
            len(found),
            "; ".join(reasons)[:500],
            ", ".join(map(str, seqs[:20])) + (", ..." if len(seqs) > 20 else ""),
            extra={
                "event": "deadletter_quarantined",
                "store": self.store_name,
                "path": adopted_from or spill.path,
                "quarantined": len(found),
            },
        )

    async def mutate(self, op: Callable[[], Awaitable[R]]) -> R:
        """Run ``op`` under the buffer's lock in a task of its own: a cancelled caller leaves it
        running to the end, so memory and file stay in step. Memory-only buffers run it inline
        (nothing in it waits)."""
        if self.files is None:
            return await op()
        task = asyncio.get_running_loop().create_task(self._locked(op))
        task.add_done_callback(retrieve)
        return await asyncio.shield(task)

    async def _locked(self, op: Callable[[], Awaitable[R]]) -> R:
        async with self.lock():
            return await op()

    async def read(self, job: Callable[[], R], default: R) -> R:
        """Run a read of the spill file; ``default`` when there is none or it fails (logged)."""
        spill = self.spill
        if spill is None:
            return default
        try:
            return await self.job(job)
        except SPILL_ERRORS as exc:
            self.read_failed(spill, exc)
            return default

    def read_failed(self, spill: SpillFile, exc: BaseException) -> None:
        if is_corruption(exc):

            async def check() -> None:
                if self.spill is spill and not self.closed:
                    await self.spill_failed(exc)

            task = asyncio.get_running_loop().create_task(self.mutate(check))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(retrieve)
            return
        now = self.monotonic()
        if now - self._read_warned_at >= _READ_WARNING_INTERVAL:
            self._read_warned_at = now
            logger.warning(
                "reading dead-letter spill file %r of store %r failed: %s",
                spill.path,
                self.store_name,
                describe(exc),
                extra={"event": "deadletter_spill_read_failed", "store": self.store_name},
            )

    async def load(self, seqs: Sequence[int]) -> list[DeadLetter]:
        """The waiting entries ``seqs``: from memory, else read from the file."""
        found: list[DeadLetter] = []
        missing: list[int] = []
        for seq in seqs:
            entry = self.held.held_entry(seq)
            if entry is None:
                missing.append(seq)
            else:
                found.append(entry)
        spill = self.spill
        if missing and spill is not None:
            found.extend(await self.read(lambda: spill.fetch(missing), []))
            found.sort(key=lambda entry: entry.seq)
        return found

    # --- claiming, failing and recovering the spill file ------------------------------------------

    async def prepare(self, *, create: bool) -> None:
        """(Under the lock.) Claim a spill file when there is none (``create``: a new one may be
        made), or try a failed one again when it is due. Never raises for the file."""
        if self.files is None or self.closed:
            return
        if self.failed:
            if self.monotonic() >= self.retry_at:
                await self.recover()
            return
        if self.spill is not None or (not create and self._looked):
            return
        await self.claim(create=create)

    async def claim(self, *, create: bool) -> int:
        """Claim a slot file; returns how many writes (waiting and parked) it held."""
        files = self.files
        assert files is not None
        minimum = self.held.generation
        try:
            spill = await self.job(lambda: files.claim(create=create, min_generation=minimum))
        except SPILL_ERRORS as exc:
            self.fail(exc, "cannot claim a spill file")
            return 0
        self._looked = True
        if spill is None:
            return 0
        return await self._attach(spill)

    async def _attach(self, spill: SpillFile) -> int:
        """Make ``spill`` the buffer's file: index what it holds, move memory-held writes into it."""
        held = self.held
        in_memory = [*held.volatile, *held.parked_memory]
        floor = min(in_memory) if in_memory else None
        next_seq = held.next_seq

        def load() -> tuple[list[RowInfo], SpillTotals, int]:
            # Writes held in memory keep their numbers: the file's move above them (its writes then
            # come after them in the replay order; every one is still replayed).
            if floor is not None and spill.max_seq() >= floor:
                spill.shift(max(spill.max_seq() + 1, next_seq))
            return list(spill.index_rows()), spill.totals(), spill.max_seq()

        try:
            rows, totals, max_seq = await self.job(load)
        except SPILL_ERRORS as exc:
            files = self.files
            if files is not None and is_corruption(exc) and not self._detaching:
                # Damaged past its header: set it aside like one found damaged at once.
                self._detaching = True
                try:
                    minimum, damage = held.generation, exc
                    _aside, fresh, error = await self.job(
                        lambda: files.replace_corrupt(spill, damage, held=None, min_generation=minimum)
                    )
                    if fresh is not None:
                        return await self._attach(fresh)
                    self.fail(error or exc, f"cannot start a fresh spill file at {spill.path!r}", quiet=True)
                    return 0
                finally:
                    self._detaching = False
            with contextlib.suppress(*SPILL_ERRORS):
                await self.job(spill.close)
            self.fail(exc, f"cannot read spill file {spill.path!r}")
            return 0
        previous = held.generation
        self.spill = spill
        held.retries.clear()  # sequence numbers of the file may have moved
        self.collect_set_aside(spill)
        held.generation = spill.generation
        held.regenerate(previous, spill.generation)
        held.next_seq = max(held.next_seq, max_seq + 1)
        held.epoch += 1
        for row in rows:
            held.index_row(row)
        held.apply_totals(totals)
        if totals.pending:
            logger.warning(
                "dead-letter spill file %r of store %r holds %d waiting write(s) from an earlier run",
                spill.path,
                self.store_name,
                totals.pending,
                extra={
                    "event": "deadletter_recovered",
                    "store": self.store_name,
                    "depth": totals.pending,
                    "parked": totals.parked,
                    "path": spill.path,
                },
            )
        await self.flush()
        return totals.pending + totals.parked

    def fail(self, exc: BaseException, doing: str, *, quiet: bool = False) -> None:
        """The spill file cannot be used: writes that need holding are refused until it is back;
        one ERROR per outage."""
        self._spill_error = f"{doing}: {describe(exc)}"
        self._disk_full = is_disk_full(exc)
        self.retry_at = self.monotonic() + self.retry_interval
        if self.failed:
            logger.debug("dead-letter spill file of store %r still unavailable: %s", self.store_name, exc)
            return
        self.failed = True
        if quiet:
            return
        logger.error(
            "dead-letter spill file of store %r is unavailable (%s); writes the backend does not take "
            "are refused until it is back (the file is tried again every %.0f s)",
            self.store_name,
            self._spill_error,
            self.retry_interval,
            extra={
                "event": "deadletter_spill_unavailable",
                "store": self.store_name,
                "path": self.path,
                "error": error_type(exc),
            },
        )

    async def spill_failed(self, exc: BaseException) -> None:
        """(Under the lock.) A spill operation failed: a damaged file is set aside and a fresh one
        started; anything else makes the file unavailable until a retry succeeds."""
        if self.spill is not None and is_corruption(exc) and not self._detaching:
            self._detaching = True
            try:
                await self._detach_corrupt(exc)
            finally:
                self._detaching = False
            return
        self.fail(exc, "writing the spill file")

    async def _detach_corrupt(self, exc: BaseException) -> None:
        spill, files, held = self.spill, self.files, self.held
        assert spill is not None
        assert files is not None
        # What memory holds of the file stays waiting, in memory only; the rest went with the file.
        merged = OrderedDict(sorted([*held.memory.items(), *held.volatile.items()]))
        held.memory = OrderedDict()
        held.volatile = merged
        done_unkeyed = sum(1 for keyed in held.pending_deletes.values() if not keyed)
        before = held.depth - done_unkeyed
        held.pending_deletes.clear()
        held.reindex([])
        lost = max(0, before - held.depth)
        held.apply_totals(EMPTY_TOTALS)
        self.spill = None
        held.epoch += 1
        if lost:
            self.counters.dropped(["unknown"] * lost, DROP_SPILL_CORRUPT)
        minimum = held.generation
        try:
            _aside, fresh, error = await self.job(
                lambda: files.replace_corrupt(spill, exc, held=lost, min_generation=minimum)
            )
        except SPILL_ERRORS as failure:
            fresh, error = None, failure
        if fresh is None:
            self.fail(error or exc, "starting a fresh spill file", quiet=True)
            return
        await self._attach(fresh)

    async def recover(self) -> None:
        """(Under the lock.) Try the failed spill file again, or claim one."""
        self.retry_at = self.monotonic() + self.retry_interval
        if self.spill is None:
            await self.claim(create=True)
        else:
            await self.flush()

    async def flush(self) -> bool:
        """(Under the lock.) Move memory-only writes and parked writes into the file and apply the
        deletions it missed; makes the file available again when that commits. The writes memory
        held were acknowledged already: the byte cap does not turn them away."""
        spill, held = self.spill, self.held
        assert spill is not None
        if not (held.volatile or held.parked_memory or held.pending_deletes):
            self._back(0)
            return True
        entries = list(held.volatile.values())
        parked = list(held.parked_memory.values())
        deletes = list(held.pending_deletes)
        generations = {
            entry.seq: held.keys[slot][entry.seq][0]
            for entry in entries
            if (slot := slot_of(entry)) is not None and entry.seq in held.keys.get(slot, {})
        }
        current = held.generation
        try:
            result = await self.job(
                lambda: spill.write(
                    entries,
                    generation=current,
                    delete=deletes,
                    generations=generations,
                    parked=parked,
                )
            )
        except SPILL_ERRORS as exc:
            await self.spill_failed(exc)
            return False
        held.pending_deletes.clear()
        for row in result.deleted:
            if row.key is None:  # keyed ones were forgotten when their deletion was deferred
                held.forget_row(row)
        held.clear_parked_memory()
        held.apply_totals(result.totals)
        held.settle(entries)
        self._back(len(entries) + len(parked))
        return True

    def _back(self, moved: int) -> None:
        if not self.failed:
            return
        self.failed = False
        self._spill_error = None
        logger.warning(
            "dead-letter spill file %r of store %r takes writes again; %d write(s) held in memory "
            "moved into it",
            self.spill.path if self.spill is not None else None,
            self.store_name,
            moved,
            extra={"event": "deadletter_spill_available", "store": self.store_name, "moved": moved},
        )

    # --- applying what the file did ---------------------------------------------------------------

    def apply_write(self, result: WriteResult, slots: Mapping[int, Slot] | None = None) -> int:
        """Forget what a write transaction deleted (``slots``: the known index slots of
        deleted entries); returns how many it deleted."""
        held = self.held
        if slots:
            for row in result.deleted:
                slot = slots.get(row.seq)
                if slot is None:
                    held.forget_row(row)
                else:
                    held.forget(row.seq, row.method, slot, row.scope)
        else:
            held.forget_rows(result.deleted)
        held.apply_totals(result.totals)
        return len(result.deleted)

    def enforce_memory(self) -> None:
        """Without a usable spill file: keep memory within its caps (see
        :meth:`HeldIndex.enforce_memory`); dropped parked writes are counted and logged."""
        dropped = self.held.enforce_memory()
        if dropped:
            self.counters.dropped(dropped, DROP_MEMORY_FULL)

    async def flush_or_enforce(self) -> None:
        """After memory took a write: into the file when it is usable (a fresh file replaced a
        damaged one), else keep the memory caps."""
        if self.usable():
            await self.flush()
        else:
            self.enforce_memory()

    # --- keeping new writes (the group commit's transactions) -------------------------------------

    def room_in_memory(self, prepared: Sequence[Prepared]) -> list[bool]:
        """Without a spill file: which of ``prepared`` the memory caps admit, in order."""
        held, config = self.held, self.config
        return admitted(
            prepared,
            config.max_memory_bytes - held.memory_bytes,
            config.max_memory_entries - len(held.volatile),
        )

    def room_in_file(self, prepared: Sequence[Prepared]) -> list[bool]:
        """Which of ``prepared`` fit in the spill file under its byte cap, in order (the room a
        write would free by replacing a held one of its key is not counted)."""
        held = self.held
        return admitted(prepared, self.config.max_disk_bytes - held.disk_bytes - held.file_parked_bytes)

    def number(
        self, prepared: Sequence[Prepared]
    ) -> tuple[list[DeadLetter], list[DeadLetter], dict[int, Slot], dict[int, str]]:
        """Number ``prepared`` and coalesce it with what waits: returns every entry, those to
        store, the file's entries they replace (to delete with them) and the calls' JSON texts."""
        held = self.held
        now = self.clock()
        results: list[DeadLetter] = []
        kept: dict[int, DeadLetter] = {}
        victims: dict[int, Slot] = {}
        texts: dict[int, str] = {}
        superseded = 0
        for method, call, key, scope, stamp, size, error, index, text in prepared:
            entry = DeadLetter(held.next_seq, method, call, key, scope, stamp, now, size, error)
            held.next_seq += 1
            results.append(entry)
            slot: Slot | None = None
            if index is not None:
                slot = (entry.method, index)
                position = (held.generation, entry.stamp)
                recent = held.recent.get(slot)
                waiting = held.keys.get(slot)
                if (recent is not None and entry.stamp < recent) or (
                    waiting and any(other > position for other in waiting.values())
                ):
                    superseded += 1
                    continue
                if waiting:
                    for seq in list(waiting):
                        older = held.volatile.get(seq)
                        if older is not None:
                            kept.pop(seq, None)
                            held.forget(seq, older.method, slot, older.scope)
                            superseded += 1
                        else:
                            victims[seq] = slot
            held.remember(entry, slot)
            kept[entry.seq] = entry
            texts[entry.seq] = text
        self.counters.superseded(superseded)
        return results, list(kept.values()), victims, texts

    async def write_new(self, writing: Writing, texts: dict[int, str]) -> str | None:
        """(Under the lock.) Commit ``writing.kept`` (deleting the ``victims`` it replaces);
        ``None`` once committed, else the reason it was not (``refused`` label); the entries not
        committed are forgotten."""
        kept, victims = writing.kept, writing.victims
        if not (kept or victims):
            return None
        spill = self.spill
        assert spill is not None
        current, max_bytes = self.held.generation, self.config.max_disk_bytes

        def write() -> WriteResult:
            try:
                writing.result = spill.write(
                    kept, generation=current, delete=list(victims), max_bytes=max_bytes, texts=texts
                )
            except BaseException as exc:
                writing.error = exc
                raise
            return writing.result

        try:
            result = await self.job(write)
        except SpillCapError:
            writing.applied = True
            reason: str | None = REFUSE_DISK_CAP
        except SPILL_ERRORS as exc:
            writing.applied = True
            reason = await self._not_written(kept, exc)
        else:
            writing.applied = True
            self._written(result, kept, victims)
            return None
        if reason is not None:
            self._forget_unacknowledged(kept)
        return reason

    def _written(self, result: WriteResult, kept: list[DeadLetter], victims: dict[int, Slot]) -> None:
        self.counters.superseded(self.apply_write(result, victims))
        self.held.settle(kept)

    async def _not_written(self, kept: list[DeadLetter], exc: BaseException) -> str | None:
        """The spill file failed to commit ``kept``: ``None`` when a damaged file was set aside and
        the fresh one took them, else the reason they were not kept."""
        await self.spill_failed(exc)
        if self.usable() and not any(entry.seq in self.held.volatile for entry in kept):
            return None
        return self.unusable_reason()

    def _forget_unacknowledged(self, kept: Sequence[DeadLetter]) -> None:
        """Entries never acknowledged: forgotten; what they would replace still waits."""
        held = self.held
        for entry in kept:
            if entry.seq in held.volatile:
                held.forget_entry(entry)

    async def finish_abandoned(self, writing: Writing) -> None:
        """(Under the lock.) Apply what the transaction of a closed loop's committer did: the
        worker thread runs jobs in order, so once an empty one ran, that one had ended. Left
        unapplied, its entries would be written again (and refused by the file) or replayed twice."""
        await self.job(_nothing)
        if writing.result is not None:
            self._written(writing.result, writing.kept, writing.victims)
            self.counters.enqueued([entry.method for entry in writing.kept])
        elif isinstance(writing.error, SpillCapError) or (
            isinstance(writing.error, SPILL_ERRORS) and await self._not_written(writing.kept, writing.error)
        ):
            self._forget_unacknowledged(writing.kept)

    # --- last-write-wins keys ---------------------------------------------------------------------

    async def drop_stale(self, slot: Slot, stamp: int) -> int:
        """(Under the lock.) Drop the waiting writes of ``slot`` older than a direct write with call
        stamp ``stamp`` of this process; returns how many were dropped (counted as superseded)."""
        held = self.held
        waiting = held.keys.get(slot)
        position = (held.generation, stamp)
        stale = [seq for seq, other in (waiting or {}).items() if other < position]
        if not stale:
            return 0
        removed = await self._remove_waiting(slot, stale)
        self.counters.superseded(removed)
        return removed

    async def take_newest(self, slot: Slot) -> DeadLetter | None:
        """(Under the lock.) Remove every waiting write of ``slot`` and return the newest."""
        seqs = sorted(self.held.keys.get(slot, {}))
        if not seqs:
            return None
        found = await self.load([seqs[-1]])
        removed = await self._remove_waiting(slot, seqs)
        self.counters.superseded(max(0, removed - 1))
        return found[0] if found else None

    async def _remove_waiting(self, slot: Slot, seqs: Sequence[int]) -> int:
        """(Under the lock.) Remove waiting entries of ``slot``; returns how many were there."""
        held = self.held
        removed = 0
        in_file: list[int] = []
        for seq in seqs:
            entry = held.volatile.get(seq)
            if entry is not None:
                held.forget(seq, entry.method, slot, entry.scope)
                removed += 1
            elif seq in held.keys.get(slot, {}):
                in_file.append(seq)
        if not in_file:
            return removed
        spill = self.spill
        if spill is not None and self.usable():
            try:
                result = await self.job(lambda: spill.delete(in_file))
            except SPILL_ERRORS as exc:
                for seq in in_file:
                    held.defer_delete(seq, slot)
                await self.spill_failed(exc)
                return removed + len(in_file)
            return removed + self.apply_write(result)
        for seq in in_file:
            held.defer_delete(seq, slot)
        return removed + len(in_file)

    # --- removing replayed writes -----------------------------------------------------------------

    async def remove_replayed(
        self, entries: Sequence[DeadLetter], epoch: int, *, superseded: bool = False
    ) -> int:
        """The backend took ``entries`` (``superseded``: left them alone, as its rows hold newer
        writes): remove (and count) those still waiting; returns how many."""

        async def op() -> list[DeadLetter]:
            done = await self._removed(entries, epoch)
            # Counted here, inside the operation: it completes even when the replaying task is
            # cancelled meanwhile (a drain stops a background pass), so no replay goes uncounted.
            if superseded:
                self.counters.superseded(len(done))
                for entry in done:
                    logger.info(
                        "a replayed %s was older than what the backend holds: superseded, not applied",
                        entry.method,
                        extra={"store": self.store_name, "method": entry.method},
                    )
                return done
            for entry in done:
                self.counters.replayed(entry.method)
            return done

        return len(await self.mutate(op))

    async def _removed(self, entries: Sequence[DeadLetter], epoch: int) -> list[DeadLetter]:
        held = self.held
        done: list[DeadLetter] = []
        in_file: list[DeadLetter] = []
        for entry in entries:
            if entry.seq in held.volatile:
                held.forget_entry(entry)
                done.append(entry)
            elif epoch == held.epoch:
                in_file.append(entry)
        if not in_file:
            return done
        spill = self.spill
        if spill is not None and self.usable():
            seqs = [entry.seq for entry in in_file]
            try:
                result = await self.job(lambda: spill.delete(seqs))
            except SPILL_ERRORS as exc:
                done.extend(self._defer_replayed(in_file))
                await self.spill_failed(exc)
            else:
                deleted = {row.seq for row in result.deleted}
                self.apply_write(result)
                done.extend(entry for entry in in_file if entry.seq in deleted)
        elif spill is not None:
            done.extend(self._defer_replayed(in_file))
        return done

    def _defer_replayed(self, entries: Sequence[DeadLetter]) -> list[DeadLetter]:
        done: list[DeadLetter] = []
        for entry in entries:
            if not self.held.still_waiting(entry, has_file=self.spill is not None):
                continue
            self.held.defer_delete(entry.seq, slot_of(entry))
            done.append(entry)
        return done

    async def resync(self) -> None:
        """The file holds no waiting write but the count says some wait (rows that could not be
        read and were set aside while counted): count again from the file."""
        held = self.held

        async def op() -> None:
            spill = self.spill
            if spill is None or not self.usable() or held.volatile or held.pending_deletes:
                return
            try:
                rows = await self.job(lambda: list(spill.index_rows()))
                totals = await self.job(spill.totals)
            except SPILL_ERRORS as exc:
                self.read_failed(spill, exc)
                return
            if held.depth != len(rows):
                logger.warning(
                    "dead-letter buffer of store %r counted %d waiting write(s), its spill file holds %d: "
                    "counted again",
                    self.store_name,
                    held.depth,
                    len(rows),
                    extra={"event": "deadletter_recounted", "store": self.store_name},
                )
                held.reindex(rows)
                held.epoch += 1
            held.apply_totals(totals)

        await self.mutate(op)

    # --- parking ----------------------------------------------------------------------------------

    async def park_new(self, method: str, call: JSONObject | None, size: int, reason: str) -> ParkedWrite:
        """(Under the lock.) Park a write that never waited (the guard refused it as bad data): in
        the file's ``parked`` table, or in memory while the file is unavailable; one the file has
        no room for under its byte cap is not kept (counted as refused)."""
        held = self.held
        await self.prepare(create=True)
        parked = ParkedWrite(
            seq=held.next_seq,
            method=method,
            call=call,
            reason=reason[:2000],
            parked_at=self.clock(),
            size=size,
        )
        held.next_seq += 1
        spill = self.spill
        kept = False
        if spill is not None and self.usable():
            try:
                result = await self.job(lambda: spill.park([parked], max_bytes=self.config.max_disk_bytes))
            except SpillCapError:
                self.refusal([method], REFUSE_DISK_CAP)  # nothing kept is evicted for it
                return parked
            except SPILL_ERRORS as exc:
                await self.spill_failed(exc)
            else:
                self.apply_write(result)
                kept = True
        if not kept:
            held.hold_parked(parked)
            await self.flush_or_enforce()
        self.counters.parked(method)
        return parked

    async def park_waiting(self, entry: DeadLetter, reason: str, epoch: int) -> bool:
        """(Under the lock.) Park a waiting entry the backend refused; ``False`` when it no longer waits."""
        held = self.held
        if entry.seq not in held.volatile and (
            epoch != held.epoch or not held.still_waiting(entry, has_file=self.spill is not None)
        ):
            return False
        reason = readable_text(reason)[:2000]
        now = self.clock()
        slot = slot_of(entry)
        spill = self.spill
        if entry.seq not in held.volatile and spill is not None and self.usable():
            try:
                result = await self.job(lambda: spill.park_pending(entry.seq, reason=reason, parked_at=now))
            except SPILL_ERRORS as exc:
                await self.spill_failed(exc)
                if held.epoch != epoch:
                    return await self.park_waiting(entry, reason, held.epoch)
            else:
                if not self.apply_write(result):
                    return False
                self.counters.parked(entry.method)
                return True
        if entry.seq in held.volatile:
            held.forget(entry.seq, entry.method, slot, entry.scope)
        else:
            held.defer_delete(entry.seq, slot)
        held.hold_parked(ParkedWrite(entry.seq, entry.method, entry.call, reason, now, entry.size))
        await self.flush_or_enforce()
        self.counters.parked(entry.method)
        return True

    # --- reading what is held ---------------------------------------------------------------------

    async def waiting_page(self, after: int, limit: int | None) -> list[DeadLetter]:
        """Waiting entries after ``after`` in order: the file's and the memory-only ones."""
        held, spill = self.held, self.spill
        found: list[DeadLetter] = []
        if spill is not None:
            read = await self.read(lambda: spill.page(after, limit), None)
            if read is None:  # the file cannot be read: what memory holds of it
                found = [entry for seq, entry in held.memory.items() if seq > after]
            elif held.pending_deletes:
                found = [entry for entry in read if entry.seq not in held.pending_deletes]
            else:
                found = read
        volatile = [entry for seq, entry in held.volatile.items() if seq > after]
        if volatile:
            merged = {entry.seq: entry for entry in found}
            merged.update((entry.seq, entry) for entry in volatile)
            found = sorted(merged.values(), key=lambda entry: entry.seq)
        return found if limit is None else found[:limit]

    async def waiting_in_scope(self, method: str, scope: str) -> list[DeadLetter]:
        """The waiting entries of ``method`` in ``scope``, oldest first (no file access when memory
        holds them all)."""
        held = self.held
        found = held.scopes.get((method, scope))
        if found is None or found.total <= 0:
            return []
        in_memory = [entry for seq in list(found.held) if (entry := held.held_entry(seq)) is not None]
        spill = self.spill
        if len(found.held) >= found.total or spill is None:
            return sorted(in_memory, key=lambda entry: entry.seq)
        no_entries: list[DeadLetter] = []
        merged = {
            entry.seq: entry
            for entry in await self.read(lambda: spill.for_scope(method, scope), no_entries)
            if entry.seq not in held.pending_deletes
        }
        merged.update((entry.seq, entry) for entry in in_memory if entry.seq in held.volatile)
        return sorted(merged.values(), key=lambda entry: entry.seq)

    async def parked_writes(self, limit: int | None) -> list[ParkedWrite]:
        """Parked writes, oldest first, at most ``limit``."""
        spill = self.spill
        found: list[ParkedWrite] = []
        if spill is not None:
            found = await self.read(lambda: spill.parked(limit), found)
        if self.held.parked_memory:
            found = sorted([*found, *self.held.parked_memory.values()], key=lambda write: write.seq)
        return found if limit is None else found[:limit]

    async def quarantined_rows(self, limit: int | None, *, with_raw: bool) -> list[QuarantinedRow]:
        """Rows of the spill file moved to its quarantine table, oldest first, at most ``limit``."""
        spill = self.spill
        found: list[QuarantinedRow] = []
        if spill is None:
            return found
        return await self.read(lambda: spill.quarantined(limit, with_raw=with_raw), found)

    # --- an operator's maintenance: unpark and purge ----------------------------------------------

    async def unpark(self, limit: int | None) -> int:
        """(Under the lock.) Move parked writes that kept their call back to the waiting writes;
        returns how many."""
        held = self.held
        await self.prepare(create=False)
        moved = held.unpark_memory(limit)
        left = None if limit is None else limit - moved
        spill = self.spill
        if spill is not None and self.usable() and (left is None or left > 0):

            def move() -> tuple[WriteResult, list[RowInfo]]:
                result = spill.unpark(left)
                return result, list(spill.index_rows())

            try:
                result, rows = await self.job(move)
            except SPILL_ERRORS as exc:
                await self.spill_failed(exc)
            else:
                before = held.depth
                held.reindex(rows)
                held.apply_totals(result.totals)
                held.epoch += 1
                moved += held.depth - before
        if moved and self.usable() and held.volatile:
            await self.flush()
        return moved

    async def purge(self, *, pending: bool, parked: bool, quarantined: bool) -> int:
        """(Under the lock.) Delete every waiting and/or parked write, and/or the quarantined rows of
        the spill file; returns how many were deleted."""
        held = self.held
        await self.prepare(create=False)
        removed = 0
        spill = self.spill
        file_purged = spill is None
        if spill is not None and self.usable():
            try:
                removed += await self.job(
                    lambda: spill.purge(pending=pending, parked=parked, quarantined=quarantined)
                )
                held.apply_totals(await self.job(spill.totals))
                file_purged = True
            except SPILL_ERRORS as exc:
                await self.spill_failed(exc)
        if pending:
            removed += len(held.volatile)
            if file_purged:
                held.clear_waiting()
            else:
                for entry in list(held.volatile.values()):
                    held.forget_entry(entry)
            held.epoch += 1
        if parked:
            removed += len(held.parked_memory)
            held.clear_parked_memory()
        return removed

    # --- adopting orphans -------------------------------------------------------------------------

    async def adopt_orphans(self) -> int:
        """(Under the lock.) Claim a slot file left by an earlier process when none is claimed (or
        retry a failed one when due), then adopt the orphans; returns how many writes were taken."""
        claimed = 0
        if self.failed:
            if self.monotonic() >= self.retry_at:
                await self.recover()
        elif self.spill is None:
            claimed = await self.claim(create=False)
            self.counters.adopted(claimed)
        return claimed + await self.adopt_if_usable()

    async def adopt_if_usable(self) -> int:
        """(Under the lock.) Adopt every orphan of the base path while the buffer's own file is
        usable; returns how many writes (waiting and parked) were adopted."""
        files = self.files
        if files is None or files.pinned or not self.usable():
            return 0
        own = self.spill.path if self.spill is not None else None
        try:
            orphans = await self.job(lambda: files.orphans(own))
        except SPILL_ERRORS as exc:
            logger.debug("looking for orphaned spill files of %r failed: %s", self.path, exc)
            return 0
        adopted = 0
        for index, orphan in enumerate(orphans):
            if not self.usable():
                for other in orphans[index:]:
                    await self._release(other)
                break
            adopted += await self._adopt_one(orphan)
        self.counters.adopted(adopted)
        return adopted

    async def _release(self, orphan: SpillFile) -> None:
        try:
            await self.job(orphan.close)
        except SPILL_ERRORS as exc:
            logger.debug("closing spill file %r failed: %s", orphan.path, exc)

    async def _drop_orphan(self, orphan: SpillFile, exc: BaseException) -> None:
        files = self.files
        assert files is not None
        if is_corruption(exc):
            try:
                await self.job(lambda: files.set_aside_orphan(orphan, exc))
                return
            except SPILL_ERRORS as error:
                logger.debug("setting spill file %r aside failed: %s", orphan.path, error)
        await self._release(orphan)

    async def _kept_of_orphan(
        self, orphan: SpillFile, rows: list[RowInfo]
    ) -> tuple[list[RowInfo], dict[int, Slot], int]:
        """Which of an orphan's waiting ``rows`` to keep: ``(kept rows, the buffer's own waiting
        entries they replace, how many rows were superseded)``; see :func:`~.slots.orphan_wins`."""
        held = self.held
        newest = newest_per_key(rows)
        contested = {slot for slot in newest if slot in held.recent or held.keys.get(slot)}
        theirs: dict[int, DeadLetter] = {}
        ours: dict[int, DeadLetter] = {}
        if contested:
            wanted = [newest[slot].seq for slot in contested]
            theirs = {entry.seq: entry for entry in await self.job(lambda: orphan.fetch(wanted))}
            own = [seq for slot in contested for seq in held.keys.get(slot, {})]
            ours = {entry.seq: entry for entry in await self.load(own)} if own else {}
        keep: list[RowInfo] = []
        victims: dict[int, Slot] = {}
        superseded = 0
        for row in rows:
            slot = None if row.key is None else (row.method, index_key_of_canonical(row.key))
            if slot is not None:
                if newest[slot] is not row:
                    superseded += 1
                    continue
                if slot in contested:
                    verdict = orphan_wins(
                        slot,
                        row,
                        theirs.get(row.seq),
                        ours,
                        recent=slot in held.recent,
                        direct_time=held.recent_times.get(slot),
                        waiting=held.keys.get(slot),
                        generation=held.generation,
                    )
                    if verdict is None:
                        superseded += 1
                        continue
                    victims.update(dict.fromkeys(verdict, slot))
            keep.append(row)
        return keep, victims, superseded

    async def _adopt_one(self, orphan: SpillFile) -> int:
        spill, held = self.spill, self.held
        assert spill is not None

        def read() -> tuple[list[RowInfo], list[int]]:
            orphan.check_all()  # rows that cannot be read go to its quarantine table, copied with it
            return list(orphan.index_rows()), orphan.parked_seqs()

        try:
            rows, parked_seqs = await self.job(read)
        except SPILL_ERRORS as exc:
            self.collect_set_aside(orphan, adopted_from=orphan.path)
            await self._drop_orphan(orphan, exc)
            return 0
        self.collect_set_aside(orphan, adopted_from=orphan.path)
        keep, victims, superseded = await self._kept_of_orphan(orphan, rows)
        renumbered: dict[int, int] = {}
        for old in sorted([row.seq for row in keep] + parked_seqs):
            renumbered[old] = held.next_seq
            held.next_seq += 1
        pending_map = {row.seq: renumbered[row.seq] for row in keep}
        parked_map = {seq: renumbered[seq] for seq in parked_seqs}
        max_bytes = self.config.max_disk_bytes
        try:
            result = await self.job(
                lambda: spill.take_over(
                    orphan, pending_map, parked_map, delete=list(victims), max_bytes=max_bytes
                )
            )
        except SourceReadError as exc:
            await self._drop_orphan(orphan, exc.__cause__ or exc)
            return 0
        except SpillCapError:
            # Its writes stay in the orphan's file, adopted once this file has the room.
            await self._release(orphan)
            logger.warning(
                "dead-letter buffer of store %r leaves %r for later: its writes do not fit under "
                "max_disk_bytes=%d now",
                self.store_name,
                orphan.path,
                max_bytes,
                extra={
                    "event": "deadletter_adoption_deferred",
                    "store": self.store_name,
                    "path": orphan.path,
                },
            )
            return 0
        except SPILL_ERRORS as exc:
            await self._release(orphan)
            await self.spill_failed(exc)
            return 0
        for row in keep:
            held.index_row(
                RowInfo(pending_map[row.seq], row.method, row.key, row.scope, row.stamp, 0, row.size)
            )
        self.counters.superseded(superseded + self.apply_write(result))
        pid = orphan.previous_pid
        try:
            await self.job(orphan.remove)
        except SPILL_ERRORS as exc:
            logger.warning(
                "adopted spill file %r could not be removed (%s): its writes may be replayed twice",
                orphan.path,
                exc,
                extra={"event": "deadletter_orphan_not_removed", "store": self.store_name},
            )
        logger.warning(
            "dead-letter buffer of store %r adopted %d waiting and %d parked write(s) from %r, left by a "
            "process that is gone%s (%d superseded)",
            self.store_name,
            len(keep),
            len(parked_seqs),
            orphan.path,
            "" if pid is None else f" (pid {pid})",
            superseded,
            extra={
                "event": "deadletter_adopted",
                "store": self.store_name,
                "path": orphan.path,
                "adopted": len(keep),
                "parked": len(parked_seqs),
                "superseded": superseded,
            },
        )
        return len(keep) + len(parked_seqs)

    # --- closing ----------------------------------------------------------------------------------

    async def close(self, on_closed: Callable[[], None]) -> None:
        """(Under the lock.) One last attempt to move memory-only writes into a failed file, then
        close the file (its lock released), or remove it when it is an empty slot file other than
        the base path itself, and stop the worker thread; ``on_closed`` runs once it takes nothing
        more. Never raises (failures are logged)."""
        try:
            held = self.held
            if self.failed and (held.volatile or held.parked_memory or held.pending_deletes):
                try:
                    await self.recover()
                except Exception:
                    logger.exception("last attempt to use the spill file of store %r failed", self.store_name)
            self.closed = True
            on_closed()
            spill, executor = self.spill, self.executor
            self.spill = self.executor = None
            if executor is not None:
                if spill is not None:
                    await self._close_file(spill, executor)
                executor.shutdown(wait=False)
        except Exception:
            self.closed = True
            logger.exception("closing the dead-letter buffer of store %r failed", self.store_name)

    async def _close_file(self, spill: SpillFile, executor: ThreadPoolExecutor) -> None:
        files, held = self.files, self.held
        removable = (
            files is not None
            and not files.pinned
            and slot_number(files.base, spill.path) not in (None, 0)
            and spill.is_empty
            and not held.volatile
            and not held.parked_memory
            and not held.pending_deletes
        )
        try:
            await asyncio.get_running_loop().run_in_executor(
                executor, spill.remove if removable else spill.close
            )
        except SPILL_ERRORS as exc:
            logger.warning(
                "closing dead-letter spill file %r of store %r failed: %s",
                spill.path,
                self.store_name,
                exc,
                extra={"event": "deadletter_close_failed", "store": self.store_name},
            )


__all__ = [
    "SPILL_ERRORS",
    "HeldIndex",
    "Prepared",
    "Retry",
    "ScopeCount",
    "SpillLink",
    "Writing",
    "admitted",
    "describe",
    "retrieve",
    "slot_of",
]
