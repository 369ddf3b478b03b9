"""Retries with exponential backoff and jitter (tenacity), for retryable errors only.

The first attempt runs without any tenacity machinery; only a retryable failure enters the
slow path. A consume (``load_planner_state``) is repeated only when the backend honours the
guard's idempotency key, or when the failed attempt provably never reached the backend.
Backoff never sleeps past the call's deadline.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from ..config import RetryConfig
from ..error_classes import ErrorClass, classify, error_type, reached_backend
from ..pipeline.call import Call, MethodSetup, Service

_FIRST_BACKOFF = (
    "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter).parameters else "initial"
)
"""tenacity 9.2 renamed ``initial`` (now deprecated) to ``multiplier``; 8.x only knows ``initial``."""


class RetryLayer:
    """Retries retryable failures of repeat-safe calls (see module docs)."""

    retry_boundary = True
    """The layers after this one bound each attempt (:func:`guarded.pipeline.compiled.compile_method`); a
    first attempt needs nothing of this layer on the success path."""

    def __init__(self, config: RetryConfig) -> None:
        self._config = config

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        max_attempts = method.settings.max_attempts
        repeat_safe = method.policy.repeat_safe or method.honours_idempotency_key

        def may_repeat(exc: BaseException) -> bool:
            if not isinstance(exc, Exception) or classify(exc) is not ErrorClass.RETRYABLE:
                return False
            return repeat_safe or not reached_backend(exc)

        def attempt(call: Call) -> Awaitable[Any]:
            call.attempts += 1
            return inner(call)

        if max_attempts <= 1:
            return attempt

        wait = wait_exponential_jitter(
            **{_FIRST_BACKOFF: self._config.initial_backoff},
            max=self._config.max_backoff,
            exp_base=self._config.multiplier,
            jitter=self._config.jitter,
        )

        async def retried(call: Call) -> Any:
            call.attempts += 1
            try:
                return await inner(call)
            except Exception as exc:
                if not may_repeat(exc):
                    raise
                first_error = exc
            return await _retry_slow_path(call, first_error)

        async def _retry_slow_path(call: Call, first_error: Exception) -> Any:
            loop = asyncio.get_running_loop()

            def stop(state: RetryCallState) -> bool:
                return (
                    call.attempts >= max_attempts
                    or loop.time() + (state.upcoming_sleep or 0.0) >= call.deadline
                )

            def before_sleep(state: RetryCallState) -> None:
                failure = state.outcome.exception() if state.outcome else None
                call.note_retry(error_type(failure) if failure else "unknown", state.upcoming_sleep)

            first = True
            retrying = AsyncRetrying(
                stop=stop,
                wait=wait,
                retry=retry_if_exception(may_repeat),
                before_sleep=before_sleep,
                reraise=True,
            )
            async for attempt_state in retrying:
                with attempt_state:
                    if first:
                        first = False
                        raise first_error
                    return await attempt(call)
            raise AssertionError("unreachable: tenacity either returns or re-raises")

        return retried
