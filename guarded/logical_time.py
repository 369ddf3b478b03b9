"""How the guard sets the logical time of an upsert and marks a replay (what a backend reads of
them, and the rules it follows, are in :mod:`guarded.backend`).

The guard sets the time of each upsert in :data:`~guarded.backend.LOGICAL_TIMES` around the
backend call (:func:`logical_times`), and a replay sets the time the write was first called with
(kept with the held write under :data:`WRITE_TIME_ARGUMENT`) and
:data:`~guarded.backend.REPLAYING` (:func:`replaying`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from .backend import LOGICAL_TIMES, REPLAYING
from .context_vars import context_value

WRITE_TIME_ARGUMENT = "_guarded_write_time"
"""Keyword argument under which a held upsert keeps the logical time of its call; a replay removes
it and sets :data:`~guarded.backend.LOGICAL_TIMES` instead."""


def logical_times(times: tuple[int, ...] | None) -> AbstractContextManager[tuple[int, ...] | None]:
    """Set :data:`~guarded.backend.LOGICAL_TIMES` for the calls made inside the block (``None``
    clears it)."""
    return context_value(LOGICAL_TIMES, times)


def replaying(replay: bool = True) -> AbstractContextManager[bool]:
    """Set :data:`~guarded.backend.REPLAYING` for the calls made inside the block: they replay
    earlier writes (``replay=False``: they are direct writes, applied whatever the stored time)."""
    return context_value(REPLAYING, replay)


def kept_write_time(value: object) -> int | None:
    """The logical time a held write kept under :data:`WRITE_TIME_ARGUMENT` (``None`` when absent
    or not an integer: the write is then replayed as :data:`~guarded.backend.UNTIMED_REPLAY`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


__all__ = [
    "WRITE_TIME_ARGUMENT",
    "kept_write_time",
    "logical_times",
    "replaying",
]
