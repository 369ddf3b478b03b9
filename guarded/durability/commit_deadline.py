"""The dead-letter step of a write is bounded by its call's deadline: a spill-file commit that
cannot finish in time ends the call with :class:`~guarded.errors.WriteNotKeptError` (outcome
``refused``), never a call that waits for the disk. The commit itself goes on (a cancelled put
leaves its write queued), so the refused write may still be committed and replayed, as the
refusal says. Used for a single write (:mod:`guarded.layers.dead_letter`), for the writes of a
failed group commit (:mod:`guarded.durability.batch_writer`) and for a write the batcher's full
queue could not take (:mod:`guarded.layers.batching`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from ..errors import WriteNotKeptError

DEAD_LETTER_GRACE = 3.0
"""Seconds a write whose backend attempts used its whole deadline still has to be committed to
the spill file (the demo under overload on a loaded 2-core machine refused 271 writes with 1 s,
none with 3 s); no call waits for its commit past its deadline plus this grace."""

_Kept = TypeVar("_Kept")


def commit_deadline(deadline: float, now: float) -> float:
    """Event-loop time by which the dead-letter step begun at ``now`` of a call whose deadline is
    ``deadline`` must end: at least :data:`DEAD_LETTER_GRACE` after a backend attempt that used the
    whole deadline, and never later than the deadline plus that grace (a write that waited for
    another flush gets what is left of it)."""
    return min(max(deadline, now + DEAD_LETTER_GRACE), deadline + DEAD_LETTER_GRACE)


def not_kept_in_time(method: str) -> WriteNotKeptError:
    """The refusal of a write whose spill-file commit did not finish by its :func:`commit_deadline`."""
    return WriteNotKeptError(
        "the spill file did not commit it within the call's deadline (it may still be committed "
        "and replayed)",
        method=method,
    )


async def kept_in_time(
    keep: Awaitable[_Kept], deadline: float, *, method: str, failure: BaseException | None = None
) -> _Kept:
    """Await ``keep`` (holding a write that failed with ``failure``, when it did) until the
    :func:`commit_deadline` of a call whose deadline is ``deadline``; raises
    :func:`not_kept_in_time` for ``method`` when it does not finish by then."""
    try:
        async with asyncio.timeout_at(commit_deadline(deadline, asyncio.get_running_loop().time())):
            return await keep
    except TimeoutError:
        raise not_kept_in_time(method) from failure


__all__ = ["DEAD_LETTER_GRACE", "commit_deadline", "kept_in_time", "not_kept_in_time"]
