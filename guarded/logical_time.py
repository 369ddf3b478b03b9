"""The logical time of a last-write-wins upsert: what orders writes of one key across processes.

A write held during an outage is replayed later, perhaps after another worker wrote the same key
directly. Bookkeeping inside one process cannot see that worker, so the data itself carries the
time: every upsert of a memory state, trajectory, remote binding or pause has the logical time of
its *call*, and the backend keeps with each row the time of the write that set it. Tasks need none
of this: a task state carries its own ``updated_at`` (a replayed one older than the stored one is
reported as below all the same).

The rules a backend follows:

* **A direct write is applied**, whatever the stored row's time: a clock behind another host's
  must not drop a live write. The row takes ``max(the write's time, the stored time + 1)``, so its
  time only grows, and the backend hands that time to :func:`merge_logical_time`.
* **Only a replay is compared** (:data:`REPLAYING` is true: a held write replayed, a snapshot
  restored): it replaces the row only when its time is not older than the stored one (an equal
  time wins, so a repeat of the same write is harmless). A replay it leaves alone is reported by
  raising :class:`~guarded.errors.WriteSupersededError` once the rest of the call is applied;
  the guard counts it as superseded, never as delivered.
* **A replay without a time** (held by a version that did not keep one) is older than any row
  with a time: :func:`current_logical_times` answers :data:`UNTIMED_REPLAY`. Such a write was
  held before the upgrade that brought logical times, so any row written with a time is newer.

A logical time is an integer, microseconds since the Unix epoch, from a hybrid logical clock: the
wall clock, but strictly increasing within the process (a clock stepped back by NTP, or two calls
in the same microsecond, still get increasing times), and moved past every time the backend
reports (:func:`merge_logical_time`), so the times of a process never fall behind what it has seen
stored by another. How a replay and a direct write made elsewhere compare is as good as the
hosts' clocks: keep them synchronised (NTP) to well under the shortest outage you expect.

The guard sets the time of each upsert in :data:`LOGICAL_TIMES` around the backend call, and a
replay sets the time the write was first called with (kept with the held write under
:data:`WRITE_TIME_ARGUMENT`) and :data:`REPLAYING`. A backend only reads them::

    times = current_logical_times(len(rows))   # one per row; the clock's time when unset
    if REPLAYING.get():
        # INSERT ... ON CONFLICT (key) DO UPDATE SET ..., logical_time = EXCLUDED.logical_time
        #     WHERE table.logical_time <= EXCLUDED.logical_time RETURNING logical_time
        # (fewer rows returned than sent: raise WriteSupersededError(refused))
    else:
        # INSERT ... ON CONFLICT (key) DO UPDATE SET ...,
        #     logical_time = GREATEST(EXCLUDED.logical_time, table.logical_time + 1)
        #     RETURNING logical_time
    merge_logical_time(max(returned times))

A custom backend opts in by doing the same. One that does not is still protected within one
process by the guard's own bookkeeping, but not against another worker's newer write.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence

from .context_vars import reset_context_var

LOGICAL_TIMES: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "guarded_logical_times", default=None
)
"""The logical time of each item of the upsert in progress (one for a single write), or ``None``
outside a guarded upsert (the backend then takes :func:`next_logical_time`)."""

REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("guarded_replaying", default=False)
"""Whether the upsert in progress replays a write made earlier (a held write, a snapshot being
restored): only then does the backend compare its time with the stored row's and leave a newer row
alone (raising :class:`~guarded.errors.WriteSupersededError`). ``False`` for a direct write, which
is always applied."""

UNTIMED_REPLAY = 0
"""The logical time of a replay kept without one (by a version that did not keep times): older
than any row written with a time, so it lands only where the key has none."""

WRITE_TIME_ARGUMENT = "_guarded_write_time"
"""Keyword argument under which a held upsert keeps the logical time of its call; a replay removes
it and sets :data:`LOGICAL_TIMES` instead."""

_last = 0


def next_logical_time() -> int:
    """A new logical time: the wall clock in microseconds, larger than any earlier one of the
    process and than any time :func:`merge_logical_time` was given."""
    global _last
    now = time.time_ns() // 1000
    _last = now if now > _last else _last + 1
    return _last


def merge_logical_time(stored: int) -> None:
    """Move the process clock past ``stored``, a logical time a backend holds (the receive step of
    a hybrid logical clock): every later :func:`next_logical_time` is larger. A backend calls it
    with the time each upsert left on its rows."""
    global _last
    if stored > _last:
        _last = stored


def current_logical_times(count: int) -> Sequence[int]:
    """The logical times of the ``count`` items of the upsert in progress: those the guard set, or
    (none set, or not one per item) a new time for all of them -- :data:`UNTIMED_REPLAY` for a
    replay."""
    times = LOGICAL_TIMES.get()
    if times is not None and len(times) == count:
        return times
    if REPLAYING.get():
        return (UNTIMED_REPLAY,) * count
    return (next_logical_time(),) * count


def current_logical_time() -> int:
    """The logical time of the single upsert in progress (see :func:`current_logical_times`)."""
    return current_logical_times(1)[0]


@contextlib.contextmanager
def logical_times(times: tuple[int, ...] | None) -> Iterator[tuple[int, ...] | None]:
    """Set :data:`LOGICAL_TIMES` for the calls made inside the block (``None`` clears it)."""
    token = LOGICAL_TIMES.set(times)
    try:
        yield times
    finally:
        reset_context_var(LOGICAL_TIMES, token)


@contextlib.contextmanager
def replaying(replay: bool = True) -> Iterator[None]:
    """Set :data:`REPLAYING` for the calls made inside the block: they replay earlier writes
    (``replay=False``: they are direct writes, applied whatever the stored time)."""
    token = REPLAYING.set(replay)
    try:
        yield
    finally:
        reset_context_var(REPLAYING, token)


def age_of(logical: int) -> float:
    """Seconds since the logical time ``logical`` by this process's wall clock (0 for a time not
    yet reached): how long ago a write was first called, when it is replayed."""
    return max(0.0, (time.time_ns() // 1000 - logical) / 1_000_000)


def ttl_left(ttl: float, logical: int) -> float:
    """Seconds a write called at logical time ``logical`` has left of a time to live ``ttl``: all of
    it for a direct write; for a replay (:data:`REPLAYING`) the TTL counts from its call, so the
    replay of a write that would have expired meanwhile has none left. A replay kept without a time
    (:data:`UNTIMED_REPLAY`: its call time is unknown) has all of it, from the replay."""
    return ttl - age_of(logical) if REPLAYING.get() and logical != UNTIMED_REPLAY else ttl


def kept_write_time(value: object) -> int | None:
    """The logical time a held write kept under :data:`WRITE_TIME_ARGUMENT` (``None`` when absent
    or not an integer: the write is then replayed as :data:`UNTIMED_REPLAY`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


__all__ = [
    "LOGICAL_TIMES",
    "REPLAYING",
    "UNTIMED_REPLAY",
    "WRITE_TIME_ARGUMENT",
    "age_of",
    "ttl_left",
    "current_logical_time",
    "current_logical_times",
    "kept_write_time",
    "logical_times",
    "merge_logical_time",
    "next_logical_time",
    "replaying",
]
