"""The dead-letter buffer: writes that finally failed are kept, not lost.

Acknowledged means committed. With a spill file every entry is committed to it before
:meth:`DeadLetterBuffer.put` returns, so an acknowledged write survives a crash of the process;
the oldest waiting entries are also held in memory within the configured caps (a cache of what
the file holds: past the caps, entries live in the file only).

**At the limits, refuse; never forget.** A write the file cannot take (its byte cap
``max_disk_bytes``, a full disk, an unusable file) is refused at once: :meth:`~DeadLetterBuffer.put`
raises :class:`~guarded.errors.WriteNotKeptError`, the refusal is counted
(``guarded_deadletter_refused_total{reason}``) and logged at ERROR, and nothing already kept is
evicted to make room. Without a spill file (``path=None``), a write past the memory caps is refused
so too. Concurrent puts
share one transaction (group commit): while a commit runs, newer puts queue, and the next commit
takes all of them; each caller returns once the transaction holding its entry committed. A put
is bounded by its call's deadline (:func:`commit_deadline`): a put whose transaction has not
committed by then is answered with a refusal (:func:`not_kept_in_time`), never left waiting for
the disk; its write stays queued, so it may still be committed and replayed, as the refusal says.
One timer per buffer watches the earliest deadline of the puts waiting, not one per put.

**Slots.** The configured path is a base path: every buffer (process, or guard in a process)
claims a slot file of its own beside it, and adopts the slot files of processes that are gone
(:meth:`~DeadLetterBuffer.adopt_orphans`); see :mod:`.slots` for names and rules. A slot file
records the backend target its writes belong to and is never claimed, adopted or replayed by a
buffer of another target.

**A spill file that fails costs nothing the backend can take.** When no slot can be claimed, the
file is damaged, the disk is full or the path cannot be written, the buffer refuses new writes to
hold (the guard's writes still go to the backend when it takes them), logs one ERROR, exports
``guarded_deadletter_spill_available`` 0 and tries the file again at most every
``retry_interval`` seconds (on a put, a park, :meth:`~DeadLetterBuffer.open` or
:meth:`~DeadLetterBuffer.adopt_orphans`), moving what memory still holds into it when it is back. A
damaged file is renamed aside (kept for inspection) and a fresh one started at once. Apart from a
put's refusal, no method raises because of the spill file. Writes the file already held stay there while it is
unavailable; deletions it cannot take (replayed, superseded writes) are applied when it is back,
so a crash in between may replay such a write once more (replays are idempotent, and the backend
refuses an upsert older than what it has).

**Last-write-wins keys** are coalesced: a newer dead-lettered write of a key replaces the waiting
one, and :meth:`~DeadLetterBuffer.supersede` drops what a newer direct write made stale, so a
replay never overwrites newer data. Stamps are call-order numbers of one process; entries left by
an earlier process or adopted from another are older than any write of this one.

All SQLite work runs on one worker thread of the buffer, so the event loop never waits on disk.
The buffer is used from one event loop; its changes run one at a time, in tasks of their own that
a caller's cancellation does not interrupt, so memory and file stay in step: the buffer's
:class:`~.spill_link.SpillLink` owns both and is the only one to change either.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import chain
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..bulk_forms import BATCHED_BULK_FORMS
from ..codec import DEFAULT_TYPES, JSONObject, RecordTypes, check_text
from ..config import DeadLetterConfig, former_default_spill_path
from ..errors import GuardClosedError, InvalidPayloadError, WriteNotKeptError
from ..pipeline.loops import abandon
from .call_codec import decode_call, encode_call
from .entries import DeadLetter, DeadLetterStats, ParkedWrite, canonical_key, index_key, readable_text
from .gate import KeyGate, Slot
from .replay import (
    REPLAY_FAILURE_STREAK,
    CallCheck,
    HeldCall,
    ReplayPass,
    ReplaySummary,
    Send,
    SendBulk,
    Sending,
    TokenBucket,
)
from .slots import MAX_SLOTS, SlotFiles, named_spill_path
from .spill import QuarantinedRow, SpillFile, dumps
from .spill_link import HeldIndex, Prepared, SpillLink, Writing, retrieve
from .telemetry import REFUSE_DISK_CAP, REFUSE_MEMORY_FULL, BufferCounters, Gauges

logger = logging.getLogger("guarded.deadletter")

RECENT_WRITES = 16_384
"""Keys whose latest successful direct write the buffer remembers, so a slower, older write of the
same key that fails afterwards is discarded instead of dead-lettered over newer data."""

SPILL_RETRY_INTERVAL = 5.0
"""Seconds between attempts to use a spill file that failed, at most."""


PutItem = tuple[str, Sequence[Any], Mapping[str, Any], Any, str | None, int, str]
"""``(method, args, kwargs, key, scope, stamp, error)`` of :meth:`DeadLetterBuffer.put_many`."""

Kept = DeadLetter | WriteNotKeptError
"""What became of one put: its entry, or the refusal raised to its caller."""

_Waiter = tuple[list[Prepared], "asyncio.Future[list[Kept]]", float]
"""A put waiting for its transaction: its writes, the future answering them and the event-loop
time by which it must be answered (its :func:`commit_deadline`)."""

DEAD_LETTER_GRACE = 3.0
"""Seconds a write whose backend attempts used its whole deadline still has to be committed to
the spill file (the demo under overload on a loaded 2-core machine refused 271 writes with 1 s,
none with 3 s); no call waits for its commit past its deadline plus this grace. The commit
itself takes milliseconds (20 MB held during an outage, 2,000 commits: at most 0.5 s with the
machine's cores and disk loaded); what the grace mostly absorbs are pauses of the whole process,
a full garbage collection of a large heap above all, which stop the spill writer's thread too."""


def commit_deadline(deadline: float, now: float) -> float:
    """Event-loop time by which the put begun at ``now`` of a call whose deadline is ``deadline``
    must be answered: at least :data:`DEAD_LETTER_GRACE` after a backend attempt that used the whole
    deadline, and never later than the deadline plus that grace (a write that waited for another
    flush gets what is left of it)."""
    return min(max(deadline, now + DEAD_LETTER_GRACE), deadline + DEAD_LETTER_GRACE)


def not_kept_in_time(method: str) -> WriteNotKeptError:
    """The refusal of a write whose spill-file commit did not finish by its :func:`commit_deadline`."""
    return WriteNotKeptError(
        "the spill file did not commit it within the call's deadline (it may still be committed "
        "and replayed)",
        method=method,
    )


def prepare(item: PutItem) -> Prepared:
    """Encode one put; raises :class:`~guarded.errors.InvalidPayloadError` when it cannot be."""
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
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return method, call, canonical, scope, int(stamp), size, readable_text(str(error))[:1000], slot, text


class GroupCommit:
    """The puts of one buffer (see the module docs)."""

    def __init__(self, link: SpillLink) -> None:
        self.link = link
        self._incoming: list[_Waiter] = []
        self._group: list[_Waiter] = []
        """The puts the committer took and has not numbered yet."""
        self._answering: list[_Waiter] = []
        """The puts of the transaction the committer runs, until it answered them."""
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = math.inf
        """When :attr:`_alarm` rings: the earliest commit deadline of the puts waiting."""
        self.committer: asyncio.Task[None] | None = None
        self._writing: Writing | None = None
        """The transaction the committer runs on the worker thread, while it runs."""
        self._finishing: asyncio.Task[None] | None = None

    def moved(self) -> None:
        """The guard moved to a new event loop: the committer of the old one never resumes. The
        puts it took and had not numbered go back to the queue, committed by a committer of this
        loop; what the transaction it was running did is applied here once it ended."""
        writing, self._writing = self._writing, None
        if writing is not None and not writing.applied:
            self._finishing = asyncio.get_running_loop().create_task(
                self.link.mutate(lambda: self.link.finish_abandoned(writing))
            )
            self._finishing.add_done_callback(retrieve)
        if self.committer is None:
            return
        abandon(self.committer)
        self.committer = None
        self._incoming[:0] = self._group
        self._group = self._answering = []
        self._silence()
        if self._incoming:
            loop = asyncio.get_running_loop()
            first_due = min(answer_by for _, _, answer_by in self._incoming)
            if first_due < math.inf:
                self._set_alarm(loop, first_due)
            self.committer = loop.create_task(
                self._commit_loop(), name=f"guarded-dlq-commit-{self.link.store_name}"
            )

    async def put(self, prepared: list[Prepared], deadline: float = math.inf) -> list[Kept]:
        """Keep ``prepared`` (not empty), each committed before this returns, or refused; the
        writes are refused with :func:`not_kept_in_time` when their transaction has not committed
        by the :func:`commit_deadline` of a call whose deadline is ``deadline`` (event-loop time)."""
        link = self.link
        if link.files is None:
            return self._keep(prepared, link.room_in_memory(prepared))
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[Kept]] = loop.create_future()
        answer_by = math.inf if deadline == math.inf else commit_deadline(deadline, loop.time())
        self._incoming.append((prepared, waiter, answer_by))
        if answer_by < self._alarm_at:
            self._set_alarm(loop, answer_by)
        if self.committer is None:
            self.committer = loop.create_task(
                self._commit_loop(), name=f"guarded-dlq-commit-{link.store_name}"
            )
        # Cancelling the caller cancels only its waiter: the queued write is committed all the same.
        return await waiter

    def _set_alarm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._silence()
        self._alarm_at = when
        self._alarm = loop.call_at(when, self._ring)

    def _silence(self) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        self._alarm_at = math.inf

    def _ring(self) -> None:
        """Answer the puts whose commit deadline passed with a refusal (their writes stay queued);
        set the alarm for the earliest deadline of the others."""
        due, self._alarm, self._alarm_at = self._alarm_at, None, math.inf
        following = math.inf
        for prepared, waiter, answer_by in chain(self._answering, self._incoming):
            if waiter.done() or waiter.get_loop().is_closed():
                continue
            if answer_by <= due:
                waiter.set_result([not_kept_in_time(item[0]) for item in prepared])
            elif answer_by < following:
                following = answer_by
        if following < math.inf:
            self._set_alarm(asyncio.get_running_loop(), following)

    def _keep(self, prepared: Sequence[Prepared], admitted: Sequence[bool]) -> list[Kept]:
        """Memory only: hold the admitted puts, refuse the others."""
        chosen = [item for item, fits in zip(prepared, admitted, strict=True) if fits]
        results = self.link.number(chosen)[0] if chosen else []
        self.link.counters.enqueued([entry.method for entry in results])
        return self._answers(prepared, admitted, results, REFUSE_MEMORY_FULL)

    def _answers(
        self, prepared: Sequence[Prepared], admitted: Sequence[bool], kept: Sequence[Kept], reason: str
    ) -> list[Kept]:
        """Each put's answer: the next of ``kept`` when admitted, else a refusal for ``reason``
        (counted and logged once for all of them)."""
        if all(admitted):
            return list(kept)
        refused = [item[0] for item, fits in zip(prepared, admitted, strict=True) if not fits]
        why = self.link.refusal(refused, reason)
        answers = iter(kept)
        return [
            next(answers) if fits else WriteNotKeptError(why, method=item[0])
            for item, fits in zip(prepared, admitted, strict=True)
        ]

    async def _commit_loop(self) -> None:
        """Commit queued puts, one transaction per group, until none is queued (or the guard moved
        to another event loop meanwhile)."""
        me = asyncio.current_task()
        group: list[_Waiter] = []
        try:
            while self._incoming and self.committer is me:
                async with self.link.lock():
                    group = self._group = self._answering = self._incoming
                    self._incoming = []
                    results = await self._commit_group([item for items, _, _ in group for item in items])
                offset = 0
                for items, waiter, _ in group:
                    if not waiter.done() and not waiter.get_loop().is_closed():
                        waiter.set_result(results[offset : offset + len(items)])
                    offset += len(items)
                group = self._answering = []
        except BaseException as exc:
            if self.committer is not me:
                raise  # abandoned (its loop closed): the queue is the new committer's
            waiting, self._incoming = [*group, *self._incoming], []
            self._answering = []
            for _, waiter, _ in waiting:
                if waiter.done() or waiter.get_loop().is_closed():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(exc)
                    waiter.exception()  # retrieved: the caller re-raises it, nobody else should log it
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self.committer is me:
                self.committer = None
                if not self._incoming:
                    self._silence()

    async def _commit_group(self, prepared: Sequence[Prepared]) -> list[Kept]:
        """(Under the lock.) Coalesce what fits of ``prepared`` against what waits and commit it in
        one transaction; the rest, or all of it when the file cannot take it, is refused."""
        link = self.link
        await link.prepare(create=True)
        self._group = []  # numbered (or answered) from here on: no await before numbering
        if not link.usable():
            return self._answers(prepared, [False] * len(prepared), [], link.unusable_reason())
        admitted = link.room_in_file(prepared)
        chosen = [item for item, fits in zip(prepared, admitted, strict=True) if fits]
        if not chosen:
            return self._answers(prepared, admitted, [], REFUSE_DISK_CAP)
        results, kept, victims, texts = link.number(chosen)
        self._writing = Writing(kept, victims)
        try:
            reason = await link.write_new(self._writing, texts)
        finally:
            self._writing = None
        if reason is not None:
            return self._answers(prepared, [False] * len(prepared), [], reason)
        link.counters.enqueued([entry.method for entry in results])
        return self._answers(prepared, admitted, results, REFUSE_DISK_CAP)


def parkable(
    method: str, args: Sequence[Any], kwargs: Any, reason: str
) -> tuple[str, JSONObject | None, int, str]:
    """``(method, encoded call, its size, reason)`` of a write to park; when the call cannot be
    encoded only the reason is kept (the call is then ``None``)."""
    call: JSONObject | None
    reason = readable_text(str(reason))
    try:
        call = encode_call(method, tuple(args), kwargs)
        size = len(dumps(call).encode("utf-8"))
    except InvalidPayloadError as exc:
        call, size = None, 0
        detail = readable_text(str(exc))
        if not reason:
            reason = detail
        elif detail not in reason:
            reason = f"{reason} (call not kept: {detail})"
    return readable_text(method), call, size, reason


def decode_entry(entry: DeadLetter, types: RecordTypes, store_name: str) -> HeldCall | None:
    """The decoded call of a waiting entry; ``None`` (logged) when it cannot be decoded."""
    try:
        return decode_call(entry.method, entry.call, types)
    except InvalidPayloadError as exc:
        logger.error(
            "dead-letter entry %d of store %r cannot be decoded: %s",
            entry.seq,
            store_name,
            exc.reason,
            extra={"event": "deadletter_undecodable", "store": store_name, "method": entry.method},
        )
        return None


class DeadLetterBuffer:
    """Keeps writes that finally failed and replays them in order (see the module docs).

    ``config.path`` (``{name}`` replaced by ``store_name``, ``{identity}`` by a digest of
    ``target``) is the base path of the slot files; ``None`` keeps the buffer in memory only.
    ``target`` identifies the store the writes belong to (see :mod:`guarded.store_identity`):
    recorded in the spill file, and files of another target are left alone. With the default
    path, the files of the former default path that recorded ``target`` are adopted too.
    ``slots=False`` uses exactly ``config.path`` (no other slot, no adoption; with ``target=None``
    whatever target the file records), for tools that work on one file. A spill file is claimed
    on the first :meth:`put` or by :meth:`open` (at startup, to replay what earlier processes left).
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
        self.path = None if config.path is None else named_spill_path(config.path, store_name, target)
        """The base path of the slot files (``None``: memory only)."""
        former = former_default_spill_path(config.path) if slots and target is not None else None
        self.target = target
        self._types = types
        self._clock = clock
        self._monotonic = monotonic
        self._closing = False
        self._held = HeldIndex(config)
        self._counters = BufferCounters(store_name, registry)
        self._counters.export(self)
        files = (
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
                former_base=None if former is None else named_spill_path(former, store_name),
            )
        )
        self._link = SpillLink(
            files,
            self._held,
            self._counters,
            config,
            store_name=store_name,
            path=self.path,
            retry_interval=retry_interval,
            monotonic=monotonic,
            clock=clock,
        )
        self._commits = GroupCommit(self._link)
        self._replaying: asyncio.Lock | None = None
        self._removals: set[asyncio.Task[None]] = set()
        self.gate = KeyGate()
        """Orders direct writes of a last-write-wins key against its replay (see :mod:`.gate`)."""

    # --- state and its reports (reading one never waits on the spill file) ------------------------

    @property
    def _spill(self) -> SpillFile | None:
        """The slot file in use, even while it fails (for tests that damage it)."""
        return self._link.spill

    @property
    def _memory(self) -> OrderedDict[int, DeadLetter]:
        """Copies of entries the spill file holds (for tests that make the buffer read the file)."""
        return self._held.memory

    @property
    def depth(self) -> int:
        """Writes waiting (memory and spill file)."""
        return self._held.depth

    @property
    def is_empty(self) -> bool:
        """Whether no write is waiting."""
        return self._held.depth == 0

    @property
    def waiting(self) -> HeldIndex:
        """The index of the writes waiting, whose ``depth`` a hot path reads as :attr:`depth`
        without a call (the same object for the buffer's lifetime)."""
        return self._held

    @property
    def durable(self) -> bool:
        """Whether the buffer has a spill file configured."""
        return self.path is not None

    @property
    def spill_available(self) -> bool:
        """Whether held writes go to the spill file now: a path is configured and the file has
        not failed (``True`` before the first write claims one)."""
        return self.path is not None and not self._link.failed and not self._link.closed

    @property
    def spill_path(self) -> str | None:
        """The slot file in use; ``None`` when memory only, none claimed yet, or unavailable."""
        spill = self._link.spill
        return spill.path if spill is not None and not self._link.failed else None

    @property
    def claimed_path(self) -> str | None:
        """The slot file this buffer holds locked, even while it fails (``None``: it holds none).
        Of the :attr:`depth` waiting writes, all but :attr:`memory_only` are in it."""
        spill = self._link.spill
        return spill.path if spill is not None else None

    @property
    def spill_error(self) -> str | None:
        """Why the spill file is unavailable (``None`` while it is fine)."""
        return self._link.spill_error

    @property
    def memory_only(self) -> int:
        """Waiting writes held in memory only (not in a spill file): lost if the process dies."""
        return 0 if self._link.usable() else len(self._held.volatile)

    def gauges(self) -> Gauges:
        """The buffer's current gauge values (read by the metrics collector at scrape time)."""
        held = self._held
        return Gauges(
            depth=held.depth,
            memory_bytes=held.memory_bytes,
            disk_bytes=held.disk_bytes,
            oldest_age=held.oldest_age(self._clock()),
            parked=held.parked,
            spill_available=None if self.path is None else self.spill_available,
        )

    async def stats(self) -> DeadLetterStats:
        """A snapshot of depth, sizes, age of the oldest entry and the totals since creation."""
        held, counters = self._held, self._counters
        return DeadLetterStats(
            depth=held.depth,
            memory_entries=len(held.memory) + len(held.volatile),
            memory_bytes=held.memory_bytes,
            disk_bytes=held.disk_bytes,
            oldest_age=held.oldest_age(self._clock()),
            parked=held.parked,
            enqueued_total=counters.enqueued_total,
            replayed_total=counters.replayed_total,
            dropped_total=counters.dropped_total,
            refused_total=counters.refused_total,
            parked_total=counters.parked_total,
            superseded_total=counters.superseded_total,
            adopted_total=counters.adopted_total,
            spill_path=self.spill_path,
            spill_available=None if self.path is None else self.spill_available,
            memory_only=self.memory_only,
            quarantined=held.file_quarantined,
            quarantined_total=counters.quarantined_total,
        )

    def moved(self) -> None:
        """The guard moved to a new event loop (the old one closed or stopped): forget the old
        loop's tasks, lock and waiters; the puts its committer had not taken or numbered are
        committed by the new loop."""
        self._commits.moved()
        self._link.moved()
        self.gate.moved()
        self._replaying = None
        self._removals.clear()

    def check_open(self) -> None:
        """Raise :class:`~guarded.errors.GuardClosedError` when the buffer is closing or closed."""
        self._check_open("a held write cannot be taken out")

    def removing(self, task: asyncio.Task[None]) -> None:
        """``task`` takes a consumed write out of the buffer (:meth:`take`): closing waits for it,
        else the spill file would keep the write and the next guard would hand it out again."""
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    def _check_open(self, refused: str = "the write was not kept") -> None:
        if self._closing or self._link.closed:
            raise GuardClosedError(f"the guard of store {self.store_name!r} is closed: {refused}")

    async def _prepared(self) -> None:
        """Claim the spill file left by earlier processes, or retry a failed one when due."""
        await self._link.mutate(lambda: self._link.prepare(create=False))

    # --- opening and adopting ---------------------------------------------------------------------

    async def open(self) -> int:
        """Claim this buffer's spill file if one is left from earlier processes, adopt the slot
        files of processes that are gone, and return how many writes wait.

        Call at startup to replay what earlier processes left. Creates nothing when there is
        nothing to take over (the first write claims a slot). Never raises because of the spill
        file (see the module docs).
        """
        self._check_open()
        link = self._link

        async def op() -> None:
            await link.prepare(create=False)
            await link.adopt_if_usable()

        await link.mutate(op)
        return self._held.depth

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
        link = self._link
        files = link.files
        if files is None or files.pinned or self._closing or link.closed:
            return 0

        return await link.mutate(link.adopt_orphans)

    # --- adding -----------------------------------------------------------------------------------

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
        deadline: float = math.inf,
    ) -> DeadLetter:
        """Keep a write that finally failed; with a usable spill file, committed before this returns.

        ``key`` is the method's last-write-wins key (a string or tuple, ``None`` for appends),
        ``scope`` the trace or session the write belongs to, ``stamp`` the call-order number of
        the call. Waiting entries of the same ``(method, key)`` with a smaller stamp are replaced;
        when a newer write of the key is already waiting or has succeeded, this one is discarded
        as superseded (the returned entry is then not kept).

        Raises :class:`~guarded.errors.InvalidPayloadError` (nothing kept) when the call cannot be
        encoded: the caller should :meth:`park` it. Raises :class:`~guarded.errors.WriteNotKeptError`
        (nothing kept, nothing evicted) when the spill file cannot take the write: at its byte cap,
        on a full disk, unusable; without a spill file, past the memory caps (see the module docs).
        A caller cancelled while its write is being committed leaves it kept. ``deadline`` is the
        event-loop time the call must end by: a commit that cannot finish in time is refused
        (:func:`commit_deadline` gives it a grace past it).
        """
        kept = (await self.put_many([(method, args, kwargs, key, scope, stamp, error)], deadline))[0]
        if isinstance(kept, WriteNotKeptError):
            raise kept
        return kept

    async def put_many(self, items: Sequence[PutItem], deadline: float = math.inf) -> list[Kept]:
        """:meth:`put` for many writes in one transaction (a failed batch of events): each write's
        entry, or the :class:`~guarded.errors.WriteNotKeptError` refusing it (write by write: the
        writes that fit are kept).

        Every call is encoded first: if one cannot be, :class:`InvalidPayloadError` is raised and
        nothing is kept. Concurrent calls share transactions (group commit); ``deadline`` bounds
        the wait as for :meth:`put`.
        """
        prepared = [prepare(item) for item in items]
        if not prepared:
            return []
        self._check_open()
        return await self._commits.put(prepared, deadline)

    # --- last-write-wins keys ---------------------------------------------------------------------

    async def supersede(self, method: str, key: Any, stamp: int, logical_time: int | None = None) -> int:
        """A direct write of ``(method, key)`` with call stamp ``stamp`` (and the logical time of
        its call, when it has one) succeeded: drop the waiting entries of that key with a smaller
        stamp. Returns how many were dropped.

        Cheap when nothing of the key waits (one dictionary lookup); the guard calls it after
        every successful upsert.
        """
        slot = self.slot(method, key)
        if slot is None or self.note_superseding(slot, stamp, logical_time) is None:
            return 0
        return await self.drop_superseded(slot, stamp)

    def note_superseding(self, slot: Slot, stamp: int, logical_time: int | None = None) -> Slot | None:
        """The part of :meth:`supersede` that never waits, for the key's :meth:`slot`: the direct
        write is noted; the slot when writes of the key wait (then await :meth:`drop_superseded`),
        else ``None``."""
        held = self._held
        if held.depth:
            held.note_healthy(self._monotonic())  # the backend takes writes: failed replays count
        held.note_direct_write(slot, stamp, remember=RECENT_WRITES, logical_time=logical_time)
        return slot if slot in held.keys else None

    async def drop_superseded(self, slot: Slot, stamp: int) -> int:
        """The rest of :meth:`supersede` for a slot :meth:`note_superseding` answered."""
        return await self._link.mutate(lambda: self._link.drop_stale(slot, stamp))

    def _decode(self, entry: DeadLetter) -> HeldCall | None:
        return decode_entry(entry, self._types, self.store_name)

    async def latest_for_key(self, method: str, key: Any) -> HeldCall | None:
        """The newest waiting call of ``(method, key)``, decoded, or ``None`` (cheap when none waits)."""
        try:
            seqs = self._held.keys.get((method, index_key(key)))
        except InvalidPayloadError:
            return None
        if not seqs:
            return None
        found = await self._link.load([max(seqs)])
        return self._decode(found[0]) if found else None

    async def take(self, method: str, key: Any) -> HeldCall | None:
        """Remove every waiting call of ``(method, key)`` and return the newest, decoded (``None``
        when none waits). Used to consume a dead-lettered planner state: it is never replayed then.
        Raises :class:`~guarded.errors.GuardClosedError` once the buffer is closed: its spill file
        would keep the call, and the next guard would hand it out again."""
        self.check_open()
        try:
            slot = (method, index_key(key))
        except InvalidPayloadError:
            return None
        if slot not in self._held.keys:
            return None

        entry = await self._link.mutate(lambda: self._link.take_newest(slot))
        return None if entry is None else self._decode(entry)

    async def pending_for_scope(self, method: str, scope: str) -> list[HeldCall]:
        """The waiting calls of ``method`` in ``scope`` (a trace or session), decoded, oldest first.

        Cheap (no file access) when nothing of that scope waits.
        """
        calls = [self._decode(entry) for entry in await self._link.waiting_in_scope(method, scope)]
        return [call for call in calls if call is not None]

    def slot(self, method: str, key: Any) -> Slot | None:
        """The :class:`~.gate.KeyGate` slot of ``(method, key)``; ``None`` for a key JSON cannot carry."""
        try:
            return (method, index_key(key))
        except InvalidPayloadError:
            return None

    # --- parking ----------------------------------------------------------------------------------

    async def park(
        self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any], *, reason: str
    ) -> ParkedWrite:
        """Keep a write refused as bad data, with its reason; never replayed automatically.

        When the call itself cannot be encoded, only the reason is kept (``call`` is ``None``).
        Never raises because of the spill file (it is then kept in memory).
        """
        method, call, size, reason = parkable(method, args, kwargs, reason)
        self._check_open()
        return await self._link.mutate(lambda: self._link.park_new(method, call, size, reason))

    async def _park_during_replay(self, entry: DeadLetter, reason: str, epoch: int) -> bool:
        return await self._link.mutate(lambda: self._link.park_waiting(entry, reason, epoch))

    # --- replay -----------------------------------------------------------------------------------

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
            await self._prepared()
            sending = Sending(
                send,
                send_bulk,
                frozenset(bulk_methods),
                TokenBucket(rate if rate is not None else self.config.replay_rate),
                max(1, batch if batch is not None else self.config.replay_batch),
                CallCheck(target),
            )
            replay_pass = ReplayPass(
                self._link,
                self.gate,
                sending,
                decode=self._decode,
                park=self._park_during_replay,
                page=self._link.waiting_page,
                stop_after=stop_after,
            )
            return await replay_pass.run()

    # --- inspection and maintenance ---------------------------------------------------------------

    async def entries(self, limit: int | None = None) -> list[DeadLetter]:
        """Waiting writes, oldest first, at most ``limit``."""
        await self._prepared()
        return await self._link.waiting_page(0, limit)

    async def parked(self, limit: int | None = None) -> list[ParkedWrite]:
        """Parked writes, oldest first, at most ``limit``."""
        await self._prepared()
        return await self._link.parked_writes(limit)

    async def unpark(self, limit: int | None = None) -> int:
        """Move parked writes that kept their call back to the waiting writes (once the cause was
        fixed); returns how many. They keep their place in the order and yield to newer writes
        of their key."""
        return await self._link.mutate(lambda: self._link.unpark(limit))

    async def purge(self, *, pending: bool, parked: bool, quarantined: bool = False) -> int:
        """Delete every waiting and/or parked write, and/or the quarantined rows of the spill file
        (an operator's decision: logged, not counted as dropped); returns how many were deleted."""
        link = self._link
        removed = await link.mutate(
            lambda: link.purge(pending=pending, parked=parked, quarantined=quarantined)
        )
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
        await self._prepared()
        return await self._link.quarantined_rows(limit, with_raw=with_raw)

    # --- closing ----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Commit what is queued, make one last attempt to move memory-only writes into a failed
        spill file, close the file (releasing its lock) and stop exporting gauges.

        Waiting writes stay in the file for the next process (the caller reports what is left:
        :attr:`depth`, :attr:`memory_only`, :attr:`spill_path`); an empty slot file other than
        the base path itself is removed. Never raises (failures are logged).
        """
        link = self._link
        if self._closing or link.closed:
            return
        while self._removals:
            await asyncio.wait(set(self._removals))
        self._closing = True
        committer = self._commits.committer
        if committer is not None:
            await asyncio.wait({committer})
        async with link.lock():
            await link.close(lambda: self._counters.stop_exporting(self))


__all__ = [
    "DEAD_LETTER_GRACE",
    "RECENT_WRITES",
    "SPILL_RETRY_INTERVAL",
    "DeadLetterBuffer",
    "GroupCommit",
    "Kept",
    "PutItem",
    "commit_deadline",
    "decode_entry",
    "not_kept_in_time",
    "parkable",
    "prepare",
]
