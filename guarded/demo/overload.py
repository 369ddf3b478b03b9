"""The demo's ``overload`` phase: far more callers than the pool has connections, on a healthy
database.

For the phase's duration ``callers`` extra callers (1,000 by default, against the demo's
10-connection pool) loop over a direct upsert (``save_memory_state``), a group-committed append
(``save_event``) and a read (``load_memory_state``) on the demo's guarded store. Every
acknowledged write goes into the ledger, so the verdict counts one that never reached the
database as lost. The effect says how many calls were made and how often the circuit breaker
changed state meanwhile: load alone must not open it (the bulkhead queues callers; time spent
queueing is not the backend being slow).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from guarded.models import StoredEvent

from .calls import ESCAPED, attempt, json_form
from .ledger import Ledger, WriteKind

OVERLOAD_CALLERS = 1000
"""Callers of an ``overload`` phase."""


async def run_overload(
    store: Any,
    ledger: Ledger,
    *,
    callers: int,
    duration: float,
    breaker_changes: Callable[[], int],
) -> tuple[str, bool]:
    """Run the phase; its effect and whether it ran."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    before = breaker_changes()
    writes = reads = 0

    async def caller(index: int) -> None:
        nonlocal writes, reads
        key, trace = f"overload:memory:{index}", f"overload-{index}"
        step = 0
        while loop.time() < end:
            state = {"caller": index, "step": step}
            if await attempt(ledger, store.save_memory_state(key, state)) is not ESCAPED:
                ledger.upsert(WriteKind.MEMORY, key, json_form(state))
                writes += 1
            payload = {"step": step}
            event = StoredEvent(trace, time.time(), "overload_step", "overload", f"caller-{index}", payload)
            if await attempt(ledger, store.save_event(event)) is not ESCAPED:
                ledger.event((trace, event.kind, event.node_id, event.ts), json_form(payload))
                writes += 1
            await attempt(ledger, store.load_memory_state(key))
            ledger.reads["load_memory_state"] += 1
            reads += 1
            step += 1

    await asyncio.gather(*(caller(index) for index in range(callers)))
    changes = breaker_changes() - before
    effect = (
        f"{callers} callers for {duration:.1f}s: {writes} writes acknowledged, {reads} reads; "
        f"circuit breaker state changes meanwhile: {changes}"
    )
    return effect, writes > 0
