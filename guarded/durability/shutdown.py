"""The end of a guard's durability: draining held writes within a time budget, and saying what was
not delivered and where it is.

:class:`~.owner.Durability` calls these from ``drain``, ``aclose`` and ``report_unclosed``:
:func:`drain_held` delivers held writes until none is left or the budget is spent (waiting out an
open breaker, retrying a failed pass after a backoff); :func:`undelivered_writes` counts the
acknowledged writes not yet in the backend and says where they are; :func:`log_unclosed` and
:func:`log_closed` write the one record a guard leaves when it goes away or closes with some.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

from ..batching.batcher import Batcher
from ..deadletter import DeadLetterBuffer
from .ports import BreakerWait

logger = logging.getLogger("guarded.durability")

DRAIN_PAUSE = 0.05
DRAIN_MAX_PAUSE = 1.0
DRAIN_BATCH = 1000
"""Held writes a drain sends in one bulk call, at most."""


async def drain_held(
    buffer: DeadLetterBuffer,
    breaker: BreakerWait,
    replay_once: Callable[[], Awaitable[bool]],
    deadline: float,
    *,
    store_name: str,
) -> int:
    """Run ``replay_once`` passes until ``buffer`` is empty or the loop time ``deadline`` passes;
    returns how many writes are left. An open breaker is waited out (probed early, with backoff);
    one forced open by an operator ends the drain."""
    loop = asyncio.get_running_loop()
    pause = DRAIN_PAUSE
    while not buffer.is_empty:
        left = deadline - loop.time()
        if left <= 0:
            break
        wait = breaker.remaining_open()
        if wait > 0:
            if math.isinf(wait):
                break  # forced open by an operator: deliver nothing
            await asyncio.sleep(min(wait, pause, left))
            pause = min(pause * 2, DRAIN_MAX_PAUSE)
            breaker.probe_now()
            continue
        try:
            async with asyncio.timeout(left):
                done = await replay_once()
        except TimeoutError:
            break
        except Exception:
            logger.exception("dead-letter drain pass failed", extra={"store": store_name})
            done = False
        if not done and not buffer.is_empty:
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, DRAIN_MAX_PAUSE)
        else:
            pause = DRAIN_PAUSE
    return buffer.depth


def undelivered_writes(batcher: Batcher | None, buffer: DeadLetterBuffer | None) -> tuple[int, bool, str]:
    """Acknowledged writes not yet in the backend, whether some of them are in memory only
    (lost with the process), and where they are."""
    queued = batcher.acknowledged_pending if batcher is not None else 0
    held = buffer.depth if buffer is not None else 0
    in_memory = buffer.memory_only if buffer is not None else 0
    where = []
    if held > in_memory and buffer is not None:
        where.append(f"{held - in_memory} in spill file {buffer.claimed_path}")
    if in_memory:
        where.append(f"{in_memory} in memory only")
    if queued:
        where.append(f"{queued} queued in memory (write-behind)")
    return queued + held, bool(queued or in_memory), ", ".join(where)


def log_unclosed(store_name: str, why: str, count: int, at_risk: bool, where: str) -> None:
    """The ERROR record of a guard that goes away (``why``) unclosed with ``count`` acknowledged
    writes not yet in the backend (:func:`undelivered_writes`)."""
    logger.error(
        "guard of store %r was not closed and %s with %d acknowledged writes not yet in the backend "
        "(%s)%s; close it with 'async with' or 'await controller(store).aclose()'",
        store_name,
        why,
        count,
        where,
        ": those in memory are lost"
        if at_risk
        else "; the next guard of this store on this spill path replays them",
        extra={"event": "guard_not_closed", "store": store_name, "undelivered": count},
    )


def log_closed(store_name: str, *, kept: int, path: str | None, lost: int, parked_lost: int) -> None:
    """The records of a guard closed with writes left: ``kept`` in the spill file at ``path`` (a
    WARNING), ``lost`` waiting and ``parked_lost`` parked writes held in memory only (an ERROR)."""
    if kept:
        logger.warning(
            "closing store %r with %d undelivered writes kept in %s; the next guard of this store "
            "on this spill path delivers them",
            store_name,
            kept,
            path,
            extra={"event": "guard_closed_undelivered", "store": store_name, "depth": kept},
        )
    if lost or parked_lost:
        logger.error(
            "closing store %r with %d undelivered and %d parked writes in memory only: they are lost",
            store_name,
            lost,
            parked_lost,
            extra={
                "event": "guard_closed_lost",
                "store": store_name,
                "depth": lost,
                "parked": parked_lost,
            },
        )


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (when it still runs) and wait until it has ended."""
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


__all__ = [
    "DRAIN_BATCH",
    "DRAIN_MAX_PAUSE",
    "DRAIN_PAUSE",
    "cancelled",
    "drain_held",
    "log_closed",
    "log_unclosed",
    "undelivered_writes",
]
