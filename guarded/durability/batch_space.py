"""The batcher's backpressure: a fixed number of slots (writes queued or being flushed, all methods
together) and the submitters waiting for one, served first come, first served.

A slot is taken at once when one is free and nobody waits (:meth:`BatchSpace.take_now`, the hot
path: no future, no lock), or waited for up to a deadline (:meth:`BatchSpace.wait`). Freed slots
go to the oldest waiter first (:meth:`BatchSpace.release`). Closing refuses every waiter and every
later request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class BatchSpace:
    """Slots for ``capacity`` writes and the FIFO of submitters waiting for one."""

    __slots__ = ("capacity", "closed", "pending", "waiters")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pending = 0
        """Slots taken: writes queued or being flushed, plus slots granted to waiters about to queue."""
        self.waiters: deque[asyncio.Future[bool]] = deque()
        self.closed = False

    def take_now(self) -> bool:
        """Take a slot when one is free and nobody waits for one (``False`` otherwise, or closed)."""
        if self.pending < self.capacity and not self.waiters and not self.closed:
            self.pending += 1
            return True
        return False

    async def wait(self, deadline: float) -> bool:
        """Wait for a slot, behind the earlier waiters, until loop time ``deadline``; ``True`` once
        granted, ``False`` when the deadline passed or the space closed first. A cancelled waiter
        gives back a slot it was granted, or its place in the line."""
        if self.closed:
            return False
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            return False
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiters.append(waiter)
        expiry = loop.call_at(deadline, self._expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release(1)
            else:
                self._forget(waiter)
            raise
        finally:
            expiry.cancel()

    def release(self, count: int) -> None:
        """Free ``count`` slots and hand them to waiting submitters, oldest first."""
        self.pending -= count
        waiters = self.waiters
        while waiters and self.pending < self.capacity:
            waiter = waiters.popleft()
            if not waiter.done():
                self.pending += 1
                waiter.set_result(True)

    def close(self) -> None:
        """Refuse every waiting submitter and every later request."""
        self.closed = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            waiter.set_result(False)
            self._forget(waiter)

    def _forget(self, waiter: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)


__all__ = ["BatchSpace"]
