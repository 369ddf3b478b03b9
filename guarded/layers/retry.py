"""Retries with exponential backoff and jitter (tenacity), for retryable errors only.

The first attempt runs without any tenacity machinery; only a retryable failure enters the
slow path. A consume (``load_planner_state``) is repeated only when the backend honours the
guard's idempotency key, or when the failed attempt provably never reached the backend.
Backoff never sleeps past the call's deadline.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from ..config import RetryConfig
from ..error_classes import ErrorClass, classify, error_type, reached_backend
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Deferred, Step, StepLayer

_FIRST_BACKOFF = (
    "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter).parameters else "initial"
)
"""tenacity 9.2 renamed ``initial`` (now deprecated) to ``multiplier``; 8.x only knows ``initial``."""


class RetryLayer(StepLayer):
    """Retries retryable failures of repeat-safe calls (see module docs)."""

    def __init__(self, config: RetryConfig) -> None:
        self._config = config

    def step(self, method: MethodSetup, inner: Service) -> Step:
        max_attempts = method.settings.max_attempts
        repeat_safe = method.policy.repeat_safe or method.honours_idempotency_key

        def may_repeat(exc: BaseException) -> bool:
            if not isinstance(exc, Exception) or classify(exc) is not ErrorClass.RETRYABLE:
                return False
            return repeat_safe or not reached_backend(exc)

        if max_attempts <= 1:
            return Step(counts_attempts=True)

        wait = wait_exponential_jitter(
            **{_FIRST_BACKOFF: self._config.initial_backoff},
            max=self._config.max_backoff,
            exp_base=self._config.multiplier,
            jitter=self._config.jitter,
        )

        def failed(call: Call, exc: BaseException) -> Any:
            if not may_repeat(exc):
                raise exc
            raise Deferred(retried(call, exc))

        async def retried(call: Call, first_error: BaseException) -> Any:
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
                    call.attempts += 1
                    result = await inner(call)
                    if call.outcome is Outcome.OK:
                        call.settle(Outcome.RETRIED)
                    return result
            raise AssertionError("unreachable: tenacity either returns or re-raises")

        return Step(failed=failed, counts_attempts=True)
