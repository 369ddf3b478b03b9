"""The dead-letter buffer: writes that finally failed are kept, not lost (DESIGN.md).

Acknowledged means committed. With a spill file every entry is committed to it before
:meth:`DeadLetterBuffer.put` returns, so an acknowledged write survives a crash of the process;
the oldest waiting entries are also held in memory within the configured caps. Concurrent puts
share one transaction (group commit): while a commit runs, newer puts queue, and the next commit
takes all of them; each caller returns once the transaction holding its entry committed.

**Slots.** The configured path is a base path: every buffer (process, or guard in a process)
claims a slot file of its own beside it, and adopts the slot files of processes that are gone
(:meth:`~DeadLetterBuffer.adopt_orphans`); see :mod:`.slots` for names and rules. A slot file
records the backend target its writes belong to and is never claimed, adopted or replayed by a
buffer of another target.

**A spill file that fails costs nothing the backend can take.** When no slot can be claimed, the
file is damaged, the disk is full or the path cannot be written, the buffer keeps new held writes
in memory only (within the memory caps: beyond them the oldest are dropped, counted and logged),
logs one ERROR, exports ``guarded_deadletter_spill_available`` 0 and tries the file again at most
every ``retry_interval`` seconds (on a put, a park, :meth:`~DeadLetterBuffer.open` or
:meth:`~DeadLetterBuffer.adopt_orphans`), moving what memory holds into it when it is back. A
damaged file is renamed aside (kept for inspection) and a fresh one started at once. No method
raises because of the spill file. Writes the file already held stay there while it is
unavailable; deletions it cannot take (replayed, superseded writes) are applied when it is back,
so a crash in between may replay such a write once more (replays are idempotent, and the backend
refuses an upsert older than what it has).

**Last-write-wins keys** are coalesced: a newer dead-lettered write of a key replaces the waiting
one, and :meth:`~DeadLetterBuffer.supersede` drops what a newer direct write made stale, so a
replay never overwrites newer data. Stamps are call-order numbers of one process; entries left by
an earlier process or adopted from another are older than any write of this one.

All SQLite work runs on one worker thread of the buffer, so the event loop never waits on disk.
The buffer is used from one event loop; its changes run one at a time, in tasks of their own that
a caller's cancellation does not interrupt, so memory and file stay in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from ..bulk_forms import BATCHED_BULK_FORMS
from ..classify import error_type
from ..codec import DEFAULT_TYPES, JSONObject, RecordTypes, check_text
from ..config import DeadLetterConfig
from ..errors import InvalidPayloadError
from .calls import CALL_ALIASES, decode_call, encode_call
from .entries import (
    DeadLetter,
    DeadLetterStats,
    ParkedWrite,
    canonical_key,
    index_key,
    index_key_of_canonical,
)
from .gate import KeyGate, Slot
from .replay import (
    REPLAY_FAILURE_STREAK,
    Attempt,
    Call,
    CallCheck,
    ReplayResult,
    ReplaySummary,
    Send,
    SendBulk,
    TokenBucket,
    attempt,
    attempt_bulk,
    replay_backoff,
)
from .slots import MAX_SLOTS, SlotFiles, slot_of
from .spill import (
    EMPTY_TOTALS,
    QuarantinedRow,
    RowInfo,
    SetAside,
    SourceReadError,
    SpillFile,
    SpillFileError,
    SpillTotals,
    WriteResult,
    dumps,
    is_corruption,
)
from .telemetry import (
    DROP_DISK_FULL,
    DROP_MEMORY_FULL,
    DROP_SPILL_CORRUPT,
    DropLog,
    Gauges,
    deadletter_telemetry,
)

logger = logging.getLogger("guarded.deadletter")

R = TypeVar("R")

PutItem = tuple[str, Sequence[Any], Mapping[str, Any], Any, str | None, int, str]
"""``(method, args, kwargs, key, scope, stamp, error)`` of :meth:`DeadLetterBuffer.put_many`."""

RECENT_WRITES = 16_384
"""Keys whose latest successful direct write the buffer remembers, so a slower, older write of the
same key that fails afterwards is discarded instead of dead-lettered over newer data."""

SPILL_RETRY_INTERVAL = 5.0
"""Seconds between attempts to use a spill file that failed, at most."""

_PAGE = 256
_READ_WARNING_INTERVAL = 60.0
_SPILL_ERRORS = (sqlite3.Error, OSError, SpillFileError)
"""What the spill file may raise; the buffer absorbs all of it."""

_Prepared = tuple[DeadLetter, Hashable | None, str]
"""An encoded put: the entry (seq and time not yet given), its key's index, its call's JSON text."""


@dataclass(slots=True)
class _Scope:
    total: int = 0
    held: dict[int, None] = field(default_factory=dict)
    """Entries of the scope whose payload is in memory (held copies and memory-only entries)."""


def _text(value: str) -> str:
    """``value`` with lone surrogates replaced, for error descriptions and reasons."""
    try:
        return check_text(value, "")
    except InvalidPayloadError:
        return value.encode("utf-8", "replace").decode("utf-8")


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a finished task's exception as seen: its caller may have been cancelled meanwhile."""
    if not task.cancelled():
        task.exception()


def _describe(exc: BaseException) -> str:
    return f"{error_type(exc)}: {exc}"


def _stream(method: str) -> str:
    """The stream a method writes to (a legacy alias writes its target's)."""
    return CALL_ALIASES.get(method, method)


def _lanes(entry: DeadLetter) -> tuple[Hashable, ...]:
    """What must stay in order for ``entry``: its last-write-wins key and its stream (scope)."""
    if entry.key is None:
        return () if entry.scope is None else (("scope", _stream(entry.method), entry.scope),)
    if entry.scope is None:
        return (("key", entry.method, entry.key),)
    return (("key", entry.method, entry.key), ("scope", _stream(entry.method), entry.scope))


def _by_stream(page: Sequence[DeadLetter]) -> list[DeadLetter]:
    """``page`` with the entries of each stream together, streams in order of first appearance
    and entries of a stream in their order: every lane (:func:`_lanes`) keeps its order, and
    interleaved writes of several methods (memory, tasks, trajectories, as an agent makes them)
    become runs that go out as bulk writes."""
    streams: dict[str, list[DeadLetter]] = {}
    for entry in page:
        streams.setdefault(_stream(entry.method), []).append(entry)
    return [entry for entries in streams.values() for entry in entries]


@dataclass(slots=True)
class _Retry:
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


@dataclass(slots=True)
class _Sending:
    """How one pass sends."""

    send: Send
    send_bulk: SendBulk | None
    bulk_methods: frozenset[str]
    pacer: TokenBucket
    batch: int
    check: CallCheck


@dataclass(slots=True)
class _Pass:
    """What one replay pass has done and holds back."""

    started: float
    stop_after: int
    epoch: int
    replayed: int = 0
    parked: int = 0
    failed: int = 0
    deferred: int = 0
    last_error: str | None = None
    answered: bool = False
    stopped: bool = False
    backend_down: bool = False
    found_nothing: bool = False
    backing_off: set[int] = field(default_factory=set)
    """Entries held back for their backoff or failed in this pass (by seq)."""
    streak: int = 0
    streak_methods: set[str] = field(default_factory=set)
    method_streaks: dict[str, int] = field(default_factory=dict)
    held_methods: set[str] = field(default_factory=set)
    blocked: set[Hashable] = field(default_factory=set)
    suspects: list[tuple[DeadLetter, _Retry, float]] = field(default_factory=list)


class DeadLetterBuffer:
    """Keeps writes that finally failed and replays them in order (see the module docs).

    ``config.path`` (``{name}`` replaced by ``store_name``) is the base path of the slot files;
    ``None`` keeps the buffer in memory only. ``target`` identifies the backend the writes belong
    to (host, port, database, schema; never credentials): recorded in the spill file, and files
    of another target are left alone. ``slots=False`` uses exactly ``config.path`` (no other
    slot, no adoption; with ``target=None`` whatever target the file records), for tools that
    work on one file. A spill file is claimed on the first :meth:`put` or by :meth:`open` (at
    startup, to replay what earlier processes left).
    """

    def __init__(
        self,
        config: DeadLetterConfig,
        *,
        store_name: str,
        registry: CollectorRegistry = REGISTRY,
        types: RecordTypes = DEFAULT_TYPES,
        clock: Callable[[], float] = time.time,
        target: str | None = None,
        slots: bool = True,
        max_slots: int = MAX_SLOTS,
        retry_interval: float = SPILL_RETRY_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.store_name = store_name
        self.path = None if config.path is None else config.path.replace("{name}", _file_safe(store_name))
        """The base path of the slot files (``None``: memory only)."""
        self.target = target
        self._types = types
        self._clock = clock
        self._monotonic = monotonic
        self._retry_interval = retry_interval
        self._telemetry = deadletter_telemetry(registry)
        self._telemetry.buffers.add(self)
        self._drop_log = DropLog(store_name)
        self._files = (
            None
            if self.path is None
            else SlotFiles(
                self.path,
                store_name,
                target,
                synchronous=config.synchronous,
                check_target=slots or target is not None,
                pinned=not slots,
                max_slots=max_slots,
                now=clock,
            )
        )

        self._spill: SpillFile | None = None
        self._failed = False
        """The spill file failed: held writes go to memory until it is back."""
        self._looked = False
        self._detaching = False
        self._spill_error: str | None = None
        self._retry_at = -math.inf
        self._read_warned_at = -math.inf
        self._executor: ThreadPoolExecutor | None = None
        self._generation = 1
        self._next_seq = 1
        self._closing = False
        self._closed = False
        self._mutex: asyncio.Lock | None = None
        self._replaying: asyncio.Lock | None = None
        self._epoch = 0
        """Changes whenever sequence numbers read earlier may no longer name the same entries."""
        self._incoming: list[tuple[list[_Prepared], asyncio.Future[list[DeadLetter]]]] = []
        self._committer: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.gate = KeyGate()
        """Orders direct writes of a last-write-wins key against its replay (see :mod:`.gate`)."""

        self._memory: OrderedDict[int, DeadLetter] = OrderedDict()
        """Copies of entries the spill file holds, within the memory caps."""
        self._volatile: OrderedDict[int, DeadLetter] = OrderedDict()
        """Waiting entries the spill file does not hold (memory only, or not yet committed)."""
        self._memory_bytes = 0
        self._keys: dict[Slot, dict[int, tuple[int, int]]] = {}
        self._keyed_scope: dict[int, str] = {}
        self._scopes: dict[tuple[str, str], _Scope] = {}
        self._recent: OrderedDict[Slot, int] = OrderedDict()
        self._pending_deletes: dict[int, bool] = {}
        """Waiting entries of the file to delete once it takes writes again (value: keyed; a
        keyed one is already forgotten, an unkeyed one still counts in the depth)."""
        self._depth = 0
        self._disk_bytes = 0
        self._oldest: float | None = None
        self._file_parked = 0
        self._file_parked_bytes = 0
        self._parked_memory: OrderedDict[int, ParkedWrite] = OrderedDict()
        self._parked_memory_bytes = 0
        self._file_quarantined = 0
        self._retries: dict[int, _Retry] = {}
        """Replay histories of waiting writes that failed (by seq)."""
        self._healthy_at = -math.inf
        """When the backend last took a write (a replay, or a direct write of a key)."""

        self._enqueued_total = 0
        self._replayed_total = 0
        self._dropped_total = 0
        self._parked_total = 0
        self._superseded_total = 0
        self._adopted_total = 0
        self._quarantined_total = 0

    # --- state ------------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Writes waiting (memory and spill file)."""
        return self._depth

    @property
    def is_empty(self) -> bool:
        """Whether no write is waiting."""
        return self._depth == 0

    @property
    def durable(self) -> bool:
        """Whether the buffer has a spill file configured."""
        return self.path is not None

    @property
    def spill_available(self) -> bool:
        """Whether held writes go to the spill file now: a path is configured and the file has
        not failed (``True`` before the first write claims one)."""
        return self.path is not None and not self._failed and not self._closed

    @property
    def spill_path(self) -> str | None:
        """The slot file in use; ``None`` when memory only, none claimed yet, or unavailable."""
        spill = self._spill
        return spill.path if spill is not None and not self._failed else None

    @property
    def claimed_path(self) -> str | None:
        """The slot file this buffer holds locked, even while it fails (``None``: it holds none).
        Of the :attr:`depth` waiting writes, all but :attr:`memory_only` are in it."""
        spill = self._spill
        return spill.path if spill is not None else None

    @property
    def spill_error(self) -> str | None:
        """Why the spill file is unavailable (``None`` while it is fine)."""
        return self._spill_error if self._failed else None

    @property
    def memory_only(self) -> int:
        """Waiting writes held in memory only (not in a spill file): lost if the process dies."""
        return 0 if self._usable() else len(self._volatile)

    @property
    def _parked(self) -> int:
        return self._file_parked + len(self._parked_memory)

    def gauges(self) -> Gauges:
        """The buffer's current gauge values (read by the metrics collector at scrape time)."""
        return Gauges(
            depth=self._depth,
            memory_bytes=self._memory_bytes,
            disk_bytes=self._disk_bytes,
            oldest_age=self._oldest_age(),
            parked=self._parked,
            spill_available=None if self.path is None else self.spill_available,
        )

    def _oldest_age(self) -> float:
        if self._depth == 0:
            return 0.0
        oldest = self._oldest
        try:
            first = next(iter(self._volatile.values())).enqueued_at
        except (StopIteration, RuntimeError):  # empty, or changing under a scrape thread
            first = None
        if first is not None and (oldest is None or first < oldest):
            oldest = first
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    async def stats(self) -> DeadLetterStats:
        """A snapshot of depth, sizes, age of the oldest entry and the totals since creation."""
        return DeadLetterStats(
            depth=self._depth,
            memory_entries=len(self._memory) + len(self._volatile),
            memory_bytes=self._memory_bytes,
            disk_bytes=self._disk_bytes,
            oldest_age=self._oldest_age(),
            parked=self._parked,
            enqueued_total=self._enqueued_total,
            replayed_total=self._replayed_total,
            dropped_total=self._dropped_total,
            parked_total=self._parked_total,
            superseded_total=self._superseded_total,
            adopted_total=self._adopted_total,
            spill_path=self.spill_path,
            spill_available=None if self.path is None else self.spill_available,
            memory_only=self.memory_only,
            quarantined=self._file_quarantined,
            quarantined_total=self._quarantined_total,
        )

    # --- worker thread, tasks and locking ---------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        if self._mutex is None:
            self._mutex = asyncio.Lock()
        return self._mutex

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise RuntimeError(f"dead-letter buffer of store {self.store_name!r} is closed")

    def _worker(self) -> ThreadPoolExecutor:
        if self._closed:
            raise RuntimeError(f"dead-letter buffer of store {self.store_name!r} is closed")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"guarded-dlq-{self.store_name}"
            )
        return self._executor

    async def _job(self, job: Callable[[], R]) -> R:
        """Run ``job`` on the worker thread (its exceptions propagate); then account for the rows
        of the spill file it found unreadable and moved to the quarantine table."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker(), job)
        finally:
            spill = self._spill
            if spill is not None:
                self._collect_set_aside(spill)

    def _collect_set_aside(self, spill: SpillFile, *, adopted_from: str | None = None) -> None:
        """Forget the unreadable rows ``spill`` set aside that were counted as waiting, count and
        log them (never their contents)."""
        found = spill.take_set_aside()
        if not found:
            return
        for item in found:
            if item.counted and item.table == "pending" and adopted_from is None:
                self._forget_set_aside(item)
            elif item.table == "parked" and adopted_from is None:
                self._file_parked = max(0, self._file_parked - 1)
        if adopted_from is None:
            self._file_quarantined += len(found)
        self._quarantined_total += len(found)
        self._telemetry.count_quarantined(self.store_name, len(found))
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

    def _forget_set_aside(self, item: SetAside) -> None:
        """A waiting entry of the file was set aside: it no longer waits."""
        seq = item.seq
        if seq is None:
            return
        if seq in self._pending_deletes:
            if not self._pending_deletes.pop(seq):  # unkeyed: still counted
                self._forget(seq, item.method or "", None, item.scope)
            return
        slot = self._slot_of_row(seq, item.method, item.key)
        if slot is not None:
            self._forget(seq, slot[0], slot, self._keyed_scope.get(seq))
        elif item.key is None:
            self._forget(seq, item.method or "", None, item.scope)

    def _slot_of_row(self, seq: int, method: str | None, key: str | None) -> Slot | None:
        """The index slot holding ``seq``: the one its row names when that holds it, else found."""
        if method is not None and key is not None:
            try:
                slot: Slot = (method, index_key_of_canonical(key))
            except (ValueError, RecursionError):
                pass
            else:
                if seq in self._keys.get(slot, {}):
                    return slot
        return self._find_slot(seq)

    def _find_slot(self, seq: int) -> Slot | None:
        """The index slot of a keyed waiting entry, found by its seq (slow: damaged rows only)."""
        for slot, seqs in self._keys.items():
            if seq in seqs:
                return slot
        return None

    async def _mutate(self, op: Callable[[], Awaitable[R]]) -> R:
        """Run ``op`` under the buffer's lock in a task of its own: a cancelled caller leaves it
        running to the end, so memory and file stay in step. Memory-only buffers run it inline
        (nothing in it waits)."""
        if self._files is None:
            return await op()
        task = asyncio.get_running_loop().create_task(self._locked(op))
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _locked(self, op: Callable[[], Awaitable[R]]) -> R:
        async with self._lock():
            return await op()

    def _usable(self) -> bool:
        return self._spill is not None and not self._failed

    async def _read(self, job: Callable[[], R], default: R) -> R:
        """Run a read of the spill file; ``default`` when there is none or it fails (logged)."""
        spill = self._spill
        if spill is None:
            return default
        try:
            return await self._job(job)
        except _SPILL_ERRORS as exc:
            self._read_failed(spill, exc)
            return default

    def _read_failed(self, spill: SpillFile, exc: BaseException) -> None:
        if is_corruption(exc):

            async def check() -> None:
                if self._spill is spill and not self._closed:
                    await self._spill_failed(exc)

            task = asyncio.get_running_loop().create_task(self._mutate(check))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(_retrieve)
            return
        now = self._monotonic()
        if now - self._read_warned_at >= _READ_WARNING_INTERVAL:
            self._read_warned_at = now
            logger.warning(
                "reading dead-letter spill file %r of store %r failed: %s",
                spill.path,
                self.store_name,
                _describe(exc),
                extra={"event": "deadletter_spill_read_failed", "store": self.store_name},
            )

    # --- claiming, failing and recovering the spill file ------------------------------------------

    async def _prepare_spill(self, *, create: bool) -> None:
        """(Under the lock.) Claim a spill file when there is none (``create``: a new one may be
        made), or try a failed one again when it is due. Never raises for the file."""
        if self._files is None or self._closed:
            return
        if self._failed:
            if self._monotonic() >= self._retry_at:
                await self._recover()
            return
        if self._spill is not None or (not create and self._looked):
            return
        await self._claim(create=create)

    async def _claim(self, *, create: bool) -> int:
        """Claim a slot file; returns how many writes (waiting and parked) it held."""
        files = self._files
        assert files is not None
        minimum = self._generation
        try:
            spill = await self._job(lambda: files.claim(create=create, min_generation=minimum))
        except _SPILL_ERRORS as exc:
            self._fail(exc, "cannot claim a spill file")
            return 0
        self._looked = True
        if spill is None:
            return 0
        return await self._attach(spill)

    async def _attach(self, spill: SpillFile) -> int:
        """Make ``spill`` the buffer's file: index what it holds, move memory-held writes into it."""

        held = [*self._volatile, *self._parked_memory]
        floor = min(held) if held else None
        next_seq = self._next_seq

        def load() -> tuple[list[RowInfo], SpillTotals, int]:
            # Writes held in memory keep their numbers: the file's move above them (its writes then
            # come after them in the replay order; every one is still replayed).
            if floor is not None and spill.max_seq() >= floor:
                spill.shift(max(spill.max_seq() + 1, next_seq))
            return list(spill.index_rows()), spill.totals(), spill.max_seq()

        try:
            rows, totals, max_seq = await self._job(load)
        except _SPILL_ERRORS as exc:
            files = self._files
            if files is not None and is_corruption(exc) and not self._detaching:
                # Damaged past its header: set it aside like one found damaged at once.
                self._detaching = True
                try:
                    minimum, damage = self._generation, exc
                    _aside, fresh, error = await self._job(
                        lambda: files.replace_corrupt(spill, damage, held=None, min_generation=minimum)
                    )
                    if fresh is not None:
                        return await self._attach(fresh)
                    self._fail(error or exc, f"cannot start a fresh spill file at {spill.path!r}", quiet=True)
                    return 0
                finally:
                    self._detaching = False
            with contextlib.suppress(*_SPILL_ERRORS):
                await self._job(spill.close)
            self._fail(exc, f"cannot read spill file {spill.path!r}")
            return 0
        previous = self._generation
        self._spill = spill
        self._retries.clear()  # sequence numbers of the file may have moved
        self._collect_set_aside(spill)
        self._generation = spill.generation
        self._regenerate(previous, spill.generation)
        self._next_seq = max(self._next_seq, max_seq + 1)
        self._epoch += 1
        for row in rows:
            self._index_row(row)
        self._apply_totals(totals)
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
        await self._flush()
        return totals.pending + totals.parked

    def _regenerate(self, previous: int, current: int) -> None:
        """Entries of this process carry the generation of the file they go to."""
        if previous == current:
            return
        for seqs in self._keys.values():
            for seq, (generation, stamp) in list(seqs.items()):
                if generation == previous:
                    seqs[seq] = (current, stamp)

    def _fail(self, exc: BaseException, doing: str, *, quiet: bool = False) -> None:
        """The spill file cannot be used: memory takes held writes; one ERROR per outage."""
        self._spill_error = f"{doing}: {_describe(exc)}"
        self._retry_at = self._monotonic() + self._retry_interval
        if self._failed:
            logger.debug("dead-letter spill file of store %r still unavailable: %s", self.store_name, exc)
            return
        self._failed = True
        if quiet:
            return
        logger.error(
            "dead-letter spill file of store %r is unavailable (%s); held writes are kept in memory only "
            "(at most %d entries, %d bytes; the oldest are dropped beyond that) and the file is tried "
            "again every %.0f s",
            self.store_name,
            self._spill_error,
            self.config.max_memory_entries,
            self.config.max_memory_bytes,
            self._retry_interval,
            extra={
                "event": "deadletter_spill_unavailable",
                "store": self.store_name,
                "path": self.path,
                "error": error_type(exc),
            },
        )

    async def _spill_failed(self, exc: BaseException) -> None:
        """(Under the lock.) A spill operation failed: a damaged file is set aside and a fresh one
        started; anything else makes the file unavailable until a retry succeeds."""
        if self._spill is not None and is_corruption(exc) and not self._detaching:
            self._detaching = True
            try:
                await self._detach_corrupt(exc)
            finally:
                self._detaching = False
            return
        self._fail(exc, "writing the spill file")

    async def _detach_corrupt(self, exc: BaseException) -> None:
        spill, files = self._spill, self._files
        assert spill is not None
        assert files is not None
        # What memory holds of the file stays waiting, in memory only; the rest went with the file.
        merged = OrderedDict(sorted([*self._memory.items(), *self._volatile.items()]))
        self._memory = OrderedDict()
        self._volatile = merged
        done_unkeyed = sum(1 for keyed in self._pending_deletes.values() if not keyed)
        before = self._depth - done_unkeyed
        self._pending_deletes.clear()
        self._reindex([])
        lost = max(0, before - self._depth)
        self._apply_totals(EMPTY_TOTALS)
        self._spill = None
        self._epoch += 1
        if lost:
            self._count_dropped(["unknown"] * lost, DROP_SPILL_CORRUPT)
        minimum = self._generation
        try:
            _aside, fresh, error = await self._job(
                lambda: files.replace_corrupt(spill, exc, held=lost, min_generation=minimum)
            )
        except _SPILL_ERRORS as failure:
            fresh, error = None, failure
        if fresh is None:
            self._fail(error or exc, "starting a fresh spill file", quiet=True)
            return
        await self._attach(fresh)

    async def _recover(self) -> None:
        """(Under the lock.) Try the failed spill file again, or claim one."""
        self._retry_at = self._monotonic() + self._retry_interval
        if self._spill is None:
            await self._claim(create=True)
        else:
            await self._flush()

    async def _flush(self) -> bool:
        """(Under the lock.) Move memory-only writes and parked writes into the file and apply the
        deletions it missed; makes the file available again when that commits."""
        spill = self._spill
        assert spill is not None
        if not (self._volatile or self._parked_memory or self._pending_deletes):
            self._back(0)
            return True
        entries = list(self._volatile.values())
        parked = list(self._parked_memory.values())
        deletes = list(self._pending_deletes)
        generations = {
            entry.seq: self._keys[slot][entry.seq][0]
            for entry in entries
            if (slot := self._slot_of(entry)) is not None and entry.seq in self._keys.get(slot, {})
        }
        current = self._generation
        try:
            result = await self._job(
                lambda: spill.write(
                    entries,
                    generation=current,
                    delete=deletes,
                    max_bytes=self.config.max_disk_bytes,
                    generations=generations,
                    parked=parked,
                )
            )
        except _SPILL_ERRORS as exc:
            await self._spill_failed(exc)
            return False
        self._pending_deletes.clear()
        for row in result.deleted:
            if row.key is None:  # keyed ones were forgotten when their deletion was deferred
                self._forget_row(row)
        self._parked_memory.clear()
        self._parked_memory_bytes = 0
        if result.dropped:
            self._forget_rows(result.dropped)
            self._count_dropped([row.method for row in result.dropped], DROP_DISK_FULL)
        self._apply_totals(result.totals)
        self._settle(entries)
        self._back(len(entries) + len(parked))
        return True

    def _back(self, moved: int) -> None:
        if not self._failed:
            return
        self._failed = False
        self._spill_error = None
        logger.warning(
            "dead-letter spill file %r of store %r takes writes again; %d write(s) held in memory "
            "moved into it",
            self.spill_path,
            self.store_name,
            moved,
            extra={"event": "deadletter_spill_available", "store": self.store_name, "moved": moved},
        )

    def _defer_delete(self, seq: int, slot: Slot | None) -> None:
        """The file cannot delete ``seq`` now: forget it (a keyed one) and delete it when it can."""
        if slot is not None:
            seqs = self._keys.get(slot)
            if seqs is None or seq not in seqs:
                return
            self._forget(seq, slot[0], slot, self._keyed_scope.get(seq))
        self._pending_deletes[seq] = slot is not None

    # --- opening and adopting ---------------------------------------------------------------------

    async def open(self) -> int:
        """Claim this buffer's spill file if one is left from earlier processes, adopt the slot
        files of processes that are gone, and return how many writes wait.

        Call at startup to replay what earlier processes left. Creates nothing when there is
        nothing to take over (the first write claims a slot). Never raises because of the spill
        file (see the module docs).
        """
        self._check_open()

        async def op() -> None:
            await self._prepare_spill(create=False)
            await self._adopt_if_usable()

        await self._mutate(op)
        return self._depth

    async def adopt_orphans(self) -> int:
        """Take over the slot files of the base path whose process is gone; returns how many
        writes (waiting and parked) were adopted.

        Cheap when there is nothing to adopt: a directory listing and one non-blocking lock
        attempt per other slot file (files of another target or layout are remembered and cost
        a ``stat``). An orphan is locked while it is adopted, so no two processes take it; its
        waiting and parked writes are copied into this buffer's file in one transaction (in their
        order, as older than any write of this process, only the newest per key kept, and none
        older than what this buffer holds or has written for its key), then the orphan and its
        WAL, shared memory and lock files are deleted. A crash between the two leaves the orphan
        in place to be adopted again: its writes may be replayed twice (replays are idempotent),
        never lost. Also retries a failed spill file when due. Never raises because of a file.
        """
        if self._files is None or self._files.pinned or self._closing or self._closed:
            return 0

        async def op() -> int:
            claimed = 0
            if self._failed:
                if self._monotonic() >= self._retry_at:
                    await self._recover()
            elif self._spill is None:
                claimed = await self._claim(create=False)
                self._adopted_total += claimed
            return claimed + await self._adopt_if_usable()

        return await self._mutate(op)

    async def _adopt_if_usable(self) -> int:
        files = self._files
        if files is None or files.pinned or not self._usable():
            return 0
        own = self._spill.path if self._spill is not None else None
        try:
            orphans = await self._job(lambda: files.orphans(own))
        except _SPILL_ERRORS as exc:
            logger.debug("looking for orphaned spill files of %r failed: %s", self.path, exc)
            return 0
        adopted = 0
        for index, orphan in enumerate(orphans):
            if not self._usable():
                for other in orphans[index:]:
                    await self._release(other)
                break
            adopted += await self._adopt_one(orphan)
        self._adopted_total += adopted
        return adopted

    async def _release(self, orphan: SpillFile) -> None:
        try:
            await self._job(orphan.close)
        except _SPILL_ERRORS as exc:
            logger.debug("closing spill file %r failed: %s", orphan.path, exc)

    async def _drop_orphan(self, orphan: SpillFile, exc: BaseException) -> None:
        files = self._files
        assert files is not None
        if is_corruption(exc):
            try:
                await self._job(lambda: files.set_aside_orphan(orphan, exc))
                return
            except _SPILL_ERRORS as error:
                logger.debug("setting spill file %r aside failed: %s", orphan.path, error)
        await self._release(orphan)

    async def _adopt_one(self, orphan: SpillFile) -> int:
        spill = self._spill
        assert spill is not None

        def read() -> tuple[list[RowInfo], list[int]]:
            orphan.check_all()  # rows that cannot be read go to its quarantine table, copied with it
            return list(orphan.index_rows()), orphan.parked_seqs()

        try:
            rows, parked_seqs = await self._job(read)
        except _SPILL_ERRORS as exc:
            self._collect_set_aside(orphan, adopted_from=orphan.path)
            await self._drop_orphan(orphan, exc)
            return 0
        self._collect_set_aside(orphan, adopted_from=orphan.path)
        slots = {
            row.seq: (row.method, index_key_of_canonical(row.key)) for row in rows if row.key is not None
        }
        newest: dict[Slot, RowInfo] = {}
        for row in rows:
            slot = slots.get(row.seq)
            if slot is not None:
                best = newest.get(slot)
                if best is None or (row.generation, row.stamp) >= (best.generation, best.stamp):
                    newest[slot] = row
        contested = [
            seq
            for slot in newest
            for seq, (generation, _) in self._keys.get(slot, {}).items()
            if generation != self._generation
        ]
        kept_at = {entry.seq: entry.enqueued_at for entry in await self._load(contested)} if contested else {}
        keep: list[RowInfo] = []
        victims: dict[int, Slot] = {}
        superseded = 0
        for row in rows:
            slot = slots.get(row.seq)
            if slot is not None:
                if newest[slot] is not row or slot in self._recent:
                    superseded += 1
                    continue
                ours = self._keys.get(slot)
                if ours:
                    if any(generation == self._generation for generation, _ in ours.values()):
                        superseded += 1
                        continue
                    if all(seq in kept_at for seq in ours):
                        if max(kept_at[seq] for seq in ours) >= row.enqueued_at:
                            superseded += 1
                            continue
                        victims.update(dict.fromkeys(ours, slot))
            keep.append(row)
        renumbered: dict[int, int] = {}
        for old in sorted([row.seq for row in keep] + parked_seqs):
            renumbered[old] = self._next_seq
            self._next_seq += 1
        pending_map = {row.seq: renumbered[row.seq] for row in keep}
        parked_map = {seq: renumbered[seq] for seq in parked_seqs}
        try:
            result = await self._job(
                lambda: spill.take_over(
                    orphan,
                    pending_map,
                    parked_map,
                    delete=list(victims),
                    max_bytes=self.config.max_disk_bytes,
                )
            )
        except SourceReadError as exc:
            await self._drop_orphan(orphan, exc.__cause__ or exc)
            return 0
        except _SPILL_ERRORS as exc:
            await self._release(orphan)
            await self._spill_failed(exc)
            return 0
        for row in keep:
            self._index_row(
                RowInfo(pending_map[row.seq], row.method, row.key, row.scope, row.stamp, 0, row.size)
            )
        self._count_superseded(superseded + self._apply_write(result))
        pid = orphan.previous_pid
        try:
            await self._job(orphan.remove)
        except _SPILL_ERRORS as exc:
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

    # --- index bookkeeping ------------------------------------------------------------------------

    @staticmethod
    def _slot_of(entry: DeadLetter) -> Slot | None:
        return None if entry.key is None else (entry.method, index_key_of_canonical(entry.key))

    def _remember(self, entry: DeadLetter, slot: Slot | None) -> None:
        """A new waiting entry, held in memory until the file has it."""
        self._depth += 1
        self._volatile[entry.seq] = entry
        self._memory_bytes += entry.size
        self._make_room()
        if slot is not None:
            self._keys.setdefault(slot, {})[entry.seq] = (self._generation, entry.stamp)
            if entry.scope is not None:
                self._keyed_scope[entry.seq] = entry.scope
        if entry.scope is not None:
            scope = self._scopes.setdefault((entry.method, entry.scope), _Scope())
            scope.total += 1
            scope.held[entry.seq] = None

    def _index_row(self, row: RowInfo) -> None:
        """A waiting entry of the file."""
        self._depth += 1
        if row.key is not None:
            slot = (row.method, index_key_of_canonical(row.key))
            self._keys.setdefault(slot, {})[row.seq] = (row.generation, row.stamp)
            if row.scope is not None:
                self._keyed_scope[row.seq] = row.scope
        if row.scope is not None:
            scope = self._scopes.setdefault((row.method, row.scope), _Scope())
            scope.total += 1
            if row.seq in self._memory:
                scope.held[row.seq] = None

    def _reindex(self, rows: Sequence[RowInfo]) -> None:
        """Rebuild the index from the file's ``rows`` and the memory-only entries."""
        positions = {seq: position for seqs in self._keys.values() for seq, position in seqs.items()}
        self._keys.clear()
        self._keyed_scope.clear()
        self._scopes.clear()
        self._depth = 0
        for row in rows:
            self._index_row(row)
        for entry in self._volatile.values():
            slot = self._slot_of(entry)
            self._depth += 1
            if slot is not None:
                self._keys.setdefault(slot, {})[entry.seq] = positions.get(
                    entry.seq, (self._generation, entry.stamp)
                )
                if entry.scope is not None:
                    self._keyed_scope[entry.seq] = entry.scope
            if entry.scope is not None:
                scope = self._scopes.setdefault((entry.method, entry.scope), _Scope())
                scope.total += 1
                scope.held[entry.seq] = None

    def _apply_totals(self, totals: SpillTotals) -> None:
        self._file_quarantined = totals.quarantined
        self._disk_bytes = totals.pending_bytes
        self._file_parked = totals.parked
        self._file_parked_bytes = totals.parked_bytes
        self._oldest = None if totals.oldest is None else totals.oldest[1]

    def _forget(self, seq: int, method: str, slot: Slot | None, scope: str | None) -> None:
        self._retries.pop(seq, None)
        if slot is not None and seq not in self._keys.get(slot, {}):
            slot = self._find_slot(seq) or slot
        self._depth -= 1
        held = self._memory.pop(seq, None)
        if held is None:
            held = self._volatile.pop(seq, None)
        if held is not None:
            self._memory_bytes -= held.size
        if slot is not None:
            seqs = self._keys.get(slot)
            if seqs is not None:
                seqs.pop(seq, None)
                if not seqs:
                    del self._keys[slot]
            self._keyed_scope.pop(seq, None)
        if scope is not None:
            found = self._scopes.get((method, scope))
            if found is not None:
                found.total -= 1
                found.held.pop(seq, None)
                if found.total <= 0:
                    del self._scopes[(method, scope)]

    def _forget_entry(self, entry: DeadLetter) -> None:
        self._forget(entry.seq, entry.method, self._slot_of(entry), entry.scope)

    def _forget_row(self, row: RowInfo) -> None:
        if row.parked:
            return
        if row.damaged:
            slot = self._slot_of_row(row.seq, row.method, row.key)
            scope = self._keyed_scope.get(row.seq) if slot is not None else row.scope
            self._forget(row.seq, row.method, slot, scope)
            return
        slot = None if row.key is None else (row.method, index_key_of_canonical(row.key))
        self._forget(row.seq, row.method, slot, row.scope)

    def _forget_rows(self, rows: Sequence[RowInfo]) -> None:
        for row in rows:
            self._forget_row(row)

    def _settle(self, entries: Sequence[DeadLetter]) -> None:
        """``entries`` are in the file now: keep copies in memory while the caps allow."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        for entry in entries:
            if self._volatile.pop(entry.seq, None) is None:
                continue
            if len(self._memory) + len(self._volatile) < cap_entries and self._memory_bytes <= cap_bytes:
                self._memory[entry.seq] = entry
            else:
                self._drop_payload(entry)

    def _make_room(self) -> None:
        """Keep the memory caps with the writes waiting for their commit counted: the copies of
        writes already in the file go first, oldest first."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        memory = self._memory
        while memory and (self._memory_bytes > cap_bytes or len(memory) + len(self._volatile) > cap_entries):
            _, entry = memory.popitem(last=False)
            self._drop_payload(entry)

    def _drop_payload(self, entry: DeadLetter) -> None:
        self._memory_bytes -= entry.size
        if entry.scope is not None:
            found = self._scopes.get((entry.method, entry.scope))
            if found is not None:
                found.held.pop(entry.seq, None)

    def _count_dropped(self, methods: Sequence[str], reason: str) -> None:
        counts: dict[str, int] = {}
        for method in methods:
            counts[method] = counts.get(method, 0) + 1
        for method, count in counts.items():
            self._telemetry.count_dropped(self.store_name, method, reason, count)
            self._drop_log.dropped(method, reason, count)
        self._dropped_total += len(methods)

    def _count_superseded(self, count: int) -> None:
        if count:
            self._superseded_total += count
            self._telemetry.count_superseded(self.store_name, count)

    def _count_parked(self, method: str) -> None:
        self._parked_total += 1
        self._telemetry.count_parked(self.store_name, method)

    def _apply_write(self, result: WriteResult, slots: Mapping[int, Slot] | None = None) -> int:
        """Forget what a write transaction deleted or dropped (``slots``: the known index slots of
        deleted entries); returns how many it deleted."""
        if slots:
            for row in result.deleted:
                slot = slots.get(row.seq)
                if slot is None:
                    self._forget_row(row)
                else:
                    self._forget(row.seq, row.method, slot, row.scope)
        else:
            self._forget_rows(result.deleted)
        if result.dropped:
            self._forget_rows(result.dropped)
            self._count_dropped([row.method for row in result.dropped], DROP_DISK_FULL)
        self._apply_totals(result.totals)
        return len(result.deleted)

    def _enforce_memory(self) -> None:
        """Without a usable spill file: keep memory within its caps, first by letting go of copies
        of what the file holds, then by dropping the oldest memory-only writes (counted, logged)."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        while self._memory and (
            len(self._memory) + len(self._volatile) > cap_entries or self._memory_bytes > cap_bytes
        ):
            _, held = self._memory.popitem(last=False)
            self._drop_payload(held)
        dropped: list[str] = []
        while self._volatile and (len(self._volatile) > cap_entries or self._memory_bytes > cap_bytes):
            entry = next(iter(self._volatile.values()))
            self._forget_entry(entry)
            dropped.append(entry.method)
        while self._parked_memory and (
            len(self._parked_memory) > cap_entries or self._parked_memory_bytes > cap_bytes
        ):
            _, parked = self._parked_memory.popitem(last=False)
            self._parked_memory_bytes -= parked.size
            dropped.append(parked.method)
        if dropped:
            self._count_dropped(dropped, DROP_MEMORY_FULL)

    # --- adding -----------------------------------------------------------------------------------

    def _prepare(self, item: PutItem) -> _Prepared:
        method, args, kwargs, key, scope, stamp, error = item
        check_text(method, "method")
        call = encode_call(method, tuple(args), kwargs)
        canonical = canonical_key(key)
        slot = None if key is None else index_key(key)
        if scope is not None and not isinstance(scope, str):
            scope = None
        if scope is not None:
            check_text(scope, "scope")
        text = dumps(call)
        entry = DeadLetter(
            seq=0,
            method=method,
            call=call,
            key=canonical,
            scope=scope,
            stamp=int(stamp),
            enqueued_at=0.0,
            size=len(text.encode("utf-8")),
            error=_text(str(error))[:1000],
        )
        return entry, slot, text

    async def put(
        self,
        method: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        key: Any = None,
        scope: str | None = None,
        stamp: int,
        error: str,
    ) -> DeadLetter:
        """Keep a write that finally failed; with a usable spill file, committed before this returns.

        ``key`` is the method's last-write-wins key (a string or tuple, ``None`` for appends),
        ``scope`` the trace or session the write belongs to, ``stamp`` the call-order number of
        the call. Waiting entries of the same ``(method, key)`` with a smaller stamp are replaced;
        when a newer write of the key is already waiting or has succeeded, this one is discarded
        as superseded (the returned entry is then not kept).

        Raises :class:`~guarded.errors.InvalidPayloadError` (nothing kept) when the call cannot be
        encoded: the caller should :meth:`park` it. Never raises because of the spill file: when
        it cannot take the write, the write is held in memory (see the module docs). A caller
        cancelled while its write is being committed leaves it kept.
        """
        entries = await self.put_many([(method, args, kwargs, key, scope, stamp, error)])
        return entries[0]

    async def put_many(self, items: Sequence[PutItem]) -> list[DeadLetter]:
        """:meth:`put` for many writes in one transaction (a failed batch of events).

        Every call is encoded first: if one cannot be, :class:`InvalidPayloadError` is raised and
        nothing is kept. Concurrent calls share transactions (group commit).
        """
        prepared = [self._prepare(item) for item in items]
        if not prepared:
            return []
        self._check_open()
        if self._files is None:
            results, _, _, _ = self._add(prepared)
            self._enforce_memory()
            return results
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[DeadLetter]] = loop.create_future()
        self._incoming.append((prepared, waiter))
        if self._committer is None:
            self._committer = loop.create_task(
                self._commit_loop(), name=f"guarded-dlq-commit-{self.store_name}"
            )
        # Cancelling the caller cancels only its waiter: the queued write is committed all the same.
        return await waiter

    async def _commit_loop(self) -> None:
        """Commit queued puts, one transaction per group, until none is queued."""
        group: list[tuple[list[_Prepared], asyncio.Future[list[DeadLetter]]]] = []
        try:
            while self._incoming:
                async with self._lock():
                    group, self._incoming = self._incoming, []
                    results = await self._commit_group([item for prepared, _ in group for item in prepared])
                offset = 0
                for prepared, waiter in group:
                    if not waiter.done():
                        waiter.set_result(results[offset : offset + len(prepared)])
                    offset += len(prepared)
                group = []
        except BaseException as exc:
            waiting, self._incoming = [*group, *self._incoming], []
            for _, waiter in waiting:
                if waiter.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(exc)
                    waiter.exception()  # retrieved: the caller re-raises it, nobody else should log it
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._committer = None

    async def _commit_group(self, prepared: Sequence[_Prepared]) -> list[DeadLetter]:
        """(Under the lock.) Coalesce ``prepared`` against what waits and commit it in one
        transaction; what the file cannot take stays in memory."""
        await self._prepare_spill(create=True)
        results, kept, victims, texts = self._add(prepared)
        if self._usable():
            if kept or victims:
                await self._write_group(kept, victims, texts)
        elif victims:
            for seq, slot in victims.items():
                self._defer_delete(seq, slot)
            self._count_superseded(len(victims))
        if not self._usable():
            self._enforce_memory()
        return results

    async def _write_group(
        self, kept: list[DeadLetter], victims: dict[int, Slot], texts: dict[int, str]
    ) -> None:
        spill = self._spill
        assert spill is not None
        current = self._generation
        try:
            result = await self._job(
                lambda: spill.write(
                    kept,
                    generation=current,
                    delete=list(victims),
                    max_bytes=self.config.max_disk_bytes,
                    texts=texts,
                )
            )
        except _SPILL_ERRORS as exc:
            for seq, slot in victims.items():
                self._defer_delete(seq, slot)
            self._count_superseded(len(victims))
            await self._spill_failed(exc)
            return
        self._count_superseded(self._apply_write(result, victims))
        self._settle(kept)

    def _add(
        self, prepared: Sequence[_Prepared]
    ) -> tuple[list[DeadLetter], list[DeadLetter], dict[int, Slot], dict[int, str]]:
        """Number ``prepared`` and coalesce it with what waits: returns every entry, those to
        store, the file's entries they replace (to delete with them) and the calls' JSON texts."""
        now = self._clock()
        results: list[DeadLetter] = []
        kept: dict[int, DeadLetter] = {}
        victims: dict[int, Slot] = {}
        texts: dict[int, str] = {}
        superseded = 0
        for template, index, text in prepared:
            entry = _with(template, seq=self._next_seq, enqueued_at=now)
            self._next_seq += 1
            results.append(entry)
            self._telemetry.count_enqueued(self.store_name, entry.method)
            slot: Slot | None = None
            if index is not None:
                slot = (entry.method, index)
                position = (self._generation, entry.stamp)
                recent = self._recent.get(slot)
                waiting = self._keys.get(slot)
                if (recent is not None and entry.stamp < recent) or (
                    waiting and any(other > position for other in waiting.values())
                ):
                    superseded += 1
                    continue
                if waiting:
                    for seq in list(waiting):
                        older = self._volatile.get(seq)
                        if older is not None:
                            kept.pop(seq, None)
                            self._forget(seq, older.method, slot, older.scope)
                            superseded += 1
                        else:
                            victims[seq] = slot
            self._remember(entry, slot)
            kept[entry.seq] = entry
            texts[entry.seq] = text
        self._enqueued_total += len(results)
        self._count_superseded(superseded)
        return results, list(kept.values()), victims, texts

    # --- last-write-wins keys ---------------------------------------------------------------------

    async def supersede(self, method: str, key: Any, stamp: int) -> int:
        """A direct write of ``(method, key)`` with call stamp ``stamp`` succeeded: drop the waiting
        entries of that key with a smaller stamp. Returns how many were dropped.

        Cheap when nothing of the key waits (one dictionary lookup); the guard calls it after
        every successful upsert.
        """
        try:
            slot = (method, index_key(key))
        except InvalidPayloadError:
            return 0
        if self._depth:
            self._healthy_at = self._monotonic()  # the backend takes writes: failed replays count
        recent = self._recent
        if recent.get(slot, stamp - 1) < stamp:
            recent[slot] = stamp
            recent.move_to_end(slot)
            if len(recent) > RECENT_WRITES:
                recent.popitem(last=False)
        if slot not in self._keys:
            return 0

        async def op() -> int:
            waiting = self._keys.get(slot)
            position = (self._generation, stamp)
            stale = [seq for seq, other in (waiting or {}).items() if other < position]
            if not stale:
                return 0
            removed = await self._remove(slot, stale)
            self._count_superseded(removed)
            return removed

        return await self._mutate(op)

    async def _remove(self, slot: Slot, seqs: Sequence[int]) -> int:
        """(Under the lock.) Remove waiting entries of ``slot``; returns how many were there."""
        removed = 0
        in_file: list[int] = []
        for seq in seqs:
            entry = self._volatile.get(seq)
            if entry is not None:
                self._forget(seq, entry.method, slot, entry.scope)
                removed += 1
            elif seq in self._keys.get(slot, {}):
                in_file.append(seq)
        if not in_file:
            return removed
        spill = self._spill
        if spill is not None and self._usable():
            try:
                result = await self._job(lambda: spill.delete(in_file))
            except _SPILL_ERRORS as exc:
                for seq in in_file:
                    self._defer_delete(seq, slot)
                await self._spill_failed(exc)
                return removed + len(in_file)
            return removed + self._apply_write(result)
        for seq in in_file:
            self._defer_delete(seq, slot)
        return removed + len(in_file)

    async def _load(self, seqs: Sequence[int]) -> list[DeadLetter]:
        found: list[DeadLetter] = []
        missing: list[int] = []
        for seq in seqs:
            entry = self._memory.get(seq) or self._volatile.get(seq)
            if entry is None:
                missing.append(seq)
            else:
                found.append(entry)
        spill = self._spill
        if missing and spill is not None:
            found.extend(await self._read(lambda: spill.fetch(missing), []))
            found.sort(key=lambda entry: entry.seq)
        return found

    def _decode(self, entry: DeadLetter) -> Call | None:
        try:
            return decode_call(entry.method, entry.call, self._types)
        except InvalidPayloadError as exc:
            logger.error(
                "dead-letter entry %d of store %r cannot be decoded: %s",
                entry.seq,
                self.store_name,
                exc.reason,
                extra={"event": "deadletter_undecodable", "store": self.store_name, "method": entry.method},
            )
            return None

    async def latest_for_key(self, method: str, key: Any) -> Call | None:
        """The newest waiting call of ``(method, key)``, decoded, or ``None`` (cheap when none waits)."""
        try:
            seqs = self._keys.get((method, index_key(key)))
        except InvalidPayloadError:
            return None
        if not seqs:
            return None
        found = await self._load([max(seqs)])
        return self._decode(found[0]) if found else None

    async def take(self, method: str, key: Any) -> Call | None:
        """Remove every waiting call of ``(method, key)`` and return the newest, decoded (``None``
        when none waits). Used to consume a dead-lettered planner state: it is never replayed then."""
        try:
            slot = (method, index_key(key))
        except InvalidPayloadError:
            return None
        if slot not in self._keys:
            return None

        async def op() -> DeadLetter | None:
            seqs = sorted(self._keys.get(slot, {}))
            if not seqs:
                return None
            found = await self._load([seqs[-1]])
            removed = await self._remove(slot, seqs)
            self._count_superseded(max(0, removed - 1))
            return found[0] if found else None

        entry = await self._mutate(op)
        return None if entry is None else self._decode(entry)

    async def pending_for_scope(self, method: str, scope: str) -> list[Call]:
        """The waiting calls of ``method`` in ``scope`` (a trace or session), decoded, oldest first.

        Cheap (no file access) when nothing of that scope waits.
        """
        found = self._scopes.get((method, scope))
        if found is None or found.total <= 0:
            return []
        held = [
            entry
            for seq in list(found.held)
            if (entry := self._memory.get(seq) or self._volatile.get(seq)) is not None
        ]
        spill = self._spill
        if len(found.held) >= found.total or spill is None:
            entries = sorted(held, key=lambda entry: entry.seq)
        else:
            no_entries: list[DeadLetter] = []
            merged = {
                entry.seq: entry
                for entry in await self._read(lambda: spill.for_scope(method, scope), no_entries)
                if entry.seq not in self._pending_deletes
            }
            merged.update((entry.seq, entry) for entry in held if entry.seq in self._volatile)
            entries = sorted(merged.values(), key=lambda entry: entry.seq)
        calls = [self._decode(entry) for entry in entries]
        return [call for call in calls if call is not None]

    # --- parking ----------------------------------------------------------------------------------

    async def park(
        self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any], *, reason: str
    ) -> ParkedWrite:
        """Keep a write refused as bad data, with its reason; never replayed automatically.

        When the call itself cannot be encoded, only the reason is kept (``call`` is ``None``).
        Never raises because of the spill file (it is then kept in memory).
        """
        call: JSONObject | None
        reason = _text(str(reason))
        try:
            call = encode_call(method, tuple(args), kwargs)
            size = len(dumps(call).encode("utf-8"))
        except InvalidPayloadError as exc:
            call, size = None, 0
            detail = _text(str(exc))
            if not reason:
                reason = detail
            elif detail not in reason:
                reason = f"{reason} (call not kept: {detail})"
        method = _text(method)
        self._check_open()

        async def op() -> ParkedWrite:
            await self._prepare_spill(create=True)
            parked = ParkedWrite(
                seq=self._next_seq,
                method=method,
                call=call,
                reason=reason[:2000],
                parked_at=self._clock(),
                size=size,
            )
            self._next_seq += 1
            await self._keep_parked(parked)
            self._count_parked(method)
            return parked

        return await self._mutate(op)

    async def _keep_parked(self, parked: ParkedWrite) -> None:
        spill = self._spill
        if spill is not None and self._usable():
            try:
                result = await self._job(lambda: spill.park([parked], max_bytes=self.config.max_disk_bytes))
            except _SPILL_ERRORS as exc:
                await self._spill_failed(exc)
            else:
                self._apply_write(result)
                return
        self._parked_memory[parked.seq] = parked
        self._parked_memory_bytes += parked.size
        if self._usable():
            await self._flush()  # a fresh file replaced a damaged one
        else:
            self._enforce_memory()

    async def _park_entry(self, entry: DeadLetter, reason: str, epoch: int) -> bool:
        """(Under the lock.) Park a waiting entry the backend refused; ``False`` when it no longer waits."""
        if entry.seq not in self._volatile and (epoch != self._epoch or not self._still_waiting(entry)):
            return False
        reason = _text(reason)[:2000]
        now = self._clock()
        slot = self._slot_of(entry)
        spill = self._spill
        if entry.seq not in self._volatile and spill is not None and self._usable():
            try:
                result = await self._job(lambda: spill.park_pending(entry.seq, reason=reason, parked_at=now))
            except _SPILL_ERRORS as exc:
                await self._spill_failed(exc)
                if self._epoch != epoch:
                    return await self._park_entry(entry, reason, self._epoch)
            else:
                if not self._apply_write(result):
                    return False
                self._count_parked(entry.method)
                return True
        if entry.seq in self._volatile:
            self._forget(entry.seq, entry.method, slot, entry.scope)
        else:
            self._defer_delete(entry.seq, slot)
        self._parked_memory[entry.seq] = ParkedWrite(
            entry.seq, entry.method, entry.call, reason, now, entry.size
        )
        self._parked_memory_bytes += entry.size
        if self._usable():
            await self._flush()
        else:
            self._enforce_memory()
        self._count_parked(entry.method)
        return True

    # --- replay -----------------------------------------------------------------------------------

    def _still_waiting(self, entry: DeadLetter) -> bool:
        if entry.seq in self._volatile:
            return True
        if entry.seq in self._pending_deletes:
            return False
        if entry.key is not None:
            seqs = self._keys.get((entry.method, index_key_of_canonical(entry.key)))
            return seqs is not None and entry.seq in seqs
        return self._spill is not None

    async def _page(self, after: int, limit: int | None) -> list[DeadLetter]:
        """Waiting entries after ``after`` in order: the file's and the memory-only ones."""
        spill = self._spill
        found: list[DeadLetter] = []
        if spill is not None:
            read = await self._read(lambda: spill.page(after, limit), None)
            if read is None:  # the file cannot be read: what memory holds of it
                found = [entry for seq, entry in self._memory.items() if seq > after]
            elif self._pending_deletes:
                found = [entry for entry in read if entry.seq not in self._pending_deletes]
            else:
                found = read
        volatile = [entry for seq, entry in self._volatile.items() if seq > after]
        if volatile:
            merged = {entry.seq: entry for entry in found}
            merged.update((entry.seq, entry) for entry in volatile)
            found = sorted(merged.values(), key=lambda entry: entry.seq)
        return found if limit is None else found[:limit]

    async def _replayed(self, entries: Sequence[DeadLetter], epoch: int) -> int:
        async def op() -> list[DeadLetter]:
            done = await removed()
            # Counted here, inside the operation: it completes even when the replaying task is
            # cancelled meanwhile (a drain stops a background pass), so no replay goes uncounted.
            for entry in done:
                self._telemetry.count_replayed(self.store_name, entry.method)
            self._replayed_total += len(done)
            return done

        async def removed() -> list[DeadLetter]:
            done: list[DeadLetter] = []
            in_file: list[DeadLetter] = []
            for entry in entries:
                if entry.seq in self._volatile:
                    self._forget_entry(entry)
                    done.append(entry)
                elif epoch == self._epoch:
                    in_file.append(entry)
            if not in_file:
                return done
            spill = self._spill
            if spill is not None and self._usable():
                seqs = [entry.seq for entry in in_file]
                try:
                    result = await self._job(lambda: spill.delete(seqs))
                except _SPILL_ERRORS as exc:
                    done.extend(self._defer_replayed(in_file))
                    await self._spill_failed(exc)
                else:
                    deleted = {row.seq for row in result.deleted}
                    self._apply_write(result)
                    done.extend(entry for entry in in_file if entry.seq in deleted)
            elif spill is not None:
                done.extend(self._defer_replayed(in_file))
            return done

        return len(await self._mutate(op))

    def _defer_replayed(self, entries: Sequence[DeadLetter]) -> list[DeadLetter]:
        done: list[DeadLetter] = []
        for entry in entries:
            if not self._still_waiting(entry):
                continue
            self._defer_delete(entry.seq, self._slot_of(entry))
            done.append(entry)
        return done

    async def _park_during_replay(self, entry: DeadLetter, reason: str, epoch: int) -> bool:
        return await self._mutate(lambda: self._park_entry(entry, reason, epoch))

    async def replay(
        self,
        send: Send,
        *,
        send_bulk: SendBulk | None = None,
        bulk_methods: Collection[str] = BATCHED_BULK_FORMS,
        rate: float | None = None,
        batch: int | None = None,
        target: object | None = None,
        stop_after: int = REPLAY_FAILURE_STREAK,
    ) -> ReplaySummary:
        """One pass over the waiting writes in order, sending each with ``send``.

        **Order is kept per key and per stream, not across the buffer.** ``OK`` removes the entry,
        ``REJECTED`` parks it with the reason. A failure (``RETRY_LATER``, or an exception that is
        not bad data) keeps it and gives it a backoff of its own (the next pass, then 0.5 s
        doubling up to 30 s, see :func:`~.replay.replay_backoff`): until it is due, it and the later
        entries of its last-write-wins key and of its stream (its ``scope``: the events of a trace,
        the updates of a session, ...) wait, while every other key and stream goes on. A failure
        counts toward parking the entry only when the backend took other writes meanwhile (a
        success in the same pass, a successful direct write of a key since the entry's previous
        attempt) and is not operational (a missing table: the data is fine); after
        ``config.max_replay_attempts`` counted failures it is parked with its last error. A call
        that can never succeed is parked at its first attempt: a stored call that does not decode,
        a method name the store does not have (``AttributeError``), a call that does not bind to
        the method's signature (checked before sending against ``target``'s own method when the
        store is given, else against the protocol's; see :class:`~.replay.CallCheck`).

        **A backend that is down is not hammered.** After ``stop_after`` failed sends in a row of
        one method (no success between them) that method waits for the next pass; after
        ``stop_after`` in a row spanning two methods or more, or as soon as the guard's circuit
        breaker refuses a send, the pass stops (``summary.backend_down``). A success shows the
        backend is back: entries whose failures it did not count become due at once.

        With ``send_bulk``, each page of entries is taken stream by stream (the order of every key
        and stream is kept; writes of different streams are independent), and runs of consecutive
        entries of one method in ``bulk_methods`` (at most
        ``batch``, default ``config.replay_batch``) go out as one bulk write; a keyed entry joins a
        run only once no newer direct write of its key is in flight (its :class:`~.gate.KeyGate`
        slot is held for the bulk write, so no direct write of it starts meanwhile) and only if it
        still waits then. A bulk write that fails in any way is sent again one by one, so only
        its bad entries fail. Writes are paced to ``rate`` per second (``None``:
        ``config.replay_rate``; ``math.inf``: not paced, at the backend's pace). Passes of one
        buffer never overlap.
        """
        if self._replaying is None:
            self._replaying = asyncio.Lock()
        async with self._replaying:
            await self._mutate(lambda: self._prepare_spill(create=False))
            return await self._replay(
                _Sending(
                    send,
                    send_bulk,
                    frozenset(bulk_methods),
                    TokenBucket(rate if rate is not None else self.config.replay_rate),
                    max(1, batch if batch is not None else self.config.replay_batch),
                    CallCheck(target),
                ),
                _Pass(started=self._monotonic(), stop_after=max(1, stop_after), epoch=self._epoch),
            )

    async def _replay(self, sending: _Sending, tally: _Pass) -> ReplaySummary:
        last = self._next_seq - 1
        cursor = 0
        first = True
        while self._live(tally):
            page = await self._page(cursor, max(sending.batch, _PAGE))
            if first and not page:
                tally.found_nothing = True
            first = False
            page = [entry for entry in page if entry.seq <= last]
            if not page:
                break
            cursor = page[-1].seq
            if sending.send_bulk is not None:
                page = _by_stream(page)
            index = 0
            while index < len(page) and self._live(tally):
                entry = page[index]
                if not self._still_waiting(entry) or self._held_back(entry, tally):
                    index += 1
                    continue
                if sending.send_bulk is not None and entry.method in sending.bulk_methods:
                    index = await self._replay_run(page, index, sending, tally)
                else:
                    index += 1
                    await self._replay_single(entry, None, sending, tally, paid=False)
        await self._end_pass(tally)
        return self._summary(tally)

    def _live(self, tally: _Pass) -> bool:
        return tally.epoch == self._epoch and not tally.stopped

    def _held_back(self, entry: DeadLetter, tally: _Pass) -> bool:
        """Whether ``entry`` waits for a later pass (its backoff, a failed entry of its key or stream
        in this pass, its method held back); its key and stream then wait too."""
        lanes = _lanes(entry)
        state = self._retries.get(entry.seq)
        due = state is not None and state.due > self._monotonic()
        if not due and _stream(entry.method) not in tally.held_methods and tally.blocked.isdisjoint(lanes):
            return False
        tally.blocked.update(lanes)
        tally.deferred += 1
        if due:
            tally.backing_off.add(entry.seq)
        return True

    def _ready(self, entry: DeadLetter, check: CallCheck) -> Call | str:
        """The decoded call of ``entry``, or why it can never succeed."""
        problem = check.method_problem(entry.method)
        if problem is not None:
            return problem
        call = self._decode(entry)
        if call is None:
            return "stored call cannot be decoded"
        problem = check.problem(entry.method, call)
        return call if problem is None else problem

    async def _replay_single(
        self, entry: DeadLetter, call: Call | None, sending: _Sending, tally: _Pass, *, paid: bool
    ) -> None:
        if call is None:
            ready = self._ready(entry, sending.check)
            if isinstance(ready, str):
                await self._park_now(entry, ready, tally)
                return
            call = ready
        doubt = sending.check.doubtful(entry.method, call)
        if not paid:
            await sending.pacer.take(1)
        outcome = await self._send_one(sending.send, entry, call, tally.epoch)
        if outcome is None:
            return
        if outcome.result is ReplayResult.OK:
            tally.replayed += await self._replayed([entry], tally.epoch)
            self._succeeded(entry.method, tally)
        elif outcome.unknown_method(entry.method):
            await self._park_now(entry, f"the store has no method {entry.method!r}", tally)
        elif doubt is not None and isinstance(outcome.error, TypeError):
            await self._park_now(entry, doubt, tally)  # the call's own fault, said in our words
        elif outcome.result is ReplayResult.REJECTED:
            self._answered(entry.method, tally)
            await self._park_now(entry, outcome.reason or "rejected by the backend", tally)
        elif outcome.refused_by_breaker:
            self._stop(tally, outcome.reason)
        else:
            self._send_failed(entry, outcome, tally)

    async def _replay_run(
        self, page: Sequence[DeadLetter], index: int, sending: _Sending, tally: _Pass
    ) -> int:
        """Replay the bulk run starting at ``page[index]``; returns the index after it."""
        method = page[index].method
        run, entered, bad, index = await self._gather_run(page, index, sending, tally)
        assert sending.send_bulk is not None
        outcome: Attempt | None = None
        try:
            if len(run) > 1:
                sending.pacer.debit(len(run) - 1)
                outcome = await attempt_bulk(sending.send_bulk, method, [call for _, call in run])
        finally:
            for slot in entered:
                self.gate.leave_replay(slot)
        for entry, reason in bad:
            await self._park_now(entry, reason, tally)
        if outcome is not None and outcome.result is ReplayResult.OK:
            tally.replayed += await self._replayed([item for item, _ in run], tally.epoch)
            self._succeeded(method, tally)
            return index
        if outcome is not None and outcome.refused_by_breaker:
            self._stop(tally, outcome.reason)
            return index
        # A lone entry, or a bulk write that failed: one by one, so only a bad entry fails.
        paid = len(run) == 1
        for item, call in run:
            if not self._live(tally):
                break
            if self._still_waiting(item) and not self._held_back(item, tally):
                await self._replay_single(item, call, sending, tally, paid=paid)
            paid = False
        return index

    async def _gather_run(
        self, page: Sequence[DeadLetter], index: int, sending: _Sending, tally: _Pass
    ) -> tuple[list[tuple[DeadLetter, Call]], list[Slot], list[tuple[DeadLetter, str]], int]:
        """The run of waiting entries of ``page[index].method`` from ``index`` for one bulk write:
        ``(entries with their calls, gate slots entered for them, entries that can never succeed
        with the reason, next index)``.

        Entries waiting for a later pass are passed over (their key and stream wait with them). A
        call that looks like it cannot succeed goes alone (it ends the run before it, or is a run
        of its own). The first keyed entry may wait for its key's newer direct writes; later ones
        join only if their slot can be entered at once, so the run never waits while it holds slots.
        """
        method = page[index].method
        check = sending.check
        run: list[tuple[DeadLetter, Call]] = []
        entered: dict[Slot, None] = {}
        bad: list[tuple[DeadLetter, str]] = []
        await sending.pacer.take(1)
        position = index
        while position < len(page) and len(run) < sending.batch and page[position].method == method:
            item = page[position]
            if not self._still_waiting(item) or self._held_back(item, tally):
                position += 1
                continue
            ready = self._ready(item, check)
            if isinstance(ready, str):
                bad.append((item, ready))
                position += 1
                continue
            alone = check.doubtful(method, ready) is not None
            if alone and run:
                break
            if item.key is not None:
                slot: Slot = (item.method, index_key_of_canonical(item.key))
                if slot not in entered:
                    found = self._keys.get(slot, {}).get(item.seq)
                    if found is None:
                        position += 1
                        continue
                    generation, stamp = found
                    earlier = generation < self._generation
                    if not entered:
                        await self.gate.enter_replay(slot, stamp, earlier_process=earlier)
                    elif not self.gate.try_enter_replay(slot, stamp, earlier_process=earlier):
                        break
                    entered[slot] = None
                if tally.epoch != self._epoch or not self._still_waiting(item):
                    position += 1
                    continue
            run.append((item, ready))
            position += 1
            if alone:
                break
        return run, list(entered), bad, position

    def slot(self, method: str, key: Any) -> Slot | None:
        """The :class:`~.gate.KeyGate` slot of ``(method, key)``; ``None`` for a key JSON cannot carry."""
        try:
            return (method, index_key(key))
        except InvalidPayloadError:
            return None

    async def _send_one(self, send: Send, entry: DeadLetter, call: Call, epoch: int) -> Attempt | None:
        """Send one held write; a keyed one only after newer direct writes of its key finished and
        only if it still waits then (``None``: it no longer does, nothing was sent)."""
        if entry.key is None:
            return await attempt(send, entry.method, call)
        slot: Slot = (entry.method, index_key_of_canonical(entry.key))
        position = self._keys.get(slot, {}).get(entry.seq)
        if position is None:
            return None
        generation, stamp = position
        await self.gate.enter_replay(slot, stamp, earlier_process=generation < self._generation)
        try:
            if epoch != self._epoch or not self._still_waiting(entry):
                return None
            return await attempt(send, entry.method, call)
        finally:
            self.gate.leave_replay(slot)

    async def _park_now(self, entry: DeadLetter, reason: str, tally: _Pass) -> None:
        if await self._park_during_replay(entry, reason, tally.epoch):
            tally.parked += 1
            tally.last_error = reason

    def _answered(self, method: str, tally: _Pass) -> None:
        """The backend answered a send (it took it or refused its data): it is up."""
        tally.answered = True
        tally.streak = 0
        tally.streak_methods.clear()
        tally.method_streaks.pop(_stream(method), None)
        self._healthy_at = self._monotonic()

    def _succeeded(self, method: str, tally: _Pass) -> None:
        self._answered(method, tally)

    def _stop(self, tally: _Pass, reason: str | None) -> None:
        tally.stopped = tally.backend_down = True
        tally.last_error = reason or "the backend looks down"

    def _send_failed(self, entry: DeadLetter, outcome: Attempt, tally: _Pass) -> None:
        """A send of ``entry`` failed and may succeed later: its own backoff, its key and stream
        wait behind it for this pass, and too many failures in a row end the pass."""
        now = self._monotonic()
        reason = outcome.reason or "the backend asked to retry later"
        state = self._retries.get(entry.seq)
        if state is None:
            state = self._retries[entry.seq] = _Retry()
        since = state.failed_at if state.failures else tally.started
        state.failures += 1
        state.failed_at = now
        state.reason = reason
        state.due = now + replay_backoff(state.failures)
        state.uncounted = False
        if not outcome.operational:
            tally.suspects.append((entry, state, since))
        tally.failed += 1
        tally.last_error = reason
        tally.blocked.update(_lanes(entry))
        tally.backing_off.add(entry.seq)
        stream = _stream(entry.method)
        tally.streak += 1
        tally.streak_methods.add(stream)
        tally.method_streaks[stream] = tally.method_streaks.get(stream, 0) + 1
        if tally.method_streaks[stream] >= tally.stop_after:
            tally.held_methods.add(stream)
        if tally.streak >= tally.stop_after and len(tally.streak_methods) > 1:
            tally.stopped = tally.backend_down = True

    async def _end_pass(self, tally: _Pass) -> None:
        """Count the pass's failures toward parking where the backend showed it was up, park
        entries that reached ``config.max_replay_attempts``, and make entries whose failures were
        not counted due at once when it did."""
        limit = self.config.max_replay_attempts
        for entry, state, since in tally.suspects:
            if not (tally.answered or self._healthy_at >= since):
                state.uncounted = True
                continue
            state.attempts += 1
            if state.attempts >= limit and self._live_entry(entry, tally):
                reason = f"gave up after {state.attempts} failed replays; last error: {state.reason}"
                await self._park_now(entry, reason, tally)
        if tally.answered:
            now = self._monotonic()
            for state in self._retries.values():
                if state.uncounted and state.due > now:
                    state.due = now
        if (
            tally.found_nothing
            and tally.epoch == self._epoch
            and self._depth > 0
            and not self._volatile
            and not self._pending_deletes
            and self._usable()
        ):
            await self._resync()

    def _live_entry(self, entry: DeadLetter, tally: _Pass) -> bool:
        return tally.epoch == self._epoch and self._still_waiting(entry)

    async def _resync(self) -> None:
        """The file holds no waiting write but the count says some wait (rows that could not be
        read and were set aside while counted): count again from the file."""

        async def op() -> None:
            spill = self._spill
            if spill is None or not self._usable() or self._volatile or self._pending_deletes:
                return
            try:
                rows = await self._job(lambda: list(spill.index_rows()))
                totals = await self._job(spill.totals)
            except _SPILL_ERRORS as exc:
                self._read_failed(spill, exc)
                return
            if self._depth != len(rows):
                logger.warning(
                    "dead-letter buffer of store %r counted %d waiting write(s), its spill file holds %d: "
                    "counted again",
                    self.store_name,
                    self._depth,
                    len(rows),
                    extra={"event": "deadletter_recounted", "store": self.store_name},
                )
                self._reindex(rows)
                self._epoch += 1
            self._apply_totals(totals)

        await self._mutate(op)

    def _summary(self, tally: _Pass) -> ReplaySummary:
        left = tally.stopped or tally.failed > 0 or tally.deferred > 0
        dues = [state.due for seq in tally.backing_off if (state := self._retries.get(seq)) is not None]
        retry_in = max(0.0, min(dues) - self._monotonic()) if dues else None
        return ReplaySummary(
            replayed=tally.replayed,
            parked=tally.parked,
            remaining=self._depth,
            stopped_early=left and self._depth > 0,
            last_error=tally.last_error,
            failed=tally.failed,
            deferred=tally.deferred,
            retry_in=retry_in,
            backend_down=tally.backend_down,
        )

    # --- inspection and maintenance ---------------------------------------------------------------

    async def entries(self, limit: int | None = None) -> list[DeadLetter]:
        """Waiting writes, oldest first, at most ``limit``."""
        await self._mutate(lambda: self._prepare_spill(create=False))
        return await self._page(0, limit)

    async def parked(self, limit: int | None = None) -> list[ParkedWrite]:
        """Parked writes, oldest first, at most ``limit``."""
        await self._mutate(lambda: self._prepare_spill(create=False))
        spill = self._spill
        found: list[ParkedWrite] = []
        if spill is not None:
            found = await self._read(lambda: spill.parked(limit), found)
        if self._parked_memory:
            found = sorted([*found, *self._parked_memory.values()], key=lambda write: write.seq)
        return found if limit is None else found[:limit]

    async def unpark(self, limit: int | None = None) -> int:
        """Move parked writes that kept their call back to the waiting writes (once the cause was
        fixed); returns how many. They keep their place in the order and yield to newer writes
        of their key."""

        async def op() -> int:
            await self._prepare_spill(create=False)
            moved = self._unpark_memory(limit)
            left = None if limit is None else limit - moved
            spill = self._spill
            if spill is not None and self._usable() and (left is None or left > 0):

                def move() -> tuple[WriteResult, list[RowInfo]]:
                    result = spill.unpark(left)
                    return result, list(spill.index_rows())

                try:
                    result, rows = await self._job(move)
                except _SPILL_ERRORS as exc:
                    await self._spill_failed(exc)
                else:
                    before = self._depth
                    self._reindex(rows)
                    self._apply_totals(result.totals)
                    self._epoch += 1
                    moved += self._depth - before
            if moved and self._usable() and self._volatile:
                await self._flush()
            return moved

        return await self._mutate(op)

    def _unpark_memory(self, limit: int | None) -> int:
        movable = [parked for parked in self._parked_memory.values() if parked.call is not None]
        if limit is not None:
            movable = movable[:limit]
        for parked in movable:
            assert parked.call is not None
            del self._parked_memory[parked.seq]
            self._parked_memory_bytes -= parked.size
            self._remember(
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
            self._volatile = OrderedDict(sorted(self._volatile.items()))
            self._epoch += 1
        return len(movable)

    async def purge(self, *, pending: bool, parked: bool, quarantined: bool = False) -> int:
        """Delete every waiting and/or parked write, and/or the quarantined rows of the spill file
        (an operator's decision: logged, not counted as dropped); returns how many were deleted."""

        async def op() -> int:
            await self._prepare_spill(create=False)
            removed = 0
            spill = self._spill
            file_purged = spill is None
            if spill is not None and self._usable():
                try:
                    removed += await self._job(
                        lambda: spill.purge(pending=pending, parked=parked, quarantined=quarantined)
                    )
                    self._apply_totals(await self._job(spill.totals))
                    file_purged = True
                except _SPILL_ERRORS as exc:
                    await self._spill_failed(exc)
            if pending:
                removed += len(self._volatile)
                if file_purged:
                    self._memory.clear()
                    self._volatile.clear()
                    self._memory_bytes = 0
                    self._keys.clear()
                    self._keyed_scope.clear()
                    self._scopes.clear()
                    self._pending_deletes.clear()
                    self._retries.clear()
                    self._depth = 0
                    self._oldest = None
                else:
                    for entry in list(self._volatile.values()):
                        self._forget_entry(entry)
                self._epoch += 1
            if parked:
                removed += len(self._parked_memory)
                self._parked_memory.clear()
                self._parked_memory_bytes = 0
            return removed

        removed = await self._mutate(op)
        logger.warning(
            "dead-letter buffer of store %r purged %d write(s)",
            self.store_name,
            removed,
            extra={
                "event": "deadletter_purged",
                "store": self.store_name,
                "purged": removed,
                "pending": pending,
                "parked": parked,
                "quarantined": quarantined,
            },
        )
        return removed

    async def quarantined(self, limit: int | None = None, *, with_raw: bool = False) -> list[QuarantinedRow]:
        """Rows of the spill file that could not be read and were moved to its quarantine table,
        oldest first, at most ``limit``; ``with_raw`` includes their raw column values (payload
        contents)."""
        await self._mutate(lambda: self._prepare_spill(create=False))
        spill = self._spill
        found: list[QuarantinedRow] = []
        if spill is None:
            return found
        return await self._read(lambda: spill.quarantined(limit, with_raw=with_raw), found)

    async def aclose(self) -> None:
        """Commit what is queued, make one last attempt to move memory-only writes into a failed
        spill file, close the file (releasing its lock) and stop exporting gauges.

        Waiting writes stay in the file for the next process (the caller reports what is left:
        :attr:`depth`, :attr:`memory_only`, :attr:`spill_path`); an empty slot file other than
        the base path itself is removed. Never raises (failures are logged).
        """
        if self._closing or self._closed:
            return
        self._closing = True
        try:
            committer = self._committer
            if committer is not None:
                await asyncio.wait({committer})
            async with self._lock():
                if self._failed and (self._volatile or self._parked_memory or self._pending_deletes):
                    try:
                        await self._recover()
                    except Exception:
                        logger.exception(
                            "last attempt to use the spill file of store %r failed", self.store_name
                        )
                self._closed = True
                self._telemetry.buffers.discard(self)
                spill, executor = self._spill, self._executor
                self._spill = self._executor = None
                if executor is not None:
                    if spill is not None:
                        await self._close_file(spill, executor)
                    executor.shutdown(wait=False)
        except Exception:
            self._closed = True
            logger.exception("closing the dead-letter buffer of store %r failed", self.store_name)

    async def _close_file(self, spill: SpillFile, executor: ThreadPoolExecutor) -> None:
        files = self._files
        removable = (
            files is not None
            and not files.pinned
            and slot_of(files.base, spill.path) not in (None, 0)
            and spill.is_empty
            and not self._volatile
            and not self._parked_memory
            and not self._pending_deletes
        )
        try:
            await asyncio.get_running_loop().run_in_executor(
                executor, spill.remove if removable else spill.close
            )
        except _SPILL_ERRORS as exc:
            logger.warning(
                "closing dead-letter spill file %r of store %r failed: %s",
                spill.path,
                self.store_name,
                exc,
                extra={"event": "deadletter_close_failed", "store": self.store_name},
            )


def _with(entry: DeadLetter, *, seq: int, enqueued_at: float) -> DeadLetter:
    return DeadLetter(
        seq=seq,
        method=entry.method,
        call=entry.call,
        key=entry.key,
        scope=entry.scope,
        stamp=entry.stamp,
        enqueued_at=enqueued_at,
        size=entry.size,
        error=entry.error,
    )


__all__ = ["RECENT_WRITES", "SPILL_RETRY_INTERVAL", "DeadLetterBuffer", "PutItem"]
