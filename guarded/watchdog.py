"""Deadline watchdog: cheap per-call timeouts for a hot path.

``asyncio.timeout`` schedules and cancels a ``TimerHandle`` per use (several microseconds).
The watchdog instead files each armed deadline into a bucket of ``tick`` seconds; one loop
callback, scheduled only while something is armed, wakes once per tick and cancels the tasks
whose deadline has passed. Arming and disarming are a set insert and removal. A deadline fires
at most one tick late.
"""

from __future__ import annotations

import asyncio
import weakref

DEFAULT_TICK = 0.005


class _Armed:
    __slots__ = ("bucket", "fired", "task", "when")

    def __init__(self, task: asyncio.Task[object], when: float, bucket: int) -> None:
        self.task = task
        self.when = when
        self.bucket = bucket
        self.fired = False


class Watchdog:
    """Cancels tasks whose deadline passed; one per event loop (see :func:`watchdog_for`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float = DEFAULT_TICK) -> None:
        self._loop = loop
        self._tick = tick
        self._buckets: dict[int, set[_Armed]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._scheduled = 0
        """The bucket ``_handle`` wakes up for."""

    def arm(self, task: asyncio.Task[object], when: float) -> _Armed:
        """Cancel ``task`` once loop time reaches ``when`` unless disarmed first."""
        bucket = int(when / self._tick) + 1
        armed = _Armed(task, when, bucket)
        entries = self._buckets.get(bucket)
        if entries is None:
            self._buckets[bucket] = {armed}
        else:
            entries.add(armed)
        handle = self._handle
        if handle is None or bucket < self._scheduled:
            # An earlier deadline than the one the wake-up is set for (calls of different
            # methods have different timeouts): wake up earlier.
            if handle is not None:
                handle.cancel()
            self._scheduled = bucket
            self._handle = self._loop.call_at(bucket * self._tick, self._check)
        return armed

    def disarm(self, armed: _Armed) -> None:
        entries = self._buckets.get(armed.bucket)
        if entries is not None:
            entries.discard(armed)
            if not entries:
                del self._buckets[armed.bucket]

    def _check(self) -> None:
        self._handle = None
        now = self._loop.time()
        due = [bucket for bucket in self._buckets if bucket * self._tick <= now]
        for bucket in due:
            for armed in self._buckets.pop(bucket):
                armed.fired = True
                armed.task.cancel()
        if self._buckets:
            self._scheduled = min(self._buckets)
            self._handle = self._loop.call_at(self._scheduled * self._tick, self._check)


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watchdog] = weakref.WeakKeyDictionary()


_last: tuple[weakref.ref[asyncio.AbstractEventLoop], Watchdog] | None = None


def watchdog_for(loop: asyncio.AbstractEventLoop) -> Watchdog:
    """The watchdog of ``loop``, created on first use (the last one is cached without a strong
    reference to its loop)."""
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    found = _watchdogs.get(loop)
    if found is None:
        found = _watchdogs[loop] = Watchdog(loop)
    _last = (weakref.ref(loop), found)
    return found
