"""Bulkhead: at most ``limit`` calls in the backend at once; the others wait in line for their turn.

Sits between retry and timeout, so each attempt waits for admission on its own (a retry does not
hold a permit while it backs off) and the per-attempt timeout measures the backend only, from the
moment the attempt is admitted. Time spent in line is written to :attr:`Call.queued
<guarded.pipeline.call.Call.queued>`: it is the guard's own queueing, which the circuit breaker leaves out
of the call's duration.

A caller waits while it has time left for an attempt: ``min(attempt timeout,
breaker.slow_call_duration, half the deadline)`` — the *reserve*. An admitted call thus has the
time to answer, or to be shown slow or failing by its own timeout. Past that it gets
:class:`~guarded.pipeline.bulkhead.BulkheadTimeoutError` without the backend being asked; so does a retry
that would start with less than the reserve left, even with a permit free. Under overload the
backend serves whole calls of the callers it admits, instead of starting calls that the deadline
cuts short (which would also look like backend failures to the breaker).

An admission timeout is the guard's queueing, not counted against the backend by the breaker —
with two exceptions, where it is evidence about the backend: no call succeeded in the backend
during the whole wait (the line was held up by a backend that stalls or fails, not by the number
of callers: a healthy backend keeps completing calls), or it ends a retry (the attempt before it
failed in the backend, and the breaker sees only a call's last error).
"""

from __future__ import annotations

from typing import Any

from ..pipeline.bulkhead import Bulkhead, BulkheadTimeoutError
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.compiled import Attempt


class BulkheadLayer:
    """Admits calls through a :class:`~guarded.pipeline.bulkhead.Bulkhead` (shared by every method of the
    store and by the guard's own calls); without one, it does not wrap at all."""

    def __init__(self, bulkhead: Bulkhead | None, *, slow_call_duration: float) -> None:
        self._bulkhead = bulkhead
        self._slow_call_duration = slow_call_duration

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        bulkhead = self._bulkhead
        if bulkhead is None:
            return inner
        settings = method.settings
        reserve = min(settings.attempt_timeout, self._slow_call_duration, settings.deadline / 2)
        stats = bulkhead.stats(method.label)
        try_acquire, wait, release = bulkhead.try_acquire, bulkhead.wait, bulkhead.release
        label = method.label

        def refused(call: Call, waited: float, *, stuck: bool) -> BulkheadTimeoutError:
            stats.timeouts += 1
            return BulkheadTimeoutError(
                f"{label}: not admitted to the backend within its deadline "
                f"(waited {waited:.3f}s; {bulkhead.limit} calls at once)",
                counts_against_backend=stuck or call.attempts > 1,
            )

        async def queue(call: Call) -> None:
            loop = call.loop
            began = loop.time()
            successes = bulkhead.successes
            admitted = await wait(loop, call.deadline - reserve)
            waited = loop.time() - began
            call.queued += waited
            stats.waits.observe(waited)
            if not admitted:
                raise refused(call, waited, stuck=bulkhead.successes == successes)

        async def admitted(call: Call) -> Any:
            if call.preloaded is not None:
                return await inner(call)  # admitted and released on the compiled success path
            if call.attempts > 1 and call.loop.time() > call.deadline - reserve:
                raise refused(call, 0.0, stuck=False)  # a retry the deadline would cut short
            if try_acquire():
                stats.immediate += 1
            else:
                await queue(call)
            try:
                result = await inner(call)
            finally:
                release()
            bulkhead.successes += 1
            return result

        return admitted

    def attempt_hooks(self, method: MethodSetup) -> Attempt:
        """A free permit for the first attempt on the compiled success path (else the chain waits
        in line for one)."""
        bulkhead = self._bulkhead
        if bulkhead is None:
            return Attempt(attempt_timeout=None)

        def succeeded() -> None:
            bulkhead.successes += 1

        return Attempt(
            attempt_timeout=None,
            acquire=bulkhead.try_acquire,
            release=bulkhead.release,
            succeeded=succeeded,
            stats=bulkhead.stats(method.label),
        )
