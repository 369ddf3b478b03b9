"""Per-attempt timeout, capped by the call's overall deadline (enforced by the loop's watchdog)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.compiled import Attempt
from ..pipeline.watchdog import attempt_timed_out, watchdog_for


class TimeoutLayer:
    """Bounds each attempt by ``min(attempt timeout, time left before the deadline)``, the attempt
    timeout counted from the attempt's admission (after any wait in the bulkhead's line).

    Raises ``TimeoutError`` at most one watchdog tick (5 ms) after the bound; a cancellation
    from the caller still propagates as ``CancelledError``.
    """

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        attempt_timeout = method.settings.attempt_timeout
        current_task = asyncio.current_task

        last: list[Any] = [None, None]
        """The event loop of the last call and its watchdog."""

        async def timed(call: Call) -> Any:
            if call.preloaded is not None:
                return await inner(call)  # timed on the compiled success path
            loop = call.loop
            task = current_task(loop)
            assert task is not None
            if loop is last[0]:
                dog = last[1]
            else:
                dog = watchdog_for(loop)
                last[:] = loop, dog
            # An attempt's time starts when it is admitted: the call's start for a first attempt
            # that did not wait in the bulkhead's line (no clock read), now for any other.
            when = (call.started if call.attempts <= 1 and not call.queued else loop.time()) + attempt_timeout
            dog.arm(call, task, when if when < call.deadline else call.deadline)
            try:
                result = await inner(call)
            except BaseException as exc:
                # Whatever the store made of the watchdog's cancellation, withdraw it (else the
                # task's cancellation count stays raised, which breaks the caller's own
                # asyncio.timeout); unless the caller cancelled too, the attempt timed out.
                if dog.disarm(call) and task.uncancel() == 0:
                    raise attempt_timed_out(method.label, exc)  # noqa: B904 (chained as it says)
                raise
            if dog.disarm(call) and task.uncancel() == 0:
                raise attempt_timed_out(method.label, None)
            return result

        return timed

    def attempt_hooks(self, method: MethodSetup) -> Attempt:
        """The first attempt's bound on the compiled success path (the same as :meth:`wrap`'s)."""
        return Attempt(attempt_timeout=method.settings.attempt_timeout)
