"""Group commit written by hand, no guard: the reference that does the same work as the guard's.

Every caller awaits its own event until the transaction holding it is committed. Callers queue
their events; a flush takes everything queued, encodes the rows with the store's own encoder
(:func:`~guarded.backends.postgres.events.encode_events`), writes them with one ``COPY`` and answers
its callers; at most two flushes run at a time, and what arrives meanwhile waits for the next. No
timeout, retry, breaker, metrics, dead-letter buffer or read-your-writes: only what returning at
commit needs, written as one would without a library. With few callers it is bound by the commit
round trip, not by the encoding or ``COPY``: how far returning at commit, before any guard, is from
``COPY`` with no callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg

from guarded.backends.postgres.events import encode_events
from guarded.models import StoredEvent


class HandGroupCommit:
    """``await save_event(event)`` returns once ``event`` is committed with ``COPY`` (``flushes``
    at a time)."""

    def __init__(self, pool: asyncpg.Pool, schema: str, columns: Sequence[str], flushes: int = 2) -> None:
        self._pool = pool
        self._schema = schema
        self._columns = list(columns)
        self._queue: list[tuple[StoredEvent, asyncio.Future[None]]] = []
        self._flushes = flushes
        self._flushing = 0

    async def save_event(self, event: StoredEvent) -> None:
        done = asyncio.get_running_loop().create_future()
        self._queue.append((event, done))
        if self._flushing < self._flushes:
            self._flushing += 1
            asyncio.get_running_loop().create_task(self._flush())
        await done

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    rows = encode_events([event for event, _ in batch])
                    async with self._pool.acquire() as conn:
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
            self._flushing -= 1
