"""Keeping new dead-lettered writes: encoded, numbered, coalesced per last-write-wins key, and
committed to the spill file in shared transactions (group commit): while a commit runs, newer puts
queue, and the next commit takes all of them; each caller returns once the transaction holding its
entry committed. A write the file cannot take (past its byte cap, a full disk, an unusable file;
without a file, past the memory caps) is refused, write by write: its caller gets a
:class:`~guarded.errors.WriteNotKeptError` and nothing kept is evicted to make room.

A put is bounded by its call's deadline (:func:`commit_deadline`): a put whose transaction has not
committed by then is answered with a refusal (:func:`not_kept_in_time`), never left waiting for the
disk. Its write stays queued, so it may still be committed and replayed, as the refusal says. One
timer per buffer watches the earliest deadline of the puts waiting, not one per put.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import chain
from typing import Any

from ..codec import JSONObject, check_text
from ..errors import WriteNotKeptError
from ..pipeline.loops import abandon
from .calls import encode_call
from .entries import DeadLetter, canonical_key, index_key, readable_text
from .gate import Slot
from .spill import SpillCapError, WriteResult, dumps
from .spill_link import SPILL_ERRORS, SpillLink, retrieve
from .telemetry import REFUSE_DISK_CAP, REFUSE_MEMORY_FULL

PutItem = tuple[str, Sequence[Any], Mapping[str, Any], Any, str | None, int, str]
"""``(method, args, kwargs, key, scope, stamp, error)`` of :meth:`DeadLetterBuffer.put_many`."""

Prepared = tuple[str, JSONObject, str | None, str | None, int, int, str, Hashable | None, str]
"""An encoded put: its entry's fields but the sequence number and time (``method, call, key,
scope, stamp, size, error``), its key's index and its call's JSON text."""

Kept = DeadLetter | WriteNotKeptError
"""What became of one put: its entry, or the refusal raised to its caller."""

_Waiter = tuple[list[Prepared], "asyncio.Future[list[Kept]]", float]
"""A put waiting for its transaction: its writes, the future answering them and the event-loop
time by which it must be answered (its :func:`commit_deadline`)."""

DEAD_LETTER_GRACE = 3.0
"""Seconds a write whose backend attempts used its whole deadline still has to be committed to
the spill file (the demo under overload on a loaded 2-core machine refused 271 writes with 1 s,
none with 3 s); no call waits for its commit past its deadline plus this grace."""


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


def _admitted(prepared: Sequence[Prepared], room: int, entries: float = math.inf) -> list[bool]:
    """Which of ``prepared`` fit, in order, in ``room`` bytes and ``entries`` entries."""
    admitted = []
    for item in prepared:
        fits = entries >= 1 and item[5] <= room
        if fits:
            room -= item[5]
            entries -= 1
        admitted.append(fits)
    return admitted


class _Writing:
    """One group's transaction, its outcome recorded by the worker thread itself."""

    __slots__ = ("error", "kept", "result", "victims")

    def __init__(self, kept: list[DeadLetter], victims: dict[int, Slot]) -> None:
        self.kept = kept
        self.victims = victims
        self.result: WriteResult | None = None
        self.error: BaseException | None = None


def _nothing() -> None:
    """An empty job for the worker thread."""


class GroupCommit:
    """The puts of one buffer (see the module docs)."""

    def __init__(self, link: SpillLink, clock: Callable[[], float]) -> None:
        self.link = link
        self.clock = clock
        self._incoming: list[_Waiter] = []
        self._group: list[_Waiter] = []
        """The puts the committer took and has not numbered yet."""
        self._answering: list[_Waiter] = []
        """The puts of the transaction the committer runs, until it answered them."""
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = math.inf
        """When :attr:`_alarm` rings: the earliest commit deadline of the puts waiting."""
        self.committer: asyncio.Task[None] | None = None
        self._writing: _Writing | None = None
        """The transaction the committer runs on the worker thread, while it runs."""
        self._finishing: asyncio.Task[None] | None = None

    def moved(self) -> None:
        """The guard moved to a new event loop: the committer of the old one never resumes. The
        puts it took and had not numbered go back to the queue, committed by a committer of this
        loop; what the transaction it was running did is applied here once it ended."""
        writing, self._writing = self._writing, None
        if writing is not None:
            self._finishing = asyncio.get_running_loop().create_task(
                self.link.mutate(lambda: self._finish_abandoned(writing))
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
            return self._keep(prepared, self._room_in_memory(prepared))
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

    def _room_in_memory(self, prepared: Sequence[Prepared]) -> list[bool]:
        """Without a spill file: which of ``prepared`` the memory caps admit, in order."""
        held, config = self.link.held, self.link.config
        return _admitted(
            prepared,
            config.max_memory_bytes - held.memory_bytes,
            config.max_memory_entries - len(held.volatile),
        )

    def _room_in_file(self, prepared: Sequence[Prepared]) -> list[bool]:
        """Which of ``prepared`` fit in the spill file under its byte cap, in order (the room a
        write would free by replacing a held one of its key is not counted)."""
        held = self.link.held
        return _admitted(prepared, self.link.config.max_disk_bytes - held.disk_bytes - held.file_parked_bytes)

    def _keep(self, prepared: Sequence[Prepared], admitted: Sequence[bool]) -> list[Kept]:
        """Memory only: hold the admitted puts, refuse the others."""
        chosen = [item for item, fits in zip(prepared, admitted, strict=True) if fits]
        results = self._add(chosen)[0] if chosen else []
        self._count_enqueued(results)
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

    def _count_enqueued(self, entries: Sequence[DeadLetter]) -> None:
        counters = self.link.counters
        for entry in entries:
            counters.enqueued(entry.method)
        counters.enqueued_total += len(entries)

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
        self._group = []  # numbered (or answered) from here on: no await before _add
        if not link.usable():
            return self._answers(prepared, [False] * len(prepared), [], link.unusable_reason())
        admitted = self._room_in_file(prepared)
        chosen = [item for item, fits in zip(prepared, admitted, strict=True) if fits]
        if not chosen:
            return self._answers(prepared, admitted, [], REFUSE_DISK_CAP)
        results, kept, victims, texts = self._add(chosen)
        reason = await self._write_group(kept, victims, texts)
        if reason is not None:
            self._forget(kept)
            return self._answers(prepared, [False] * len(prepared), [], reason)
        self._count_enqueued(results)
        return self._answers(prepared, admitted, results, REFUSE_DISK_CAP)

    async def _write_group(
        self, kept: list[DeadLetter], victims: dict[int, Slot], texts: dict[int, str]
    ) -> str | None:
        """Commit ``kept`` (deleting the ``victims`` it replaces); ``None`` once committed, else
        the reason it was not (``refused`` label)."""
        if not (kept or victims):
            return None
        link = self.link
        spill = link.spill
        assert spill is not None
        current = link.held.generation
        writing = self._writing = _Writing(kept, victims)

        def write() -> WriteResult:
            try:
                writing.result = spill.write(
                    kept,
                    generation=current,
                    delete=list(victims),
                    max_bytes=link.config.max_disk_bytes,
                    texts=texts,
                )
            except BaseException as exc:
                writing.error = exc
                raise
            return writing.result

        try:
            result = await link.job(write)
        except SpillCapError:
            self._writing = None
            return REFUSE_DISK_CAP
        except SPILL_ERRORS as exc:
            self._writing = None
            return await self._not_written(kept, exc)
        self._writing = None
        self._written(result, kept, victims)
        return None

    def _written(self, result: WriteResult, kept: list[DeadLetter], victims: dict[int, Slot]) -> None:
        link = self.link
        link.counters.superseded(link.apply_write(result, victims))
        link.held.settle(kept)

    async def _not_written(self, kept: list[DeadLetter], exc: BaseException) -> str | None:
        """The spill file failed to commit ``kept``: ``None`` when a damaged file was set aside and
        the fresh one took them, else the reason they were not kept."""
        link = self.link
        await link.spill_failed(exc)
        if link.usable() and not any(entry.seq in link.held.volatile for entry in kept):
            return None
        return link.unusable_reason()

    def _forget(self, kept: Sequence[DeadLetter]) -> None:
        """Entries never acknowledged: forgotten; what they would replace still waits."""
        held = self.link.held
        for entry in kept:
            if entry.seq in held.volatile:
                held.forget_entry(entry)

    async def _finish_abandoned(self, writing: _Writing) -> None:
        """(Under the lock.) Apply what the transaction of a closed loop's committer did: the
        worker thread runs jobs in order, so once an empty one ran, that one had ended. Left
        unapplied, its entries would be written again (and refused by the file) or replayed twice."""
        await self.link.job(_nothing)
        if writing.result is not None:
            self._written(writing.result, writing.kept, writing.victims)
            self._count_enqueued(writing.kept)
        elif isinstance(writing.error, SpillCapError) or (
            isinstance(writing.error, SPILL_ERRORS) and await self._not_written(writing.kept, writing.error)
        ):
            self._forget(writing.kept)

    def _add(
        self, prepared: Sequence[Prepared]
    ) -> tuple[list[DeadLetter], list[DeadLetter], dict[int, Slot], dict[int, str]]:
        """Number ``prepared`` and coalesce it with what waits: returns every entry, those to
        store, the file's entries they replace (to delete with them) and the calls' JSON texts."""
        held, counters = self.link.held, self.link.counters
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
        counters.superseded(superseded)
        return results, list(kept.values()), victims, texts


__all__ = [
    "DEAD_LETTER_GRACE",
    "GroupCommit",
    "Kept",
    "Prepared",
    "PutItem",
    "commit_deadline",
    "not_kept_in_time",
    "prepare",
]
