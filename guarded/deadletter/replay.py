"""Replay vocabulary: what a sender answers, what a pass reports, and the pace it keeps."""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..durability.bulk_forms import bulk_call, bulk_method_for, bulk_methods_of
from ..errors import GuardedError, InvalidPayloadError, WriteSupersededError
from ..pipeline.call_check import own_signature, protocol_signature
from ..pipeline.classify import (
    CircuitOpenError,
    ErrorClass,
    classify,
    error_type,
    no_wait_fixes,
    safe_message,
)
from ..pipeline.idempotency import KEPT_ARGUMENTS, replayed_call
from ..protocol import LEGACY_NAMES

Call = tuple[tuple[Any, ...], dict[str, Any]]
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
as bad data (:func:`guarded.pipeline.classify.classify`, e.g. :class:`InvalidPayloadError`) or a
:class:`ReplayRejected` parks the entry with the exception as reason; any other retries later."""
SendBulk = Callable[[str, list[Call]], Awaitable[ReplayResult]]
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
    :func:`guarded.durability.bulk_forms.bulk_methods_of`) that replays into a plain store.

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

    async def send_bulk(method: str, calls: list[Call]) -> ReplayResult:
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


async def attempt(send: Send, method: str, call: Call) -> Attempt:
    """Run ``send`` and turn an exception into a result and a reason (cancellation propagates)."""
    return await _attempted(lambda: send(method, *call))


async def attempt_bulk(send_bulk: SendBulk, method: str, calls: Sequence[Call]) -> Attempt:
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


async def call_sender(send: Send, method: str, call: Call) -> tuple[ReplayResult, str | None]:
    """Run ``send`` and turn an exception into a result and a reason (cancellation propagates)."""
    found = await attempt(send, method, call)
    return found.result, found.reason


async def call_bulk_sender(
    send_bulk: SendBulk, method: str, calls: Sequence[Call]
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
    (:func:`guarded.pipeline.call_check.protocol_signatures`), and so is a store method that takes anything
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

    def problem(self, method: str, call: Call) -> str | None:
        """Why the call can certainly never succeed (``None``: it may)."""
        found = self.method_problem(method)
        if found is None and self.exact(method):
            found = self.binding_problem(method, *call)
        return found

    def doubtful(self, method: str, call: Call) -> str | None:
        """Without the store: why the call looks like it cannot succeed (it is sent alone, and
        parked if the store refuses it with a ``TypeError``)."""
        return None if self.exact(method) else self.binding_problem(method, *call)


__all__ = [
    "REPLAY_BACKOFF_BASE",
    "REPLAY_BACKOFF_MAX",
    "REPLAY_FAILURE_STREAK",
    "Attempt",
    "Call",
    "CallCheck",
    "ReplayRejected",
    "ReplayResult",
    "ReplaySummary",
    "Send",
    "SendBulk",
    "TokenBucket",
    "attempt",
    "attempt_bulk",
    "call_bulk_sender",
    "call_sender",
    "describe_failure",
    "judge",
    "replay_backoff",
    "store_sender",
]
