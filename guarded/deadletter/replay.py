"""Replaying a dead-letter buffer's held writes: what a sender answers, what a pass reports, the
pace it keeps, which calls can never succeed, and one pass itself (order per key and stream, bulk
runs, backoff per write, parking what can never succeed, stopping when the backend is down).

See :meth:`~.buffer.DeadLetterBuffer.replay` for the rules; :class:`ReplayPass` carries them out
on the buffer's :class:`~.spill_link.SpillLink` (which removes and parks what a pass answered) and
:class:`~.gate.KeyGate`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..bulk_forms import bulk_call, bulk_method_for, bulk_methods_of
from ..error_classes import (
    CircuitOpenError,
    ErrorClass,
    classify,
    error_type,
    no_wait_fixes,
    safe_message,
)
from ..errors import GuardedError, InvalidPayloadError, WriteSupersededError
from ..pipeline.idempotency import KEPT_ARGUMENTS, replayed_call
from ..protocol import LEGACY_NAMES, own_signature, protocol_signature
from .call_codec import CALL_ALIASES
from .entries import DeadLetter, index_key_of_canonical
from .gate import KeyGate, Slot
from .spill_link import Retry, SpillLink

HeldCall = tuple[tuple[Any, ...], dict[str, Any]]
"""A decoded store call: ``(args, kwargs)``."""


class ReplayResult(str, Enum):
    """What a sender reports for one replayed write (or one bulk write)."""

    OK = "ok"
    """The backend took it: the entry is removed."""
    RETRY_LATER = "retry_later"
    """It failed: the entry stays and is tried again after its own backoff; later entries of its
    key or stream wait behind it, the others go on (see :meth:`DeadLetterBuffer.replay`)."""
    REJECTED = "rejected"
    """Bad data the backend will never take: the entry is parked with the reason, the pass goes on."""
    SUPERSEDED = "superseded"
    """The backend left it alone: the key holds a newer write (another process wrote it since;
    :class:`~guarded.errors.WriteSupersededError`). The entry is removed and counted as superseded,
    not as replayed. From a bulk sender: some items were left alone, the run's writes are sent one
    by one to tell which."""


Send = Callable[[str, tuple[Any, ...], dict[str, Any]], Awaitable[ReplayResult]]
"""``send(method, args, kwargs)``: replay one write. It may also raise: an exception classified
as bad data (:func:`guarded.error_classes.classify`, e.g. :class:`InvalidPayloadError`) or a
:class:`ReplayRejected` parks the entry with the exception as reason; any other retries later."""
SendBulk = Callable[[str, list[HeldCall]], Awaitable[ReplayResult]]
"""``send_bulk(method, calls)``: replay a run of consecutive writes of ``method`` (one of the
pass's ``bulk_methods``) as one bulk write, applied in list order (``save_event`` runs become one
``save_events``, ``save_memory_state`` runs one ``save_memory_states``). Anything but ``OK`` (an
exception included) makes the pass send the run's writes one by one, so a bad one is found and
the good ones are not held back with it."""


class ReplayRejected(GuardedError):
    """Raised by a sender to park the entry being replayed with this message as its reason."""


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """What one replay pass did."""

    replayed: int
    parked: int
    remaining: int
    stopped_early: bool
    """``True`` when the pass left entries behind because sends failed: it stopped (the backend
    looks down) or entries wait for their backoff or behind a failed entry of their key or stream.
    A caller should pause before the next pass (:attr:`retry_in` says how long entries wait)."""
    last_error: str | None = None
    """Why the pass stopped or the last entry failed or was parked (exception type and safe message)."""
    failed: int = 0
    """Sends that failed and will be tried again (bulk writes retried one by one not counted)."""
    deferred: int = 0
    """Entries left for a later pass: waiting for their backoff, or behind a failed entry of their
    key or stream."""
    retry_in: float | None = None
    """Seconds until the first entry left behind may be tried again (0: at the next pass; ``None``:
    none was left behind for a backoff)."""
    backend_down: bool = False
    """The pass stopped because the backend looks down: ``REPLAY_FAILURE_STREAK`` sends in a row
    failed with no success between them, or the guard's circuit breaker refused a send."""

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready mapping."""
        return {
            "replayed": self.replayed,
            "parked": self.parked,
            "remaining": self.remaining,
            "stopped_early": self.stopped_early,
            "last_error": self.last_error,
            "failed": self.failed,
            "deferred": self.deferred,
            "retry_in": self.retry_in,
            "backend_down": self.backend_down,
        }


REPLAY_FAILURE_STREAK = 3
"""Sends failing in a row (each of another key or stream, with no success between them) after
which a pass stops: the backend looks down, and the next pass comes after the caller's pause."""
REPLAY_BACKOFF_BASE = 0.5
"""Seconds an entry waits after its second failure in a row; doubled after each further one. After
its first failure an entry is tried again at the next pass."""
REPLAY_BACKOFF_MAX = 30.0
"""The longest an entry waits between two attempts."""


def replay_backoff(failures: int) -> float:
    """Seconds an entry waits after ``failures`` failed attempts in a row (see
    :data:`REPLAY_BACKOFF_BASE`): 0, 0.5, 1, 2, 4, ... up to :data:`REPLAY_BACKOFF_MAX`."""
    if failures <= 1:
        return 0.0
    return min(REPLAY_BACKOFF_MAX, REPLAY_BACKOFF_BASE * 2.0 ** min(failures - 2, 64))


class TokenBucket:
    """Paces writes to ``rate`` per second with a burst of ``burst``; ``rate=math.inf`` does not
    pace at all (a drain sends at the backend's pace).

    :meth:`take` of ``n`` tokens may overdraw the bucket (a bulk write of 100 events at 500/s
    goes out at once) and the next take waits until the debt is paid.
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not rate > 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = burst
        self._updated = clock()

    @property
    def unlimited(self) -> bool:
        """Whether the bucket does not pace (``rate`` is infinite)."""
        return math.isinf(self.rate)

    def debit(self, tokens: float) -> None:
        """Take ``tokens`` without waiting: the debt makes the next :meth:`take` wait longer."""
        if self.unlimited:
            return
        self._refill()
        self._tokens -= tokens

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    async def take(self, tokens: float = 1.0) -> None:
        """Wait until the bucket holds ``tokens`` (at most a burst), then take them; a shortfall
        left by an early wake-up is carried as debt into the next take."""
        if self.unlimited:
            return
        self._refill()
        deficit = min(tokens, self.burst) - self._tokens
        if deficit > 1e-9:
            await self._sleep(deficit / self.rate)
            self._refill()
        self._tokens -= tokens


def describe_failure(exc: BaseException) -> str:
    """A reason fit for a parked write or a log: the exception type and its safe message.

    An :class:`InvalidPayloadError` names the method and the path of the bad value, never the value.
    """
    if isinstance(exc, InvalidPayloadError | ReplayRejected):
        return f"{error_type(exc)}: {exc}"[:1000]
    message = safe_message(exc)
    return f"{error_type(exc)}: {message}" if message else error_type(exc)


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one send (or bulk send) came to: its result, the reason of a failure, the exception."""

    result: ReplayResult
    reason: str | None = None
    error: BaseException | None = None

    @property
    def refused_by_breaker(self) -> bool:
        """The guard's circuit breaker refused the send: nothing reached the backend."""
        return isinstance(self.error, CircuitOpenError)

    @property
    def operational(self) -> bool:
        """The database reported a condition an operator must fix (a missing table, a grant): the
        entry's data is not at fault, so the failure never counts toward parking it."""
        operational = getattr(ErrorClass, "OPERATIONAL", None)
        return operational is not None and self.error is not None and classify(self.error) is operational

    def unknown_method(self, method: str) -> bool:
        """The send failed because the store has no ``method`` at all."""
        error = self.error
        return isinstance(error, AttributeError) and getattr(error, "name", None) == method


def judge(exc: BaseException) -> ReplayResult:
    """How a replay treats a sender's exception: bad data is rejected, anything else retried later."""
    if isinstance(exc, ReplayRejected) or no_wait_fixes(exc):
        return ReplayResult.REJECTED  # bad data or a bug: parked with the reason
    return ReplayResult.RETRY_LATER


def store_sender(store: Any) -> tuple[Send, SendBulk | None]:
    """A sender (and a bulk sender when the store has bulk forms, see
    :func:`guarded.bulk_forms.bulk_methods_of`) that replays into a plain store.

    A method the store lacks is rejected (parked), exceptions are judged by :func:`judge`.
    """

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        target = getattr(store, method, None)
        if not callable(target):
            raise ReplayRejected(f"the store has no method {method!r}")
        try:
            with replayed_call(kwargs):
                await target(*args, **kwargs)
        except WriteSupersededError:
            return ReplayResult.SUPERSEDED
        return ReplayResult.OK

    if not bulk_methods_of(store):
        return send, None

    async def send_bulk(method: str, calls: list[HeldCall]) -> ReplayResult:
        bulk = bulk_method_for(store, method)
        if bulk is None:
            raise ReplayRejected(f"no bulk form of {method!r}")
        try:
            replay = bulk_call(method, calls)
        except TypeError as exc:
            raise ReplayRejected(f"cannot group these calls into a bulk write: {exc}") from None
        try:
            with replay.context():
                await getattr(store, bulk)(*replay.args)
        except WriteSupersededError:
            return ReplayResult.SUPERSEDED
        return ReplayResult.OK

    return send, send_bulk


async def attempt(send: Send, method: str, call: HeldCall) -> Attempt:
    """Run ``send`` and turn an exception into a result and a reason (cancellation propagates)."""
    return await _attempted(lambda: send(method, *call))


async def attempt_bulk(send_bulk: SendBulk, method: str, calls: Sequence[HeldCall]) -> Attempt:
    """:func:`attempt` for a bulk sender."""
    return await _attempted(lambda: send_bulk(method, list(calls)))


async def _attempted(sending: Callable[[], Awaitable[ReplayResult]]) -> Attempt:
    """Await ``sending()`` and turn an exception into a result and a reason: the one body of
    :func:`attempt` and :func:`attempt_bulk` (the caller's own cancellation propagates)."""
    try:
        return Attempt(await sending())
    except asyncio.CancelledError as exc:
        if _cancelled_by_caller():
            raise
        return Attempt(judge(exc), describe_failure(exc), exc)  # the store's own: retried later
    except Exception as exc:
        return Attempt(judge(exc), describe_failure(exc), exc)


def _cancelled_by_caller() -> bool:
    """Whether a ``CancelledError`` just caught is the replaying task's own cancellation (else the
    store raised it on its own: a failed send like any other)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def call_sender(send: Send, method: str, call: HeldCall) -> tuple[ReplayResult, str | None]:
    """Run ``send`` and turn an exception into a result and a reason (cancellation propagates)."""
    found = await attempt(send, method, call)
    return found.result, found.reason


async def call_bulk_sender(
    send_bulk: SendBulk, method: str, calls: Sequence[HeldCall]
) -> tuple[ReplayResult, str | None]:
    """:func:`call_sender` for a bulk sender."""
    found = await attempt_bulk(send_bulk, method, calls)
    return found.result, found.reason


# --- calls that can never succeed ------------------------------------------------------------------


class CallCheck:
    """Tells a held call that can never succeed, before it is sent.

    With the ``target`` store, a method it lacks and a call that does not bind to the method's own
    signature (``inspect.signature(getattr(target, method)).bind(*args, **kwargs)``) are certain:
    :meth:`problem` says why, and the entry is parked at once. Without one, a call is checked
    against the protocol's signature of its method
    (:func:`guarded.protocol.protocol_signatures`), and so is a store method that takes anything
    (``*args, **kwargs``: a wrapper or proxy); a backend may accept more than the protocol, so such
    a call is only :meth:`doubtful`: it is sent alone, and parked when the store then refuses it
    with a ``TypeError``.
    """

    def __init__(self, target: object | None = None) -> None:
        self.target = target
        self._signatures: dict[str, tuple[inspect.Signature | None, bool]] = {}
        self._shapes: dict[tuple[str, int, tuple[str, ...]], str | None] = {}

    def method_problem(self, method: str) -> str | None:
        """Why ``method`` can never be called (not a method name, or the store has none)."""
        if not method.isidentifier() or method.startswith("_"):
            return "not a store method name"
        if self.target is not None and not any(
            callable(getattr(self.target, name, None)) for name in (method, *LEGACY_NAMES.get(method, ()))
        ):
            return f"the store has no method {method!r}"
        return None

    def _signature(self, method: str) -> tuple[inspect.Signature | None, bool]:
        """The signature calls of ``method`` are checked against, and whether it is the store's
        own (exact). A store method that takes anything (``*args, **kwargs``: a wrapper, a proxy)
        says nothing: the protocol's signature stands in, as a doubt only."""
        found = self._signatures.get(method)
        if found is not None:
            return found
        own = own_signature(getattr(self.target, method, None)) if self.target is not None else None
        found = (own, True) if own is not None else (protocol_signature(method), False)
        self._signatures[method] = found
        return found

    def exact(self, method: str) -> bool:
        """Whether calls of ``method`` are checked against the store's own signature."""
        return self._signature(method)[1]

    def binding_problem(self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """Why ``method(*args, **kwargs)`` does not bind to the signature it is checked against
        (``None``: it binds, or there is no signature to check)."""
        # Binding depends only on how many positional arguments and which keywords: cached so.
        shape = (method, len(args), tuple(name for name in kwargs if name not in KEPT_ARGUMENTS))
        if shape in self._shapes:
            return self._shapes[shape]
        signature = self._signature(method)[0]
        problem: str | None = None
        if signature is not None:
            kept = {name: value for name, value in kwargs.items() if name not in KEPT_ARGUMENTS}
            try:
                signature.bind(*args, **kept)
            except TypeError as exc:
                problem = f"the call does not bind to {method}(): {exc}"
        if len(self._shapes) < 1024:
            self._shapes[shape] = problem
        return problem

    def problem(self, method: str, call: HeldCall) -> str | None:
        """Why the call can certainly never succeed (``None``: it may)."""
        found = self.method_problem(method)
        if found is None and self.exact(method):
            found = self.binding_problem(method, *call)
        return found

    def doubtful(self, method: str, call: HeldCall) -> str | None:
        """Without the store: why the call looks like it cannot succeed (it is sent alone, and
        parked if the store refuses it with a ``TypeError``)."""
        return None if self.exact(method) else self.binding_problem(method, *call)


# --- one replay pass ------------------------------------------------------------------------------

PAGE = 256
"""Waiting entries read at a time (at least a bulk run)."""

Decode = Callable[[DeadLetter], HeldCall | None]
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

    def _ready(self, entry: DeadLetter) -> HeldCall | str:
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

    async def _replay_single(self, entry: DeadLetter, call: HeldCall | None, *, paid: bool) -> None:
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
            tally.replayed += await self.link.remove_replayed([entry], tally.epoch)
            self._answered(entry.method)
        elif outcome.result is ReplayResult.SUPERSEDED:
            await self.link.remove_replayed([entry], tally.epoch, superseded=True)
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
            tally.replayed += await self.link.remove_replayed([item for item, _ in run], tally.epoch)
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
    ) -> tuple[list[tuple[DeadLetter, HeldCall]], list[Slot], list[tuple[DeadLetter, str]], int]:
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
        run: list[tuple[DeadLetter, HeldCall]] = []
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

    async def _send_one(self, entry: DeadLetter, call: HeldCall) -> Attempt | None:
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
        self.held.note_healthy(self.link.monotonic())

    def _stop(self, reason: str | None) -> None:
        self.tally.stopped = self.tally.backend_down = True
        self.tally.last_error = reason or "the backend looks down"

    def _send_failed(self, entry: DeadLetter, outcome: Attempt) -> None:
        """A send of ``entry`` failed and may succeed later: its own backoff, its key and stream
        wait behind it for this pass, and too many failures in a row end the pass."""
        tally = self.tally
        now = self.link.monotonic()
        reason = outcome.reason or "the backend asked to retry later"
        state = self.held.retry_of(entry.seq)
        since = state.failed_at if state.failures else tally.started
        state.failed(now, reason, replay_backoff(state.failures + 1))
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
                state.leave_uncounted()
                continue
            if state.count() >= limit and tally.epoch == held.epoch and self._still_waiting(entry):
                reason = f"gave up after {state.attempts} failed replays; last error: {state.reason}"
                await self._park_now(entry, reason)
        if tally.answered:
            held.uncounted_due(link.monotonic())
        if (
            tally.found_nothing
            and tally.epoch == held.epoch
            and held.depth > 0
            and not held.volatile
            and not held.pending_deletes
            and link.usable()
        ):
            await link.resync()

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
    "REPLAY_BACKOFF_BASE",
    "REPLAY_BACKOFF_MAX",
    "REPLAY_FAILURE_STREAK",
    "Attempt",
    "HeldCall",
    "CallCheck",
    "ReplayPass",
    "ReplayRejected",
    "ReplayResult",
    "ReplaySummary",
    "Send",
    "SendBulk",
    "Sending",
    "Tally",
    "TokenBucket",
    "attempt",
    "attempt_bulk",
    "by_stream",
    "call_bulk_sender",
    "call_sender",
    "describe_failure",
    "judge",
    "lanes",
    "replay_backoff",
    "store_sender",
    "stream",
]
