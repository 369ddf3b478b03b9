"""Must-not-throw: every failure becomes the method's safe default, with its outcome recorded.

A programming error (the caller's wrong call, a ``TypeError`` or ``AttributeError`` of the
backend) ends ``rejected`` and is logged at ERROR with its message. A write that could not be kept
(:class:`~guarded.errors.WriteNotKeptError`: the backend did not take it and the dead-letter buffer
had no room for it, or a backend refused it as older than what it holds) ends ``refused``, never
``ok``, and is logged at ERROR; it returns the fallback value, or the refusal's ``answer`` when it
carries one (a refused artifact put: the reference of its copy in this process). In strict mode
(:mod:`guarded.pipeline.strict_mode`) a rejected or refused call raises to the caller instead;
store failures degrade all the same.

Caller cancellation (``asyncio.CancelledError``), ``KeyboardInterrupt`` and ``SystemExit`` are
``BaseException``s and pass through untouched. A backend answering ``{}`` for a missing pause
token gets ``None`` (spec 000 §5, "missing token semantics"), and single-item reads that find
nothing report ``not_found`` so "store down" and "token expired" never look alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..error_classes import (
    NO_WAIT_FIXES,
    CircuitOpenError,
    ErrorClass,
    classify,
    error_type,
    no_wait_fixes,
    safe_message,
)
from ..errors import WriteNotKeptError
from ..observability.failure_log import FailureLog
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.compiled import Hooks
from ..pipeline.strict_mode import forced as strict_forced
from ..policy import Kind


def failure_outcome(exc: BaseException) -> Outcome:
    """The outcome of a call that failed with ``exc``."""
    if isinstance(exc, WriteNotKeptError):
        return Outcome.REFUSED
    if isinstance(exc, CircuitOpenError):
        return Outcome.CIRCUIT_OPEN
    if isinstance(exc, TimeoutError):
        return Outcome.TIMEOUT
    if no_wait_fixes(exc):
        return Outcome.REJECTED
    return Outcome.FALLBACK


class FallbackLayer:
    """Turns failures into the policy's fallback value; sets the call's final outcome."""

    def __init__(self, failure_log: FailureLog, *, strict: bool = False) -> None:
        self._log = failure_log
        self._strict = strict

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        policy = method.policy
        normalise_empty = policy.kind is Kind.CONSUME
        single_item = policy.single_item
        current_task = asyncio.current_task
        ok, not_found, retried = Outcome.OK, Outcome.NOT_FOUND, Outcome.RETRIED
        failed = self._failure_handler(method)

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
                    call.settle(not_found)
                elif call.attempts > 1:
                    call.settle(retried)
            return result

        return must_not_throw

    def hooks(self, method: MethodSetup) -> Hooks:
        """The answer of a call that took the success path, and the answer to a failure of a hook
        inside this layer."""
        policy = method.policy
        normalise_empty = policy.kind is Kind.CONSUME
        single_item = policy.single_item
        ok, not_found = Outcome.OK, Outcome.NOT_FOUND
        current_task = asyncio.current_task
        failed = self._failure_handler(method)

        def answered(call: Call, result: Any) -> Any:
            if normalise_empty and result == {}:
                result = None
            if single_item and result is None and call.outcome is ok:
                call.settle(not_found)
            return result

        def answer_failure(call: Call, exc: BaseException) -> Any:
            # As must_not_throw: the caller's cancellation (and any other BaseException) goes
            # through; a CancelledError of the store's own is just a failure.
            if not isinstance(exc, Exception):
                if not isinstance(exc, asyncio.CancelledError):
                    raise exc  # GeneratorExit of a call collected as garbage included: no running loop
                task = current_task()
                if task is None or task.cancelling():
                    raise exc
            return failed(call, exc)

        # A method whose result this layer never rewrites has no ``after`` step.
        rewrites = normalise_empty or single_item
        return Hooks(after=answered if rewrites else None, on_failure=answer_failure)

    def _failure_handler(self, method: MethodSetup) -> Callable[[Call, BaseException], Any]:
        make_fallback = method.policy.fallback.value_factory()
        log = self._log
        strict = self._strict

        def failed(call: Call, exc: BaseException) -> Any:
            kind = classify(exc)
            outcome = failure_outcome(exc)
            call.settle(outcome, exc)
            refused = outcome is Outcome.REFUSED
            if (kind in NO_WAIT_FIXES or refused) and (strict or strict_forced()):
                raise exc
            bug = kind is ErrorClass.PROGRAMMING or refused
            log.failure(
                store=method.store_name,
                method=method.label,
                error_type=error_type(exc),
                outcome=call.outcome.value,
                message=lambda: safe_message(exc),  # made only for a record that is logged
                level=logging.ERROR if bug else logging.WARNING,
                distinct=bug,  # each bug's own message is logged, not only the first of its type
            )
            if isinstance(exc, WriteNotKeptError) and exc.answer is not None:
                return exc.answer
            return make_fallback()

        return failed
