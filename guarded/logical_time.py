"""The logical time of a last-write-wins upsert: what a backend compares to refuse an older write.

A write held during an outage is replayed later, perhaps after another worker wrote the same key
directly. Bookkeeping inside one process cannot see that worker, so the data itself carries the
time: every upsert of a memory state, trajectory, remote binding or pause has the logical time of
its *call*, and the backend keeps a row's time and refuses a write older than it (an equal time
wins, so a repeat of the same write is harmless). Tasks need none of this: a task state carries
its own ``updated_at``.

A logical time is an integer, microseconds since the Unix epoch, from a hybrid clock: the wall
clock, but strictly increasing within the process (a clock stepped back by NTP, or two calls in
the same microsecond, still get increasing times). Across processes and hosts it is as good as
their clocks: keep hosts synchronised (NTP) to well under the shortest outage you expect.

The guard sets the time of each upsert in :data:`LOGICAL_TIMES` around the backend call, and a
replay sets the time the write was first called with (kept with the held write under
:data:`WRITE_TIME_ARGUMENT`). A backend only reads it::

    times = current_logical_times(len(rows))   # one per row; the clock's time when unset
    # INSERT ... ON CONFLICT (key) DO UPDATE SET ..., logical_time = EXCLUDED.logical_time
    #     WHERE table.logical_time <= EXCLUDED.logical_time

A custom backend opts in by doing the same: store the time with the row and refuse an older one.
One that does not is still protected within one process by the guard's own bookkeeping, but not
against another worker's newer write.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence

LOGICAL_TIMES: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "guarded_logical_times", default=None
)
"""The logical time of each item of the upsert in progress (one for a single write), or ``None``
outside a guarded upsert (the backend then takes :func:`next_logical_time`)."""

WRITE_TIME_ARGUMENT = "_guarded_write_time"
"""Keyword argument under which a held upsert keeps the logical time of its call; a replay removes
it and sets :data:`LOGICAL_TIMES` instead."""

_last = 0


def next_logical_time() -> int:
    """A new logical time: the wall clock in microseconds, larger than any earlier one of the
    process."""
    global _last
    now = time.time_ns() // 1000
    _last = now if now > _last else _last + 1
    return _last


def current_logical_times(count: int) -> Sequence[int]:
    """The logical times of the ``count`` items of the upsert in progress: those the guard set, or
    (none set, or not one per item) a new time for all of them."""
    times = LOGICAL_TIMES.get()
    if times is not None and len(times) == count:
        return times
    return (next_logical_time(),) * count


def current_logical_time() -> int:
    """The logical time of the single upsert in progress (see :func:`current_logical_times`)."""
    times = LOGICAL_TIMES.get()
    if times is not None and len(times) == 1:
        return times[0]
    return next_logical_time()


@contextlib.contextmanager
def logical_times(times: tuple[int, ...] | None) -> Iterator[tuple[int, ...] | None]:
    """Set :data:`LOGICAL_TIMES` for the calls made inside the block (``None`` clears it)."""
    token = LOGICAL_TIMES.set(times)
    try:
        yield times
    finally:
        LOGICAL_TIMES.reset(token)


def age_of(logical: int) -> float:
    """Seconds since the logical time ``logical`` by this process's wall clock (0 for a time not
    yet reached): how long ago a write was first called, when it is replayed."""
    return max(0.0, (time.time_ns() // 1000 - logical) / 1_000_000)


def kept_write_time(value: object) -> int | None:
    """The logical time a held write kept under :data:`WRITE_TIME_ARGUMENT` (``None`` when absent
    or not an integer: the write is then replayed with a new time, as before this existed)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


__all__ = [
    "LOGICAL_TIMES",
    "WRITE_TIME_ARGUMENT",
    "age_of",
    "current_logical_time",
    "current_logical_times",
    "kept_write_time",
    "logical_times",
    "next_logical_time",
]
