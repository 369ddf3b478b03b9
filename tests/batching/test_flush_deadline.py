"""A group-commit caller is answered within its own deadline, even behind a flush in flight.

``save_update`` is flushed one batch at a time (its reads follow insertion order). On a backend
that hangs, a caller whose write arrives during a flush waits for that flush, and then for its
own: each flush used to get a whole deadline of its own, so the caller waited up to two. A flush
now carries the earliest deadline of the writes in it; what it cannot write in time is
dead-lettered (held, replayed later), and the caller is answered by its deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, DeadLetterConfig
from guarded.guard import controller, guard
from guarded.models import StateUpdate, UpdateType
from tests.guard.support import fast_config

DEADLINE = 0.3
SLACK = 0.15
"""Watchdog tick, the spill of the dead-lettered writes and a loaded machine's scheduling."""


class HangingStore(InMemoryStateStore):
    """Fault injection: writes of updates hang until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def _hang(self) -> None:
        await self.release.wait()

    async def save_update(self, update: StateUpdate) -> None:
        await self._hang()
        await super().save_update(update)

    async def save_updates(self, updates: Sequence[StateUpdate]) -> None:
        await self._hang()
        await super().save_updates(updates)


def update(number: int) -> StateUpdate:
    return StateUpdate(
        session_id="s",
        task_id="t",
        update_id=f"u{number}",
        update_type=UpdateType.PROGRESS,
        content={"n": number},
    )


@pytest.mark.asyncio
async def test_a_write_behind_a_hung_flush_is_answered_within_its_own_deadline() -> None:
    backend = HangingStore()
    store = guard(
        backend,
        registry=CollectorRegistry(),
        config=fast_config(
            attempt=DEADLINE,
            deadline=DEADLINE,
            max_attempts=1,
            batching=BatchConfig(),
            dead_letter=DeadLetterConfig(path=None),
        ),
    )
    loop = asyncio.get_running_loop()

    async def timed(number: int) -> float:
        started = loop.time()
        await store.save_update(update(number))
        return loop.time() - started

    first = asyncio.create_task(timed(1))
    await asyncio.sleep(DEADLINE / 6)  # the first flush is in flight (hung)
    took = await asyncio.gather(first, *(timed(number) for number in range(2, 6)))
    assert max(took) <= DEADLINE + SLACK, took
    control = controller(store)
    assert control.dead_letters is not None
    assert control.dead_letters.depth == 5  # every write held, none lost
    backend.release.set()
    assert await control.drain(5.0) == 0
    stored: list[Any] = list(await backend.list_updates("s"))
    assert sorted(item.update_id for item in stored) == [f"u{number}" for number in range(1, 6)]
