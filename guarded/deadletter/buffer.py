"""The dead-letter buffer: writes that finally failed are kept, not lost (DESIGN.md).

Every entry is committed to the spill file (when configured) before :meth:`DeadLetterBuffer.put`
returns, so an acknowledged write survives a crash of the process; the newest entries are also
held in memory within the configured caps. Without a spill file, or past ``max_disk_bytes``, the
oldest entries are dropped: counted (``guarded_deadletter_dropped_total``) and logged, never
silently.

Last-write-wins keys are coalesced: a newer dead-lettered write of a key replaces the waiting
one, and :meth:`~DeadLetterBuffer.supersede` drops what a newer direct write made stale, so a
replay never overwrites newer data. Stamps are call-order numbers of one process; entries left by
an earlier process are older than any write of this one.

All SQLite work runs on one worker thread of the buffer, so the event loop never waits on disk.
The buffer is used from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from ..codec import DEFAULT_TYPES, JSONObject, RecordTypes, check_text
from ..config import DeadLetterConfig
from ..errors import InvalidPayloadError
from .calls import decode_call, encode_call
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
    BULK_FORMS,
    Call,
    ReplayResult,
    ReplaySummary,
    Send,
    SendBulk,
    TokenBucket,
    call_bulk_sender,
    call_sender,
)
from .spill import RowInfo, SpillFile, SpillFileError, SpillTotals, WriteResult, dumps
from .telemetry import DROP_DISK_FULL, DROP_MEMORY_FULL, DropLog, Gauges, deadletter_telemetry

logger = logging.getLogger("guarded.deadletter")

R = TypeVar("R")
A = TypeVar("A")

PutItem = tuple[str, Sequence[Any], Mapping[str, Any], Any, str | None, int, str]
"""``(method, args, kwargs, key, scope, stamp, error)`` of :meth:`DeadLetterBuffer.put_many`."""

RECENT_WRITES = 16_384
"""Keys whose latest successful direct write the buffer remembers, so a slower, older write of the
same key that fails afterwards is discarded instead of dead-lettered over newer data."""

_PAGE = 256


@dataclass(slots=True)
class _Scope:
    total: int = 0
    held: dict[int, None] = field(default_factory=dict)


@dataclass(slots=True)
class _New:
    entry: DeadLetter
    index: Hashable | None


def _text(value: str) -> str:
    """``value`` with lone surrogates replaced, for error descriptions and reasons."""
    try:
        return check_text(value, "")
    except InvalidPayloadError:
        return value.encode("utf-8", "replace").decode("utf-8")


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


class DeadLetterBuffer:
    """Keeps writes that finally failed and replays them in order (see the module docs).

    ``config.path`` may contain ``{name}``, replaced by ``store_name``; ``None`` keeps the buffer
    in memory only. The spill file is opened on the first :meth:`put`, or by :meth:`open` (at
    startup, to replay what a previous process left).
    """

    def __init__(
        self,
        config: DeadLetterConfig,
        *,
        store_name: str,
        registry: CollectorRegistry = REGISTRY,
        types: RecordTypes = DEFAULT_TYPES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store_name = store_name
        self.path = None if config.path is None else config.path.replace("{name}", _file_safe(store_name))
        self._types = types
        self._clock = clock
        self._telemetry = deadletter_telemetry(registry)
        self._telemetry.buffers.add(self)
        self._drop_log = DropLog(store_name)

        self._spill: SpillFile | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._generation = 0
        self._next_seq = 1
        self._closed = False
        self._mutex: asyncio.Lock | None = None
        self._replaying: asyncio.Lock | None = None
        self._purges = 0
        self.gate = KeyGate()
        """Orders direct writes of a last-write-wins key against its replay (see :mod:`.gate`)."""

        self._memory: OrderedDict[int, DeadLetter] = OrderedDict()
        self._memory_bytes = 0
        self._keys: dict[tuple[str, Hashable], dict[int, tuple[int, int]]] = {}
        self._scopes: dict[tuple[str, str], _Scope] = {}
        self._recent: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        self._depth = 0
        self._disk_bytes = 0
        self._oldest: float | None = None
        self._parked_memory: OrderedDict[int, ParkedWrite] = OrderedDict()
        self._parked = 0
        self._parked_bytes = 0

        self._enqueued_total = 0
        self._replayed_total = 0
        self._dropped_total = 0
        self._parked_total = 0
        self._superseded_total = 0

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

    def gauges(self) -> Gauges:
        """The buffer's current gauge values (read by the metrics collector at scrape time)."""
        return Gauges(
            depth=self._depth,
            memory_bytes=self._memory_bytes,
            disk_bytes=self._disk_bytes,
            oldest_age=self._oldest_age(),
            parked=self._parked,
        )

    def _oldest_age(self) -> float:
        if self._depth == 0:
            return 0.0
        oldest = self._oldest
        if self._spill is None:
            try:
                oldest = next(iter(self._memory.values())).enqueued_at
            except (StopIteration, RuntimeError):  # empty, or changing under a scrape thread
                oldest = None
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    async def stats(self) -> DeadLetterStats:
        """A snapshot of depth, sizes, age of the oldest entry and the totals since creation."""
        return DeadLetterStats(
            depth=self._depth,
            memory_entries=len(self._memory),
            memory_bytes=self._memory_bytes,
            disk_bytes=self._disk_bytes,
            oldest_age=self._oldest_age(),
            parked=self._parked,
            enqueued_total=self._enqueued_total,
            replayed_total=self._replayed_total,
            dropped_total=self._dropped_total,
            parked_total=self._parked_total,
            superseded_total=self._superseded_total,
        )

    # --- worker thread and locking ----------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        if self._mutex is None:
            self._mutex = asyncio.Lock()
        return self._mutex

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            raise RuntimeError(f"dead-letter buffer of store {self.store_name!r} is closed")
        return self._executor

    async def _read(self, job: Callable[[], R]) -> R:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker(), job)
        except sqlite3.Error as exc:
            raise SpillFileError(f"reading dead-letter spill file {self.path!r} failed: {exc}") from exc

    async def _commit(self, job: Callable[[], R], apply: Callable[[R], A]) -> A:
        """Run a write ``job`` on the worker and ``apply`` its result, even if the caller is
        cancelled meanwhile (the cancellation is re-raised afterwards): memory and file stay in step."""
        try:
            result, interrupted = await _complete(self._worker(), job)
        except (sqlite3.Error, OSError) as exc:
            raise SpillFileError(f"writing dead-letter spill file {self.path!r} failed: {exc}") from exc
        applied = apply(result)
        if interrupted:
            raise asyncio.CancelledError
        return applied

    async def open(self) -> int:
        """Open an existing spill file (taking its lock) and return how many writes wait in it.

        Call at startup to replay what a crashed process left; without a file (or a path) this
        returns the in-memory depth. Raises :class:`~guarded.deadletter.SpillFileLockedError`
        when another live process holds the file.
        """
        async with self._lock():
            await self._ensure_open(create=False)
        return self._depth

    async def _ensure_open(self, *, create: bool) -> None:
        if self._closed:
            raise RuntimeError(f"dead-letter buffer of store {self.store_name!r} is closed")
        if self._spill is not None or self.path is None:
            return
        path = self.path
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"guarded-dlq-{self.store_name}")

        def load() -> tuple[SpillFile, list[RowInfo], SpillTotals, int] | None:
            if not create and not os.path.exists(path):
                return None
            spill = SpillFile.open(path, synchronous=self.config.synchronous)
            try:
                rows = [row for row in spill.index_rows() if row.key is not None or row.scope is not None]
                return spill, rows, spill.totals(), spill.max_seq()
            except BaseException:
                spill.close()
                raise

        try:
            loaded, interrupted = await _complete(executor, load)
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=False)
            raise SpillFileError(f"cannot open dead-letter spill file {path!r}: {exc}") from exc
        except BaseException:
            executor.shutdown(wait=False)
            raise
        if loaded is None:
            executor.shutdown(wait=False)
            if interrupted:
                raise asyncio.CancelledError
            return
        spill, rows, totals, max_seq = loaded
        self._executor, self._spill = executor, spill
        self._generation = spill.generation
        self._next_seq = max(self._next_seq, max_seq + 1)
        self._index(rows)
        self._depth = totals.pending
        self._apply_totals(totals)
        if totals.pending:
            logger.warning(
                "dead-letter spill file of store %r holds %d waiting write(s) from an earlier run",
                self.store_name,
                totals.pending,
                extra={
                    "event": "deadletter_recovered",
                    "store": self.store_name,
                    "depth": totals.pending,
                    "parked": totals.parked,
                },
            )
        if interrupted:
            raise asyncio.CancelledError

    def _index(self, rows: Sequence[RowInfo]) -> None:
        """Rebuild the key and scope index from the file's rows (the file holds every waiting entry)."""
        self._keys.clear()
        self._scopes.clear()
        for row in rows:
            if row.key is not None:
                slot = (row.method, index_key_of_canonical(row.key))
                self._keys.setdefault(slot, {})[row.seq] = (row.generation, row.stamp)
            if row.scope is not None:
                scope = self._scopes.setdefault((row.method, row.scope), _Scope())
                scope.total += 1
                if row.seq in self._memory:
                    scope.held[row.seq] = None

    def _apply_totals(self, totals: SpillTotals) -> None:
        self._disk_bytes = totals.pending_bytes
        self._parked = totals.parked
        self._parked_bytes = totals.parked_bytes
        self._oldest = None if totals.oldest is None else totals.oldest[1]

    # --- index bookkeeping ------------------------------------------------------------------------

    def _hold(self, size: int) -> bool:
        if self._spill is None:
            return True
        return (
            len(self._memory) < self.config.max_memory_entries
            and self._memory_bytes + size <= self.config.max_memory_bytes
        )

    def _remember(self, new: _New) -> None:
        entry = new.entry
        self._depth += 1
        hold = self._hold(entry.size)
        if hold:
            self._memory[entry.seq] = entry
            self._memory_bytes += entry.size
        if new.index is not None:
            self._keys.setdefault((entry.method, new.index), {})[entry.seq] = (self._generation, entry.stamp)
        if entry.scope is not None:
            scope = self._scopes.setdefault((entry.method, entry.scope), _Scope())
            scope.total += 1
            if hold:
                scope.held[entry.seq] = None
        if self._oldest is None:
            self._oldest = entry.enqueued_at

    def _forget(self, seq: int, method: str, key: str | None, scope: str | None) -> None:
        self._depth -= 1
        held = self._memory.pop(seq, None)
        if held is not None:
            self._memory_bytes -= held.size
        if key is not None:
            slot = (method, index_key_of_canonical(key))
            seqs = self._keys.get(slot)
            if seqs is not None:
                seqs.pop(seq, None)
                if not seqs:
                    del self._keys[slot]
        if scope is not None:
            found = self._scopes.get((method, scope))
            if found is not None:
                found.total -= 1
                found.held.pop(seq, None)
                if found.total <= 0:
                    del self._scopes[(method, scope)]

    def _forget_entry(self, entry: DeadLetter) -> None:
        self._forget(entry.seq, entry.method, entry.key, entry.scope)

    def _forget_rows(self, rows: Sequence[RowInfo]) -> None:
        for row in rows:
            if not row.parked:
                self._forget(row.seq, row.method, row.key, row.scope)

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

    def _apply_write(self, result: WriteResult) -> int:
        """Forget what a write transaction deleted or dropped; returns how many it deleted."""
        self._forget_rows(result.deleted)
        if result.dropped:
            self._forget_rows(result.dropped)
            self._count_dropped([row.method for row in result.dropped], DROP_DISK_FULL)
        self._apply_totals(result.totals)
        return len(result.deleted)

    def _enforce_memory(self) -> None:
        """Without a spill file: drop the oldest entries (and parked writes) beyond the caps."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        dropped: list[str] = []
        while self._memory and (len(self._memory) > cap_entries or self._memory_bytes > cap_bytes):
            entry = next(iter(self._memory.values()))
            self._forget_entry(entry)
            dropped.append(entry.method)
        while self._parked_memory and (self._parked > cap_entries or self._parked_bytes > cap_bytes):
            _, parked = self._parked_memory.popitem(last=False)
            self._parked -= 1
            self._parked_bytes -= parked.size
            dropped.append(parked.method)
        if dropped:
            self._count_dropped(dropped, DROP_MEMORY_FULL)

    # --- adding -----------------------------------------------------------------------------------

    def _prepare(self, item: PutItem) -> tuple[DeadLetter, Hashable | None]:
        method, args, kwargs, key, scope, stamp, error = item
        check_text(method, "method")
        call = encode_call(method, tuple(args), kwargs)
        canonical = canonical_key(key)
        slot = None if key is None else index_key(key)
        if scope is not None and not isinstance(scope, str):
            scope = None
        if scope is not None:
            check_text(scope, "scope")
        size = len(dumps(call).encode("utf-8"))
        entry = DeadLetter(
            seq=0,
            method=method,
            call=call,
            key=canonical,
            scope=scope,
            stamp=int(stamp),
            enqueued_at=0.0,
            size=size,
            error=_text(str(error))[:1000],
        )
        return entry, slot

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
        """Keep a write that finally failed; with a spill file, committed before this returns.

        ``key`` is the method's last-write-wins key (a string or tuple, ``None`` for appends),
        ``scope`` the trace or session the write belongs to, ``stamp`` the call-order number of
        the call. Waiting entries of the same ``(method, key)`` with a smaller stamp are replaced;
        when a newer write of the key is already waiting or has succeeded, this one is discarded
        as superseded (the returned entry is then not kept).

        Raises :class:`~guarded.errors.InvalidPayloadError` (nothing kept) when the call cannot be
        encoded: the caller should :meth:`park` it. Raises
        :class:`~guarded.deadletter.SpillFileError` (nothing kept) when the spill file cannot be
        opened or written, :class:`~guarded.deadletter.SpillFileLockedError` when another live
        process holds it.
        """
        entries = await self.put_many([(method, args, kwargs, key, scope, stamp, error)])
        return entries[0]

    async def put_many(self, items: Sequence[PutItem]) -> list[DeadLetter]:
        """:meth:`put` for many writes in one transaction (a failed batch of events).

        Every call is encoded first: if one cannot be, :class:`InvalidPayloadError` is raised and
        nothing is kept.
        """
        prepared = [self._prepare(item) for item in items]
        if not prepared:
            return []
        async with self._lock():
            await self._ensure_open(create=True)
            return await self._add(prepared)

    async def _add(self, prepared: Sequence[tuple[DeadLetter, Hashable | None]]) -> list[DeadLetter]:
        now = self._clock()
        results: list[DeadLetter] = []
        kept: dict[int, _New] = {}
        victims: dict[int, None] = {}
        superseded_now = 0
        for template, slot in prepared:
            entry = _with(template, seq=self._next_seq, enqueued_at=now)
            self._next_seq += 1
            results.append(entry)
            self._telemetry.count_enqueued(self.store_name, entry.method)
            if slot is not None:
                position = (self._generation, entry.stamp)
                recent = self._recent.get((entry.method, slot))
                waiting = self._keys.get((entry.method, slot), {})
                if (recent is not None and entry.stamp < recent) or any(
                    other > position for other in waiting.values()
                ):
                    superseded_now += 1
                    continue
                for seq in list(waiting):
                    older = kept.pop(seq, None)
                    if older is not None or self._spill is None:
                        self._forget_entry(older.entry if older is not None else self._memory[seq])
                        superseded_now += 1
                    else:
                        victims[seq] = None
            new = _New(entry, slot)
            kept[entry.seq] = new
            self._remember(new)
        self._enqueued_total += len(results)
        self._count_superseded(superseded_now)
        spill = self._spill
        if spill is None:
            self._enforce_memory()
            return results
        batch = [new.entry for new in kept.values()]
        applied = False

        def apply(result: WriteResult) -> None:
            nonlocal applied
            applied = True
            self._count_superseded(self._apply_write(result))

        try:
            await self._commit(
                lambda: spill.write(
                    batch,
                    generation=self._generation,
                    delete=list(victims),
                    max_bytes=self.config.max_disk_bytes,
                ),
                apply,
            )
        except BaseException:
            if not applied:
                for entry in batch:
                    self._forget_entry(entry)
            raise
        return results

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
        recent = self._recent
        if recent.get(slot, stamp - 1) < stamp:
            recent[slot] = stamp
            recent.move_to_end(slot)
            if len(recent) > RECENT_WRITES:
                recent.popitem(last=False)
        if slot not in self._keys:
            return 0
        async with self._lock():
            waiting = self._keys.get(slot)
            position = (self._generation, stamp)
            stale = [seq for seq, other in (waiting or {}).items() if other < position]
            if not stale:
                return 0
            removed = await self._remove(stale)
            self._count_superseded(removed)
            return removed

    async def _remove(self, seqs: Sequence[int]) -> int:
        """Remove waiting entries (memory and file); returns how many were still there."""
        spill = self._spill
        if spill is None:
            removed = 0
            for seq in seqs:
                entry = self._memory.get(seq)
                if entry is not None:
                    self._forget_entry(entry)
                    removed += 1
            return removed
        return await self._commit(lambda: spill.delete(list(seqs)), self._apply_write)

    async def _load(self, seqs: Sequence[int]) -> list[DeadLetter]:
        found = [self._memory[seq] for seq in seqs if seq in self._memory]
        missing = [seq for seq in seqs if seq not in self._memory]
        spill = self._spill
        if missing and spill is not None:
            found.extend(await self._read(lambda: spill.fetch(missing)))
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
        async with self._lock():
            seqs = sorted(self._keys.get(slot, {}))
            if not seqs:
                return None
            found = await self._load([seqs[-1]])
            removed = await self._remove(seqs)
            self._count_superseded(max(0, removed - 1))
        return self._decode(found[0]) if found else None

    async def pending_for_scope(self, method: str, scope: str) -> list[Call]:
        """The waiting calls of ``method`` in ``scope`` (a trace or session), decoded, oldest first.

        Cheap (no file access) when nothing of that scope waits.
        """
        found = self._scopes.get((method, scope))
        if found is None or found.total <= 0:
            return []
        if len(found.held) >= found.total:
            entries = [self._memory[seq] for seq in list(found.held) if seq in self._memory]
        elif self._spill is not None:
            spill = self._spill
            entries = await self._read(lambda: spill.for_scope(method, scope))
        else:
            entries = []
        calls = [self._decode(entry) for entry in entries]
        return [call for call in calls if call is not None]

    # --- parking ----------------------------------------------------------------------------------

    async def park(
        self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any], *, reason: str
    ) -> ParkedWrite:
        """Keep a write refused as bad data, with its reason; never replayed automatically.

        When the call itself cannot be encoded, only the reason is kept (``call`` is ``None``).
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
        async with self._lock():
            await self._ensure_open(create=True)
            parked = ParkedWrite(
                seq=self._next_seq,
                method=method,
                call=call,
                reason=reason[:2000],
                parked_at=self._clock(),
                size=size,
            )
            self._next_seq += 1
            spill = self._spill
            if spill is None:
                self._store_parked(parked)
                self._enforce_memory()
            else:
                await self._commit(
                    lambda: spill.park([parked], max_bytes=self.config.max_disk_bytes), self._apply_write
                )
            self._count_parked(method)
        return parked

    def _store_parked(self, parked: ParkedWrite) -> None:
        self._parked_memory[parked.seq] = parked
        self._parked += 1
        self._parked_bytes += parked.size

    async def _park_entry(self, entry: DeadLetter, reason: str) -> None:
        reason = _text(reason)[:2000]
        spill = self._spill
        now = self._clock()
        if spill is None:
            if entry.seq not in self._memory:
                return
            self._forget_entry(entry)
            self._store_parked(ParkedWrite(entry.seq, entry.method, entry.call, reason, now, entry.size))
            self._enforce_memory()
        else:
            removed = await self._commit(
                lambda: spill.park_pending(entry.seq, reason=reason, parked_at=now), self._apply_write
            )
            if not removed:
                return
        self._count_parked(entry.method)

    # --- replay -----------------------------------------------------------------------------------

    def _still_waiting(self, entry: DeadLetter) -> bool:
        if self._spill is None:
            return entry.seq in self._memory
        if entry.key is None:
            return True
        seqs = self._keys.get((entry.method, index_key_of_canonical(entry.key)))
        return seqs is not None and entry.seq in seqs

    async def _page(self, after: int, limit: int | None) -> list[DeadLetter]:
        spill = self._spill
        if spill is not None:
            return await self._read(lambda: spill.page(after, limit))
        entries = [entry for seq, entry in self._memory.items() if seq > after]
        return entries if limit is None else entries[:limit]

    async def _replayed(self, entries: Sequence[DeadLetter]) -> int:
        async with self._lock():
            seqs = [entry.seq for entry in entries]
            methods = {entry.seq: entry.method for entry in entries}
            spill = self._spill
            if spill is None:
                done = [seq for seq in seqs if seq in self._memory]
                for seq in done:
                    self._forget_entry(self._memory[seq])
            else:

                def apply(result: WriteResult) -> list[int]:
                    self._apply_write(result)
                    return [row.seq for row in result.deleted]

                done = await self._commit(lambda: spill.delete(seqs), apply)
            for seq in done:
                self._telemetry.count_replayed(self.store_name, methods[seq])
            self._replayed_total += len(done)
            return len(done)

    async def _park_during_replay(self, entry: DeadLetter, reason: str) -> None:
        async with self._lock():
            await self._park_entry(entry, reason)

    async def replay(
        self,
        send: Send,
        *,
        send_bulk: SendBulk | None = None,
        rate: float | None = None,
        batch: int | None = None,
    ) -> ReplaySummary:
        """One pass over the waiting writes in order, sending each with ``send``.

        ``OK`` removes the entry, ``RETRY_LATER`` ends the pass (that entry and every later one
        stay), ``REJECTED`` parks it with the reason and goes on. Runs of consecutive
        ``save_event`` entries (at most ``batch``, default ``config.replay_batch``) go through
        ``send_bulk`` when given. Writes are paced to ``rate`` per second (default
        ``config.replay_rate``). Passes of one buffer never overlap.
        """
        if self._replaying is None:
            self._replaying = asyncio.Lock()
        async with self._replaying:
            async with self._lock():
                await self._ensure_open(create=False)
            return await self._replay(
                send,
                send_bulk,
                TokenBucket(rate if rate is not None else self.config.replay_rate),
                max(1, batch if batch is not None else self.config.replay_batch),
            )

    async def _replay(
        self, send: Send, send_bulk: SendBulk | None, bucket: TokenBucket, batch: int
    ) -> ReplaySummary:
        replayed = parked = 0
        last_error: str | None = None
        purges = self._purges
        last = self._next_seq - 1
        cursor = 0
        while purges == self._purges:
            page = [entry for entry in await self._page(cursor, max(batch, _PAGE)) if entry.seq <= last]
            if not page:
                break
            cursor = page[-1].seq
            index = 0
            while index < len(page) and purges == self._purges:
                entry = page[index]
                index += 1
                if not self._still_waiting(entry):
                    continue
                run = [entry]
                if send_bulk is not None and entry.method in BULK_FORMS:
                    while index < len(page) and len(run) < batch and page[index].method == entry.method:
                        if self._still_waiting(page[index]):
                            run.append(page[index])
                        index += 1
                decoded: list[tuple[DeadLetter, Call]] = []
                for item in run:
                    call = self._decode(item)
                    if call is None:
                        await self._park_during_replay(item, "stored call cannot be decoded")
                        parked += 1
                    else:
                        decoded.append((item, call))
                if len(decoded) > 1 and send_bulk is not None:
                    await bucket.take(len(decoded))
                    result, reason = await call_bulk_sender(
                        send_bulk, entry.method, [call for _, call in decoded]
                    )
                    if result is ReplayResult.OK:
                        replayed += await self._replayed([item for item, _ in decoded])
                        continue
                    if result is ReplayResult.RETRY_LATER:
                        last_error = reason or "the backend asked to retry later"
                        return self._summary(replayed, parked, last_error, stopped=True)
                for item, call in decoded:
                    await bucket.take(1)
                    sent = await self._send_one(send, item, call)
                    if sent is None:
                        continue
                    result, reason = sent
                    if result is ReplayResult.OK:
                        replayed += await self._replayed([item])
                    elif result is ReplayResult.RETRY_LATER:
                        last_error = reason or "the backend asked to retry later"
                        return self._summary(replayed, parked, last_error, stopped=True)
                    else:
                        last_error = reason or "rejected by the backend"
                        await self._park_during_replay(item, last_error)
                        parked += 1
        return self._summary(replayed, parked, last_error, stopped=False)

    def slot(self, method: str, key: Any) -> Slot | None:
        """The :class:`~.gate.KeyGate` slot of ``(method, key)``; ``None`` for a key JSON cannot carry."""
        try:
            return (method, index_key(key))
        except InvalidPayloadError:
            return None

    async def _send_one(
        self, send: Send, entry: DeadLetter, call: Call
    ) -> tuple[ReplayResult, str | None] | None:
        """Send one held write; a keyed one only after newer direct writes of its key finished and
        only if it still waits then (``None``: it no longer does, nothing was sent)."""
        if entry.key is None:
            return await call_sender(send, entry.method, call)
        slot: Slot = (entry.method, index_key_of_canonical(entry.key))
        position = self._keys.get(slot, {}).get(entry.seq)
        if position is None:
            return None
        generation, stamp = position
        await self.gate.enter_replay(slot, stamp, earlier_process=generation < self._generation)
        try:
            if not self._still_waiting(entry):
                return None
            return await call_sender(send, entry.method, call)
        finally:
            self.gate.leave_replay(slot)

    def _summary(self, replayed: int, parked: int, last_error: str | None, *, stopped: bool) -> ReplaySummary:
        return ReplaySummary(
            replayed=replayed,
            parked=parked,
            remaining=self._depth,
            stopped_early=stopped and self._depth > 0,
            last_error=last_error,
        )

    # --- inspection and maintenance ---------------------------------------------------------------

    async def entries(self, limit: int | None = None) -> list[DeadLetter]:
        """Waiting writes, oldest first, at most ``limit``."""
        async with self._lock():
            await self._ensure_open(create=False)
        return await self._page(0, limit)

    async def parked(self, limit: int | None = None) -> list[ParkedWrite]:
        """Parked writes, oldest first, at most ``limit``."""
        async with self._lock():
            await self._ensure_open(create=False)
        spill = self._spill
        if spill is not None:
            return await self._read(lambda: spill.parked(limit))
        found = list(self._parked_memory.values())
        return found if limit is None else found[:limit]

    async def unpark(self, limit: int | None = None) -> int:
        """Move parked writes that kept their call back to the waiting writes (once the cause was
        fixed); returns how many. They keep their place in the order and yield to newer writes
        of their key."""
        async with self._lock():
            await self._ensure_open(create=False)
            spill = self._spill
            if spill is None:
                moved = [parked for parked in self._parked_memory.values() if parked.call is not None]
                for parked in moved[:limit]:
                    assert parked.call is not None
                    del self._parked_memory[parked.seq]
                    self._parked -= 1
                    self._parked_bytes -= parked.size
                    self._memory[parked.seq] = DeadLetter(
                        seq=parked.seq,
                        method=parked.method,
                        call=parked.call,
                        key=None,
                        scope=None,
                        stamp=0,
                        enqueued_at=parked.parked_at,
                        size=parked.size,
                        error="unparked: " + parked.reason,
                    )
                    self._memory_bytes += parked.size
                    self._depth += 1
                self._memory = OrderedDict(sorted(self._memory.items()))
                return len(moved[:limit])

            def move() -> tuple[WriteResult, list[RowInfo]]:
                result = spill.unpark(limit)
                return result, list(spill.index_rows())

            def apply(outcome: tuple[WriteResult, list[RowInfo]]) -> int:
                result, rows = outcome
                moved = result.totals.pending - self._depth
                self._depth = result.totals.pending
                self._apply_totals(result.totals)
                self._index(rows)
                return moved

            return await self._commit(move, apply)

    async def purge(self, *, pending: bool, parked: bool) -> int:
        """Delete every waiting and/or parked write (an operator's decision: logged, not counted
        as dropped); returns how many were deleted."""
        async with self._lock():
            await self._ensure_open(create=False)
            spill = self._spill
            removed = 0
            if spill is not None:
                removed = await self._commit(lambda: spill.purge(pending=pending, parked=parked), lambda n: n)
                totals = await self._read(spill.totals)
                self._apply_totals(totals)
            else:
                if pending:
                    removed += len(self._memory)
                if parked:
                    removed += len(self._parked_memory)
            if pending:
                self._memory.clear()
                self._memory_bytes = 0
                self._keys.clear()
                self._scopes.clear()
                self._depth = 0
                self._oldest = None
                self._purges += 1
            if parked:
                self._parked_memory.clear()
                self._parked = 0
                self._parked_bytes = 0
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
            },
        )
        return removed

    async def aclose(self) -> None:
        """Close the spill file (releasing its lock) and stop exporting gauges. Waiting writes stay
        in the file for the next process; without a file they are lost (and logged)."""
        if self._closed:
            return
        async with self._lock():
            self._closed = True
            self._telemetry.buffers.discard(self)
            spill, executor = self._spill, self._executor
            self._spill = self._executor = None
            if spill is not None and executor is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(executor, spill.close)
                finally:
                    executor.shutdown(wait=False)
            elif self._depth or self._parked:
                logger.error(
                    "dead-letter buffer of store %r closed with %d waiting and %d parked write(s) and no "
                    "spill file: they are lost",
                    self.store_name,
                    self._depth,
                    self._parked,
                    extra={
                        "event": "deadletter_lost_on_close",
                        "store": self.store_name,
                        "depth": self._depth,
                        "parked": self._parked,
                    },
                )


async def _complete(executor: ThreadPoolExecutor, job: Callable[[], R]) -> tuple[R, bool]:
    """Run ``job`` on ``executor`` and wait for it to finish even through cancellation; returns its
    result and whether the caller was cancelled meanwhile (a failed job re-raises its exception,
    as a cancellation when the caller was cancelled)."""
    future = asyncio.get_running_loop().run_in_executor(executor, job)
    interrupted = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            interrupted = True
        except Exception:
            break
    try:
        return future.result(), interrupted
    except Exception as exc:
        if interrupted:
            raise asyncio.CancelledError from exc
        raise


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


__all__ = ["RECENT_WRITES", "DeadLetterBuffer", "PutItem"]
