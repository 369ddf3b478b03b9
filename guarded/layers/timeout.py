"""Per-attempt timeout, capped by the call's overall deadline (enforced by the loop's watchdog)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Step, StepLayer
from ..pipeline.watchdog import Watchdog, running_task, watchdog_for


class TimeoutLayer(StepLayer):
    """Bounds each attempt by ``min(attempt timeout, time left before the deadline)``, the attempt
    timeout counted from the attempt's admission (after any wait in the bulkhead's line).

    Raises ``TimeoutError`` at most one watchdog tick (5 ms) after the bound; a cancellation
    from the caller still propagates as ``CancelledError``.
    """

    def step(self, method: MethodSetup, inner: Service) -> Step:
        attempt_timeout = method.settings.attempt_timeout
        label = method.label
        last_loop: asyncio.AbstractEventLoop | None = None
        last_dog: Watchdog | None = None
        last_armed: dict[object, tuple[asyncio.Task[object], float]] = {}
        """The event loop of the last call, its watchdog and the watchdog's armed deadlines."""

        def watchdog(loop: asyncio.AbstractEventLoop) -> Watchdog:
            nonlocal last_loop, last_dog, last_armed
            dog = watchdog_for(loop)
            last_loop, last_dog, last_armed = loop, dog, dog.armed
            return dog

        def arm(call: Call) -> None:
            loop = call.loop
            dog = last_dog if loop is last_loop else watchdog(loop)
            # An attempt's time starts when it is admitted: the call's start for a first attempt
            # that did not wait in the bulkhead's line (no clock read), now for any other.
            if call.attempts > 1 or call.queued:
                when = loop.time() + attempt_timeout
            else:
                when = call.started + attempt_timeout
            if when > call.deadline:
                when = call.deadline
            dog.armed[call] = (running_task(loop), when)  # type: ignore[union-attr,assignment]  # dog.arm(), inline
            if when < dog.wake_at:  # type: ignore[union-attr]
                dog.wake_by(when)  # type: ignore[union-attr]

        def answered(call: Call, result: Any) -> Any:
            # Whatever the store made of the watchdog's cancellation, withdraw it (else the task's
            # cancellation count stays raised, which breaks the caller's own asyncio.timeout).
            loop = call.loop
            armed = last_armed if loop is last_loop else watchdog(loop).armed
            if armed.pop(call, None) is None and _withdrawn(call):
                raise attempt_timed_out(label, None)
            return result

        def failed(call: Call, exc: BaseException) -> Any:
            # Unless the caller cancelled too, an attempt the watchdog cancelled timed out.
            if watchdog(call.loop).disarm(call) and _withdrawn(call):
                raise attempt_timed_out(label, exc)
            raise exc

        return Step(enter=arm, ok=answered, failed=failed)


def _withdrawn(call: Call) -> bool:
    """The watchdog's cancellation of the call's task withdrawn: ``True`` when it was the only one
    (the caller did not cancel too). ``False`` without a task: a call of a closed loop being
    collected as garbage."""
    task = running_task(call.loop)
    return task is not None and task.uncancel() == 0


def attempt_timed_out(label: str, failure: BaseException | None) -> BaseException:
    """What an attempt the watchdog cancelled ends with. ``failure`` is what the store raised then
    (``None``: it returned, having swallowed the cancellation): a ``CancelledError`` or any other
    ``Exception`` becomes ``TimeoutError`` (chained to the store's exception); anything else goes
    on as it is."""
    if failure is None:
        return TimeoutError(f"{label} timed out (the store swallowed the cancellation)")
    if isinstance(failure, asyncio.CancelledError):
        timed_out = TimeoutError(f"{label} timed out")
        timed_out.__suppress_context__ = True
        return timed_out
    if isinstance(failure, Exception):
        timed_out = TimeoutError(f"{label} timed out")
        timed_out.__cause__ = failure
        return timed_out
    return failure
