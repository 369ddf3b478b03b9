"""Deadline watchdog: cheap per-call timeouts for a hot path.

``asyncio.timeout`` schedules and cancels a ``TimerHandle`` per use (several microseconds).
The watchdog instead keeps the armed deadlines in one dict (arming and disarming are a dict
insert and pop) and keeps a single loop callback scheduled for the earliest of them, rounded
up to a ``tick``. When it wakes it cancels the tasks whose deadline has passed and schedules
itself for the next one. A deadline fires at most one tick late.
"""

from __future__ import annotations

import asyncio
import math
import types
import weakref
from collections.abc import Callable

DEFAULT_TICK = 0.005


class Watchdog:
    """Cancels tasks whose deadline passed; one per event loop (see :func:`watchdog_for`)."""

    __slots__ = ("__weakref__", "_handle", "_loop", "_tick", "armed", "wake_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float = DEFAULT_TICK) -> None:
        self._loop = loop
        self._tick = tick
        self.armed: dict[object, tuple[asyncio.Task[object], float]] = {}
        """The deadline of each armed key and the task it cancels. A hot path may arm and disarm
        inline: ``armed[key] = (task, when)`` then :meth:`wake_by` when ``when < wake_at``, and
        ``armed.pop(key, None) is None`` for :meth:`disarm`."""
        self._handle: asyncio.TimerHandle | None = None
        self.wake_at = math.inf
        """Loop time the watchdog wakes up at (infinity when nothing is scheduled)."""

    def arm(self, key: object, task: asyncio.Task[object], when: float) -> None:
        """Cancel ``task`` once loop time reaches ``when`` unless ``key`` is disarmed first.

        ``key`` is any hashable object that stays unique while armed (the guard uses the call).
        """
        self.armed[key] = (task, when)
        if when < self.wake_at:
            self.wake_by(when)

    def wake_by(self, when: float) -> None:
        """Make sure the watchdog wakes up for a deadline at ``when``."""
        if self._tick_after(when) < self.wake_at:
            # A deadline before the tick the wake-up is set for (calls of different methods have
            # different timeouts): wake up earlier. A deadline within that tick is met by it: the
            # timer is not moved (every call's deadline is a little later than the last one's).
            self._schedule(when)

    def disarm(self, key: object) -> bool:
        """Withdraw the deadline of ``key``; ``True`` when it had already fired (the task was
        cancelled by the watchdog)."""
        return self.armed.pop(key, None) is None

    def _tick_after(self, when: float) -> float:
        """The first tick of the watchdog's clock after ``when``: when a wake-up for it comes."""
        tick = self._tick
        return (int(when / tick) + 1) * tick

    def _schedule(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.wake_at = at = self._tick_after(when)
        self._handle = self._loop.call_at(at, self._check)

    def _check(self) -> None:
        self._handle = None
        self.wake_at = math.inf
        armed = self.armed
        if not armed:
            return
        now = self._loop.time()
        due = [key for key, (_, when) in armed.items() if when <= now]
        for key in due:
            task, _ = armed.pop(key)
            task.cancel()
        if armed:
            self._schedule(min(when for _, when in armed.values()))


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[Watchdog]] = (
    weakref.WeakKeyDictionary()
)
"""The watchdog of each loop, referenced weakly: it references its loop and the calls armed on it,
so a strong reference here would keep every loop a guard ever ran on alive, with the calls a
closed one dropped. While calls are armed its loop's timer references it; otherwise the callers
that used it last do."""


_last: tuple[weakref.ref[asyncio.AbstractEventLoop], Watchdog] | None = None


def watchdog_for(loop: asyncio.AbstractEventLoop) -> Watchdog:
    """The watchdog of ``loop``, created on first use (the last one is cached without a strong
    reference to its loop)."""
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    known = _watchdogs.get(loop)
    found = known() if known is not None else None
    if found is None:
        found = Watchdog(loop)
        _watchdogs[loop] = weakref.ref(found)
    _last = (weakref.ref(loop), found)
    return found


def _running_task_lookup() -> Callable[[asyncio.AbstractEventLoop], asyncio.Task[object] | None]:
    """``asyncio.current_task(loop)`` for a given loop, without the Python frame CPython 3.11 spends
    on it (its C version came in 3.12): the lookup in the table the C tasks keep."""
    current_task = asyncio.current_task
    if isinstance(current_task, types.BuiltinFunctionType):
        return current_task
    table = getattr(asyncio.tasks, "_current_tasks", None)
    return table.get if isinstance(table, dict) else current_task


running_task = _running_task_lookup()
"""The task running on a loop (``asyncio.current_task(loop)``), for a hot path."""


def forget_closed(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` is closed: its watchdog lets go of the calls still armed on it (they never resume;
    kept, they could never be collected while anything references the watchdog)."""
    known = _watchdogs.get(loop)
    found = known() if known is not None else None
    if found is not None:
        found.armed.clear()
