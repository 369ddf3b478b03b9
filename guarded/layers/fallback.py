"""Must-not-throw: every failure becomes the method's safe default, with its outcome recorded.

Caller cancellation (``asyncio.CancelledError``), ``KeyboardInterrupt`` and ``SystemExit`` are
``BaseException``s and pass through untouched. A backend answering ``{}`` for a missing pause
token gets ``None`` (spec 000 §5, "missing token semantics"), and single-item reads that find
nothing report ``not_found`` so "store down" and "token expired" never look alike.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..call import Call, MethodSetup, Service
from ..classify import CircuitOpenError, ErrorClass, classify, error_type, safe_message
from ..failure_log import FailureLog
from ..outcome import Outcome
from ..policy import Kind


def failure_outcome(exc: BaseException) -> Outcome:
    """The outcome of a call that failed with ``exc``."""
    if isinstance(exc, CircuitOpenError):
        return Outcome.CIRCUIT_OPEN
    if isinstance(exc, TimeoutError):
        return Outcome.TIMEOUT
    if classify(exc) is ErrorClass.REJECTED:
        return Outcome.REJECTED
    return Outcome.FALLBACK


class FallbackLayer:
    """Turns failures into the policy's fallback value; sets the call's final outcome."""

    def __init__(self, failure_log: FailureLog) -> None:
        self._log = failure_log

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        policy = method.policy
        make_fallback = policy.fallback.value_factory()
        normalise_empty = policy.kind is Kind.CONSUME
        single_item = policy.single_item
        log = self._log
        current_task = asyncio.current_task
        ok, not_found, retried = Outcome.OK, Outcome.NOT_FOUND, Outcome.RETRIED

        async def must_not_throw(call: Call) -> Any:
            try:
                result = await inner(call)
            except Exception as exc:
                return failed(call, exc)
            except asyncio.CancelledError as exc:
                # The caller's cancellation propagates; a CancelledError the store raised on
                # its own (an internal future of the driver was cancelled) is just a failure.
                task = current_task()
                if task is None or task.cancelling():
                    raise
                return failed(call, exc)
            if normalise_empty and result == {}:
                result = None
            if call.outcome is ok:
                if single_item and result is None:
                    call.outcome = not_found
                elif call.attempts > 1:
                    call.outcome = retried
            return result

        def failed(call: Call, exc: BaseException) -> Any:
            call.error = exc
            call.outcome = failure_outcome(exc)
            log.failure(
                store=method.store_name,
                method=method.label,
                error_type=error_type(exc),
                outcome=call.outcome.value,
                message=safe_message(exc),
            )
            return make_fallback()

        return must_not_throw
