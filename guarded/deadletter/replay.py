"""Replay vocabulary: what a sender answers, what a pass reports, and the pace it keeps."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..batching import bulk_call, bulk_method_for, bulk_methods_of
from ..classify import ErrorClass, classify, error_type, safe_message
from ..errors import GuardedError, InvalidPayloadError
from ..idempotency import item_keys, replayed_item_key

Call = tuple[tuple[Any, ...], dict[str, Any]]
"""A decoded store call: ``(args, kwargs)``."""


class ReplayResult(str, Enum):
    """What a sender reports for one replayed write (or one bulk write)."""

    OK = "ok"
    """The backend took it: the entry is removed."""
    RETRY_LATER = "retry_later"
    """The backend still fails: the pass stops, this entry and every later one stay."""
    REJECTED = "rejected"
    """Bad data the backend will never take: the entry is parked with the reason, the pass goes on."""


Send = Callable[[str, tuple[Any, ...], dict[str, Any]], Awaitable[ReplayResult]]
"""``send(method, args, kwargs)``: replay one write. It may also raise: an exception classified
as bad data (:func:`guarded.classify.classify`, e.g. :class:`InvalidPayloadError`) or a
:class:`ReplayRejected` parks the entry with the exception as reason; any other retries later."""
SendBulk = Callable[[str, list[Call]], Awaitable[ReplayResult]]
"""``send_bulk(method, calls)``: replay a run of consecutive writes of ``method`` (one of the
pass's ``bulk_methods``) as one bulk write, applied in list order (``save_event`` runs become one
``save_events``, ``save_memory_state`` runs one ``save_memory_states``). ``REJECTED`` makes the
pass send the run's writes one by one, so only the bad ones are parked."""


class ReplayRejected(GuardedError):
    """Raised by a sender to park the entry being replayed with this message as its reason."""


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """What one replay pass did."""

    replayed: int
    parked: int
    remaining: int
    stopped_early: bool
    """``True`` when the backend answered ``RETRY_LATER`` and the pass left entries behind."""
    last_error: str | None = None
    """Why the pass stopped or the last entry was parked (exception type and safe message)."""

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready mapping."""
        return {
            "replayed": self.replayed,
            "parked": self.parked,
            "remaining": self.remaining,
            "stopped_early": self.stopped_early,
            "last_error": self.last_error,
        }


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


def judge(exc: BaseException) -> ReplayResult:
    """How a replay treats a sender's exception: bad data is rejected, anything else retried later."""
    if isinstance(exc, ReplayRejected) or classify(exc) is ErrorClass.REJECTED:
        return ReplayResult.REJECTED
    return ReplayResult.RETRY_LATER


BULK_FORMS: dict[str, str] = {"save_event": "save_events"}
"""Methods :func:`store_sender` groups into a bulk write, and the bulk method of the store; the
default ``bulk_methods`` of :meth:`~guarded.deadletter.DeadLetterBuffer.replay`."""


def store_sender(store: Any) -> tuple[Send, SendBulk | None]:
    """A sender (and a bulk sender when the store has bulk forms, see
    :func:`guarded.batching.bulk_methods_of`) that replays into a plain store.

    A method the store lacks is rejected (parked), exceptions are judged by :func:`judge`.
    """

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        target = getattr(store, method, None)
        if not callable(target):
            raise ReplayRejected(f"the store has no method {method!r}")
        with replayed_item_key(kwargs):
            await target(*args, **kwargs)
        return ReplayResult.OK

    if not bulk_methods_of(store):
        return send, None

    async def send_bulk(method: str, calls: list[Call]) -> ReplayResult:
        bulk = bulk_method_for(store, method)
        if bulk is None:
            raise ReplayRejected(f"no bulk form of {method!r}")
        try:
            args, keys = bulk_call(method, calls)
        except TypeError as exc:
            raise ReplayRejected(f"cannot group these calls into a bulk write: {exc}") from None
        with item_keys(keys):
            await getattr(store, bulk)(*args)
        return ReplayResult.OK

    return send, send_bulk


async def call_sender(send: Send, method: str, call: Call) -> tuple[ReplayResult, str | None]:
    """Run ``send`` and turn an exception into a result and a reason (cancellation propagates)."""
    try:
        return await send(method, *call), None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return judge(exc), describe_failure(exc)


async def call_bulk_sender(
    send_bulk: SendBulk, method: str, calls: Sequence[Call]
) -> tuple[ReplayResult, str | None]:
    """:func:`call_sender` for a bulk sender."""
    try:
        return await send_bulk(method, list(calls)), None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return judge(exc), describe_failure(exc)


__all__ = [
    "BULK_FORMS",
    "Call",
    "ReplayRejected",
    "ReplayResult",
    "ReplaySummary",
    "Send",
    "SendBulk",
    "TokenBucket",
    "call_bulk_sender",
    "call_sender",
    "describe_failure",
    "judge",
    "store_sender",
]
