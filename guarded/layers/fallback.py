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
from ..pipeline.steps import Step, StepLayer
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


class FallbackLayer(StepLayer):
    """Turns failures into the policy's fallback value; sets the call's final outcome."""

    def __init__(self, failure_log: FailureLog, *, strict: bool = False) -> None:
        self._log = failure_log
        self._strict = strict

    def step(self, method: MethodSetup, inner: Service) -> Step:
        policy = method.policy
        normalise_empty = policy.kind is Kind.CONSUME
        single_item = policy.single_item
        found = (Outcome.OK, Outcome.RETRIED)
        not_found = Outcome.NOT_FOUND
        current_task = asyncio.current_task
        failed = self._failure_handler(method)

        def answered(call: Call, result: Any) -> Any:
            if normalise_empty and result == {}:
                result = None
            if single_item and result is None and call.outcome in found:
                call.settle(not_found)
            return result

        def answer_failure(call: Call, exc: BaseException) -> Any:
            # The caller's cancellation (and any other BaseException) goes through; a
            # CancelledError the store raised on its own (an internal future of the driver was
            # cancelled) is just a failure.
            if not isinstance(exc, Exception):
                if not isinstance(exc, asyncio.CancelledError):
                    raise exc  # GeneratorExit of a call collected as garbage included: no running loop
                task = current_task()
                if task is None or task.cancelling():
                    raise exc
            return failed(call, exc)

        # A method whose result this layer never rewrites has no ``ok`` step.
        rewrites = normalise_empty or single_item
        return Step(ok=answered if rewrites else None, failed=answer_failure)

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
