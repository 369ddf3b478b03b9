"""A dead-letter buffer's link to its spill file: the worker thread every SQLite call runs on, the
lock its changes take one at a time, and the file's lifecycle (claim, fail, set a damaged one
aside, recover and move what memory held into it). See :mod:`.buffer` for the rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..config import DeadLetterConfig
from ..pipeline.classify import error_type
from .counters import BufferCounters
from .entries import DeadLetter
from .gate import Slot
from .held import HeldIndex, slot_of
from .slots import SlotFiles
from .spill import (
    EMPTY_TOTALS,
    RowInfo,
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
)

logger = logging.getLogger("guarded.deadletter")

R = TypeVar("R")

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
    ) -> None:
        self.files = files
        self.held = held
        self.counters = counters
        self.config = config
        self.store_name = store_name
        self.path = path
        self.retry_interval = retry_interval
        self.monotonic = monotonic
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
        :meth:`~.held.HeldIndex.enforce_memory`); dropped parked writes are counted and logged."""
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


__all__ = ["SPILL_ERRORS", "SpillLink", "describe", "retrieve"]
