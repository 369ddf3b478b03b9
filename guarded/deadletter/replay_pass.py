"""One replay pass over a dead-letter buffer's waiting writes: order per key and stream, bulk runs,
backoff per write, parking what can never succeed, stopping when the backend is down.

See :meth:`~.buffer.DeadLetterBuffer.replay` for the rules; :class:`ReplayPass` carries them out
on the buffer's :class:`~.spill_link.SpillLink` and :class:`~.gate.KeyGate`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field

from .calls import CALL_ALIASES
from .entries import DeadLetter, index_key_of_canonical
from .gate import KeyGate, Slot
from .held import Retry
from .replay import (
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
from .replayed import remove_replayed, resync
from .spill_link import SpillLink

PAGE = 256
"""Waiting entries read at a time (at least a bulk run)."""

Decode = Callable[[DeadLetter], Call | None]
"""The decoded call of an entry, ``None`` when it cannot be decoded (logged)."""
Park = Callable[[DeadLetter, str, int], Awaitable[bool]]
"""``park(entry, reason, epoch)``: park a waiting entry; ``False`` when it no longer waits."""


def stream(method: str) -> str:
    """The stream a method writes to (a legacy alias writes its target's)."""
    return CALL_ALIASES.get(method, method)


def lanes(entry: DeadLetter) -> tuple[Hashable, ...]:
    """What must stay in order for ``entry``: its last-write-wins key and its stream (scope)."""
    if entry.key is None:
        return () if entry.scope is None else (("scope", stream(entry.method), entry.scope),)
    if entry.scope is None:
        return (("key", entry.method, entry.key),)
    return (("key", entry.method, entry.key), ("scope", stream(entry.method), entry.scope))


def by_stream(page: Sequence[DeadLetter]) -> list[DeadLetter]:
    """``page`` with the entries of each stream together, streams in order of first appearance
    and entries of a stream in their order: every lane (:func:`lanes`) keeps its order, and
    interleaved writes of several methods (memory, tasks, trajectories, as an agent makes them)
    become runs that go out as bulk writes."""
    streams: dict[str, list[DeadLetter]] = {}
    for entry in page:
        streams.setdefault(stream(entry.method), []).append(entry)
    return [entry for entries in streams.values() for entry in entries]


@dataclass(slots=True)
class Sending:
    """How one pass sends."""

    send: Send
    send_bulk: SendBulk | None
    bulk_methods: frozenset[str]
    pacer: TokenBucket
    batch: int
    check: CallCheck


@dataclass(slots=True)
class Tally:
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
    suspects: list[tuple[DeadLetter, Retry, float]] = field(default_factory=list)


class ReplayPass:
    """One pass: :meth:`run` sends the waiting writes and reports what it did."""

    def __init__(
        self,
        link: SpillLink,
        gate: KeyGate,
        sending: Sending,
        *,
        decode: Decode,
        park: Park,
        page: Callable[[int, int | None], Awaitable[list[DeadLetter]]],
        stop_after: int,
    ) -> None:
        self.link = link
        self.held = link.held
        self.gate = gate
        self._gate_generation = gate.generation
        self.sending = sending
        self._decode = decode
        self._park = park
        self._page = page
        self.tally = Tally(started=link.monotonic(), stop_after=max(1, stop_after), epoch=link.held.epoch)

    def _still_waiting(self, entry: DeadLetter) -> bool:
        return self.held.still_waiting(entry, has_file=self.link.spill is not None)

    async def run(self) -> ReplaySummary:
        sending, tally = self.sending, self.tally
        last = self.held.next_seq - 1
        cursor = 0
        first = True
        while self._live():
            page = await self._page(cursor, max(sending.batch, PAGE))
            if first and not page:
                tally.found_nothing = True
            first = False
            page = [entry for entry in page if entry.seq <= last]
            if not page:
                break
            cursor = page[-1].seq
            if sending.send_bulk is not None:
                page = by_stream(page)
            index = 0
            while index < len(page) and self._live():
                entry = page[index]
                if not self._still_waiting(entry) or self._held_back(entry):
                    index += 1
                    continue
                if sending.send_bulk is not None and entry.method in sending.bulk_methods:
                    index = await self._replay_run(page, index)
                else:
                    index += 1
                    await self._replay_single(entry, None, paid=False)
        await self._end_pass()
        return self._summary()

    def _live(self) -> bool:
        return self.tally.epoch == self.held.epoch and not self.tally.stopped

    def _held_back(self, entry: DeadLetter) -> bool:
        """Whether ``entry`` waits for a later pass (its backoff, a failed entry of its key or stream
        in this pass, its method held back); its key and stream then wait too."""
        tally = self.tally
        entry_lanes = lanes(entry)
        state = self.held.retries.get(entry.seq)
        due = state is not None and state.due > self.link.monotonic()
        if (
            not due
            and stream(entry.method) not in tally.held_methods
            and tally.blocked.isdisjoint(entry_lanes)
        ):
            return False
        tally.blocked.update(entry_lanes)
        tally.deferred += 1
        if due:
            tally.backing_off.add(entry.seq)
        return True

    def _ready(self, entry: DeadLetter) -> Call | str:
        """The decoded call of ``entry``, or why it can never succeed."""
        check = self.sending.check
        problem = check.method_problem(entry.method)
        if problem is not None:
            return problem
        call = self._decode(entry)
        if call is None:
            return "stored call cannot be decoded"
        problem = check.problem(entry.method, call)
        return call if problem is None else problem

    async def _replay_single(self, entry: DeadLetter, call: Call | None, *, paid: bool) -> None:
        sending, tally = self.sending, self.tally
        if call is None:
            ready = self._ready(entry)
            if isinstance(ready, str):
                await self._park_now(entry, ready)
                return
            call = ready
        doubt = sending.check.doubtful(entry.method, call)
        if not paid:
            await sending.pacer.take(1)
        outcome = await self._send_one(entry, call)
        if outcome is None:
            return
        if outcome.result is ReplayResult.OK:
            tally.replayed += await remove_replayed(self.link, [entry], tally.epoch)
            self._answered(entry.method)
        elif outcome.result is ReplayResult.SUPERSEDED:
            await remove_replayed(self.link, [entry], tally.epoch, superseded=True)
            self._answered(entry.method)
        elif outcome.unknown_method(entry.method):
            await self._park_now(entry, f"the store has no method {entry.method!r}")
        elif doubt is not None and isinstance(outcome.error, TypeError):
            await self._park_now(entry, doubt)  # the call's own fault, said in our words
        elif outcome.result is ReplayResult.REJECTED:
            self._answered(entry.method)
            await self._park_now(entry, outcome.reason or "rejected by the backend")
        elif outcome.refused_by_breaker:
            self._stop(outcome.reason)
        else:
            self._send_failed(entry, outcome)

    async def _replay_run(self, page: Sequence[DeadLetter], index: int) -> int:
        """Replay the bulk run starting at ``page[index]``; returns the index after it."""
        sending, tally = self.sending, self.tally
        method = page[index].method
        run, entered, bad, index = await self._gather_run(page, index)
        assert sending.send_bulk is not None
        outcome: Attempt | None = None
        try:
            if len(run) > 1:
                sending.pacer.debit(len(run) - 1)
                outcome = await attempt_bulk(sending.send_bulk, method, [call for _, call in run])
        finally:
            for slot in entered:
                self.gate.leave_replay(slot, self._gate_generation)
        for entry, reason in bad:
            await self._park_now(entry, reason)
        if outcome is not None and outcome.result is ReplayResult.OK:
            tally.replayed += await remove_replayed(self.link, [item for item, _ in run], tally.epoch)
            self._answered(method)
            return index
        if outcome is not None and outcome.refused_by_breaker:
            self._stop(outcome.reason)
            return index
        # A lone entry, or a bulk write that failed: one by one, so only a bad entry fails.
        paid = len(run) == 1
        for item, call in run:
            if not self._live():
                break
            if self._still_waiting(item) and not self._held_back(item):
                await self._replay_single(item, call, paid=paid)
            paid = False
        return index

    async def _gather_run(
        self, page: Sequence[DeadLetter], index: int
    ) -> tuple[list[tuple[DeadLetter, Call]], list[Slot], list[tuple[DeadLetter, str]], int]:
        """The run of waiting entries of ``page[index].method`` from ``index`` for one bulk write:
        ``(entries with their calls, gate slots entered for them, entries that can never succeed
        with the reason, next index)``.

        Entries waiting for a later pass are passed over (their key and stream wait with them). A
        call that looks like it cannot succeed goes alone (it ends the run before it, or is a run
        of its own). The first keyed entry may wait for its key's newer direct writes; later ones
        join only if their slot can be entered at once, so the run never waits while it holds slots.
        """
        sending, tally, held = self.sending, self.tally, self.held
        method = page[index].method
        check = sending.check
        run: list[tuple[DeadLetter, Call]] = []
        entered: dict[Slot, None] = {}
        bad: list[tuple[DeadLetter, str]] = []
        await sending.pacer.take(1)
        position = index
        while position < len(page) and len(run) < sending.batch and page[position].method == method:
            item = page[position]
            if not self._still_waiting(item) or self._held_back(item):
                position += 1
                continue
            ready = self._ready(item)
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
                    found = held.keys.get(slot, {}).get(item.seq)
                    if found is None:
                        position += 1
                        continue
                    generation, stamp = found
                    earlier = generation < held.generation
                    if not entered:
                        await self.gate.enter_replay(slot, stamp, earlier_process=earlier)
                    elif not self.gate.try_enter_replay(slot, stamp, earlier_process=earlier):
                        break
                    entered[slot] = None
                if tally.epoch != held.epoch or not self._still_waiting(item):
                    position += 1
                    continue
            run.append((item, ready))
            position += 1
            if alone:
                break
        return run, list(entered), bad, position

    async def _send_one(self, entry: DeadLetter, call: Call) -> Attempt | None:
        """Send one held write; a keyed one only after newer direct writes of its key finished and
        only if it still waits then (``None``: it no longer does, nothing was sent)."""
        send, held = self.sending.send, self.held
        if entry.key is None:
            return await attempt(send, entry.method, call)
        slot: Slot = (entry.method, index_key_of_canonical(entry.key))
        position = held.keys.get(slot, {}).get(entry.seq)
        if position is None:
            return None
        generation, stamp = position
        await self.gate.enter_replay(slot, stamp, earlier_process=generation < held.generation)
        try:
            if self.tally.epoch != held.epoch or not self._still_waiting(entry):
                return None
            return await attempt(send, entry.method, call)
        finally:
            self.gate.leave_replay(slot, self._gate_generation)

    async def _park_now(self, entry: DeadLetter, reason: str) -> None:
        if await self._park(entry, reason, self.tally.epoch):
            self.tally.parked += 1
            self.tally.last_error = reason

    def _answered(self, method: str) -> None:
        """The backend answered a send (it took it or refused its data): it is up."""
        tally = self.tally
        tally.answered = True
        tally.streak = 0
        tally.streak_methods.clear()
        tally.method_streaks.pop(stream(method), None)
        self.held.healthy_at = self.link.monotonic()

    def _stop(self, reason: str | None) -> None:
        self.tally.stopped = self.tally.backend_down = True
        self.tally.last_error = reason or "the backend looks down"

    def _send_failed(self, entry: DeadLetter, outcome: Attempt) -> None:
        """A send of ``entry`` failed and may succeed later: its own backoff, its key and stream
        wait behind it for this pass, and too many failures in a row end the pass."""
        tally, retries = self.tally, self.held.retries
        now = self.link.monotonic()
        reason = outcome.reason or "the backend asked to retry later"
        state = retries.get(entry.seq)
        if state is None:
            state = retries[entry.seq] = Retry()
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
        tally.blocked.update(lanes(entry))
        tally.backing_off.add(entry.seq)
        entry_stream = stream(entry.method)
        tally.streak += 1
        tally.streak_methods.add(entry_stream)
        tally.method_streaks[entry_stream] = tally.method_streaks.get(entry_stream, 0) + 1
        if tally.method_streaks[entry_stream] >= tally.stop_after:
            tally.held_methods.add(entry_stream)
        if tally.streak >= tally.stop_after and len(tally.streak_methods) > 1:
            tally.stopped = tally.backend_down = True

    async def _end_pass(self) -> None:
        """Count the pass's failures toward parking where the backend showed it was up, park
        entries that reached ``config.max_replay_attempts``, and make entries whose failures were
        not counted due at once when it did."""
        tally, held, link = self.tally, self.held, self.link
        limit = link.config.max_replay_attempts
        for entry, state, since in tally.suspects:
            if not (tally.answered or held.healthy_at >= since):
                state.uncounted = True
                continue
            state.attempts += 1
            if state.attempts >= limit and tally.epoch == held.epoch and self._still_waiting(entry):
                reason = f"gave up after {state.attempts} failed replays; last error: {state.reason}"
                await self._park_now(entry, reason)
        if tally.answered:
            now = link.monotonic()
            for state in held.retries.values():
                if state.uncounted and state.due > now:
                    state.due = now
        if (
            tally.found_nothing
            and tally.epoch == held.epoch
            and held.depth > 0
            and not held.volatile
            and not held.pending_deletes
            and link.usable()
        ):
            await resync(link)

    def _summary(self) -> ReplaySummary:
        tally, held = self.tally, self.held
        left = tally.stopped or tally.failed > 0 or tally.deferred > 0
        dues = [state.due for seq in tally.backing_off if (state := held.retries.get(seq)) is not None]
        retry_in = max(0.0, min(dues) - self.link.monotonic()) if dues else None
        return ReplaySummary(
            replayed=tally.replayed,
            parked=tally.parked,
            remaining=held.depth,
            stopped_early=left and held.depth > 0,
            last_error=tally.last_error,
            failed=tally.failed,
            deferred=tally.deferred,
            retry_in=retry_in,
            backend_down=tally.backend_down,
        )


__all__ = [
    "PAGE",
    "ReplayPass",
    "Sending",
    "Tally",
    "by_stream",
    "lanes",
    "remove_replayed",
    "resync",
    "stream",
]
