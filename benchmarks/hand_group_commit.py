"""Group commit written by hand, no guard: the reference that does the same work as the guard's.

Every caller awaits its own event until the transaction holding it is committed. Callers queue
their events; a flush takes everything queued, encodes the rows with the store's own encoder
(:func:`~guarded.backends.postgres.event_log.encode_events`), writes them with one ``COPY`` and answers
its callers. As in the guard's default (``BatchConfig``), a further flush starts beside the running
ones when ``parallel_at`` writes wait, up to ``flushes`` at a time, so the process prepares one
batch while the database commits another. Each flush keeps its connection between batches (no
pool acquire and release per batch, which the guard pays); :meth:`HandGroupCommit.release` gives
them back. No timeout, retry, breaker, metrics, dead-letter buffer or read-your-writes: only what
returning at commit needs, written for this workload alone. With few callers it is bound by the
commit round trip, not by the encoding or ``COPY``: how far returning at commit, before any guard,
is from ``COPY`` with no callers; with many, how far it is from unbatched writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from guarded.backends.postgres.event_log import encode_events
from guarded.config import BatchConfig
from guarded.models import StoredEvent

_DEFAULTS = BatchConfig()


class HandGroupCommit:
    """``await save_event(event)`` returns once ``event`` is committed with ``COPY``; at most
    ``flushes`` flushes at a time, a further one once ``parallel_at`` writes wait."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        schema: str,
        columns: Sequence[str],
        *,
        flushes: int = _DEFAULTS.max_concurrent_flushes,
        parallel_at: int = _DEFAULTS.parallel_flush_at,
    ) -> None:
        self._pool = pool
        self._schema = schema
        self._columns = list(columns)
        self._queue: list[tuple[StoredEvent, asyncio.Future[None]]] = []
        self._flushes = flushes
        self._parallel_at = parallel_at
        self._flushing = 0
        """Flushes running, counted down as a flush ends (a finished task leaves ``_tasks`` only
        when its callbacks run, after the callers it answered may have queued again)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: list[PoolConnectionProxy[asyncpg.Record]] = []

    async def save_event(self, event: StoredEvent) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queue.append((event, done))
        running = self._flushing
        if running == 0 or (running < self._flushes and len(self._queue) >= self._parallel_at):
            self._flushing += 1
            task = loop.create_task(self._flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await done

    async def release(self) -> None:
        """Wait for the running flushes, then give their connections back to the pool."""
        while self._tasks:
            await asyncio.gather(*self._tasks)
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._pool.release(conn)

    async def _flush(self) -> None:
        conn = self._idle.pop() if self._idle else await self._pool.acquire()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    rows = encode_events([event for event, _ in batch])
                    await conn.copy_records_to_table(
                        "flow_events", schema_name=self._schema, columns=self._columns, records=rows
                    )
                except Exception as exc:
                    for _, done in batch:
                        done.set_exception(exc)
                else:
                    for _, done in batch:
                        done.set_result(None)
        finally:
            self._idle.append(conn)
            self._flushing -= 1
